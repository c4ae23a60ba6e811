"""The contract every registered attention mechanism honours.

Parametrised over ``zoo.list_attention()``, so a new mechanism is tested the moment it registers;
tests skip by capability flag, never by name. Each check can fail: outputs are compared against
the same mechanism under a change that must not matter (future tokens, padded tokens, other batch
rows), and gradients are checked for reach and for leaks.
"""

from __future__ import annotations

import pytest
import torch

import zoo
from zoo.models import map_tensors
from zoo.registry import ATTENTION

D, H = 32, 4
NAMES = zoo.list_attention()


def modes(name):
    cls = ATTENTION.get(name)
    return [True] if cls.causal_only else [False, True]


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


@pytest.mark.parametrize("name,causal", [c for c in CASES if ATTENTION.get(c[0]).supports_padding], ids=[i for c, i in zip(CASES, IDS) if ATTENTION.get(c[0]).supports_padding])
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


@pytest.mark.parametrize("name,causal", [c for c in CASES if ATTENTION.get(c[0]).supports_memory], ids=[i for c, i in zip(CASES, IDS) if ATTENTION.get(c[0]).supports_memory])
def test_state_is_detached_and_threads(name, causal):
    attn = build(name, causal)
    state = attn.init_state(2)
    t = lengths(name)[0]
    for step in range(3):
        x = inputs(2, t, seed=step).requires_grad_(True)
        result = attn(x, state=state)
        state = result.state
        assert torch.isfinite(result.out).all()
        grads = []
        map_tensors(state, lambda v, found=grads: found.append(v.requires_grad) or v)
        assert not any(grads), "state must be detached"


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
