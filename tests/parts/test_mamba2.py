"""Mamba-2's SSD layer (zoo/attention/mamba2.py, the kernels of zoo/attention/delta_chunks.py).

- the chunkwise form (SSD) == the recurrent form == the selective SSM of Dao & Gu 2024 (arXiv:2405.21060,
  with scalar A per head: h_t = exp(dt_t A) h_{t-1} + dt_t B_t x_t^T, y_t = C_t^T h_t + D x_t)
  written out, float64, 1e-10, at chunk sizes that do and do not divide the length, from a state;
- the recurrence == flash-linear-attention's ``naive_recurrent_simple_gla`` / ``naive_chunk_simple_gla`` (the
  same scalar-decay recurrence) in float32, 1e-5: both cast with ``.float()``;
- the whole layer == HF transformers' ``Mamba2Mixer`` (its pure-torch path: ``mamba2_chunk_scan`` over
  chunks, the fallbacks of the kernels it would load) with the weights copied, float32, 1e-5, one group and
  two, inside one of its chunks and across several.

Differences found in the references: HF's ``Mamba2Mixer`` (5.24) has no ``torch_forward`` any more; its
``forward`` runs the pure-torch fallbacks when the kernels are absent, as here. It computes the scan in
float32 (``.float()``), clamps dt by ``time_step_limit`` (not offered here; (0, inf) by default, no clamp),
and at padded positions zeroes x, B, C but still decays the state by exp(dt A) (ours leaves it as it was:
the comparison runs without padding). Its A_log is initialised to log(1..h) (mamba_ssm's and ours: A ~ U(1,
16)); the weights are copied. fla's simple_gla functions scale q by k^-1/2 (passed as scale=1) and take [b, t, h, k].
"""

from __future__ import annotations

import pytest
import torch
from einops import rearrange

import zoo
from tests.parts.references import fla_naive
from zoo.attention.delta_chunks import chunk_delta_rule, recurrent_delta_rule

B, H, N, P = 2, 3, 5, 7


def inputs(t, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, H, t, P, generator=g, dtype=dtype)
    b, c = (torch.randn(B, H, t, N, generator=g, dtype=dtype) for _ in range(2))
    dt = torch.rand(B, H, t, generator=g, dtype=dtype) * 0.5
    a = -torch.rand(H, generator=g, dtype=dtype) * 4 - 0.5
    state = torch.randn(B, H, N, P, generator=g, dtype=dtype)
    return x, b, c, dt, a, state


def selective_ssm(x, b, c, dt, a, state):
    """The paper's recurrence per head and token: h = exp(dt a) h + dt B x^T, y = C^T h (D x added by the layer)."""
    h = state.clone()
    y = torch.empty_like(x)
    for i in range(x.shape[2]):
        step = dt[:, :, i, None, None]
        h = torch.exp(step * a[:, None, None]) * h + step * b[:, :, i, :, None] * x[:, :, i, None, :]
        y[:, :, i] = (c[:, :, i, :, None] * h).sum(-2)
    return y, h


@pytest.mark.parametrize("t,chunk", [(19, 4), (16, 16), (33, 8), (5, 64)])
def test_chunk_form_equals_recurrent_form_equals_the_selective_ssm(t, chunk):
    x, b, c, dt, a, state = inputs(t)
    want, want_state = selective_ssm(x, b, c, dt, a, state)
    g = a[:, None] * dt
    for got, got_state in (
        chunk_delta_rule(c, b, x * dt[..., None], None, g, state, chunk),
        recurrent_delta_rule(c, b, x * dt[..., None], None, g, state),
    ):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-10)
        torch.testing.assert_close(got_state, want_state, rtol=0, atol=1e-10)


def test_equals_flash_linear_attention_naive_simple_gla():
    fla = fla_naive("simple_gla")
    x, b, c, dt, a, state = (y.float() for y in inputs(19, seed=1))
    v, g = x * dt[..., None], a[:, None] * dt
    ours, ours_state = chunk_delta_rule(c, b, v, None, g, state, 4)
    tc, tb, tv, tg = (rearrange(y, "b h t ... -> b t h ...") for y in (c, b, v, g))
    recurrent = fla.naive_recurrent_simple_gla(tc, tb, tv, tg, scale=1.0, initial_state=state, output_final_state=True)
    chunked = fla.naive_chunk_simple_gla(
        tc, tb, tv, tg, initial_state=state, output_final_state=True, chunk_size=8, scale=1.0
    )
    for theirs, theirs_state in (recurrent, chunked):
        torch.testing.assert_close(ours, rearrange(theirs, "b t h e -> b h t e"), rtol=0, atol=1e-5)
        torch.testing.assert_close(ours_state, theirs_state, rtol=0, atol=1e-5)


def hf_mixer(ours, chunk_size):
    """HF's Mamba2Mixer with our layer's weights (the same layout: mamba_ssm's)."""
    modeling = pytest.importorskip("transformers.models.mamba2.modeling_mamba2")
    from transformers import Mamba2Config

    o = ours.options
    config = Mamba2Config(
        hidden_size=ours.d_model,
        num_heads=ours.n_heads,
        head_dim=ours.p,
        expand=o.expand,
        state_size=o.d_state,
        n_groups=o.n_groups,
        conv_kernel=o.conv_size,
        chunk_size=chunk_size,
        use_bias=o.bias,
        use_conv_bias=o.conv_bias,
        layer_norm_epsilon=o.norm_eps,
        num_hidden_layers=1,
    )
    theirs = modeling.Mamba2Mixer(config, layer_idx=0)
    with torch.no_grad():
        for name in ("in_proj", "out_proj"):
            getattr(theirs, name).weight.copy_(getattr(ours, name).weight)
        theirs.conv1d.weight.copy_(ours.conv.conv.weight)
        theirs.conv1d.bias.copy_(ours.conv.conv.bias)
        for name in ("dt_bias", "A_log", "D"):
            getattr(theirs, name).copy_(getattr(ours, name))
        theirs.norm.weight.copy_(ours.norm)
    return theirs.eval()


@pytest.mark.parametrize("groups,t", [(1, 7), (1, 19), (2, 19)])
def test_the_layer_equals_hf_mamba2_mixer_with_weights_copied(groups, t):
    torch.manual_seed(0)
    ours = zoo.create_attention("mamba2", d_model=16, n_heads=4, causal=True, d_state=8, n_groups=groups, chunk_size=4)
    with torch.no_grad():
        ours.norm.uniform_(0.5, 1.5)
        ours.D.uniform_(0.5, 1.5)
    theirs = hf_mixer(ours, chunk_size=8)  # another chunking than ours: the result does not depend on it
    x = torch.randn(2, t, 16)
    with torch.no_grad():
        torch.testing.assert_close(ours(x).out, theirs(x), rtol=0, atol=1e-5)
