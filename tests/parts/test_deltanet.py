"""DeltaNet (zoo/attention/deltanet.py, the kernels of zoo/attention/delta_chunks.py).

- the chunkwise form (the UT transform, chunk sizes that do and do not divide the length, from a state)
  == the recurrent form == the delta rule of Schlag et al. 2021 (arXiv:2102.11174) written out
  below in its own orientation (W [e, k], W_t = W_{t-1} + beta_t (v_t - W_{t-1} k_t) k_t^T), float64, 1e-10;
- == flash-linear-attention's ``delta_rule_chunkwise`` (float64: its ``torch.float32`` mapped to float64,
  lengths a multiple of its chunk, no initial state: its signature) to 1e-10, and its
  ``delta_rule_recurrence`` to 1e-5 (it casts to float32 with ``.float()``, which the loader cannot map);
- the whole layer == the paper's layer written out here (projections, SiLU short convolutions by
  ``F.conv1d``, L2 norm, the recurrence above, per-head RMSNorm, the output gate) in float64, 1e-10.
  flash-linear-attention's layer needs Triton (a GPU), HF has no DeltaNet: no other whole-layer reference
  runs on this CPU.

Differences found in the references: both fla functions scale q by k^-1/2 themselves (ours: the layer does);
``delta_rule_chunkwise`` asserts the length is a multiple of the chunk (ours pads the last chunk).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import zoo
from tests.parts.references import fla_naive
from zoo.attention.delta_chunks import chunk_delta_rule, l2_normalise, recurrent_delta_rule

B, H, DK, DV = 2, 3, 5, 7


def inputs(t, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, t, DK, generator=g, dtype=dtype)
    k = l2_normalise(torch.randn(B, H, t, DK, generator=g, dtype=dtype))
    v = torch.randn(B, H, t, DV, generator=g, dtype=dtype)
    beta = torch.rand(B, H, t, generator=g, dtype=dtype)
    state = torch.randn(B, H, DK, DV, generator=g, dtype=dtype)
    return q, k, v, beta, state


def schlag_delta_rule(q, k, v, beta, state):
    """The paper's fast weight W [e, k] per head, one token at a time: retrieve v_bar = W k, write
    beta (v - v_bar) k^T, read W q."""
    w = state.transpose(-1, -2).clone()  # ours is S = W^T [k, e]
    out = torch.empty(*q.shape[:-1], v.shape[-1], dtype=q.dtype)
    for b in range(q.shape[0]):
        for h in range(q.shape[1]):
            for i in range(q.shape[2]):
                kk, vv = k[b, h, i], v[b, h, i]
                w[b, h] = w[b, h] + beta[b, h, i] * torch.outer(vv - w[b, h] @ kk, kk)
                out[b, h, i] = w[b, h] @ q[b, h, i]
    return out, w.transpose(-1, -2)


@pytest.mark.parametrize("t,chunk", [(19, 4), (16, 16), (33, 8), (5, 64)])
def test_chunk_form_equals_recurrent_form_equals_the_paper_recurrence(t, chunk):
    q, k, v, beta, state = inputs(t)
    want, want_state = schlag_delta_rule(q, k, v, beta, state)
    for got, got_state in (
        chunk_delta_rule(q, k, v, beta, None, state, chunk),
        recurrent_delta_rule(q, k, v, beta, None, state),
    ):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-10)
        torch.testing.assert_close(got_state, want_state, rtol=0, atol=1e-10)


def test_equals_flash_linear_attention_naive_delta_rule():
    fla = fla_naive("delta_rule", float64=True)
    q, k, v, beta, _ = inputs(32, seed=1)
    ours, ours_state = chunk_delta_rule(q * DK**-0.5, k, v, beta, None, None, 8)
    theirs, theirs_state = fla.delta_rule_chunkwise(q, k, v, beta, chunk_size=8)
    assert theirs.dtype == torch.float64
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-10)
    torch.testing.assert_close(ours_state, theirs_state, rtol=0, atol=1e-10)
    q, k, v, beta, state = (x.float() for x in inputs(19, seed=2))
    ours, ours_state = chunk_delta_rule(q * DK**-0.5, k, v, beta, None, state, 4)
    theirs, theirs_state = fla.delta_rule_recurrence(q, k, v, beta, initial_state=state)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)
    torch.testing.assert_close(ours_state, theirs_state, rtol=0, atol=1e-5)


def written_out_layer(layer, x, decay=None):
    """DeltaNet's layer (Yang et al. 2024, arXiv:2406.06484) written out from its weights:
    q, k, v = silu(causal depthwise conv(W x)), q and k L2-normalised, beta = sigmoid(W_b x), the delta rule
    (with ``decay`` [b, h, t], the log of Gated DeltaNet's alpha, when given), RMSNorm per head, the gate."""
    h, dk, dv = layer.n_heads, layer.key_dim, layer.value_dim
    proj = torch.cat([layer.q_proj(x), layer.k_proj(x), layer.v_proj(x)], -1).transpose(1, 2)
    kernel = layer.conv.conv.weight
    mixed = F.silu(F.conv1d(proj, kernel, padding=kernel.shape[-1] - 1, groups=proj.shape[1]))[..., : x.shape[1]]
    q, k, v = mixed.transpose(1, 2).split([h * dk, h * dk, h * dv], -1)
    q, k, v = (y.unflatten(-1, (h, -1)).transpose(1, 2) for y in (q, k, v))
    q, k = (y / torch.sqrt((y * y).sum(-1, keepdim=True) + 1e-6) for y in (q, k))
    beta = torch.sigmoid(layer.b_proj(x)).transpose(1, 2)
    s = torch.zeros(x.shape[0], h, dk, dv, dtype=x.dtype)
    outs = []
    for i in range(x.shape[1]):
        if decay is not None:
            s = s * decay[:, :, i, None, None].exp()
        kk = k[:, :, i]
        s = s + beta[:, :, i, None, None] * kk[..., :, None] * (v[:, :, i] - (s * kk[..., None]).sum(-2))[..., None, :]
        outs.append((s * q[:, :, i, :, None]).sum(-2) * dk**-0.5)
    o = torch.stack(outs, 1)  # [b, t, h, e]
    o = o / torch.sqrt(o.pow(2).mean(-1, keepdim=True) + layer.options.norm_eps) * layer.o_norm
    if layer.g_proj is not None:
        o = o * F.silu(layer.g_proj(x).unflatten(-1, (h, dv)))
    return layer.o_proj(o.flatten(2))


@pytest.mark.parametrize("options", [{}, {"use_gate": True, "expand_v": 2.0, "head_dim": 4}], ids=["paper", "gated"])
def test_the_layer_equals_the_paper_layer_written_out(options):
    torch.manual_seed(0)
    layer = zoo.create_attention("deltanet", d_model=16, n_heads=2, causal=True, chunk_size=4, **options).double()
    with torch.no_grad():
        layer.o_norm.uniform_(0.5, 1.5)
    x = torch.randn(2, 11, 16, dtype=torch.float64)
    torch.testing.assert_close(layer(x).out, written_out_layer(layer, x), rtol=0, atol=1e-10)


@pytest.mark.parametrize("name", ["deltanet", "gated_deltanet", "mamba2"])
def test_padded_positions_neither_read_nor_update_the_state(name):
    """The state after [real ; padding] equals the state after the real tokens alone (right padding), and a
    stream's state after [padding ; real] equals a fresh stream over the real tokens (left padding): the
    convolution tail holds the padding as the zeros before a stream, the matrix is neither written nor
    decayed there."""
    torch.manual_seed(0)
    layer = zoo.create_attention(name, d_model=16, n_heads=2, causal=True, chunk_size=4, conv_size=3).double()
    x = torch.randn(2, 13, 16, dtype=torch.float64)
    right = torch.ones(2, 13, dtype=torch.bool)
    right[:, 9:] = False
    padded = layer(x, pad_mask=right, state=layer.init_state(2)).state
    real = layer(x[:, :9], state=layer.init_state(2)).state
    torch.testing.assert_close(padded.memory, real.memory, rtol=0, atol=1e-12)
    left = right.flip(1)  # the first 4 positions padded
    padded = layer(x, pad_mask=left, state=layer.init_state(2))
    fresh = layer(x[:, 4:], state=layer.init_state(2))
    torch.testing.assert_close(padded.out[:, 4:], fresh.out, rtol=0, atol=1e-12)
    torch.testing.assert_close(padded.state.memory, fresh.state.memory, rtol=0, atol=1e-12)
