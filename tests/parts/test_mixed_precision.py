"""bf16 autocast, part by part: the float32 islands each part keeps where bfloat16's 8 bits would
change what it computes (``# float32:`` comments in zoo/), and recomputation in backward under the
forward's precision. Each test below fails on the code before these islands (noted per test)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import zoo
from zoo.attention.adaptive_span import blocked_span_attention
from zoo.attention.recompute import recompute_in_backward
from zoo.models.base import map_tensors
from zoo.presets.factory import get_preset


def bf16():
    return torch.autocast("cpu", dtype=torch.bfloat16)


def tiny(name, **extra):
    return zoo.create_model(name, **{**get_preset(name).tiny, **extra})


def test_lsh_buckets_under_bf16_are_the_float32_buckets():
    """The sort follows the hash. Before: the rotations ran in bf16 and 30 of 8,192 buckets moved."""
    attn = zoo.create_attention("lsh", d_model=64, n_heads=4, causal=True, n_buckets=8, n_hashes=2)
    qk = torch.randn(2, 4, 512, 16).bfloat16()  # what to_qk gives under autocast
    real = torch.ones(2, 512, dtype=torch.bool)
    with bf16():
        buckets = attn.hash(qk, real, 8)
    assert torch.equal(buckets, attn.hash(qk.float(), real, 8))


def test_act_halts_after_the_same_steps_as_float32():
    """h = sigmoid(b) = 0.3297 each step: float32 halts at step 4 (3h = 0.989 < 0.99). Before, the
    halting unit ran in bf16, rounded h to 0.3301 and halted every position one step early."""
    bias = torch.logit(torch.tensor(0.3297)).item()
    model = tiny("universal_transformer_act", n_layers=8, stack={"halting_bias": bias, "epsilon": 0.01}).eval()
    tokens = torch.randint(0, 32, (2, 12))
    with torch.no_grad():
        fp32 = model(tokens).stats["act/steps"]
        with bf16():
            mixed = model(tokens).stats["act/steps"]
    assert bool((fp32 == 4).all()) and torch.equal(mixed, fp32)


def test_adaptive_span_window_holds_under_bf16():
    """Keys past the window (distance > S = 1000) get no weight. Before, distances were bf16: 1001
    rounded to 1000 and the key past the window took 1/1001 of the weight."""
    t, far = 1100, 50  # key 50 is 1001 positions before the last query
    q = torch.zeros(1, 1, t, 8, dtype=torch.bfloat16)
    v = torch.zeros(1, 1, t, 8, dtype=torch.bfloat16)
    v[:, :, far] = 1.0
    with bf16():
        out = blocked_span_attention(q, q, v, spans=torch.tensor([1000.0]), ramp=32, reach=1000)
    assert out[0, 0, far + 1001].abs().max() == 0  # outside the window: nothing
    assert out[0, 0, far + 1000].float().mean().item() == pytest.approx(1 / 1000, rel=0.02)  # at its edge: 1/S


def test_dynamic_spans_under_bf16_are_the_float32_spans():
    """z_t = S sigmoid(v . x_t + b). Before, the sigmoid ran in bf16 and z moved by up to S / 512."""
    attn = zoo.create_attention("adaptive_span", d_model=32, n_heads=4, causal=True, mode="dynamic", max_span=8192)
    x = torch.randn(2, 40, 32)
    with bf16():
        mixed = attn.spans(x)
    assert mixed.dtype == torch.float32 and torch.equal(mixed, attn.spans(x))


@pytest.mark.parametrize("preset", ["transformer_xl", "gtrxl", "adaptive_span_lm"])
def test_carried_memory_stays_float32_under_bf16(preset):
    """The memory holds layer inputs, float32 under autocast; a bf16 run's state continues in float32.
    (Pins behaviour that held before: the memory was never rounded.)"""
    model = tiny(preset)
    tokens = torch.randint(0, 32, (2, 16))
    with bf16():
        out = model(tokens, tokens, state=model.init_state(2))
        out = model(tokens, tokens, state=out.state)
    seen: set[torch.dtype] = set()
    map_tensors(out.state, lambda x: seen.add(x.dtype) or x)
    assert seen == {torch.float32}
    assert torch.isfinite(model(tokens, tokens, state=out.state).loss)  # the same state, fp32: accepted


def test_reversible_recomputes_under_the_forwards_precision():
    """Gradients of the recomputing stack equal the stored-activation run's under bf16. Before,
    backward recomputed in float32: rebuilt inputs were off and gradients differed by 16%."""

    def grads(recompute: bool) -> dict[str, torch.Tensor]:
        torch.manual_seed(0)
        model = tiny("reformer", stack={"recompute": recompute})
        tokens = torch.randint(0, 32, (2, 33), generator=torch.Generator().manual_seed(1))
        with bf16():
            loss = model(tokens[:, :-1], tokens[:, 1:]).loss
        loss.backward()
        return {n: p.grad for n, p in model.named_parameters() if p.grad is not None}

    recomputed, stored = grads(True), grads(False)
    worst = max(float((recomputed[n] - g).norm() / g.norm()) for n, g in stored.items())
    assert worst < 2e-2  # bf16 rounding order (2^-8 = 0.4%), not another function


def test_recompute_in_backward_replays_autocast():
    """Gradients through recompute_in_backward equal plain autograd's under bf16, bit for bit."""
    q, k, v = (torch.randn(2, 2, 16, 8, requires_grad=True) for _ in range(3))

    def attend(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    results = []
    for wrap in (attend, lambda *x: recompute_in_backward(attend, *x)):
        with bf16():
            out = wrap(q, k, v)
        results.append(torch.autograd.grad(out.float().square().sum(), (q, k, v)))
    for plain, recomputed in zip(*results):
        assert torch.equal(plain, recomputed)
