"""generate() as users of HF expect it, over every causal mechanism and preset (picked by flags):
left-padded batched prompts decode row by row as each prompt alone (padding never attended, never
updating a state), or are refused with the reason; a row stops at its end token and stays stopped;
the stream of steps is what generate returns; a seeded generator repeats a sample.
"""

from __future__ import annotations

import pytest
import torch
from support.fast_cases import FAST_PRESETS, default_run_keeps

import zoo
from zoo.attention.base import ATTENTION
from zoo.presets.factory import get_preset

VOCAB = 24
CAUSAL = [n for n in zoo.list_attention() if ATTENTION.get(n).supports_causal]
LM_PRESETS = [n for n in zoo.list_models() if zoo.preset_config(n).kind == "lm"]
LENGTHS = (6, 2, 4)  # prompts of different lengths in one batch


def lm(name: str, **options):
    cls = ATTENTION.get(name)
    attention = {"name": name, **cls.contract_options(), **options}
    torch.manual_seed(0)
    return zoo.create_model(
        "vanilla_lm", vocab_size=VOCAB, d_model=32, n_heads=4, d_ff=48, n_layers=2, attention=attention, dropout=0.0
    ).eval()


def preset_lm(name: str):
    torch.manual_seed(0)
    return zoo.create_model(name, **get_preset(name).tiny).eval()


def left_padded(prompts: list[torch.Tensor], filler: int):
    """Right-aligned prompts [b, t0] whose pad positions hold random ids (seeded by ``filler``), and
    their pad_mask: what lies under the padding must never matter."""
    width = max(p.numel() for p in prompts)
    vocab = int(max(p.max() for p in prompts)) + 1
    batch = torch.randint(0, vocab, (len(prompts), width), generator=torch.Generator().manual_seed(filler))
    mask = torch.zeros(len(prompts), width, dtype=torch.bool)
    for i, p in enumerate(prompts):
        batch[i, width - p.numel() :] = p
        mask[i, width - p.numel() :] = True
    return batch, mask


def prompts_for(vocab: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return [torch.randint(0, vocab, (n,), generator=g) for n in LENGTHS]


def check_rows_decode_alone(model, new_tokens: int = 6):
    """The batched, left-padded steps equal each prompt's steps alone: logits row by row (so a leak of
    padding into any step shows) and the greedy tokens; other ids under the padding change nothing."""
    prompts = prompts_for(model.config.vocab_size)
    batch, mask = left_padded(prompts, filler=0)
    steps = list(model.stream(batch, new_tokens, pad_mask=mask, greedy=True))
    refilled, _ = left_padded(prompts, filler=1)
    again = list(model.stream(refilled, new_tokens, pad_mask=mask, greedy=True))
    for i, prompt in enumerate(prompts):
        alone = list(model.stream(prompt[None], new_tokens, greedy=True))
        assert len(alone) == len(steps) == new_tokens
        for step, other, single in zip(steps, again, alone):
            torch.testing.assert_close(step.logits[i], single.logits[0], atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(other.logits[i], single.logits[0], atol=1e-4, rtol=1e-4)
            assert int(step.tokens[i]) == int(single.tokens[0])


def check_refused(model, reason: str):
    prompts = prompts_for(model.config.vocab_size)
    batch, mask = left_padded(prompts, filler=0)
    with pytest.raises(ValueError, match="cannot decode left-padded prompts") as caught:
        model.generate(batch, 3, pad_mask=mask)
    assert reason in str(caught.value)


def check_left_padding(model, new_tokens: int = 6) -> str | None:
    """Rows decode as alone, or generate() refuses the padded batch with the model's reason (returned)."""
    reason = model.left_padding_refusal()
    if reason is not None:
        check_refused(model, reason)
    else:
        check_rows_decode_alone(model, new_tokens)
    return reason


@pytest.mark.parametrize("name", CAUSAL)
def test_left_padded_rows_decode_as_each_prompt_alone_or_are_refused(name):
    check_left_padding(lm(name))


@pytest.mark.parametrize(
    "name, options",
    [
        ("vanilla", {"max_cache": 8}),  # the window evicts padding first, so rows still equal alone
        ("vanilla", {"max_cache": 8, "sinks": 2}),  # refused: the sinks would be padding
        ("longformer", {"global_tokens": 0}),
        ("xl_rel", {"mem_len": 5}),
    ],
)
def test_options_that_change_what_left_padding_does(name, options):
    reason = check_left_padding(lm(name, **options), new_tokens=8)
    assert reason is None or "sinks" in reason


@pytest.mark.parametrize("name", LM_PRESETS)
def test_every_causal_preset_decodes_left_padding_as_alone_or_refuses(name):
    check_left_padding(preset_lm(name))


@pytest.mark.parametrize("name", default_run_keeps(LM_PRESETS, FAST_PRESETS))
def test_the_issue_call_runs_for_every_causal_preset(name):
    """The issue's call, sampled: each row stops at its end token (pad after it, never changing), and
    a padded batch is either decoded or refused with the reason."""
    model = preset_lm(name)
    prompts = prompts_for(model.config.vocab_size)
    batch, mask = left_padded(prompts, filler=0)
    options = dict(max_new_tokens=12, do_sample=True, top_p=0.9, eos_token_id=0, generator=torch.Generator())
    if model.left_padding_refusal() is not None:
        batch, mask = batch[:, -min(LENGTHS) :], None  # prompts of one length need no padding
    out = model.generate(batch, pad_mask=mask, **options)
    check_stops_at_end(out[:, batch.shape[1] :], ends=[0], pad=0)


def check_stops_at_end(new: torch.Tensor, ends: list[int], pad: int):
    for row in new.tolist():
        hits = [j for j, tok in enumerate(row) if tok in ends]
        if hits:
            assert all(tok == pad for tok in row[hits[0] + 1 :]), f"row kept generating past its end token: {row}"


def test_a_row_stops_at_its_end_token_and_the_others_go_on():
    """Row 0's first new token that row 1 never emits is made the end token (beside an id neither row
    emits): from then on row 0 emits the pad token, and row 1 generates exactly what it does without it."""
    model = lm("vanilla")
    prompt = torch.randint(0, VOCAB, (2, 5), generator=torch.Generator().manual_seed(1))
    free = model.generate(prompt, 8, greedy=True)
    row0, row1 = free[0, 5:].tolist(), free[1, 5:].tolist()
    stop = next(j for j, tok in enumerate(row0) if tok not in row1 and j < 6)
    unused = next(i for i in range(VOCAB) if i not in row0 + row1)
    pad = next(i for i in range(VOCAB) if i not in (row0[stop], unused))
    out = model.generate(prompt, 8, greedy=True, eos_token_id=[unused, row0[stop]], pad_token_id=pad)
    assert out.shape == (2, 13)
    assert torch.equal(out[0, : 5 + stop + 1], free[0, : 5 + stop + 1])
    assert out[0, 5 + stop + 1 :].tolist() == [pad] * (8 - stop - 1), "a finished row kept generating"
    assert torch.equal(out[1], free[1])


def test_generation_ends_once_every_row_has_stopped():
    """One row: its end token at the third new position ends the output there (HF's shorter output)."""
    model = lm("vanilla")
    prompt = torch.randint(0, VOCAB, (1, 5), generator=torch.Generator().manual_seed(1))
    free = model.generate(prompt, 8, greedy=True)
    new = free[0, 5:].tolist()
    out = model.generate(prompt, 8, greedy=True, eos_token_id=new[2])
    assert torch.equal(out, free[:, : 5 + new.index(new[2]) + 1])


def test_the_stream_and_the_callback_give_what_generate_returns():
    model = lm("vanilla")
    prompt = torch.randint(0, VOCAB, (2, 4), generator=torch.Generator().manual_seed(2))
    seen = []
    out = model.generate(
        prompt, 7, do_sample=True, top_k=5, generator=torch.Generator().manual_seed(9), streamer=seen.append
    )
    steps = list(model.stream(prompt, 7, do_sample=True, top_k=5, generator=torch.Generator().manual_seed(9)))
    assert torch.equal(torch.stack(seen, 1), out[:, 4:])
    assert torch.equal(torch.stack([s.tokens for s in steps], 1), out[:, 4:])


def test_a_seeded_generator_repeats_a_sample_and_another_seed_differs():
    model = lm("vanilla")
    prompt = torch.randint(0, VOCAB, (2, 4), generator=torch.Generator().manual_seed(2))
    options = dict(do_sample=True, temperature=1.5, top_p=0.95, min_p=0.01, repetition_penalty=1.3)
    a = model.generate(prompt, 12, generator=torch.Generator().manual_seed(0), **options)
    b = model.generate(prompt, 12, generator=torch.Generator().manual_seed(0), **options)
    c = model.generate(prompt, 12, generator=torch.Generator().manual_seed(1), **options)
    assert torch.equal(a, b) and not torch.equal(a, c)


@pytest.mark.parametrize(
    "kwargs, key",
    [
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"min_p": -0.1}, "min_p"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"do_sample": "yes"}, "do_sample"),
        ({"eos_token_id": VOCAB}, "eos_token_id"),
        ({"eos_token_id": []}, "eos_token_id"),
        ({"pad_token_id": -1, "eos_token_id": 1}, "pad_token_id"),
        ({"do_sample": False, "top_p": 0.5}, "do_sample"),
        ({"do_sample": True, "greedy": True}, "greedy"),
    ],
)
def test_bad_generation_options_are_refused_by_name(kwargs, key):
    model = lm("vanilla")
    with pytest.raises(ValueError, match=key):
        model.generate(torch.zeros(1, 3, dtype=torch.long), 2, **kwargs)


def test_a_pad_mask_that_is_not_left_padding_is_refused():
    model = lm("vanilla")
    tokens = torch.zeros(2, 4, dtype=torch.long)
    right = torch.tensor([[True, True, True, False], [True] * 4])
    with pytest.raises(ValueError, match="left padding"):
        model.generate(tokens, 2, pad_mask=right)
    empty = torch.tensor([[False] * 4, [True] * 4])
    with pytest.raises(ValueError, match="all padding"):
        model.generate(tokens, 2, pad_mask=empty)


def test_a_pad_mask_without_padding_is_no_padding_even_where_padding_is_refused():
    model = lm("local_1d")
    assert model.left_padding_refusal() is not None
    prompt = torch.randint(0, VOCAB, (2, 5), generator=torch.Generator().manual_seed(4))
    full = torch.ones(2, 5, dtype=torch.bool)
    assert torch.equal(model.generate(prompt, 4, pad_mask=full, greedy=True), model.generate(prompt, 4, greedy=True))
