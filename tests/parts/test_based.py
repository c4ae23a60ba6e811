"""Based (arXiv:2402.18668) against its attention written out in float64 (the Taylor polynomial 1 + s + s^2/2
summed over every earlier key, softmax over the last w keys), and the Taylor part against
flash-linear-attention's naive_parallel_based and naive_chunk_based (float64: they keep the input's dtype)."""

from __future__ import annotations

import pytest
import torch

import zoo
from tests.parts.references import fla_naive
from tests.parts.streams import fed_in_pieces
from zoo.attention.based import taylor_features
from zoo.attention.kernelized import causal_kernel_attention

D, H = 32, 4


def layer(**options):
    torch.manual_seed(0)
    options = {"feature_dim": 4, **options}
    return zoo.create_attention("based", d_model=D, n_heads=H, causal=True, **options).double()


def paper_layer(attn, x, pad_mask=None):
    """Query by query: Taylor attention over keys j <= i, normalised, plus softmax over i - w < j <= i."""
    b, t, _ = x.shape
    f, w, k = attn.options.feature_dim, attn.options.window_size, D // H
    q, kk = attn.to_q(x).view(b, t, H, f), attn.to_k(x).view(b, t, H, f)
    v = attn.to_v(x).view(b, t, H, k)
    real = torch.ones(b, t, dtype=torch.bool) if pad_mask is None else pad_mask
    rows = []
    for i in range(t):
        s = torch.einsum("bhf,bjhf->bhj", q[:, i], kk[:, : i + 1]) / f**0.5
        weight = (1 + s + s**2 / 2) * real[:, None, : i + 1]
        row = torch.einsum("bhj,bjhe->bhe", weight, v[:, : i + 1]) / (weight.sum(-1, keepdim=True) + attn.options.eps)
        if w:
            lo = max(0, i - w + 1)
            qw = attn.to_q_window(x[:, i]).view(b, H, k)
            kw = attn.to_k_window(x[:, lo : i + 1]).view(b, i + 1 - lo, H, k)
            scores = torch.einsum("bhe,bjhe->bhj", qw, kw) / k**0.5
            scores = scores.masked_fill(~real[:, None, lo : i + 1], float("-inf"))
            row = row + torch.einsum("bhj,bjhe->bhe", scores.softmax(-1).nan_to_num(0.0), v[:, lo : i + 1])
        rows.append(row.reshape(b, D))
    return attn.to_out(torch.stack(rows, 1))


@pytest.mark.parametrize("window_size,chunk_size", [(0, 4), (3, 4), (5, 1), (5, 7), (8, 64)])
def test_layer_equals_the_papers_attention_written_out(window_size, chunk_size):
    attn = layer(window_size=window_size, chunk_size=chunk_size)
    x = torch.randn(2, 19, D, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(attn(x).out, paper_layer(attn, x), rtol=0, atol=1e-10)


def test_padded_keys_are_neither_summed_nor_in_the_window():
    attn = layer(window_size=5, chunk_size=4)
    x = torch.randn(2, 13, D, dtype=torch.float64)
    pad = torch.ones(2, 13, dtype=torch.bool)
    pad[0, :3], pad[1, 6:8] = False, False
    with torch.no_grad():
        got, want = attn(x, pad_mask=pad).out, paper_layer(attn, x, pad)
    torch.testing.assert_close(got[pad], want[pad], rtol=0, atol=1e-10)


def test_streaming_in_segments_equals_the_paper_with_a_state_of_window_minus_one_keys():
    attn = layer(window_size=5, chunk_size=4)
    x = torch.randn(2, 17, D, dtype=torch.float64)
    ends = [1, 2, 9, 10, 17]
    out, states = fed_in_pieces(attn, x, ends)
    assert [state.length for state in states] == [min(end, attn.state_bound()) for end in ends]  # w - 1 = 4 at most
    with torch.no_grad():
        torch.testing.assert_close(out, paper_layer(attn, x), rtol=0, atol=1e-10)


def taylor_case(t, f=4, seed=3):
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(2, H, t, f, generator=g, dtype=torch.float64) for _ in range(2))
    return q, k, torch.randn(2, H, t, 6, generator=g, dtype=torch.float64)


@pytest.mark.parametrize("chunk_size", [1, 8, 64])
def test_taylor_part_equals_fla_naive_parallel_based(chunk_size):
    naive = fla_naive("based").naive_parallel_based
    q, k, v = taylor_case(37)
    ours, _, _ = causal_kernel_attention(taylor_features(q), taylor_features(k), v, 1e-6, chunk_size=chunk_size)
    torch.testing.assert_close(ours, naive(q, k, v), rtol=0, atol=1e-10)


def test_taylor_part_equals_fla_naive_chunk_based():
    """naive_chunk_based forms the second-order state [f, f, e] per chunk; its length must fill its chunks."""
    naive = fla_naive("based").naive_chunk_based
    q, k, v = taylor_case(48)
    ours, _, _ = causal_kernel_attention(taylor_features(q), taylor_features(k), v, 1e-6, chunk_size=5)
    torch.testing.assert_close(ours, naive(q, k, v, chunk_size=16), rtol=0, atol=1e-10)


def test_positions_are_refused_with_the_reason():
    with pytest.raises(ValueError, match="Taylor attention sums feature maps"):
        zoo.create_model("vanilla_lm", attention="based", position={"name": "rope"}, d_model=D, n_heads=H)
