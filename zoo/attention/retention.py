"""Multi-scale retention: linear attention with a fixed decay per head, a group norm and a swish gate.

Paper: "Retentive Network: A Successor to Transformer for Large Language Models", Sun, Dong, Huang, Ma,
Xia, Xue, Wang, Wei 2023, arXiv:2307.08621, Section 2.1-2.2 (eqs. 1-8); the official code is
microsoft/torchscale (``MultiScaleRetention``, ``RetNetRelPos``).

    Q = (X W_Q) ⊙ Θ,  K = (X W_K) ⊙ conj(Θ),  V = X W_V          Θ_n = e^{i n θ}  (the xPos-style rotation)
    S_n = γ S_{n-1} + K_n^T V_n,  head = Q_n S_n                   (recurrent, eq. 6)
    head = (Q K^T ⊙ D) V,  D_nm = γ^{n-m} [n >= m]                 (parallel, eq. 5)
    γ_h = 1 - 2^{-5-h}  for heads h = 0 .. H-1                      (fixed, Section 2.2)
    Y = GroupNorm_H(Concat(head_1 .. head_H)),  MSR(X) = (swish(X W_G) ⊙ Y) W_O         (eq. 8)

Forms: training runs the chunkwise form (eq. 7, ``decay_chunks.py``: C x C inside a chunk, the decayed
state across; chunk size ``chunk_size``); decoding one token runs the recurrence; the parallel form with
its t x t D is only the test's reference (tests/parts/test_retention.py). The state is S per head
([f, e]) and the count of tokens seen (where the rotation stands): constant size, ``state_bound`` 0.

Shapes: x [b, t, d] -> q, k [b, h, t, f] (f = expand_k d / h), v, gate [b, h, t, e] (e = expand_v d / h)
-> heads [b, h, t, e] -> out [b, t, d]. The paper's sizes: expand_k 1, expand_v 2 (V and the gate are
2d wide), head dim 256 for q/k (so H = d / 256), no biases.

Deviations and details:
- The rotation is torchscale's ``theta_shift``: pairs (2i, 2i+1) of q and k rotated by n θ_i with
  θ_i = 10000^{-i / (f/2 - 1)} (a linspace of exponents, as ``RetNetRelPos``), no xPos scale (the decay
  replaces it). ``xpos=False`` leaves it out (what flash-linear-attention's ``naive_retention`` computes).
- K is scaled by f^{-1/2} (torchscale scales k; fla scales q: the same product).
- The paper's numerical normalisations of the parallel form (D's rows divided by sqrt of their sum,
  scores divided by max(|row sum|, 1), Section 2.2 "Retention Score Normalization") are left out: each
  scales one head's output at one position by one number, which the group norm removes (up to its eps).
  flash-linear-attention leaves them out too.
- GroupNorm with one group per head is a LayerNorm over each head's e features without affine weights
  (torchscale's ``LayerNorm(head_dim, elementwise_affine=False)``), eps ``norm_eps``. Not built by the
  norm axis (``zoo/norm``): its ``layernorm`` always learns a weight (only the bias is optional), which
  would add a parameter the paper's layer does not have.
- Positions: the decay and the rotation are RetNet's own relative positions; rope, alibi and t5_bias
  are refused (adding a second scheme is not the paper's model).

References found to differ: fla's ``naive_retention`` (``fla/ops/retention/naive.py``, bc3b101d) casts
q, k, v to float32 (so it is checked to float32 tolerance), applies no rotation and no norm (it is the
core retention only), and builds the full t x t decay matrix.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from einops import rearrange, repeat
from torch import Tensor, nn

from zoo.attention.base import ATTENTION
from zoo.attention.decay_layer import DecayAttention
from zoo.config import require


def retention_log_decay(n_heads: int) -> Tensor:
    """log γ_h = log(1 - 2^{-5-h}) per head, float64 [h] (Section 2.2)."""
    return torch.log1p(-torch.pow(2.0, -5.0 - torch.arange(n_heads, dtype=torch.float64)))


def rotate_every_two(x: Tensor) -> Tensor:
    """(x_{2i}, x_{2i+1}) -> (-x_{2i+1}, x_{2i}) along the last dim: multiplication by i, pair by pair."""
    pairs = rearrange(x, "... (f two) -> ... f two", two=2)
    return rearrange(torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1), "... f two -> ... (f two)")


def theta_shift(x: Tensor, positions: Tensor) -> Tensor:
    """x [b, h, t, f] at absolute positions [t] rotated pair by pair by n θ_i, θ_i = 10000^{-i/(f/2 - 1)}."""
    f = x.shape[-1]
    angle = 1.0 / 10000 ** torch.linspace(0, 1, f // 2, dtype=torch.float64, device=x.device)
    angle = repeat(angle, "f -> (f two)", two=2)
    phase = positions.to(torch.float64)[:, None] * angle[None, :]  # [t, f], float64: exact at long positions
    return x * phase.cos().to(x.dtype) + rotate_every_two(x) * phase.sin().to(x.dtype)


@ATTENTION.register("retention")
class Retention(DecayAttention):
    no_position_reason = (
        "retention carries its own relative positions (the decay γ^(n-m) and the xPos-style rotation of q and k, "
        "arXiv:2307.08621 Section 2.1); a second scheme is not the paper's model"
    )

    @dataclass
    class Options:
        expand_k: float = 1.0  # q/k width = expand_k * d_model (the paper: 1)
        expand_v: float = 2.0  # value and gate width = expand_v * d_model (the paper: 2)
        chunk_size: int = 64  # C of the chunkwise form
        xpos: bool = True  # rotate q and k by their position (torchscale's theta_shift)
        norm_eps: float = 1e-5  # eps of the per-head group norm
        bias: bool = False  # bias in the projections (the paper's have none)

        def __post_init__(self) -> None:
            require(self.expand_k > 0 and self.expand_v > 0, "expand_k and expand_v must be > 0")
            require(isinstance(self.chunk_size, int) and self.chunk_size >= 1, "chunk_size must be an int >= 1")
            require(self.norm_eps > 0, f"norm_eps must be > 0, got {self.norm_eps}")

    @classmethod
    def contract_options(cls) -> dict:
        return {"chunk_size": 4}

    def __init__(self, d_model: int, n_heads: int, **kwargs):
        super().__init__(d_model, n_heads, **kwargs)
        o, h = self.options, n_heads
        self.key_dim, self.value_dim = self.expanded_head_dims()
        require(not o.xpos or self.key_dim % 2 == 0, f"retention: xpos rotates pairs: head dim {self.key_dim} is odd")
        self.to_q = nn.Linear(d_model, h * self.key_dim, bias=o.bias)
        self.to_k = nn.Linear(d_model, h * self.key_dim, bias=o.bias)
        self.to_v = nn.Linear(d_model, h * self.value_dim, bias=o.bias)
        self.to_gate = nn.Linear(d_model, h * self.value_dim, bias=o.bias)
        self.to_out = nn.Linear(h * self.value_dim, d_model, bias=o.bias)

    def project(self, x: Tensor, positions: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        q, k, v = (self.split_heads(proj(x)) for proj in (self.to_q, self.to_k, self.to_v))
        if self.options.xpos:
            q, k = theta_shift(q, positions), theta_shift(k, positions)
        k = k * self.key_dim**-0.5
        b, _, t, _ = q.shape
        work = torch.promote_types(q.dtype, torch.float32)  # float32 at least: γ = 1 - 2^-12 is 1 in bfloat16
        log_gamma = retention_log_decay(self.n_heads).to(device=x.device, dtype=work)
        return q, k, v, log_gamma[None, :, None].expand(b, self.n_heads, t)

    def finish(self, x: Tensor, out: Tensor) -> Tensor:
        # the group norm: no affine weight, which the norm axis's layernorm cannot leave out (module docstring)
        normed = self.merge_heads(nn.functional.layer_norm(out, out.shape[-1:], eps=self.options.norm_eps))
        return self.to_out(nn.functional.silu(self.to_gate(x)) * normed.to(x.dtype))
