"""Performer: softmax attention approximated by positive orthogonal random features (FAVOR+).

Paper: "Rethinking Attention with Performers", Choromanski, Likhosherstov, Dohan, Song, Gane, Sarlos,
Hawkins, Davis, Mohiuddin, Kaiser, Belanger, Colwell, Weller 2020, arXiv:2009.14794, Sections 2.2-2.4.

exp(q . k / sqrt(k)) = E_w[phi(q') phi(k')] with x' = x / k^(1/4) and the positive features (Lemma 1)

    phi(x) = exp(-|x|^2 / 2) / sqrt(M) [exp(w_1 . x), ..., exp(w_M . x)],

w_1..w_M drawn as blocks of k orthogonal directions (Gram-Schmidt via QR) with Gaussian norms
(Section 2.4, "orthogonal random features"). Attention is then kernelised (``kernelized.py``):
out_i = phi(q_i)^T sum_j phi(k_j) v_j^T / phi(q_i)^T sum_j phi(k_j), O(t M k) per head, never t x t; the
causal form is the prefix-sum one (Section 2.6 / Fig. 1), chunked so no [t, M, k] tensor is kept.

Feature redraw: in training, every ``redraw_interval`` forward calls the layer draws fresh features
(from torch's generator, so a seeded run redraws the same); never in eval. The features are a buffer,
saved with the model. Streaming (causal): the state pins the features the stream started with
(``KernelState.features``) and every later call of that stream uses them, so a redraw between calls
never changes the map mid-stream; the state is M x k + M numbers per head, constant.

Shapes: x [b, t, d] -> q, k, v [b, h, t, k]; features [M, k] shared by the heads;
phi(q), phi(k) [b, h, t, M] -> out [b, t, d].

Stabilisers (they cancel in the ratio except through ``feature_eps``): each query's exponents are shifted
by their largest w . q', as in the authors' and performer-pytorch's code; keys, bidirectional, by the
largest w . k' over the real keys of the row (theirs: over all keys, padded ones included), and, causal,
by the data-independent bound max_r |w_r|^2 / 2 >= w . x - |x|^2 / 2, so no key's features depend on
later tokens and a stream keeps one scale. ``feature_eps`` is added to every feature after the exponential
(authors' code 1e-6, performer-pytorch 1e-4). Deviations: the ReLU "generalized attention" kernel is not
offered; there are no attention weights, so attention dropout is not applied.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from zoo.attention.base import ATTENTION, FlopCount
from zoo.attention.kernelized import KernelizedAttention, KernelState, kernel_flops
from zoo.attention.recompute import recomputing
from zoo.config import require


def orthogonal_features(m: int, k: int, orthogonal: bool = True, device=None) -> Tensor:
    """[m, k] random projection: rows in blocks of k orthonormal directions, each scaled by the norm
    of a k-dimensional Gaussian (so every row has a Gaussian's length distribution); iid Gaussian rows
    when ``orthogonal`` is False."""
    if not orthogonal:
        return torch.randn(m, k, device=device)
    blocks = []
    for _ in range(-(-m // k)):
        q, _ = torch.linalg.qr(torch.randn(k, k, device=device))
        blocks.append(q.T)  # rows orthonormal
    directions = torch.cat(blocks)[:m]
    return directions * torch.randn(m, k, device=device).norm(dim=1, keepdim=True)


@ATTENTION.register("performer")
class PerformerAttention(KernelizedAttention):
    lra_row = "Performer"

    @dataclass
    class Options:
        n_features: int = 256  # M, random features per head
        orthogonal: bool = True  # orthogonal random features (FAVOR+); False = iid Gaussian
        redraw_interval: int = 1000  # training forward calls between redraws; 0 = never redraw
        feature_eps: float = 1e-6  # added to every feature after the exponential
        eps: float = 0.0  # added to the denominator (0: none, as in the paper)
        bias: bool = True  # bias in the q/k/v/output projections

        def __post_init__(self) -> None:
            require(self.n_features >= 1, f"n_features must be >= 1, got {self.n_features}")
            require(self.redraw_interval >= 0, f"redraw_interval must be >= 0 (0 = never), got {self.redraw_interval}")
            require(self.feature_eps >= 0, f"feature_eps must be >= 0, got {self.feature_eps}")
            require(self.eps >= 0, f"eps must be >= 0, got {self.eps}")

    @classmethod
    def contract_options(cls) -> dict:
        return {"n_features": 16}

    def __init__(self, d_model: int, n_heads: int, **kwargs):
        super().__init__(d_model, n_heads, **kwargs)
        o = self.options
        self.register_buffer("features", orthogonal_features(o.n_features, self.head_dim, o.orthogonal))
        # training forward calls so far: a buffer, so a resumed run keeps the redraw schedule
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))

    def feature_dim(self) -> int:
        return self.options.n_features

    def redraw(self) -> None:
        """Fresh random features, drawn from torch's generator."""
        o = self.options
        self.features.copy_(orthogonal_features(o.n_features, self.head_dim, o.orthogonal, self.features.device))

    def feature_map(self, x: Tensor, features: Tensor, *, query: bool, pad_mask: Tensor | None = None) -> Tensor:
        """phi(x / k^(1/4)) [b, h, t, M] for x [b, h, t, k] under ``features`` [M, k] (see the module doc)."""
        x = x * self.head_dim**-0.25
        projected = torch.einsum("bhtk,mk->bhtm", x, features.to(x.dtype))
        exponent = projected - (x**2).sum(-1, keepdim=True) / 2
        if query:
            stabiliser = projected.amax(-1, keepdim=True)
        elif self.causal:
            stabiliser = (features.to(x.dtype) ** 2).sum(-1).max() / 2
        else:  # the largest w . x' over the real keys of each (row, head)
            real = projected if pad_mask is None else projected.masked_fill(~pad_mask[:, None, :, None], -math.inf)
            stabiliser = real.amax(dim=(-1, -2), keepdim=True).clamp_min(-1e30)  # all padding: any finite scale
        return (torch.exp(exponent - stabiliser) + self.options.feature_eps) / math.sqrt(features.shape[0])

    def forward_flops(self, t: int) -> FlopCount:
        m, k, h = self.options.n_features, self.head_dim, self.n_heads
        return FlopCount(
            {
                "projections": t * self.projection_flops(),
                "random features": h * 2 * (2.0 * t * m * k),  # w . q' and w . k'
                **kernel_flops(t, m, k, h, self.causal),
            }
        )

    def feature_maps(
        self, q: Tensor, k: Tensor, pad_mask: Tensor | None, state: KernelState | None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """FAVOR+ features of q and k under this call's random features: a stream's pinned ones (its first
        call pins the layer's current draw), else the layer's, redrawn on schedule in training."""
        if self.training:
            if not recomputing():  # backward running this forward again (zoo.attention.recompute) is no new call
                self.calls += 1
            # recomputed: the same draw again (the generator is replayed), so the same features
            if self.options.redraw_interval and int(self.calls) % self.options.redraw_interval == 0:
                self.redraw()
        features = self.features
        if state is not None:
            features = state.features if state.features is not None else self.features.detach().clone()
        phi_q = self.feature_map(q, features, query=True)
        return phi_q, self.feature_map(k, features, query=False, pad_mask=pad_mask), features
