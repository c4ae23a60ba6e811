"""The logits processors (zoo/models/sampling.py) against HF transformers' own, a reference we did not
write: each filter alone, and the whole chain in HF's order, on random logits in float64."""

from __future__ import annotations

import pytest
import torch

from zoo.models.sampling import Sampling, keep_min_p, keep_top_k, keep_top_p, penalise_repeats

processors = pytest.importorskip("transformers.generation.logits_process", reason="HF transformers is not installed")

B, V = 4, 50


def random_logits(seed: int = 0) -> torch.Tensor:
    return torch.randn(B, V, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * 3


def history(seed: int = 1) -> torch.Tensor:
    return torch.randint(0, V, (B, 12), generator=torch.Generator().manual_seed(seed))


def seen_of(ids: torch.Tensor) -> torch.Tensor:
    return torch.zeros(B, V, dtype=torch.bool).scatter(1, ids, True)


def same_filter(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    assert torch.equal(torch.isinf(ours), torch.isinf(theirs)), "a different set of tokens was kept"
    kept = ~torch.isinf(ours)
    torch.testing.assert_close(ours[kept], theirs[kept])


@pytest.mark.parametrize("k", [1, 5, 49])
def test_top_k_equals_hf(k):
    logits = random_logits()
    same_filter(keep_top_k(logits, k), processors.TopKLogitsWarper(k)(history(), logits.clone()))


@pytest.mark.parametrize("p", [0.05, 0.3, 0.9, 0.99])
def test_top_p_equals_hf(p):
    for seed in range(5):
        logits = random_logits(seed)
        same_filter(keep_top_p(logits, p), processors.TopPLogitsWarper(p)(history(), logits.clone()))


@pytest.mark.parametrize("min_p", [0.01, 0.1, 0.5, 1.0])
def test_min_p_equals_hf(min_p):
    logits = random_logits()
    same_filter(keep_min_p(logits, min_p), processors.MinPLogitsWarper(min_p)(history(), logits.clone()))


@pytest.mark.parametrize("penalty", [0.7, 1.3, 2.0])
def test_repetition_penalty_equals_hf(penalty):
    logits, ids = random_logits(), history()
    theirs = processors.RepetitionPenaltyLogitsProcessor(penalty)(ids, logits.clone())
    torch.testing.assert_close(penalise_repeats(logits, seen_of(ids), penalty), theirs)


def test_the_whole_chain_equals_hf_in_its_order():
    """Repetition penalty, temperature, top-k, top-p, min-p: the order HF's generate applies them in."""
    options = dict(temperature=0.7, top_k=20, top_p=0.8, min_p=0.05, repetition_penalty=1.2)
    chain = processors.LogitsProcessorList(
        [
            processors.RepetitionPenaltyLogitsProcessor(options["repetition_penalty"]),
            processors.TemperatureLogitsWarper(options["temperature"]),
            processors.TopKLogitsWarper(options["top_k"]),
            processors.TopPLogitsWarper(options["top_p"]),
            processors.MinPLogitsWarper(options["min_p"]),
        ]
    )
    for seed in range(5):
        logits, ids = random_logits(seed), history(seed + 10)
        ours = Sampling(do_sample=True, **options).process(logits.double(), seen_of(ids))
        same_filter(ours, chain(ids, logits.clone()).float())


def test_greedy_takes_the_argmax_of_the_penalised_logits():
    logits, ids = random_logits(), history()
    picked = Sampling(repetition_penalty=1.5).next_tokens(logits, seen_of(ids))
    theirs = processors.RepetitionPenaltyLogitsProcessor(1.5)(ids, logits.clone()).argmax(-1)
    assert torch.equal(picked, theirs)


def test_a_filtered_token_is_never_drawn():
    """Drawn many times, top-k 3 only ever gives the three most likely tokens of each row."""
    logits = random_logits()
    sampling = Sampling(do_sample=True, top_k=3)
    allowed = logits.topk(3, dim=-1).indices
    g = torch.Generator().manual_seed(0)
    for _ in range(50):
        drawn = sampling.next_tokens(logits, generator=g)
        assert (allowed == drawn[:, None]).any(-1).all()
