"""The contract every registered attention mechanism honours.

Parametrised over ``zoo.list_attention()``, so a new mechanism is tested the moment it registers;
tests skip by capability flag, never by name. Each check can fail: outputs are compared against
the same mechanism under a change that must not matter (future tokens, padded tokens, other batch
rows), and gradients are checked for reach and for leaks. Every mechanism with ``supports_memory``
also honours the state contract it declares in ``contract_state()``: segments threaded through the
state equal one call, token by token equals the full pass, and the state is detached and bounded.
"""

from __future__ import annotations

import pytest
import torch

import zoo
from zoo.attention.base import ATTENTION
from zoo.models.base import map_tensors

D, H = 32, 4
NAMES = zoo.list_attention()


def modes(name):
    """The causalities a mechanism is built with, by its flags: causal-only, bidirectional-only, or both."""
    cls = ATTENTION.get(name)
    return [True] if cls.causal_only else [False, True] if cls.supports_causal else [False]


CASES = [(n, c) for n in NAMES for c in modes(n)]
IDS = [f"{n}-{'causal' if c else 'bidir'}" for n, c in CASES]


def build(name, causal, **extra):
    cls = ATTENTION.get(name)
    attn = zoo.create_attention(name, d_model=D, n_heads=H, causal=causal, **{**cls.contract_options(), **extra})
    return attn.eval()


def lengths(name):
    return ATTENTION.get(name).contract_lengths()


def inputs(b, t, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, t, D, generator=g)


def test_registry_is_populated():
    assert {"vanilla", "additive"} <= set(NAMES)


@pytest.mark.parametrize("name,causal", CASES, ids=IDS)
def test_shape_dtype_finite_and_aux(name, causal):
    attn = build(name, causal)
    for t in lengths(name):
        result = attn(inputs(2, t))
        assert isinstance(result, zoo.AttnOutput)
        assert result.out.shape == (2, t, D) and result.out.dtype == torch.float32
        assert torch.isfinite(result.out).all()
        for key, value in result.aux.items():
            assert value.dim() == 0 and torch.isfinite(value), f"aux {key} must be a finite scalar"


@pytest.mark.parametrize("name,causal", CASES, ids=IDS)
def test_batch_rows_are_independent(name, causal):
    attn = build(name, causal)
    t = lengths(name)[-1]
    x = inputs(3, t)
    together = attn(x).out
    alone = torch.cat([attn(x[i : i + 1]).out for i in range(3)])
    torch.testing.assert_close(together, alone, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("name", [n for n in NAMES if not ATTENTION.get(n).supports_causal])
def test_a_mechanism_without_a_causal_form_refuses_causal_with_the_reason(name):
    cls = ATTENTION.get(name)
    with pytest.raises(ValueError, match="no causal form") as info:
        zoo.create_attention(name, d_model=D, n_heads=H, causal=True, **cls.contract_options())
    assert cls.no_causal_reason and cls.no_causal_reason in str(info.value)
    with pytest.raises(ValueError, match="no causal form"):
        zoo.create_model("vanilla_lm", vocab_size=16, d_model=D, n_heads=H, n_layers=1, attention=name)


@pytest.mark.parametrize("name", [n for n, c in CASES if c])
def test_causal_no_gradient_from_the_future(name):
    """d out[:, i] / d x[:, j] == 0 for every j > i (holds for content-routed mechanisms too)."""
    attn = build(name, True)
    for t in lengths(name):
        x = inputs(2, t).requires_grad_(True)
        out = attn(x).out
        for i in sorted({0, t // 2, t - 2}):
            (grad,) = torch.autograd.grad(out[:, i].sum(), x, retain_graph=True)
            assert grad[:, i + 1 :].abs().max() == 0, f"position {i} receives gradient from the future"


@pytest.mark.parametrize("name", [n for n, c in CASES if c and not ATTENTION.get(n).content_routed])
def test_causal_by_perturbation(name):
    """Changing token j never changes outputs before j."""
    attn = build(name, True)
    for t in lengths(name):
        x = inputs(2, t)
        base = attn(x).out
        for j in sorted({1, t // 2, t - 1}):
            changed = x.clone()
            changed[:, j:] += torch.randn_like(changed[:, j:])
            out = attn(changed).out
            torch.testing.assert_close(out[:, :j], base[:, :j], atol=1e-5, rtol=1e-4)
            assert not torch.allclose(out[:, j:], base[:, j:]), "the change must reach the changed positions"


def pad_masks(b, t):
    mask = torch.ones(b, t, dtype=torch.bool)
    mask[0, -max(1, t // 3) :] = False  # right padding
    mask[1, : max(1, t // 4)] = False  # left padding
    return mask


@pytest.mark.parametrize("name,causal", CASES, ids=IDS)
def test_padding_invariance(name, causal):
    """Real positions never see padded ones: by gradient always, by perturbation where routing is static."""
    attn = build(name, causal)
    for t in lengths(name):
        mask = pad_masks(2, t)
        x = inputs(2, t).requires_grad_(True)
        out = attn(x, pad_mask=mask).out
        (grad,) = torch.autograd.grad((out * mask[..., None]).sum(), x)
        assert grad[~mask].abs().max() == 0, "real outputs depend on padded inputs"
        assert torch.isfinite(out).all()
        if not ATTENTION.get(name).content_routed:
            changed = x.detach().clone()
            changed[~mask] = torch.randn_like(changed[~mask]) * 5
            out2 = attn(changed, pad_mask=mask).out
            torch.testing.assert_close(out2[mask], out.detach()[mask], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("name,causal", CASES, ids=IDS)
def test_every_parameter_gets_a_gradient(name, causal):
    attn = build(name, causal).train()
    t = lengths(name)[-1]
    result = attn(inputs(2, t))
    loss = (result.out**2).mean() + sum(result.aux.values(), torch.zeros(()))
    loss.backward()
    for pname, p in attn.named_parameters():
        assert p.grad is not None, f"{pname} received no gradient"
        assert torch.isfinite(p.grad).all(), f"{pname} has a non-finite gradient"
        assert p.grad.abs().sum() > 0, f"{pname} received an all-zero gradient"


# -- state: every mechanism with supports_memory, in causal use ---------------------------------

STATEFUL = [n for n in NAMES if ATTENTION.get(n).supports_memory]
STREAM = 60  # a stream length past every contract window, for mechanisms exact at any length


def state_contract(name):
    contract = ATTENTION.get(name).contract_state()
    assert contract is not None, f"{name} sets supports_memory: declare contract_state() (see zoo/attention/base.py)"
    return contract


def exact_for(name):
    return state_contract(name).exact_for or STREAM


@pytest.mark.parametrize("name", STATEFUL)
def test_a_stateful_mechanism_streams_under_its_contract_options_and_says_its_bound(name):
    """The state contract below must run, not skip: in causal use under contract_options() the layer can
    continue a sequence, and the bound it answers (state_bound) is the one its contract promises."""
    attn = build(name, True)
    assert attn.stream_refusal() is None, attn.stream_refusal()
    assert attn.state_bound() == state_contract(name).bound


@pytest.mark.parametrize("name", NAMES)
def test_a_layer_that_cannot_continue_a_stream_refuses_a_state_with_the_reason(name):
    """Never compute without the earlier context: a mechanism with no state, or a bidirectional layer
    whose state is a decoding cache, refuses init_state and a state passed to forward, saying why."""
    cls = ATTENTION.get(name)
    cases = [] if cls.causal_only else [build(name, False)]
    if not cls.supports_memory and cls.supports_causal:
        cases.append(build(name, True))
    for attn in cases:
        if attn.carries_segment_memory():
            continue  # segment memory (XL) is a model of its own in a bidirectional layer
        reason = attn.stream_refusal()
        assert reason, f"{name} (causal={attn.causal}) would continue a stream it cannot"
        with pytest.raises(ValueError, match="bidirectional|keeps no state"):
            attn(inputs(2, 5), state=attn.init_state(2) if cls.supports_memory else object())


def segment_lengths(name, total):
    """Segments covering a stream of ``total`` tokens: the contract lengths with single tokens between."""
    pattern = [n for length in lengths(name) for n in (length, 1)]
    pieces, i = [], 0
    while sum(pieces) < total:
        pieces.append(min(pattern[i % len(pattern)], total - sum(pieces)))
        i += 1
    return pieces


def run_stream(attn, x, pieces, pad_mask=None):
    """Feed x in segments of the given lengths, threading the state -> (outputs [b, t, d], state)."""
    state, outs, start = attn.init_state(x.shape[0]), [], 0
    for n in pieces:
        part = slice(start, start + n)
        result = attn(x[:, part], pad_mask=None if pad_mask is None else pad_mask[:, part], state=state)
        state, start = result.state, start + n
        outs.append(result.out)
    return torch.cat(outs, 1), state


@pytest.mark.parametrize("padded", [False, True], ids=["dense", "padded"])
@pytest.mark.parametrize("name", STATEFUL)
def test_state_segments_equal_one_call(name, padded):
    """Threading the state through segments == one call over the stream (a mechanism that ignores
    its state, or forgets too early, fails: one call sees every earlier token)."""
    attn = build(name, True)
    total = exact_for(name)
    x = inputs(2, total)
    mask = pad_masks(2, total) if padded else torch.ones(2, total, dtype=torch.bool)
    whole = attn(x, pad_mask=mask if padded else None).out
    for grad in (True, False):  # some mechanisms reuse cached projections when no graph is built
        with torch.set_grad_enabled(grad):
            out, _ = run_stream(attn, x, segment_lengths(name, total), mask if padded else None)
        torch.testing.assert_close(out[mask], whole[mask], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("name", STATEFUL)
def test_state_token_by_token_equals_full_pass(name):
    attn = build(name, True)
    total = exact_for(name)
    x = inputs(2, total, seed=3)
    whole = attn(x).out
    for grad in (True, False):
        with torch.set_grad_enabled(grad):
            out, _ = run_stream(attn, x, [1] * total)
        torch.testing.assert_close(out, whole, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("name", STATEFUL)
def test_state_is_detached_and_bounded(name):
    """state.length == min(tokens seen, bound) (<= where the contract says the window is block-aligned),
    its tensors stop growing at the bound, and no gradient crosses into the state. An unbounded state
    (dense attention, strided columns) never holds more than the tokens seen."""
    attn = build(name, True)
    contract = state_contract(name)
    bound = contract.bound
    step = lengths(name)[0]
    for grad in (True, False):
        with torch.set_grad_enabled(grad):
            state, seen, sizes = attn.init_state(2), 0, {}
            while seen < (bound or STREAM) + 3 * step:
                x = inputs(2, step, seed=seen).requires_grad_(grad)
                result = attn(x, state=state)
                state, seen = result.state, seen + step
                assert torch.isfinite(result.out).all()
                most = seen if bound is None else min(seen, bound)
                if contract.exact_length and bound is not None:
                    assert state.length == most, f"after {seen} tokens the state holds {state.length}"
                else:
                    assert state.length <= most, f"after {seen} tokens the state holds {state.length} > {most}"
                found = []
                map_tensors(state, lambda v, found=found: found.append(v) or v)
                assert not any(v.requires_grad for v in found), "state must be detached"
                sizes[seen] = sum(v.numel() for v in found)
        if bound is not None:
            full = {size for tokens, size in sizes.items() if tokens >= bound}
            assert len(full) == 1, f"state tensors keep growing past the bound: {sizes}"


@pytest.mark.parametrize("name", [n for n in NAMES if ATTENTION.get(n).supports_cross])
def test_cross_attention_shapes_and_context_padding(name):
    attn = build(name, False)
    x, context = inputs(2, 5), inputs(2, 9, seed=1)
    mask = pad_masks(2, 9)
    out = attn(x, context=context, pad_mask=mask).out
    assert out.shape == (2, 5, D)
    changed = context.clone()
    changed[~mask] += 3.0
    torch.testing.assert_close(attn(x, context=changed, pad_mask=mask).out, out, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("name", [n for n in NAMES if not ATTENTION.get(n).supports_cross])
def test_cross_attention_refused_when_unsupported(name):
    attn = build(name, modes(name)[0])
    t = lengths(name)[0]
    with pytest.raises(ValueError, match="cross"):
        attn(inputs(2, t), context=inputs(2, t))


@pytest.mark.parametrize("name", NAMES)
def test_bad_inputs_are_refused_clearly(name):
    attn = build(name, modes(name)[0])
    t = lengths(name)[0]
    with pytest.raises(ValueError, match="d_model"):
        attn(torch.randn(2, t, D + 1))
    with pytest.raises(ValueError, match=r"\[b, t, d\]"):
        attn(torch.randn(t, D))
    with pytest.raises(ValueError, match="divisible"):
        zoo.create_attention(name, d_model=30, n_heads=4, causal=modes(name)[0])
    with pytest.raises(KeyError, match="valid"):
        zoo.create_attention(name, d_model=D, n_heads=H, causal=modes(name)[0], no_such_option=1)
