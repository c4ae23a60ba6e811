"""Gated DeltaNet: the delta rule with a data-dependent scalar decay per head (the gated delta rule).

Paper: Yang, Kautz, Hatamizadeh 2024, "Gated Delta Networks: Improving Mamba2 with Delta Rule",
arXiv:2412.06464 (the gated delta rule S_t = S_{t-1} (alpha_t (I - beta_t k_t k_t^T)) + beta_t v_t k_t^T in
their [e, k] orientation; its chunkwise form; the layer). Per head, S [k, e]:

    S_t = alpha_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T,   o_t = S_t^T q_t / sqrt(k)
    alpha_t = exp(g_t),   g_t = -exp(A_log) softplus(w_a . x_t + dt_bias)     (Mamba-2's decay)
    beta_t = sigmoid(w_b . x_t),   q, k L2-normalised after SiLU short convolutions
    out = W_o (RMSNorm(o) * silu(W_g x))   (per head: the output gate and norm of the paper)

The layer is :class:`zoo.attention.deltanet.DeltaNet` plus the decay (A_log, dt_bias, a_proj) and the output
gate on by default, following flash-linear-attention's ``fla/layers/gated_deltanet.py`` (the paper's code,
NVlabs/GatedDeltaNet, builds on it): ``expand_v`` 2 and ``head_dim`` 256 there (here ``head_dim`` 0 means
d_model / n_heads, ``expand_v`` defaults to 2 as there), A ~ U(0, 16) and dt ~ logU(0.001, 0.1) at init
(dt_bias = softplus^-1(dt)). Options: as DeltaNet's, ``use_gate`` defaulting to True.

Shapes: x [b, t, d] -> q, k [b, h, t, k], v [b, h, t, e], beta, g [b, h, t] -> o [b, h, t, e] -> [b, t, d].

Deviations: as DeltaNet's. Qwen3-Next's layer (HF transformers, the whole-layer reference of the tests) fuses
the q, k, v, gate and a, b projections into two matrices laid out by key-head group; the numbers are the
same with the weights copied (tests/parts/test_gated_deltanet.py), its RMSNorm eps is 1e-6 (``norm_eps``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from zoo.attention.base import ATTENTION
from zoo.attention.deltanet import DeltaNet, DeltaOptions


@dataclass
class GatedDeltaOptions(DeltaOptions):
    expand_v: float = 2.0
    use_gate: bool = True


@ATTENTION.register("gated_deltanet")
class GatedDeltaNet(DeltaNet):
    Options = GatedDeltaOptions

    def __init__(self, d_model: int, n_heads: int, **kwargs):
        super().__init__(d_model, n_heads, **kwargs)
        h = n_heads
        self.a_proj = nn.Linear(d_model, h, bias=False)
        self.A_log = nn.Parameter(torch.empty(h).uniform_(0, 16).log())
        dt = torch.exp(torch.rand(h) * (math.log(0.1) - math.log(0.001)) + math.log(0.001)).clamp(min=1e-4)
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))  # softplus(dt_bias) = dt

    def decay(self, x: Tensor) -> Tensor:
        """g = -exp(A_log) softplus(W_a x + dt_bias) [b, h, t] (float32 at least: it is cumulated)."""
        a = self.a_proj(x).float() if x.dtype != torch.float64 else self.a_proj(x)
        g = -self.A_log.to(a.dtype).exp() * F.softplus(a + self.dt_bias.to(a.dtype))
        return rearrange(g, "b t h -> b h t")
