"""``nystromformer`` against mlpen/Nystromformer LRA/code/attention_nystrom.py @ 56893131 in float64 (the
convolution's weights copied, their per-matrix pseudo-inverse initialisation, no padding: theirs averages
padded zeros into the landmarks, ours does not); the landmarks are the segment means the paper defines for
lengths m does not divide; with m >= t it is exact softmax attention; more landmarks approximate better."""

from __future__ import annotations

import torch

import zoo
from tests.parts.references import mlpen_module
from zoo.attention.base import reference_attention
from zoo.attention.nystromformer import iterative_pinv

D, H = 32, 4


def test_nystromformer_equals_mlpen_lra_nystrom_attention():
    module = mlpen_module("attention_nystrom")
    torch.manual_seed(0)
    t, m, width = 64, 8, 5
    config = {
        "head_dim": D // H,
        "num_head": H,
        "num_landmarks": m,
        "seq_len": t,
        "conv_kernel_size": width,
        "inv_coeff_init_option": True,  # theirs reads this key, then the next one (a typo in their code)
        "inv_init_coeff_option": "per-matrix",  # anything but "original": one scale per matrix
    }
    ref = module.NystromAttention(config).double()
    attn = zoo.create_attention("nystromformer", d_model=D, n_heads=H, landmarks=m, conv_kernel=width).double().eval()
    with torch.no_grad():
        ref.conv.weight.copy_(attn.conv.weight)
    x = torch.randn(2, t, D, dtype=torch.float64)
    q, k, v = (attn.split_heads(p(x)) for p in (attn.to_q, attn.to_k, attn.to_v))
    expected = attn.to_out(attn.merge_heads(ref(q, k, v, torch.ones(2, t, dtype=torch.float64))))
    torch.testing.assert_close(attn(x).out, expected, rtol=1e-10, atol=1e-10)


def test_landmarks_are_segment_means_and_m_at_least_t_is_exact():
    torch.manual_seed(1)
    attn = zoo.create_attention("nystromformer", d_model=D, n_heads=H, landmarks=5, conv_kernel=0).double().eval()
    x = torch.randn(1, 5, D, dtype=torch.float64)
    q, k, v = (attn.split_heads(p(x)) for p in (attn.to_q, attn.to_k, attn.to_v))
    exact = attn.to_out(attn.merge_heads(reference_attention(q, k, v)))
    torch.testing.assert_close(attn(x).out, exact, rtol=1e-10, atol=1e-10)
    # 13 positions over 5 landmarks: segments floor(i * 5 / 13) = sizes 3, 3, 2, 3, 2, none empty
    segment = torch.arange(13) * 5 // 13
    assert torch.bincount(segment).tolist() == [3, 3, 2, 3, 2]


def test_the_pseudo_inverse_converges_and_more_landmarks_approximate_better():
    a = torch.softmax(torch.randn(3, 6, 6, dtype=torch.float64), -1)
    torch.testing.assert_close(iterative_pinv(a, 20), torch.linalg.pinv(a), rtol=1e-6, atol=1e-6)
    torch.manual_seed(2)
    x = 0.3 * torch.randn(2, 96, D, dtype=torch.float64)
    errors = []
    for m in (4, 16, 48):
        torch.manual_seed(3)  # the same projections for every m
        attn = zoo.create_attention(
            "nystromformer", d_model=D, n_heads=H, landmarks=m, conv_kernel=0, pinv_iterations=12
        )
        attn = attn.double().eval()
        with torch.no_grad():
            q, k, v = (attn.split_heads(p(x)) for p in (attn.to_q, attn.to_k, attn.to_v))
            exact = attn.to_out(attn.merge_heads(reference_attention(q, k, v)))
            errors.append(float((attn(x).out - exact).norm() / exact.norm()))
    assert errors[0] > errors[1] > errors[2], errors
