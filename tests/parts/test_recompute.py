"""Recompute-in-backward (zoo/attention/recompute.py) for adaptive span and the merged sparse head.

Checked: gradients through the recomputing function pass torch.autograd.gradcheck in float64 and
equal those of the plain computation (the previous implementation) exactly, with dropout too (the
same random mask is drawn again); the layers keep only O(t d) for backward: at most what fused
dense attention keeps (adaptive span) or 1.5x it (merged head), far below the plain computation.
"""

from __future__ import annotations

import functools

import pytest
import torch
from support.fast_cases import default_run_keeps

import zoo
from zoo.attention.adaptive_span import blocked_span_attention, span_reach
from zoo.attention.recompute import recompute_in_backward
from zoo.train.activation_meter import ActivationMeter


def span_case(dynamic, dtype=torch.float64, seed=0, b=2, h=3, t=13, m=5, k=4):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, t, k, generator=g, dtype=dtype, requires_grad=True)
    keys = torch.randn(b, h, m + t, k, generator=g, dtype=dtype, requires_grad=True)
    values = torch.randn(b, h, m + t, k, generator=g, dtype=dtype, requires_grad=True)
    if dynamic:  # spans off the integers: finite differences never straddle a kink of the soft mask
        spans = (torch.rand(b, h, t, generator=g, dtype=dtype) * 6).floor() + 0.4
    else:
        spans = torch.tensor([0.3, 2.6, 5.5], dtype=dtype)
    valid = torch.rand(b, m + t, generator=g) > 0.3
    return q, keys, values, spans.requires_grad_(True), valid


def span_fn(reach, block=4, dropout=0.0):
    def attend(q, k, v, spans, key_valid):
        return blocked_span_attention(
            q, k, v, spans=spans, ramp=3, reach=reach, key_valid=key_valid, block_size=block, dropout=dropout
        )

    return attend


@pytest.mark.parametrize("dynamic", default_run_keeps([False, True], ["False"]), ids=["learned", "dynamic"])
def test_recomputed_span_attention_passes_gradcheck(dynamic):
    # one row of 9 queries over 3 cached keys: blocks of 4 still end mid-block (gradcheck's cost is a forward
    # per input element: 2 rows of 13 took 10-30 s)
    q, k, v, spans, valid = span_case(dynamic, b=1, t=9, m=3)
    fn = span_fn(span_reach(float(spans.detach().max()), 3))
    assert torch.autograd.gradcheck(lambda *x: recompute_in_backward(fn, *x, valid), (q, k, v, spans))


@pytest.mark.parametrize("dynamic", [False, True], ids=["learned", "dynamic"])
@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_recomputed_gradients_equal_the_plain_computation(dynamic, dropout):
    q, k, v, spans, valid = span_case(dynamic, dtype=torch.float32, t=40, m=7, k=8)
    fn = span_fn(span_reach(float(spans.detach().max()), 3), block=6, dropout=dropout)
    weight = torch.randn(q.shape)
    results = []
    for run in (fn, functools.partial(recompute_in_backward, fn, stochastic=dropout > 0)):
        torch.manual_seed(5)
        out = run(q, k, v, spans, valid)
        torch.manual_seed(99)  # backward must not depend on the generator's state by then
        results.append((out, torch.autograd.grad((out * weight).sum(), (q, k, v, spans))))
    (plain, plain_grads), (recomputed, grads) = results
    assert torch.equal(plain, recomputed)
    for got, want in zip(grads, plain_grads):
        assert torch.equal(got, want)


def test_recompute_is_plain_without_a_gradient():
    q, k, v, spans, valid = span_case(False)
    with torch.no_grad():
        out = recompute_in_backward(span_fn(8), q, k, v, spans, valid)
    assert out.grad_fn is None


# -- saved activations of whole layers ----------------------------------------------------------------


def saved_bytes(attn, t, d=32):
    """Exact bytes autograd keeps for backward (each storage once, parameters excluded)."""
    with ActivationMeter(attn) as meter:
        attn(torch.randn(1, t, d, requires_grad=True))
    return meter.bytes


def layer(name, **options):
    return zoo.create_attention(name, d_model=32, n_heads=4, causal=True, **options).train()


@pytest.mark.parametrize(
    "options", [dict(mode="fixed"), dict(span_init=200.0), dict(mode="dynamic")], ids=["fixed", "learned", "dynamic"]
)
def test_adaptive_span_keeps_no_more_than_fused_dense(options):
    t = 2048
    dense = saved_bytes(layer("vanilla", dropout=0.0), t)
    span = saved_bytes(layer("adaptive_span", max_span=256, **options), t)
    assert span <= dense, f"adaptive_span keeps {span} bytes, fused dense attention {dense}"


@pytest.mark.parametrize(
    "name,options",
    [("sparse_strided", dict(stride=64)), ("sparse_fixed", dict(stride=64, c=8))],
    ids=["strided", "fixed"],
)
def test_merged_head_keeps_at_most_one_and_a_half_dense(name, options):
    t = 2048
    dense = saved_bytes(layer("vanilla", dropout=0.0), t)
    union = saved_bytes(layer(name, combine="union", **options), t)
    assert union <= 1.5 * dense, f"{name} union keeps {union} bytes, fused dense attention {dense}"


def test_merged_head_gradients_equal_the_plain_computation():
    attn = layer("sparse_fixed", stride=8, c=2, combine="union", dropout=0.2)
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 4, 37, 8, generator=g, requires_grad=True) for _ in range(3))
    pad = torch.ones(2, 37, dtype=torch.bool)
    pad[0, -5:] = False
    weight = torch.randn(2, 4, 37, 8, generator=g)
    torch.manual_seed(0)
    out = attn.attend(q, k, v, pad)
    grads = torch.autograd.grad((out * weight).sum(), (q, k, v))
    # the plain computation, as before recomputation: same padding, same seed for the dropout
    length = 40
    qp, kp, vp = (torch.nn.functional.pad(x, (0, 0, 0, length - 37)) for x in (q, k, v))
    valid = torch.nn.functional.pad(pad, (0, length - 37), value=False)
    torch.manual_seed(0)
    plain = attn.merged(qp, kp, vp, valid, 8)[:, :, :37]
    plain_grads = torch.autograd.grad((plain * weight).sum(), (q, k, v))
    assert torch.equal(out, plain)
    for got, want in zip(grads, plain_grads):
        assert torch.equal(got, want)
