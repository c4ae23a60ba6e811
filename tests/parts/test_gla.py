"""Gated linear attention (arXiv:2312.06635) against the paper's recurrence written out in float64, the
chunkwise kernel against the recurrent one with a decay per key dimension, and the core against
flash-linear-attention's naive_recurrent_gla."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import zoo
from tests.parts.references import fla_naive
from tests.parts.streams import fed_in_pieces
from zoo.attention.decay_chunks import chunk_decay_attention, recurrent_decay_attention

D, H = 32, 4


def layer(**options):
    torch.manual_seed(0)
    attn = zoo.create_attention("gla", d_model=D, n_heads=H, causal=True, gate_logit_normalizer=2.0, **options)
    with torch.no_grad():  # a norm weight and a gate bias that are not the init's ones and zeros
        attn.head_norm.weight.uniform_(0.5, 1.5)
        attn.to_decay.bias.uniform_(-1, 1)
    return attn.double()


def paper_layer(attn, x):
    """α_t = sigmoid(x W1 W2 + b)^(1/τ), S_t = diag(α_t) S_{t-1} + k_t^T v_t, o_t = q_t S_t / sqrt(f),
    y = (swish(x W_r) ⊙ RMSNorm(o) w) W_O, token by token in float64."""
    b, t, _ = x.shape
    f, e = attn.key_dim, attn.value_dim
    q, k = attn.to_q(x).view(b, t, H, f), attn.to_k(x).view(b, t, H, f)
    v = attn.to_v(x).view(b, t, H, e)
    tau = attn.options.gate_logit_normalizer
    alpha = torch.sigmoid(attn.to_decay(attn.to_gate_low(x))).view(b, t, H, f) ** (1 / tau)
    state, heads = torch.zeros(b, H, f, e, dtype=x.dtype), []
    for n in range(t):
        state = alpha[:, n, :, :, None] * state + k[:, n, :, :, None] * v[:, n, :, None, :]
        heads.append(torch.einsum("bhf,bhfe->bhe", q[:, n], state) / f**0.5)
    o = torch.stack(heads, 1)  # [b, t, h, e]
    o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + attn.options.norm_eps) * attn.head_norm.weight
    gate = F.silu(attn.to_output_gate(x)) if attn.to_output_gate is not None else 1.0
    return attn.to_out(gate * o.reshape(b, t, H * e))


@pytest.mark.parametrize("chunk_size", [1, 4, 7, 64])
@pytest.mark.parametrize("use_output_gate", [True, False])
def test_layer_equals_the_papers_recurrence(chunk_size, use_output_gate):
    attn = layer(chunk_size=chunk_size, use_output_gate=use_output_gate)
    x = torch.randn(2, 19, D, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(attn(x).out, paper_layer(attn, x), rtol=0, atol=1e-10)


def test_streaming_token_by_token_equals_the_paper():
    attn = layer(chunk_size=4)
    x = torch.randn(2, 9, D, dtype=torch.float64)
    out, _ = fed_in_pieces(attn, x, range(1, 10))
    with torch.no_grad():
        torch.testing.assert_close(out, paper_layer(attn, x), rtol=0, atol=1e-10)


def diagonal_case(t=21, seed=1, dtype=torch.float64, strength=1.0):
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(2, H, t, 8, generator=g, dtype=dtype) for _ in range(2))
    v = torch.randn(2, H, t, 6, generator=g, dtype=dtype)
    log_decay = F.logsigmoid(torch.randn(2, H, t, 8, generator=g, dtype=dtype) * 3) * strength
    state = torch.randn(2, H, 8, 6, generator=g, dtype=dtype)
    return q, k, v, log_decay, state


@pytest.mark.parametrize("chunk_size,t", [(1, 21), (5, 21), (8, 21), (32, 70), (64, 70)])
def test_chunk_form_equals_recurrent_form_with_a_decay_per_key_dim_and_a_starting_state(chunk_size, t):
    """Chunks of 32 and 64 run the secondary blocks of 16 (decays factored through each block's start)."""
    q, k, v, log_decay, state = diagonal_case(t=t)
    want, want_state = recurrent_decay_attention(q, k, v, log_decay, state=state)
    got, got_state = chunk_decay_attention(q, k, v, log_decay, chunk_size=chunk_size, state=state)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-10)
    torch.testing.assert_close(got_state, want_state, rtol=0, atol=1e-10)


def test_chunk_form_stays_finite_where_a_ratio_of_decay_products_would_overflow():
    """Decays down to e^-30 per step: a chunk of 64 spans e^-1920, past float32's range; differences of logs do
    not (float32 against the float64 recurrence: the cumulative logs near 1e3 keep about 1e-4 of an exponent)."""
    q, k, v, log_decay, _ = diagonal_case(t=130, strength=30.0)
    got, _ = chunk_decay_attention(*(x.float() for x in (q, k, v, log_decay)), chunk_size=64)
    want, _ = recurrent_decay_attention(q, k, v, log_decay)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got.double(), want, rtol=1e-3, atol=1e-3)


def test_core_equals_fla_naive_recurrent_gla():
    """fla's naive_recurrent_gla ([b, t, h, f], float32 inside, q scaled by f^-1/2) with a starting state."""
    naive = fla_naive("gla").naive_recurrent_gla
    q, k, v, log_decay, state = diagonal_case(t=37, dtype=torch.float32)
    ours, ours_state = chunk_decay_attention(q * 8**-0.5, k, v, log_decay, chunk_size=32, state=state)

    def btd(x):
        return x.transpose(1, 2)

    theirs, theirs_state = naive(btd(q), btd(k), btd(v), btd(log_decay), initial_state=state, output_final_state=True)
    torch.testing.assert_close(ours, btd(theirs), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours_state, theirs_state, rtol=1e-5, atol=1e-5)


def test_gate_low_rank_dim_sizes_the_gate_and_positions_are_refused():
    attn = zoo.create_attention("gla", d_model=D, n_heads=H, causal=True, gate_low_rank_dim=3)
    assert attn.to_gate_low.weight.shape == (3, D) and attn.to_decay.weight.shape == (D // 2, 3)
    with pytest.raises(ValueError, match="no position encoding"):
        zoo.create_model("vanilla_lm", attention="gla", position={"name": "alibi"}, vocab_size=16, d_model=D, n_heads=H)


def test_the_head_norm_comes_from_the_norm_axis_and_old_checkpoints_load():
    """The per-head norm is the norm axis's rmsnorm (one weight [e] shared by the heads, as fla's); a state
    dict written while its weight was the layer's own ``norm_weight`` loads into it."""
    attn = layer()
    assert type(attn.head_norm).registry_name == "rmsnorm" and attn.head_norm.weight.shape == (attn.value_dim,)
    old = {("norm_weight" if k == "head_norm.weight" else k): v for k, v in attn.state_dict().items()}
    fresh = zoo.create_attention("gla", d_model=D, n_heads=H, causal=True, gate_logit_normalizer=2.0).double()
    fresh.load_state_dict(old)
    x = torch.randn(1, 5, D, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(fresh(x).out, attn(x).out, rtol=0, atol=0)
