"""``linear`` and ``performer`` against references we did not write, in float64, projections shared.

- linear, bidirectional: mlpen/Nystromformer LRA/code/attention_linear.py @ 56893131 computes
  phi(Q)(phi(K)^T V) / sqrt(t) without the paper's denominator; called once with V and once with ones it
  gives numerator and denominator, whose ratio must equal ours (padding included: both zero padded keys).
- linear, causal: the paper's recurrence written out token by token (Katharopoulos et al. 2020, eqs. 8-10),
  over a length past two chunks.
- performer, bidirectional: mlpen's PerformerAttention (performer-pytorch's FastAttention, FAVOR+) given our
  random features, feature_eps = 1e-4 as theirs.
- performer, causal: with many features FAVOR+ approximates causal softmax attention; and the stream pins
  its features across a redraw.
"""

from __future__ import annotations

import math

import pytest
import torch
from einops import rearrange

import zoo
from tests.parts.references import mlpen_module
from zoo.attention.base import causal_allowed, reference_attention
from zoo.attention.kernelized import KernelState

D, H = 32, 4


def heads(attn, x):
    return [attn.split_heads(p(x)) for p in (attn.to_q, attn.to_k, attn.to_v)]


def finish(attn, out):
    return attn.to_out(rearrange(out, "b h t k -> b t (h k)"))


def test_linear_equals_mlpen_lra_linear_attention_with_the_papers_denominator():
    ref = mlpen_module("attention_linear").LinearAttention({})
    torch.manual_seed(0)
    attn = zoo.create_attention("linear", d_model=D, n_heads=H, eps=0.0).double().eval()
    x = torch.randn(2, 40, D, dtype=torch.float64)
    mask = torch.ones(2, 40, dtype=torch.bool)
    mask[0, 29:] = False
    q, k, v = heads(attn, x)
    num = ref(q, k, v, mask.double())
    den = ref(q, k, torch.ones_like(v), mask.double())
    expected = finish(attn, num / den[..., :1])
    out = attn(x, pad_mask=mask).out
    torch.testing.assert_close(out[mask], expected[mask], rtol=1e-10, atol=1e-10)


def test_linear_causal_is_the_papers_recurrence():
    torch.manual_seed(1)
    attn = zoo.create_attention("linear", d_model=D, n_heads=H, causal=True).double().eval()
    t = 150  # past two chunks of 64
    x = torch.randn(2, t, D, dtype=torch.float64)
    q, k, v = heads(attn, x)
    phi_q, phi_k = attn.feature_map(q), attn.feature_map(k)
    s = torch.zeros(2, H, D // H, D // H, dtype=torch.float64)
    z = torch.zeros(2, H, D // H, dtype=torch.float64)
    rows = []
    for i in range(t):
        s = s + torch.einsum("bhf,bhe->bhfe", phi_k[:, :, i], v[:, :, i])  # S_i = S_{i-1} + phi(k_i) v_i^T
        z = z + phi_k[:, :, i]  # z_i = z_{i-1} + phi(k_i)
        num = torch.einsum("bhf,bhfe->bhe", phi_q[:, :, i], s)
        rows.append(num / (torch.einsum("bhf,bhf->bh", phi_q[:, :, i], z)[..., None] + attn.options.eps))
    expected = finish(attn, torch.stack(rows, dim=2))
    torch.testing.assert_close(attn(x).out, expected, rtol=1e-10, atol=1e-10)


def test_performer_equals_mlpen_lra_performer_given_the_same_features():
    pytest.importorskip("performer_pytorch")
    module = mlpen_module("attention_performer")
    torch.manual_seed(2)
    k_dim, m = D // H, 64
    attn = zoo.create_attention("performer", d_model=D, n_heads=H, n_features=m, feature_eps=1e-4).double().eval()
    ref = module.PerformerAttention({"head_dim": k_dim, "rp_dim": m, "kernel_type": "exp"}).double()
    ref.attn_fn.projection_matrix.copy_(attn.features)
    x = torch.randn(2, 48, D, dtype=torch.float64)
    q, k, v = heads(attn, x)
    scale = k_dim**0.25  # theirs divides q and k by k^(1/4) before FastAttention divides again: undo one
    expected = finish(attn, ref(q * scale, k * scale, v, torch.ones(2, 48, dtype=torch.float64)))
    torch.testing.assert_close(attn(x).out, expected, rtol=1e-10, atol=1e-10)


def test_performer_approximates_softmax_attention_causal_and_bidirectional():
    """FAVOR+ is unbiased for exp(q . k / sqrt(k)): with 4,096 orthogonal features the output is close to
    exact softmax attention (a wrong scale, sign or normaliser is far off), in both forms."""
    torch.manual_seed(3)
    for causal in (False, True):
        attn = zoo.create_attention("performer", d_model=D, n_heads=H, causal=causal, n_features=4096).double()
        attn.eval()
        x = 0.5 * torch.randn(2, 70, D, dtype=torch.float64)
        q, k, v = heads(attn, x)
        allowed = causal_allowed(70, 70) if causal else None
        exact = finish(attn, reference_attention(q, k, v, allowed))
        error = (attn(x).out - exact).norm() / exact.norm()
        assert error < 0.05, (causal, float(error))
        cheap = zoo.create_attention("performer", d_model=D, n_heads=H, causal=causal, n_features=4).double()
        cheap.load_state_dict({k: v for k, v in attn.state_dict().items() if k != "features"}, strict=False)
        assert (cheap.eval()(x).out - exact).norm() / exact.norm() > error  # fewer features, worse


def test_performer_redraws_in_training_on_schedule_and_a_stream_keeps_its_features():
    torch.manual_seed(4)
    attn = zoo.create_attention("performer", d_model=D, n_heads=H, causal=True, n_features=8, redraw_interval=2)
    x = torch.randn(1, 10, D)
    first = attn.features.clone()
    attn.eval()
    attn(x)
    assert torch.equal(attn.features, first), "eval never redraws"
    with torch.no_grad():
        state = attn.init_state(1)
        out_a = attn(x[:, :5], state=state)
        attn.train()
        attn(x)
        attn(x)  # the second training call redraws
        assert not torch.equal(attn.features, first)
        attn.eval()
        out_b = attn(x[:, 5:], state=out_a.state)  # continues under the features it started with
        attn.features.copy_(first)
        whole = attn(x).out
    assert torch.equal(out_b.state.features, first)
    torch.testing.assert_close(torch.cat([out_a.out, out_b.out], 1), whole, rtol=1e-5, atol=1e-6)
    assert isinstance(out_b.state, KernelState) and out_b.state.length == 0 and out_b.state.seen == 10
    assert math.isfinite(float(whole.sum()))


def rotate_pairs(x: torch.Tensor, positions: torch.Tensor, rotated: int, base: float = 10000.0) -> torch.Tensor:
    """RoFormer eq. 34 written as complex multiplication: the pairs (x_2i, x_2i+1), i < rotated / 2, turned
    by m theta_i, theta_i = base^(-2i / rotated); the other dimensions unchanged. x [..., n, f]."""
    theta = base ** (-torch.arange(0, rotated, 2, dtype=torch.float64) / rotated)
    turn = torch.polar(torch.ones_like(theta), positions.double()[:, None] * theta[None])  # [n, rotated / 2]
    pairs = torch.view_as_complex(x[..., :rotated].reshape(*x.shape[:-1], rotated // 2, 2).contiguous())
    return torch.cat([torch.view_as_real(pairs * turn).flatten(-2), x[..., rotated:]], dim=-1)


@pytest.mark.parametrize("name", ["linear", "performer"])
@pytest.mark.parametrize("causal", [False, True])
def test_rope_inside_kernelized_attention_is_roformers_eq_19(name, causal):
    """RoFormer (Su et al. 2021, arXiv:2104.09864) Section 3.4.3, eq. 19, written out over every pair:
    out_i = sum_j (R_i phi(q_i))^T (R_j phi(k_j)) v_j / sum_j phi(q_i)^T phi(k_j), j over the keys i sees,
    the rotation in the numerator only. Past two causal chunks; padded keys in the bidirectional case."""
    torch.manual_seed(3)
    rope = zoo.position.base.POSITION.get("rope")(D, 512, n_heads=H)
    options = {"n_features": 16} if name == "performer" else {}
    attn = zoo.create_attention(name, d_model=D, n_heads=H, causal=causal, position=rope, **options).double().eval()
    t = 150
    x = torch.randn(2, t, D, dtype=torch.float64)
    mask = None if causal else torch.ones(2, t, dtype=torch.bool)
    if mask is not None:
        mask[0, 111:] = False
    q, k, v = heads(attn, x)
    phi_q, phi_k, _ = attn.feature_maps(q, k, mask, None)
    if mask is not None:
        phi_k, v = phi_k * mask[:, None, :, None], v * mask[:, None, :, None]
    positions = torch.arange(t)
    rq, rk = (rotate_pairs(f, positions, rope.rotated) for f in (phi_q, phi_k))
    seen = torch.ones(t, t, dtype=torch.bool).tril() if causal else torch.ones(t, t, dtype=torch.bool)
    num = torch.einsum("bhif,bhjf->bhij", rq, rk) * seen
    den = (torch.einsum("bhif,bhjf->bhij", phi_q, phi_k) * seen).sum(-1, keepdim=True)
    expected = finish(attn, (num @ v) / (den + attn.options.eps if attn.options.eps else den))
    out = attn(x, pad_mask=mask).out
    keep = slice(None) if mask is None else mask
    torch.testing.assert_close(out[keep], expected[keep], rtol=1e-9, atol=1e-10)
    plain = zoo.create_attention(name, d_model=D, n_heads=H, causal=causal, **options).double().eval()
    plain.load_state_dict(attn.state_dict())
    assert not torch.allclose(plain(x, pad_mask=mask).out, out, atol=1e-4), "the rotation is applied"
