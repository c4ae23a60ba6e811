"""Nyströmformer: softmax attention through m landmarks and an iterative pseudo-inverse.

Paper: "Nyströmformer: A Nyström-Based Algorithm for Approximating Self-Attention", Xiong, Zeng,
Chakraborty, Tan, Fung, Li, Singh 2021, arXiv:2102.03902, Section 3 (eqs. 13-16, Algorithm 1).

    softmax(Q K^T / sqrt(k)) V ~ softmax(Q K~^T) pinv(softmax(Q~ K~^T)) softmax(Q~ K^T) V

(q and k each scaled by k^(-1/4)), with landmarks Q~, K~ [m, k] the means of m contiguous segments of
the queries and keys (Section 3.3), and pinv the Newton-Schulz-type iteration of eq. 16,
Z_{j+1} = Z_j (13 I - A Z_j (15 I - A Z_j (7 I - A Z_j))) / 4, started at Z_0 = A^T / max_i sum_r A_ri
(the column-sum scale the authors' repository recommends, per matrix). A depthwise convolution of the
values along the sequence (kernel ``conv_kernel``, one filter per head) is added as a skip (Section 4,
as in their code). Cost O(t m) per head: the t x m and m x t kernels, never t x t.

Segments: position i belongs to segment floor(i m / t), so every segment holds t/m positions (within
one) and none is empty when t >= m; a length that divides by m gives the authors' equal segments. A
landmark is the mean of the real (unpadded) positions of its segment; a segment that is all padding
gives no landmark (its column is masked out of both kernels and its row of the m x m kernel is the unit
row, which leaves the pseudo-inverse of the real landmarks unchanged). A sequence of t <= m positions
is attended exactly, as the paper does when m = t.

Shapes: x [b, t, d] -> q, k, v [b, h, t, k]; landmarks [b, h, m, k]; kernels [b, h, t, m], [b, h, m, m],
[b, h, m, t] -> out [b, t, d].

Deviations: padding. The authors' LRA code zeroes padded queries and keys and averages them into the
landmarks as zeros; ours averages the real positions only, so padding changes nothing (checked by the
contract suite). Their original initialisation (one scale over the whole batch) makes a row depend on
the others and is not offered. Attention dropout is not applied (their LRA code applies none to the
three kernels either). No causal form: a landmark averages later tokens, and the paper gives none.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from zoo.attention.base import ATTENTION, Attention, AttnOutput, FlopCount, KeysPerQuery, dense_keys, guard_empty_rows
from zoo.config import require


def iterative_pinv(a: Tensor, iterations: int) -> Tensor:
    """Approximate Moore-Penrose inverse of a [..., m, m] (eq. 16), Z_0 = A^T / (largest column sum)."""
    eye = torch.eye(a.shape[-1], dtype=a.dtype, device=a.device)
    z = a.transpose(-1, -2) / a.sum(-2).amax(-1)[..., None, None]
    for _ in range(iterations):
        az = a @ z
        z = 0.25 * z @ (13 * eye - az @ (15 * eye - az @ (7 * eye - az)))
    return z


def masked_softmax(scores: Tensor, allowed: Tensor) -> Tensor:
    """softmax over the last axis of scores where ``allowed`` (broadcastable); a row with nothing allowed is 0."""
    probs = torch.softmax(scores.masked_fill(~guard_empty_rows(allowed), float("-inf")), dim=-1)
    return probs * allowed.any(-1, keepdim=True)


@ATTENTION.register("nystromformer")
class NystromAttention(Attention):
    no_packing_reason = "its landmarks average segments of the whole row, which mixes documents"
    projection_features = ("grouped_kv", "qk_norm")  # keeps no state: keys widened once projected
    no_projection_reason = "its three kernels are softmaxes over landmark means, not one score per pair to cap"
    position_kinds = ()
    no_position_reason = "its landmarks average many positions, which have no single distance to a query"
    supports_causal = False
    no_causal_reason = "its landmarks are segment means that include later tokens; the paper gives no causal form"
    lra_row = "Nyströmformer"

    @dataclass
    class Options:
        landmarks: int = 64  # m
        pinv_iterations: int = 6  # iterations of eq. 16
        conv_kernel: int = 33  # depthwise convolution skip over the values (odd; 0 = none)
        bias: bool = True  # bias in the q/k/v/output projections

        def __post_init__(self) -> None:
            require(self.landmarks >= 1, f"landmarks must be >= 1, got {self.landmarks}")
            require(self.pinv_iterations >= 1, f"pinv_iterations must be >= 1, got {self.pinv_iterations}")
            require(
                self.conv_kernel == 0 or (self.conv_kernel > 0 and self.conv_kernel % 2 == 1),
                f"conv_kernel must be an odd kernel width or 0 (no skip), got {self.conv_kernel}",
            )

    @classmethod
    def contract_options(cls) -> dict:
        return {"landmarks": 4, "conv_kernel": 3}

    def __init__(self, d_model: int, n_heads: int, **kwargs):
        super().__init__(d_model, n_heads, **kwargs)
        self.add_projections(bias=self.options.bias)
        width = self.options.conv_kernel
        self.conv = None
        if width:  # one filter per head, along the sequence (the [t, k] plane, kernel width x 1)
            self.conv = nn.Conv2d(n_heads, n_heads, (width, 1), padding=(width // 2, 0), groups=n_heads, bias=False)

    def keys_per_query(self, t: int) -> KeysPerQuery:
        keys = dense_keys(t, False)
        return KeysPerQuery(keys.keys, f"every key, through {min(self.options.landmarks, t)} landmarks")

    def forward_flops(self, t: int) -> FlopCount:
        m, d, h = min(self.options.landmarks, t), self.d_model, self.n_heads
        flops = {
            "projections": t * self.projection_flops(),
            "landmark kernels": 2.0 * t * m * d * 4,  # Q K~, Q~ K, (Q~ K) V, and the read-out
            "pseudo-inverse": h * (2.0 * m**3 * (1 + 4 * self.options.pinv_iterations) + 2.0 * t * m * m),
        }
        if self.conv is not None:
            flops["convolution"] = 2.0 * t * self.options.conv_kernel * d
        return FlopCount(flops)

    def forward(
        self, x: Tensor, *, context: Tensor | None = None, pad_mask: Tensor | None = None, state=None
    ) -> AttnOutput:
        self.check_inputs(x, context, pad_mask, state)
        b, t = x.shape[:2]
        q, k, v = (self.split_heads(proj(x)) for proj in (self.to_q, self.to_k, self.to_v))
        k, v = self.expand_kv(k, v)
        valid = torch.ones(b, t, dtype=torch.bool, device=x.device) if pad_mask is None else pad_mask
        keep = valid[:, None, :, None].to(x.dtype)
        scale = self.head_dim**-0.25
        q, k, v = q * scale * keep, k * scale * keep, v * keep
        if t <= self.options.landmarks:  # m >= t: exact attention is no dearer than the approximation
            out = masked_softmax(q @ k.transpose(-1, -2), valid[:, None, None, :]) @ v
        else:
            out = self.nystrom(q, k, v, valid)
        if self.conv is not None:
            out = out + self.conv(v)
        return AttnOutput(self.to_out(self.merge_heads(out)))

    def nystrom(self, q: Tensor, k: Tensor, v: Tensor, valid: Tensor) -> Tensor:
        """Eq. 15 on scaled q, k (padded rows zero) and masked v [b, h, t, k] with valid [b, t] -> [b, h, t, k]."""
        t, m = q.shape[2], self.options.landmarks
        segment = torch.arange(t, device=q.device) * m // t  # floor(i m / t)
        member = F.one_hot(segment, m).to(q.dtype)  # [t, m]
        counts = valid.to(q.dtype) @ member  # [b, m]: real positions per segment
        has = counts > 0
        mean = member / counts.clamp_min(1)[:, None, :]  # [b, t, m]
        q_land = torch.einsum("bhtk,btm->bhmk", q, mean)
        k_land = torch.einsum("bhtk,btm->bhmk", k, mean)
        kernel_1 = masked_softmax(q @ k_land.transpose(-1, -2), has[:, None, None, :])  # [b, h, t, m]
        kernel_2 = masked_softmax(q_land @ k_land.transpose(-1, -2), has[:, None, None, :])  # [b, h, m, m]
        unit = torch.eye(m, dtype=q.dtype, device=q.device)
        kernel_2 = torch.where(has[:, None, :, None], kernel_2, unit)  # no landmark: the unit row
        kernel_3 = masked_softmax(q_land @ k.transpose(-1, -2), valid[:, None, None, :])  # [b, h, m, t]
        return (kernel_1 @ iterative_pinv(kernel_2, self.options.pinv_iterations)) @ (kernel_3 @ v)
