"""Mamba-2's SSD layer as the block's mixer: a selective state space with a scalar decay per head, computed
chunkwise (state space duality).

Paper: Dao & Gu 2024, "Transformers are SSMs: Generalized Models and Efficient Algorithms Through
Structured State Space Duality", arXiv:2405.21060 (the SSD recurrence and its chunked algorithm; the Mamba-2
block). Per head h with state S [n, p] (n = ``d_state``, p the head dim):

    [z | x B C | dt] = W_in u,   x B C <- silu(conv1d(x B C))          (the short convolution)
    dt_t = softplus(dt_t + dt_bias),   a_t = exp(dt_t A),   A = -exp(A_log)
    S_t = a_t S_{t-1} + B_t (dt_t x_t)^T,   y_t = S_t^T C_t + D x_t     (B, C shared by the heads of a group)
    out = W_out RMSNorm_grouped(y * silu(z))

In the terms of ``delta_chunks.py``: q = C, k = B, v = dt x, g = dt A, no beta; its chunk form is the SSD
algorithm (the diagonal blocks C B^T * L inside a chunk, the states passed between chunks). The layout of the
parameters is mamba_ssm's ``Mamba2`` (and HF's ``Mamba2Mixer``): one ``in_proj``, one ``conv1d`` over
[x | B | C] with bias, ``dt_bias``, ``A_log``, ``D``, the grouped gated RMSNorm, ``out_proj``.

Options as mamba_ssm names them: ``d_state`` (N), ``expand`` (d_inner = expand x d_model), ``n_groups``
(ngroups: heads sharing one B and C), ``chunk_size``, ``conv_size`` (d_conv), ``bias`` (in/out projections),
``conv_bias``, ``norm_eps``. The heads are the block's ``n_heads``, so the head dim is d_inner / n_heads
(mamba_ssm fixes headdim = 64 and derives the heads; set n_heads = d_inner / 64 for its layout). Init as
mamba_ssm: A ~ U(1, 16), dt ~ logU(0.001, 0.1), D = 1.

Shapes: x [b, t, d] -> q = C, k = B [b, h, t, n], v = dt x [b, h, t, p], g [b, h, t] -> y [b, h, t, p] ->
[b, t, d]. Cost: O(t C (n + p) + t n p) per head; streaming keeps S and the convolution tail.

Deviations: ``dt_limit`` (a clamp of dt, (0, inf) by default in mamba_ssm and HF) is not offered. At a padded
position the state is neither written nor decayed (k = 0, g = 0); HF's Mamba2Mixer zeroes x, B and C there but
still decays the state by exp(dt A), so a real token after padding differs from it (the tests compare without
padding, and say so).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from einops import rearrange, repeat
from torch import Tensor, nn

from zoo.attention.base import ATTENTION, FlopCount
from zoo.attention.short_conv import ShortConv
from zoo.attention.state_mixer import RecurrenceInputs, StateMixer, rms_norm
from zoo.config import require


@ATTENTION.register("mamba2")
class Mamba2(StateMixer):
    @dataclass
    class Options:
        d_state: int = 128  # N
        expand: int = 2  # d_inner = expand x d_model
        n_groups: int = 1  # heads per group share B and C
        chunk_size: int = 256  # mamba_ssm's default
        conv_size: int = 4  # d_conv
        bias: bool = False  # in_proj / out_proj bias
        conv_bias: bool = True
        norm_eps: float = 1e-5

        def __post_init__(self) -> None:
            for key in ("d_state", "expand", "n_groups", "chunk_size", "conv_size"):
                require(getattr(self, key) >= 1, f"{key} must be >= 1, got {getattr(self, key)}")
            require(self.norm_eps > 0, f"norm_eps must be > 0, got {self.norm_eps}")

    def __init__(self, d_model: int, n_heads: int, **kwargs):
        super().__init__(d_model, n_heads, **kwargs)
        o = self.options
        self.d_inner = o.expand * d_model
        require(
            self.d_inner % n_heads == 0 and n_heads % o.n_groups == 0,
            f"mamba2: d_inner = expand x d_model = {self.d_inner} must divide into n_heads={n_heads}, and n_heads "
            f"into n_groups={o.n_groups}",
        )
        self.p = self.d_inner // n_heads
        conv_dim = self.d_inner + 2 * o.n_groups * o.d_state
        self.in_proj = nn.Linear(d_model, self.d_inner + conv_dim + n_heads, bias=o.bias)
        self.conv = ShortConv(conv_dim, o.conv_size, bias=o.conv_bias)
        dt = torch.exp(torch.rand(n_heads) * (math.log(0.1) - math.log(0.001)) + math.log(0.001)).clamp(min=1e-4)
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))  # softplus(dt_bias) = dt
        self.A_log = nn.Parameter(torch.empty(n_heads).uniform_(1, 16).log())
        self.D = nn.Parameter(torch.ones(n_heads))
        self.norm = nn.Parameter(torch.ones(self.d_inner))
        self.out_proj = nn.Linear(self.d_inner, d_model, bias=o.bias)

    def project(self, x: Tensor) -> tuple[Tensor, Any]:
        z, xbc, dt = self.in_proj(x).split([self.d_inner, self.conv.conv.in_channels, self.n_heads], -1)
        return xbc, (z, dt)

    def split(self, xbc: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """[b, t, d_inner + 2 G N] -> x [b, h, t, p], B and C [b, h, t, n] (each group's repeated over its heads)."""
        gn = self.options.n_groups * self.options.d_state
        x, b, c = xbc.split([self.d_inner, gn, gn], -1)
        per_group = self.n_heads // self.options.n_groups
        b, c = (repeat(y, "b t (g n) -> b (g r) t n", g=self.options.n_groups, r=per_group) for y in (b, c))
        return rearrange(x, "b t (h p) -> b h t p", h=self.n_heads), b, c

    def step(self, dt: Tensor) -> Tensor:
        """dt = softplus(dt + dt_bias) [b, h, t], float32 at least (it is cumulated in the decay)."""
        dt = dt.float() if dt.dtype != torch.float64 else dt
        return rearrange(F.softplus(dt + self.dt_bias.to(dt.dtype)), "b t h -> b h t")

    def recurrence_inputs(self, mixed: Tensor, rest: Any) -> RecurrenceInputs:
        x, b, c = self.split(mixed)
        dt = self.step(rest[1])
        g = -self.A_log.to(dt.dtype).exp()[:, None] * dt
        return RecurrenceInputs(c, b, x * dt[..., None].to(x.dtype), None, g)

    def read_out(self, o: Tensor, mixed: Tensor, rest: Any) -> Tensor:
        x = self.split(mixed)[0]
        y = rearrange(o + self.D[:, None, None].to(o.dtype) * x, "b h t p -> b t (h p)")
        y = y * F.silu(rest[0])  # gate before the norm (mamba_ssm's norm_before_gate=False)
        groups = rearrange(y, "b t (g f) -> b t g f", g=self.options.n_groups)
        weight = rearrange(self.norm, "(g f) -> g f", g=self.options.n_groups)
        return self.out_proj(rearrange(rms_norm(groups, weight, self.options.norm_eps), "b t g f -> b t (g f)"))

    def forward_flops(self, t: int) -> FlopCount:
        c, n, p, h = min(self.options.chunk_size, t), self.options.d_state, self.p, self.n_heads
        # per chunk: C B^T and its product with V (C^2 n + C^2 p); per token: C S and B^T V (2 n p)
        recurrence = 2.0 * h * t * (c * (n + p) + 2 * n * p)
        return FlopCount({"projections": t * self.projection_flops(), "recurrence": recurrence})

    @classmethod
    def contract_options(cls) -> dict[str, Any]:
        return {**super().contract_options(), "d_state": 8}
