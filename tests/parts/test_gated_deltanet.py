"""Gated DeltaNet (zoo/attention/gated_deltanet.py, the kernels of zoo/attention/delta_chunks.py).

- the chunkwise form == the recurrent form == the gated delta rule of Yang et al. 2024 (arXiv:2412.06464,
  S_t = S_{t-1} (alpha_t (I - beta_t k_t k_t^T)) + beta_t v_t k_t^T, S [e, k]) written out, float64, 1e-10,
  at chunk sizes that do and do not divide the length, from a state;
- == flash-linear-attention's ``naive_recurrent_gated_delta_rule`` (float64: its ``torch.float32`` mapped to
  float64), 1e-10, and ``naive_chunk_gated_delta_rule`` the same way to 1e-6: it forms its decay mask with
  ``.float()``, float32 inside a float64 run (2.9e-8 apart here);
- == Qwen3-Next's ``torch_chunk_gated_delta_rule`` / ``torch_recurrent_gated_delta_rule`` (HF transformers),
  which cast to float32 inside: float32, 1e-5;
- the whole layer == HF's ``Qwen3NextGatedDeltaNet`` (its pure-torch path on the CPU) with the weights copied,
  float32, 1e-5, and == the paper's layer written out in float64, 1e-10.

Differences found in the references: Qwen3-Next fuses q, k, v, z (the output gate) into ``in_proj_qkvz``
and b, a into ``in_proj_ba``, laid out by key-head group ([q_h | k_h | v_h | z_h] per head here, one value
head per key head), and runs one depthwise convolution over [q | k | v] (ours too); its RMSNorm eps is 1e-6
(flash-linear-attention's 1e-5 is our default ``norm_eps``) and it casts the recurrence to float32. fla's
chunk function takes g before beta, its recurrent one beta before g; both take [b, t, h, k] and scale q
themselves; Qwen3-Next L2-normalises q and k inside (``use_qk_l2norm_in_kernel``), ours before the call.
"""

from __future__ import annotations

import pytest
import torch
from einops import rearrange

import zoo
from tests.parts.references import fla_naive
from tests.parts.test_deltanet import B, H, written_out_layer
from tests.parts.test_deltanet import inputs as delta_inputs
from zoo.attention.delta_chunks import chunk_delta_rule, l2_normalise, recurrent_delta_rule

DK = 5


def inputs(t, seed=0, dtype=torch.float64):
    """DeltaNet's test inputs and a log-decay g in (-2, 0]: q, k, v, beta, g, state."""
    q, k, v, beta, state = delta_inputs(t, seed, dtype)
    decay = -torch.rand(B, H, t, generator=torch.Generator().manual_seed(seed + 100), dtype=dtype) * 2
    return q, k, v, beta, decay, state


def gated_delta_rule_as_written(q, k, v, beta, decay, state):
    """The paper's gated delta rule per head, its [e, k] state: S_t = S_{t-1} alpha_t (I - beta_t k k^T) + beta_t v k^T,
    o_t = S_t q_t."""
    s = state.transpose(-1, -2).clone()
    eye = torch.eye(q.shape[-1], dtype=q.dtype)
    out = torch.empty(*q.shape[:-1], v.shape[-1], dtype=q.dtype)
    for b in range(q.shape[0]):
        for h in range(q.shape[1]):
            for i in range(q.shape[2]):
                kk, alpha, bt = k[b, h, i], decay[b, h, i].exp(), beta[b, h, i]
                s[b, h] = s[b, h] @ (alpha * (eye - bt * torch.outer(kk, kk))) + bt * torch.outer(v[b, h, i], kk)
                out[b, h, i] = s[b, h] @ q[b, h, i]
    return out, s.transpose(-1, -2)


@pytest.mark.parametrize("t,chunk", [(19, 4), (16, 16), (33, 8), (5, 64)])
def test_chunk_form_equals_recurrent_form_equals_the_gated_delta_rule(t, chunk):
    q, k, v, beta, decay, state = inputs(t)
    want, want_state = gated_delta_rule_as_written(q, k, v, beta, decay, state)
    for got, got_state in (
        chunk_delta_rule(q, k, v, beta, decay, state, chunk),
        recurrent_delta_rule(q, k, v, beta, decay, state),
    ):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-10)
        torch.testing.assert_close(got_state, want_state, rtol=0, atol=1e-10)


def time_major(*xs):
    return [rearrange(x, "b h t ... -> b t h ...") for x in xs]


def test_equals_flash_linear_attention_naive_gated_delta_rule():
    fla = fla_naive("gated_delta_rule", float64=True)
    q, k, v, beta, decay, state = inputs(19, seed=1)
    ours, ours_state = chunk_delta_rule(q * DK**-0.5, k, v, beta, decay, state, 4)
    tq, tk, tv, tbeta, tdecay = time_major(q, k, v, beta, decay)
    recurrent = fla.naive_recurrent_gated_delta_rule(
        tq, tk, tv, tbeta, tdecay, initial_state=state, output_final_state=True
    )
    chunked = fla.naive_chunk_gated_delta_rule(
        tq, tk, tv, tdecay, tbeta, chunk_size=8, initial_state=state, output_final_state=True
    )
    for (theirs, theirs_state), tolerance in ((recurrent, 1e-10), (chunked, 1e-6)):
        assert theirs.dtype == torch.float64
        torch.testing.assert_close(ours, rearrange(theirs, "b t h e -> b h t e"), rtol=0, atol=tolerance)
        torch.testing.assert_close(ours_state, theirs_state, rtol=0, atol=tolerance)


def test_equals_qwen3_next_torch_gated_delta_rule():
    qwen = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")
    q, k, v, beta, decay, state = (x.float() for x in inputs(19, seed=2))
    raw_q, raw_k = q, torch.randn_like(k)  # Qwen3-Next normalises q and k itself
    ours, ours_state = chunk_delta_rule(l2_normalise(raw_q) * DK**-0.5, l2_normalise(raw_k), v, beta, decay, state, 4)
    args = time_major(raw_q, raw_k, v)
    g, b = time_major(decay, beta)
    for fn, extra in (
        (qwen.torch_chunk_gated_delta_rule, {"chunk_size": 8}),
        (qwen.torch_recurrent_gated_delta_rule, {}),
    ):
        theirs, theirs_state = fn(
            *args, g=g, beta=b, initial_state=state, output_final_state=True, use_qk_l2norm_in_kernel=True, **extra
        )
        torch.testing.assert_close(ours, rearrange(theirs, "b t h e -> b h t e"), rtol=0, atol=1e-5)
        torch.testing.assert_close(ours_state, theirs_state, rtol=0, atol=1e-5)


def qwen3_next_layer(ours):
    """HF's Qwen3NextGatedDeltaNet with our layer's weights (one value head per key head)."""
    qwen = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")
    from transformers import Qwen3NextConfig

    h, dk, dv = ours.n_heads, ours.key_dim, ours.value_dim
    config = Qwen3NextConfig(
        hidden_size=ours.d_model,
        linear_num_key_heads=h,
        linear_num_value_heads=h,
        linear_key_head_dim=dk,
        linear_value_head_dim=dv,
        linear_conv_kernel_dim=ours.conv.size,
        rms_norm_eps=ours.options.norm_eps,
        hidden_act="silu",
        num_hidden_layers=1,
        layer_types=["linear_attention"],
    )
    theirs = qwen.Qwen3NextGatedDeltaNet(config, 0)
    per_head = [w.unflatten(0, (h, -1)) for w in (ours.q_proj.weight, ours.k_proj.weight, ours.v_proj.weight)]
    gate = ours.g_proj.weight.unflatten(0, (h, -1))
    with torch.no_grad():
        theirs.in_proj_qkvz.weight.copy_(torch.cat([*per_head, gate], 1).flatten(0, 1))
        theirs.in_proj_ba.weight.copy_(torch.stack([ours.b_proj.weight, ours.a_proj.weight], 1).flatten(0, 1))
        theirs.conv1d.weight.copy_(ours.conv.conv.weight)
        theirs.dt_bias.copy_(ours.dt_bias)
        theirs.A_log.copy_(ours.A_log)
        theirs.norm.weight.copy_(ours.o_norm)
        theirs.out_proj.weight.copy_(ours.o_proj.weight)
    return theirs.eval()


@pytest.mark.parametrize("t", [7, 70])  # one chunk of Qwen3-Next's 64, and past it
def test_the_layer_equals_qwen3_next_gated_deltanet_with_weights_copied(t):
    torch.manual_seed(0)
    ours = zoo.create_attention("gated_deltanet", d_model=16, n_heads=2, causal=True, head_dim=8, norm_eps=1e-6)
    with torch.no_grad():
        ours.o_norm.uniform_(0.5, 1.5)
    theirs = qwen3_next_layer(ours)
    x = torch.randn(2, t, 16)
    with torch.no_grad():
        torch.testing.assert_close(ours(x).out, theirs(x), rtol=0, atol=1e-5)


def test_the_layer_equals_the_paper_layer_written_out():
    torch.manual_seed(0)
    layer = zoo.create_attention("gated_deltanet", d_model=16, n_heads=2, causal=True, chunk_size=4).double()
    with torch.no_grad():
        layer.o_norm.uniform_(0.5, 1.5)
    x = torch.randn(2, 11, 16, dtype=torch.float64)
    decay = -layer.A_log.exp()[:, None] * torch.nn.functional.softplus(layer.a_proj(x) + layer.dt_bias).transpose(1, 2)
    torch.testing.assert_close(layer(x).out, written_out_layer(layer, x, decay), rtol=0, atol=1e-10)
