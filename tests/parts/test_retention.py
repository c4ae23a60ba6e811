"""Retention (RetNet, arXiv:2307.08621) against the paper's recurrence and parallel form written out in float64,
the chunkwise kernel against the recurrent one, and the core against flash-linear-attention's naive_retention."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import zoo
from tests.parts.references import fla_naive
from tests.parts.streams import fed_in_pieces
from zoo.attention.decay_chunks import chunk_decay_attention, recurrent_decay_attention
from zoo.attention.retention import retention_log_decay

D, H = 32, 4


def layer(**options):
    torch.manual_seed(0)
    return zoo.create_attention("retention", d_model=D, n_heads=H, causal=True, **options).double()


def rotated(x, n):
    """The paper's Q ⊙ Θ: pairs as complex numbers times e^{i n θ_j}, θ_j = 10000^{-j/(f/2 - 1)}."""
    f = x.shape[-1]
    theta = 1.0 / 10000 ** torch.linspace(0, 1, f // 2, dtype=torch.float64)
    pairs = torch.view_as_complex(x.reshape(*x.shape[:-1], f // 2, 2).contiguous())
    return torch.view_as_real(pairs * torch.polar(torch.ones_like(theta), n * theta)).flatten(-2)


def paper_heads(attn, x, parallel=False):
    """Every head's retention [b, t, h, e] of x [b, t, d], by eq. 6 (token by token) or eq. 5 (t x t D)."""
    b, t, _ = x.shape
    f, e = attn.key_dim, attn.value_dim
    q = attn.to_q(x).view(b, t, H, f)
    k = attn.to_k(x).view(b, t, H, f) / f**0.5
    v = attn.to_v(x).view(b, t, H, e)
    q = torch.stack([rotated(q[:, n], n) for n in range(t)], 1)
    k = torch.stack([rotated(k[:, n], n) for n in range(t)], 1)
    gamma = 1 - 2.0 ** (-5 - torch.arange(H, dtype=torch.float64))
    if parallel:
        n = torch.arange(t, dtype=torch.float64)
        decay = gamma[:, None, None] ** (n[:, None] - n[None, :]).clamp_min(0) * (n[:, None] >= n[None, :])
        return torch.einsum("bnhf,bmhf,hnm,bmhe->bnhe", q, k, decay, v)
    state = torch.zeros(b, H, f, e, dtype=torch.float64)
    heads = []
    for n in range(t):
        state = gamma[:, None, None] * state + torch.einsum("bhf,bhe->bhfe", k[:, n], v[:, n])
        heads.append(torch.einsum("bhf,bhfe->bhe", q[:, n], state))
    return torch.stack(heads, 1)


def paper_layer(attn, x, parallel=False):
    """MSR(X) = (swish(X W_G) ⊙ GroupNorm_h(heads)) W_O (eq. 8), GroupNorm as torch's, one group per head."""
    b, t, _ = x.shape
    heads = paper_heads(attn, x, parallel).reshape(b * t, -1)
    normed = F.group_norm(heads, H, eps=attn.options.norm_eps).view(b, t, -1)
    return attn.to_out(F.silu(attn.to_gate(x)) * normed)


@pytest.mark.parametrize("chunk_size", [1, 4, 7, 64])
def test_layer_equals_the_papers_recurrence_and_parallel_form(chunk_size):
    attn = layer(chunk_size=chunk_size)
    x = torch.randn(2, 19, D, dtype=torch.float64)
    with torch.no_grad():
        ours = attn(x).out
        torch.testing.assert_close(ours, paper_layer(attn, x), rtol=0, atol=1e-10)
        torch.testing.assert_close(ours, paper_layer(attn, x, parallel=True), rtol=0, atol=1e-10)


def test_streaming_token_by_token_runs_the_recurrence_and_equals_the_paper():
    attn = layer(chunk_size=4)
    x = torch.randn(2, 11, D, dtype=torch.float64)
    out, states = fed_in_pieces(attn, x, range(1, 12))
    with torch.no_grad():
        torch.testing.assert_close(out, paper_layer(attn, x), rtol=0, atol=1e-10)
    state = states[-1]
    assert state.memory.shape == (2, H, attn.key_dim, attn.value_dim) and state.length == 0


def scalar_case(t=21, seed=1, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(2, H, t, 8, generator=g, dtype=dtype) for _ in range(2))
    v = torch.randn(2, H, t, 6, generator=g, dtype=dtype)
    log_decay = F.logsigmoid(torch.randn(2, H, t, generator=g, dtype=dtype) + 2)
    state = torch.randn(2, H, 8, 6, generator=g, dtype=dtype)
    return q, k, v, log_decay, state


@pytest.mark.parametrize("chunk_size", [1, 5, 8, 64])
def test_chunk_form_equals_recurrent_form_with_scalar_decay_and_a_starting_state(chunk_size):
    q, k, v, log_decay, state = scalar_case()
    want, want_state = recurrent_decay_attention(q, k, v, log_decay, state=state)
    got, got_state = chunk_decay_attention(q, k, v, log_decay, chunk_size=chunk_size, state=state)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-10)
    torch.testing.assert_close(got_state, want_state, rtol=0, atol=1e-10)


def test_core_equals_fla_naive_retention():
    """fla's naive_retention casts to float32: equal to float32 tolerance on float32 inputs."""
    naive = fla_naive("retention").naive_retention
    q, k, v, _, _ = scalar_case(t=37, dtype=torch.float32)
    log_gamma = retention_log_decay(H).float()[None, :, None].expand(2, H, 37)
    ours, _ = chunk_decay_attention(q * 8**-0.5, k, v, log_gamma, chunk_size=8)
    torch.testing.assert_close(ours, naive(q, k, v), rtol=1e-5, atol=1e-5)


def test_fla_simple_gla_naive_forms_equal_ours_with_data_dependent_scalar_decay():
    """simple_gla (a scalar decay per head and step, as Gated DeltaNet's gate): fla's chunk and recurrent naive
    forms (float32 inside) against ours, with a starting state and the final state."""
    naive = fla_naive("simple_gla")
    q, k, v, log_decay, state = scalar_case(t=37, dtype=torch.float32)
    ours, ours_state = chunk_decay_attention(q * 8**-0.5, k, v, log_decay, chunk_size=8, state=state)

    def btd(x):
        return x.transpose(1, 2)

    for form in (naive.naive_recurrent_simple_gla, naive.naive_chunk_simple_gla):
        extra = {"chunk_size": 16} if form is naive.naive_chunk_simple_gla else {}
        theirs, theirs_state = form(
            btd(q), btd(k), btd(v), btd(log_decay), initial_state=state.clone(), output_final_state=True, **extra
        )
        torch.testing.assert_close(ours, btd(theirs), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(ours_state, theirs_state, rtol=1e-5, atol=1e-5)


def test_external_positions_are_refused_with_the_reason():
    with pytest.raises(ValueError, match="own relative positions"):
        zoo.create_model("vanilla_lm", attention="retention", position={"name": "rope"}, **TINY_MODEL)


TINY_MODEL = dict(vocab_size=16, d_model=32, n_layers=1, n_heads=4, d_ff=32)
