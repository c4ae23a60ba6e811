"""DeltaNet: linear attention whose state is written by the delta rule, trained chunkwise.

Papers: Schlag, Irie, Schmidhuber 2021, "Linear Transformers Are Secretly Fast Weight Programmers",
arXiv:2102.11174 (the delta rule); Yang, Wang, Zhang, Shen, Kim 2024, "Parallelizing Linear
Transformers with the Delta Rule over Sequence Length", arXiv:2406.06484 (the chunkwise form by the WY
representation / UT transform, Section 3; the layer: L2-normalised q and k,
SiLU short convolutions, a per-head output norm). Per head, with S [k, e]:

    S_t = S_{t-1} + k_t (beta_t (v_t - S_{t-1}^T k_t))^T = (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T
    o_t = S_t^T q_t / sqrt(k),   beta_t = sigmoid(w_beta . x_t),   q, k L2-normalised after the convolution

then RMSNorm of o per head, and the output projection. The layer follows flash-linear-attention's
``fla/layers/delta_net.py`` (the paper's code): q, k, v projections without bias, each through its own
SiLU short convolution (one depthwise convolution over [q | k | v] here, the same numbers), beta from a
projection of x, ``use_gate`` (off by default, as there) multiplies the normed output by silu(W_g x).

Options as the papers and that code name them: ``head_dim`` (key dim per head, 0 = d_model / n_heads),
``expand_v`` (value dim = expand_v x head_dim), ``chunk_size`` (C), ``use_short_conv``, ``conv_size``,
``use_beta`` (False: beta = 1), ``use_gate``, ``norm_eps``.

Shapes: x [b, t, d] -> q, k [b, h, t, k], v [b, h, t, e], beta [b, h, t] -> o [b, h, t, e] -> [b, t, d].
Cost: O(t C (k + e) + t k e) per head (``delta_chunks.py``); streaming keeps S and the convolution tail.

Deviations: without the short convolution, q, k and v pass through SiLU, as flash-linear-attention does
(the paper does not say). The L2 norm is x / sqrt(|x|^2 + 1e-6), flash-linear-attention's. Padded positions
write nothing to the state (their key is zeroed), where flash-linear-attention drops them from the
sequence (unpadding): the same result for real positions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from zoo.attention.base import ATTENTION, FlopCount
from zoo.attention.delta_chunks import l2_normalise
from zoo.attention.state_mixer import RecurrenceInputs, StateMixer, rms_norm, short_conv
from zoo.config import require


@dataclass
class DeltaOptions:
    head_dim: int = 0  # key dim per head; 0 = d_model / n_heads
    expand_v: float = 1.0  # value dim per head = expand_v x head_dim
    chunk_size: int = 64  # C: positions per chunk of the chunkwise form
    use_short_conv: bool = True
    conv_size: int = 4
    use_beta: bool = True  # False: beta = 1 (the plain delta rule of Schlag et al.)
    use_gate: bool = False  # output gate silu(W_g x) after the norm
    norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        require(self.head_dim >= 0, f"head_dim must be >= 0 (0 = d_model / n_heads), got {self.head_dim}")
        require(self.expand_v > 0, f"expand_v must be > 0, got {self.expand_v}")
        require(self.chunk_size >= 1, f"chunk_size must be >= 1, got {self.chunk_size}")
        require(self.conv_size >= 1, f"conv_size must be >= 1, got {self.conv_size}")
        require(self.norm_eps > 0, f"norm_eps must be > 0, got {self.norm_eps}")


@ATTENTION.register("deltanet")
class DeltaNet(StateMixer):
    Options = DeltaOptions

    def __init__(self, d_model: int, n_heads: int, **kwargs):
        super().__init__(d_model, n_heads, **kwargs)
        o = self.options
        self.key_dim = o.head_dim or self.head_dim
        value_dim = o.expand_v * self.key_dim
        require(
            value_dim == int(value_dim),
            f"{self.registry_name}: expand_v={o.expand_v} x head_dim={self.key_dim} is not a whole value dim",
        )
        self.value_dim = int(value_dim)
        h, k, e = n_heads, self.key_dim, self.value_dim
        self.q_proj = nn.Linear(d_model, h * k, bias=False)
        self.k_proj = nn.Linear(d_model, h * k, bias=False)
        self.v_proj = nn.Linear(d_model, h * e, bias=False)
        self.b_proj = nn.Linear(d_model, h, bias=False) if o.use_beta else None
        self.g_proj = nn.Linear(d_model, h * e, bias=False) if o.use_gate else None
        self.conv = short_conv(h * (2 * k + e), o)
        self.o_norm = nn.Parameter(self.q_proj.weight.new_ones(e))  # per-head RMSNorm weight [e]
        self.o_proj = nn.Linear(h * e, d_model, bias=False)

    def project(self, x: Tensor) -> tuple[Tensor, Any]:
        return torch.cat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], -1), x

    def split(self, mixed: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """[b, t, h (2k + e)] -> q, k [b, h, t, k], v [b, h, t, e], SiLU applied where no convolution did."""
        if self.conv is None:
            mixed = F.silu(mixed)
        hk = self.n_heads * self.key_dim
        q, k, v = mixed.split([hk, hk, mixed.shape[-1] - 2 * hk], -1)
        return tuple(rearrange(y, "b t (h f) -> b h t f", h=self.n_heads) for y in (q, k, v))

    def beta(self, x: Tensor) -> Tensor:
        """beta [b, h, t] in (0, 1), or 1 without ``use_beta``."""
        if self.b_proj is None:
            return x.new_ones(x.shape[0], self.n_heads, x.shape[1])
        return rearrange(self.b_proj(x).sigmoid(), "b t h -> b h t")

    def decay(self, x: Tensor) -> Tensor | None:
        """The log-decay g [b, h, t]: none in DeltaNet."""
        return None

    def recurrence_inputs(self, mixed: Tensor, rest: Any) -> RecurrenceInputs:
        q, k, v = self.split(mixed)
        q = l2_normalise(q) * self.key_dim**-0.5
        return RecurrenceInputs(q, l2_normalise(k), v, self.beta(rest), self.decay(rest))

    def read_out(self, o: Tensor, mixed: Tensor, rest: Any) -> Tensor:
        o = rms_norm(rearrange(o, "b h t e -> b t h e"), self.o_norm, self.options.norm_eps)
        if self.g_proj is not None:
            o = o * F.silu(rearrange(self.g_proj(rest), "b t (h e) -> b t h e", h=self.n_heads))
        return self.o_proj(rearrange(o, "b t h e -> b t (h e)"))

    def forward_flops(self, t: int) -> FlopCount:
        c = min(self.options.chunk_size, t)
        k, e, h = self.key_dim, self.value_dim, self.n_heads
        # per chunk of C: K K^T and the triangular solve (C^2 k + C^2 (k + e)), Q K^T and its product with
        # V_new (C^2 k + C^2 e); per token: W S, Q S and K^T V_new (3 k e)
        recurrence = 2.0 * h * t * (c * (3 * k + 2 * e) + 3 * k * e)
        return FlopCount({"projections": t * self.projection_flops(), "recurrence": recurrence})
