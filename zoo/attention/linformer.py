"""Linformer: keys and values projected along the length to k rows, so attention is t x k.

Paper: "Linformer: Self-Attention with Linear Complexity", Wang, Li, Khabsa, Fang, Ma 2020,
arXiv:2006.04768, Section 4 (eq. 7) and "Additional Efficiency Techniques".

    head_i = softmax(Q_i (E_i K_i)^T / sqrt(d_k)) (F_i V_i),   E_i, F_i in R^{k x n}

where n (``max_len``) is the longest sequence the layer takes: one learned k x n matrix per projection
(left 0, it is the model's max_len, which the app raises to the task's sequence length).
Cost O(t k) scores per head, never t x t. Sharing (``sharing``), as the paper lists them:

- ``none``: E_i and F_i per head;
- ``headwise``: one E and one F per layer, for every head;
- ``kv``: one E per layer for keys and values and every head (E = F);
- ``layerwise``: one E for every layer, head, keys and values (the stack ties later layers to the
  first through ``share_with``).

A sequence shorter than n uses the first t columns of E: exactly what padding it to n with zero
keys and values gives (padded keys are zeroed before the projection, so they add nothing). A
sequence longer than n is refused: E has no columns for it.

Shapes: x [b, t, d] -> q, k, v [b, h, t, k_h]; E [h or 1, k, n]; E K, F V [b, h, k, k_h];
scores [b, h, t, k] -> out [b, t, d].

Deviations: none in the maths. The projections start as N(0, 1/k) (the paper's Johnson-Lindenstrauss
argument uses such a matrix; mlpen's LRA code uses N(0, 0.02^2)). No causal form: E mixes every position
into each projected key, and the paper gives none, so ``causal=True`` is refused.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from zoo.attention.base import ATTENTION, Attention, AttnOutput, FlopCount, KeysPerQuery, dense_keys, require_length
from zoo.config import require

SHARING = ("none", "headwise", "kv", "layerwise")


@ATTENTION.register("linformer")
class LinformerAttention(Attention):
    no_packing_reason = "projects the whole row's keys onto k summaries, which mixes every document of the row"
    projection_features = ("grouped_kv", "qk_norm")  # keeps no state: keys widened once projected
    no_projection_reason = "its scores go through fused SDPA kernels and are never written out to cap"
    position_kinds = ()
    no_position_reason = (
        "its keys are projected along the length to k mixtures of positions, which have no distance to a query"
    )
    supports_causal = False
    no_causal_reason = (
        "Linformer's length projection mixes every position into each projected key; the paper gives no causal form"
    )
    length_option = "max_len"
    lra_row = "Linformer"

    @dataclass
    class Options:
        k: int = 256  # projected length
        max_len: int = 0  # n, the longest sequence (columns of E and F); 0 = the model's max_len
        sharing: str = "headwise"  # none | headwise | kv | layerwise
        bias: bool = True  # bias in the q/k/v/output projections

        def __post_init__(self) -> None:
            require(self.k >= 1, f"k must be >= 1, got {self.k}")
            require(self.max_len >= 0, f"max_len must be >= 0 (0 = the model's max_len), got {self.max_len}")
            require(self.sharing in SHARING, f"sharing must be one of {', '.join(SHARING)}; got {self.sharing!r}")

    @classmethod
    def contract_options(cls) -> dict:
        return {"k": 8, "max_len": 96}

    def __init__(self, d_model: int, n_heads: int, **kwargs):
        super().__init__(d_model, n_heads, **kwargs)
        self.add_projections(bias=self.options.bias)
        o = self.options
        require_length(o.max_len, "linformer")
        per_head = n_heads if o.sharing == "none" else 1

        def projection() -> nn.Parameter:
            return nn.Parameter(torch.randn(per_head, o.k, o.max_len) * o.k**-0.5)

        self.project_k = projection()  # E
        self.project_v = projection() if o.sharing in ("none", "headwise") else None  # F (else F = E)

    def share_with(self, first: Attention) -> None:
        """``layerwise``: every layer uses the first layer's E."""
        if self.options.sharing == "layerwise" and isinstance(first, LinformerAttention):
            require(
                first.project_k.shape == self.project_k.shape,
                "linformer: layerwise sharing needs one k x max_len in every layer; got "
                f"{tuple(first.project_k.shape)} "
                f"and {tuple(self.project_k.shape)}",
            )
            self.project_k = first.project_k

    def keys_per_query(self, t: int) -> KeysPerQuery:
        keys = dense_keys(t, False)
        return KeysPerQuery(keys.keys, f"every key, through {min(self.options.k, t)} projected keys")

    def forward_flops(self, t: int) -> FlopCount:
        k, d = self.options.k, self.d_model
        return FlopCount(
            {
                "projections": t * self.projection_flops(),
                "length projection": 2 * (2.0 * t * k * d),  # E K and F V
                "attention over projected keys": 2.0 * t * self.score_terms * d * k,
            }
        )

    def forward(
        self, x: Tensor, *, context: Tensor | None = None, pad_mask: Tensor | None = None, state=None
    ) -> AttnOutput:
        self.check_inputs(x, context, pad_mask, state)
        t, n = x.shape[1], self.options.max_len
        require(t <= n, f"linformer: sequence length {t} is longer than max_len={n}, the columns of its projection E")
        q, k, v = (self.split_heads(proj(x)) for proj in (self.to_q, self.to_k, self.to_v))
        k, v = self.expand_kv(k, v)
        if pad_mask is not None:  # a padded key or value adds nothing to E K, F V
            keep = pad_mask[:, None, :, None].to(k.dtype)
            k, v = k * keep, v * keep
        e = self.project_k[..., :t]
        f = e if self.project_v is None else self.project_v[..., :t]
        k = torch.einsum("hct,bhtk->bhck", e, k)  # [b, h, k, k_h]
        v = torch.einsum("hct,bhtk->bhck", f, v)
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0)
        return AttnOutput(self.to_out(self.merge_heads(out)))
