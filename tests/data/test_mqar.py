"""The MQAR task (zoo/data/mqar.py): token for token Zoology's generator, and its options."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.parts.zoology_reference import zoology_module
from zoo.config import IGNORE_INDEX
from zoo.data import create_task
from zoo.data.mqar import mqar_batch


def zoology_mqar(seed: int, **options):
    """zoology.data.multiquery_ar.multiquery_ar for ``seed``: its NumPy stream is seeded inside, its
    random non-queries come from torch's global generator, seeded here with the same seed."""
    reference = zoology_module("data.multiquery_ar")
    torch.manual_seed(seed)
    segment = reference.multiquery_ar(seed=seed, **options)
    return segment.inputs, segment.labels


@pytest.mark.parametrize(
    "options",
    [
        dict(vocab_size=8192, num_examples=16, input_seq_len=64, num_kv_pairs=8),
        dict(vocab_size=256, num_examples=8, input_seq_len=128, num_kv_pairs=16, power_a=0.3),
        dict(vocab_size=300, num_examples=8, input_seq_len=64, num_kv_pairs=4, random_non_queries=False),
    ],
)
def test_tokens_equal_zoology_for_the_same_seed(options):
    inputs, labels = zoology_mqar(7, **options)
    ours = mqar_batch(
        options["num_examples"],
        options["input_seq_len"],
        seed=7,
        vocab_size=options["vocab_size"],
        num_kv_pairs=options["num_kv_pairs"],
        power_a=options.get("power_a", 0.01),
        random_non_queries=options.get("random_non_queries", True),
    )
    assert torch.equal(ours["tokens"], inputs)
    assert torch.equal(ours["targets"], labels)


def test_structure_keys_values_and_queries():
    """Keys from the lower half (each once in the context), values from the upper half, every key
    asked once after the context with its own value as the target; nothing else is scored."""
    vocab, pairs, t = 512, 8, 64
    out = mqar_batch(32, t, seed=3, vocab_size=vocab, num_kv_pairs=pairs, random_non_queries=False)
    tokens, targets = out["tokens"], out["targets"]
    keys, values = tokens[:, 0 : 2 * pairs : 2], tokens[:, 1 : 2 * pairs : 2]
    assert bool(((keys >= 1) & (keys < vocab // 2)).all()) and bool((values >= vocab // 2).all())
    assert all(len(set(row.tolist())) == pairs for row in keys)
    scored = targets != IGNORE_INDEX
    assert scored.sum(1).eq(pairs).all() and not scored[:, : 2 * pairs].any()
    for row in range(32):
        binding = dict(zip(keys[row].tolist(), values[row].tolist()))
        where = scored[row].nonzero().flatten()
        assert bool(((where - 2 * pairs) % 2 == 0).all())  # first token of a two-token slot
        assert sorted(tokens[row, where].tolist()) == sorted(binding)
        assert all(binding[k] == v for k, v in zip(tokens[row, where].tolist(), targets[row, where].tolist()))
    rest = ~scored.clone()
    rest[:, : 2 * pairs] = False
    assert bool((tokens[rest] == 0).all())  # non-queries hold 0 without random_non_queries


def test_gaps_follow_the_power_law():
    """Small power_a puts queries near the context; power_a = 1 spreads them uniformly."""

    def mean_gap(power_a):
        out = mqar_batch(400, 128, seed=0, vocab_size=256, num_kv_pairs=1, power_a=power_a)
        where = (out["targets"] != IGNORE_INDEX).nonzero()[:, 1]
        return float((where - 2).float().div(2).mean())

    assert mean_gap(0.01) < 15 < 25 < mean_gap(1.0)  # 1/g law over 63 slots: mean about 12; uniform: 31


def test_single_query_and_bad_options():
    out = mqar_batch(8, 64, seed=1, vocab_size=256, num_kv_pairs=8, num_queries=1)
    assert (out["targets"] != IGNORE_INDEX).sum(1).eq(1).all()
    with pytest.raises(ValueError, match="num_kv_pairs"):
        mqar_batch(2, 32, seed=0, vocab_size=256, num_kv_pairs=9)
    with pytest.raises(ValueError, match="vocab_size"):
        mqar_batch(2, 64, seed=0, vocab_size=64)


def test_task_splits_and_extrapolation():
    task = create_task("mqar", batch_size=4, seq_len=64, vocab_size=512, test_seq_len=128, test_num_kv_pairs=16)
    train, again, val = task.batch("train", 3), task.batch("train", 3), task.batch("val", 0)
    assert torch.equal(train["tokens"], again["tokens"]) and train["tokens"].shape == (4, 64)
    assert not torch.equal(train["tokens"], task.batch("train", 4)["tokens"])
    assert val["tokens"].shape == (4, 128) and (val["targets"] != IGNORE_INDEX).sum(1).eq(16).all()
    assert task.vocab_size == 512 and task.metric == "accuracy" and task.num_batches("train") is None
    assert np.isclose(task.num_batches("test"), 1024 // 4)
    with pytest.raises(ValueError, match="test_num_kv_pairs|num_kv_pairs"):
        create_task("mqar", batch_size=4, seq_len=64, vocab_size=512, test_num_kv_pairs=17)
