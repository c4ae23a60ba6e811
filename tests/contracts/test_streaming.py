"""Streaming at the model level: a model continues a sequence from its state exactly, or refuses.

Before issue 22, ``zoo.create_model("vanilla_lm", attention="local_1d")`` fed 96 tokens one at a time
with ``state=m.init_state(2)`` returned logits 1.3-2.2 away from ``m(x)`` for seven mechanisms, with no
error: ``init_state`` held no per-layer state and each call saw no earlier token. Here every
mechanism is checked by its flags (never by a list of names): a causal LM built on it either
streams exactly (token by token == segments == one call) with a state whose size stops growing
where its part says it is bounded, or refuses the state up front, saying why; ``generate`` takes the
cached path whenever the model can stream and gives what recomputing the prefix gives.
"""

from __future__ import annotations

import pytest
import torch
from support.fast_cases import FAST_MECHANISMS, default_run_keeps

import zoo
from zoo.attention.base import ATTENTION
from zoo.models.base import map_tensors
from zoo.presets.factory import get_preset

NAMES = zoo.list_attention()
MODELS = zoo.list_models()
STREAMING = [n for n in NAMES if ATTENTION.get(n).supports_memory]
VOCAB = 24


def lm(name: str, **options):
    cls = ATTENTION.get(name)
    attention = {"name": name, **cls.contract_options(), **options}
    return zoo.create_model(
        "vanilla_lm", vocab_size=VOCAB, d_model=32, n_heads=4, d_ff=48, n_layers=2, attention=attention, dropout=0.0
    ).eval()


def stream(model, tokens, pieces):
    state, logits, start = model.init_state(tokens.shape[0]), [], 0
    for n in pieces:
        out = model(tokens[:, start : start + n], state=state)
        state, start = out.state, start + n
        logits.append(out.logits)
    return torch.cat(logits, dim=1), state


def tokens_for(t, seed=0):
    return torch.randint(0, VOCAB, (2, t), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name", default_run_keeps(NAMES, FAST_MECHANISMS))
def test_a_causal_lm_streams_exactly_or_refuses_the_state(name):
    """The issue's reproduction, over every mechanism: 96 tokens one at a time (and in uneven segments)
    through the state equal one call, or init_state refuses with the reason (a mechanism without a causal
    form refuses the language model itself: test_attention checks that)."""
    if not ATTENTION.get(name).supports_causal:
        pytest.skip(f"{name} has no causal form: {ATTENTION.get(name).no_causal_reason}")
    model = lm(name)
    contract = ATTENTION.get(name).contract_state()
    total = min(96, (contract and contract.exact_for) or 96)  # a bounded memory is exact this far (XL, max_cache)
    tokens = tokens_for(total)
    reason = model.stream_refusal()
    if reason is not None:
        assert not ATTENTION.get(name).supports_memory, reason  # a stateful part streams under its contract
        with pytest.raises(ValueError, match="cannot continue a sequence"):
            model.init_state(2)
        return
    with torch.no_grad():
        whole = model(tokens).logits
        one_by_one, _ = stream(model, tokens, [1] * total)
        pieces = [7, 1, 19, 1, total - 28]
        segments, state = stream(model, tokens, pieces)
    torch.testing.assert_close(one_by_one, whole, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(segments, whole, atol=1e-4, rtol=1e-4)
    assert state.offset == total


def test_every_causal_mechanism_continues_a_stream():
    """The README's claim, "every causal mechanism continues a sequence from its state": before, sinkhorn and
    synthesizer refused a state (both can continue exactly: a causal sort of earlier blocks, a score row over
    earlier positions). Every mechanism with a causal form streams in a causal LM under its contract options."""
    refusing = {name: lm(name).stream_refusal() for name in NAMES if ATTENTION.get(name).supports_causal}
    assert not {name: reason for name, reason in refusing.items() if reason}, refusing


@pytest.mark.parametrize("name", default_run_keeps(STREAMING, FAST_MECHANISMS))
def test_a_bounded_mechanism_streams_in_constant_memory(name):
    """Where the layer says its state is bounded (state_bound), the model's state stops growing: the same
    bytes once the stream is past the bound (plus a margin) and 40 tokens later (was 100 and 300 tokens:
    5-10 s a mechanism, for the same check)."""
    model = lm(name)
    bound = model.stack.blocks[0].attention.state_bound()
    if model.stream_refusal() is not None or bound is None:
        pytest.skip(f"{name} keeps an unbounded state under its contract options (its receptive field is)")
    checks = (bound + 16, bound + 56)
    sizes = {}
    with torch.no_grad():
        state = model.init_state(2)
        for step in range(checks[1]):
            state = model(tokens_for(1, seed=step), state=state).state
            if step + 1 in checks:
                found = []
                map_tensors(state, lambda v, found=found: found.append(v) or v)
                sizes[step + 1] = sum(v.numel() * v.element_size() for v in found)
    assert sizes[checks[0]] == sizes[checks[1]], sizes


@pytest.mark.parametrize("name", MODELS)
def test_every_preset_streams_or_refuses_up_front(name):
    """A preset whose parts can continue a sequence does so exactly (segments == one call); one whose
    parts cannot refuses init_state and a continued state with the reason (the stack or the layer)."""
    preset = get_preset(name)
    model = zoo.create_model(name, **preset.tiny).eval()
    if model.config.kind != "lm":
        pytest.skip("streaming is a language model's (the encoder-decoder's decoder is checked in test_backbone)")
    t = min(preset.example_length, 24)
    tokens = torch.randint(0, model.config.vocab_size, (2, t), generator=torch.Generator().manual_seed(1))
    reason = model.stream_refusal()
    if reason is not None:
        with pytest.raises(ValueError, match="cannot continue a sequence"):
            model.init_state(2)
        return
    with torch.no_grad():
        whole = model(tokens).logits
        pieces, _ = stream(model, tokens, [t // 3, 1, t - t // 3 - 1])
    torch.testing.assert_close(pieces, whole, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name", default_run_keeps(STREAMING, FAST_MECHANISMS))
def test_generate_takes_the_cache_and_equals_recomputing_the_prefix(name):
    """Greedy generate() through the caches == greedy decoding that re-runs the whole prefix each step
    (the path a model that cannot stream takes), so the cache changes cost, never the tokens."""
    model = lm(name)
    if model.stream_refusal() is not None:
        pytest.skip(model.stream_refusal())
    torch.manual_seed(0)
    prompt = tokens_for(9, seed=5)
    calls = []
    hook = model.register_forward_hook(lambda module, args, output: calls.append(args[0].shape[1]))
    cached = model.generate(prompt, 20, greedy=True)
    hook.remove()
    assert calls == [9] + [1] * 19, "generate() fed the whole prefix instead of one token through the cache"
    recomputed = prompt
    with torch.no_grad():
        for _ in range(20):
            recomputed = torch.cat([recomputed, model(recomputed).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(cached, recomputed)


def test_sinks_are_the_first_positions_in_the_full_pass_and_in_the_stream():
    """local_1d with sinks: every query also sees the first k positions, in one call and through the cache
    (which keeps them), and a model trained without sinks takes them at inference (same weights)."""
    plain = lm("local_1d", block=4, memory=4)
    sinks = lm("local_1d", block=4, memory=4, sinks=3)
    sinks.load_state_dict(plain.state_dict())  # no weights of their own: added at inference
    tokens = tokens_for(60, seed=2)
    changed = tokens.clone()
    changed[:, 1] = (changed[:, 1] + 1) % VOCAB
    with torch.no_grad():
        # a position far past the window sees position 1 only through the sinks
        assert torch.allclose(plain(tokens).logits[:, -1], plain(changed).logits[:, -1])
        assert not torch.allclose(sinks(tokens).logits[:, -1], sinks(changed).logits[:, -1])
        whole = sinks(tokens).logits
        streamed, state = stream(sinks, tokens, [1] * 60)
    torch.testing.assert_close(streamed, whole, atol=1e-4, rtol=1e-4)
    attention = state.layers[0].attention
    assert attention.position[:3].tolist() == [0, 1, 2] and attention.length == 3 + 4 + 4 - 1


def test_a_bounded_vanilla_cache_keeps_its_sinks_and_rolls_the_window():
    """vanilla max_cache=W, sinks=k: after a long stream the cache holds the first k tokens' keys and the
    most recent W - k ones (StreamingLLM's eviction), so a token's logits equal one call over exactly
    those tokens' keys plus itself."""
    model = zoo.create_model(
        "vanilla_lm",
        vocab_size=VOCAB,
        d_model=32,
        n_heads=4,
        d_ff=48,
        n_layers=1,
        position="none",
        dropout=0.0,
        attention={"max_cache": 10, "sinks": 4},
    ).eval()
    tokens = tokens_for(40, seed=3)
    with torch.no_grad():
        streamed, state = stream(model, tokens, [1] * 40)
        kept = torch.cat([tokens[:, :4], tokens[:, 33:40]], dim=1)  # 4 sinks + 6 recent + the new token
        reference = model(kept).logits[:, -1]
    assert state.layers[0].attention.length == 10
    torch.testing.assert_close(streamed[:, -1], reference, atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="max_cache > sinks"):
        zoo.create_model("vanilla_lm", vocab_size=VOCAB, d_model=32, n_heads=4, attention={"sinks": 4})
