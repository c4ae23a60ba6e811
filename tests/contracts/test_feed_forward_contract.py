"""The contract every registered feed-forward part keeps (zoo/feed_forward/), and every part in every stack.

Per part, by its registration alone (under its ``contract_options`` and its defaults):

- shape and dtype kept (float32, float64); every parameter receives a gradient;
- ``parameter_count()`` equals the sum of its tensors' sizes; ``forward_flops(t)`` equals the matmul
  FLOPs torch's own counter (``FlopCounterMode``) counts in one call;
- chunked equals unchunked (outputs and input gradients; chunk sizes that do not divide the length,
  with padding, causal and bidirectional): the base's chunking and the part's ``halo`` agree;
- ``position_wise``: changing position j changes output j only; otherwise (a convolution) a causal part
  never lets j reach an earlier output, and padded positions never reach real ones.

Every part x every stack (sequential, reversible, universal): the model builds with it, or is refused
at build time with the reason (the reversible coupling needs a position-wise part); it trains a step
(finite loss, a gradient for every feed-forward parameter); under the reversible stack the recomputed
gradients equal plain autograd's, and a chunked model equals the unchunked one.
"""

from __future__ import annotations

import pytest
import torch
from support.fast_cases import FAST_PRESETS, default_run_keeps
from torch.utils.flop_counter import FlopCounterMode

import zoo
from tests.contracts.test_models import batch_for
from zoo.config import split_part
from zoo.feed_forward import FEED_FORWARD, create_feed_forward
from zoo.presets.factory import get_preset
from zoo.stacks.base import STACK

PARTS = FEED_FORWARD.list()
D, FF, T = 12, 20, 11
OPTION_SETS = ["defaults", "contract"]


def build(name: str, options: str = "contract", *, causal: bool = True, chunk_size: int = 0, dtype=torch.float32):
    torch.manual_seed(0)
    spec = {"name": name, **(FEED_FORWARD.get(name).contract_options() if options == "contract" else {})}
    part = create_feed_forward(spec, D, FF, causal=causal, chunk_size=chunk_size).to(dtype)
    with torch.no_grad():  # biases off zero, so a part that forgot one is caught
        for p in part.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return part


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", PARTS)
def test_shape_dtype_and_every_parameter_gets_a_gradient(name, dtype):
    part = build(name, dtype=dtype)
    x = torch.randn(2, T, D, dtype=dtype, requires_grad=True)
    y = part(x)
    assert y.shape == x.shape and y.dtype == dtype and torch.isfinite(y).all()
    y.square().sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0
    for param_name, p in part.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, param_name


@pytest.mark.parametrize("options", OPTION_SETS)
@pytest.mark.parametrize("name", PARTS)
def test_parameter_and_flop_counts_are_the_parts_own(name, options):
    part = build(name, options)
    assert part.parameter_count() == sum(p.numel() for p in part.parameters())
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        part(torch.randn(1, T, D))
    assert part.forward_flops(T) == counter.get_total_flops()
    assert part.activation_bytes_per_token() > 0 and part.flops_rule()


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("chunk_size", [1, 3, 4])
@pytest.mark.parametrize("name", PARTS)
def test_chunked_equals_unchunked(name, chunk_size, causal):
    whole = build(name, causal=causal).double()
    chunked = build(name, causal=causal, chunk_size=chunk_size).double()
    chunked.load_state_dict(whole.state_dict())
    x = torch.randn(2, T, D, dtype=torch.float64, requires_grad=True)
    pad_mask = torch.ones(2, T, dtype=torch.bool)
    pad_mask[1, -4:] = False
    for mask in (None, pad_mask):
        a, b = whole(x, pad_mask=mask), chunked(x, pad_mask=mask)
        torch.testing.assert_close(b, a, atol=1e-12, rtol=1e-12)
        (ga,) = torch.autograd.grad(a.square().sum(), x)
        (gb,) = torch.autograd.grad(b.square().sum(), x)
        torch.testing.assert_close(gb, ga, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("name", PARTS)
def test_what_each_output_reads(name, causal):
    part = build(name, causal=causal).double().eval()
    x = torch.randn(2, T, D, dtype=torch.float64)
    j = 5
    moved = x.clone()
    moved[:, j] += 1.0
    changed = (part(moved) - part(x)).abs().amax(dim=(0, 2)) > 0  # [T]: which outputs moved
    if FEED_FORWARD.get(name).position_wise:
        assert changed.tolist() == [i == j for i in range(T)]
    elif causal:
        assert not changed[:j].any() and changed[j]
    pad_mask = torch.ones(2, T, dtype=torch.bool)
    pad_mask[:, -3:] = False
    noisy = torch.where(pad_mask[..., None], x, torch.randn_like(x))
    torch.testing.assert_close(part(noisy, pad_mask=pad_mask)[pad_mask], part(x, pad_mask=pad_mask)[pad_mask])


# -- every part in every stack ---------------------------------------------------------------------


def stack_model(name: str, stack: str | dict, **overrides):
    config = {**get_preset("vanilla_lm").tiny, "residual": "pre_norm", "feed_forward": name, "stack": stack}
    stack_name, stack_options = split_part(stack)
    if STACK.get(stack_name).adds_position_signal(stack_options):
        config["position"] = "none"  # the universal stack adds its own
    return zoo.create_model("vanilla_lm", **{**config, **overrides})


@pytest.mark.parametrize("stack", STACK.list())
@pytest.mark.parametrize("name", PARTS)
def test_every_part_in_every_stack(name, stack):
    torch.manual_seed(0)
    try:
        model = stack_model(name, stack)
    except ValueError as error:  # the stack refuses the part at build time, with the reason
        assert not FEED_FORWARD.get(name).position_wise and "neighbouring positions" in str(error)
        return
    parts = [m for m in model.modules() if isinstance(m, FEED_FORWARD.get(name))]
    assert parts and all(type(m) is FEED_FORWARD.get(name) for m in parts)
    tokens = torch.randint(0, 32, (2, 9))
    loss = model(tokens[:, :-1], tokens[:, 1:]).loss
    assert torch.isfinite(loss)
    loss.backward()
    for part in parts:
        for param_name, p in part.named_parameters():
            assert p.grad is not None and p.grad.abs().sum() > 0, param_name


@pytest.mark.parametrize("stack", STACK.list())
@pytest.mark.parametrize("name", PARTS)
def test_a_chunked_model_equals_the_unchunked_one_in_every_stack(name, stack):
    try:
        whole = stack_model(name, stack).double().eval()
    except ValueError:
        pytest.skip(f"stack {stack!r} refuses feed_forward {name!r} (test_every_part_in_every_stack)")
    chunked = stack_model(name, stack, ff_chunk_size=3).double().eval()
    chunked.load_state_dict(whole.state_dict())
    tokens = torch.randint(0, 32, (2, 10))
    torch.testing.assert_close(chunked(tokens).logits, whole(tokens).logits, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("name", [n for n in PARTS if FEED_FORWARD.get(n).position_wise])
def test_reversible_recomputed_gradients_equal_stored_ones(name):
    torch.manual_seed(0)
    ours = stack_model(name, "reversible", ff_chunk_size=3, dropout=0.1).train()
    plain = stack_model(name, {"name": "reversible", "recompute": False}, ff_chunk_size=3, dropout=0.1).train()
    plain.load_state_dict(ours.state_dict())
    tokens = torch.randint(0, 32, (2, 12), generator=torch.Generator().manual_seed(1))
    for model in (ours, plain):
        torch.manual_seed(123)
        model(tokens[:, :-1], tokens[:, 1:]).loss.backward()
    for (param_name, p), q in zip(ours.named_parameters(), plain.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-4, msg=param_name)


@pytest.mark.parametrize("preset", default_run_keeps(zoo.list_models(), FAST_PRESETS))
def test_every_preset_takes_each_part_and_the_norms_or_refuses_with_the_reason(preset):
    """Each feed-forward part (with rmsnorm, so both new axes at once) in every preset: it builds and
    trains a step on the head's own batch, or is refused at build time naming the feed-forward."""
    tiny = get_preset(preset).tiny
    for name in PARTS:
        try:
            model = zoo.create_model(preset, **tiny, feed_forward=name, norm="rmsnorm")
        except ValueError as error:
            assert "feed_forward" in str(error), (preset, name, str(error))
            continue
        torch.manual_seed(0)
        out = model(**batch_for(model, preset, b=2))
        assert torch.isfinite(out.loss), (preset, name)
        out.loss.backward()
