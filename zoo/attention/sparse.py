"""Factorised sparse attention: the strided and fixed patterns (the fixed one's class: ``sparse_fixed.py``).

Paper: "Generating Long Sequences with Sparse Transformers", Child, Gray, Radford, Sutskever 2019,
arXiv:1904.10509, Sections 4.2-4.3.

Each pattern is two sets of keys per query i (positions 0-based, l = stride, c = summary width):

- ``sparse_strided``: A1 = {j : max(0, i - l) <= j <= i} (the previous l positions and i),
  A2 = {j : (i - j) mod l = 0} (every l-th position back from i).
- ``sparse_fixed``: A1 = {j : floor(j / l) = floor(i / l)} (i's own block),
  A2 = {j : j mod l in {l - c, ..., l - 1}} (the last c "summary" positions of every block).

Causal (the paper's setting) intersects both with j <= i. Bidirectional (as Long Range Arena uses
it) drops that condition, which for strided A1 means the symmetric band |i - j| <= l.

The three ways of combining the two sets (Section 4.3), option ``combine``:

- ``interleaved``: one set per residual block, alternating with depth (A1 in even layers, A2 in
  odd ones, from ``layer_index``);
- ``union``: every head attends to A1 ∪ A2 under one softmax (the paper's "merged head");
- ``per_head``: the first half of the heads attend to A1, the other half to A2.

How it is computed (no t x t tensor anywhere; cost ~ t * (l + t / l), i.e. t * sqrt(t) for
l ~ sqrt(t)): the sequence is padded to T = R * l and seen as an R x l grid (row = block).
Strided A1 is a band: each block attends to itself and its previous block (and the next one when
bidirectional) under one static relative mask. Strided A2 is attention along the grid's columns,
one causal SDPA of length R per column. Fixed A1 is attention inside each block. Fixed A2 is
attention to the c * R summary keys, passed once and shared by all blocks (GQA); only the c
queries at the end of a block need a per-query mask (they see their own block's summaries up to
themselves), the rest use one mask row per block. The merged head computes the scores of both
parts (A2 restricted to keys outside A1, so nothing is counted twice) and normalises them
together with one softmax. Its scores cannot go through a fused kernel, so only q, k, v are kept
for backward and the scores are recomputed there (``recompute.py``).

Positions inside attention: rope rotates q and k before the pattern runs; a pair bias (ALiBi, T5) is
added to the pairs each part computes, from templates that repeat from block to block (the band's
[h, l, w], the columns' [h, R, R]); only the fixed pattern's summaries need a bias per query block
([h, n, l, n c], the size of that part's scores). The merged head takes them as inputs of its
recomputation, so a learned bias gets its gradient.

Deviations: a query whose set is empty (causal fixed A2 for the first l - c positions, or all its
keys padded) outputs 0, as the dense masked reference does; the paper does not say. ``stride=0``
picks l = ceil(sqrt(t)) per call, the paper's l ~ sqrt(n). The paper's block-sparse GPU kernels,
recomputation and mixed precision are not reproduced: on CPU the blocked formulation over fused
SDPA is the fast path (see BENCHMARKS.md).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import ClassVar

import torch
from einops import rearrange
from torch import Tensor

from zoo.attention.base import ATTENTION, KeysPerQuery, StateContract, at_most_segment
from zoo.attention.blocked import (
    PatternAttention,
    attend_groups,
    banded_attention,
    joint_softmax,
    key_validity,
    pad_time,
    padded_length,
    windows,
)
from zoo.attention.flex import check_backend
from zoo.attention.recompute import recompute_in_backward
from zoo.config import require

COMBINE = ("interleaved", "union", "per_head")


class FactorisedSparseAttention(PatternAttention):
    """Shared by the two patterns: padding to the stride and the three combinations.

    Subclasses implement ``first`` (A1), ``second`` (A2) and ``merged`` (A1 ∪ A2) on padded
    q, k, v [b, h, T, k] with key validity [b or 1, T]."""

    set_names: ClassVar[tuple[str, str]] = ("A1", "A2")  # what the two sets are called in keys_per_query's rule
    lra_row = "Sparse Trans."

    def __init__(self, d_model: int, n_heads: int, **kwargs):
        super().__init__(d_model, n_heads, **kwargs)
        name = self.registry_name
        require(
            self.options.combine != "per_head" or n_heads >= 2,
            f"{name}: combine='per_head' splits the heads between the two patterns and needs n_heads >= 2, got "
            f"{n_heads}",
        )

    @classmethod
    def contract_options(cls) -> dict:
        return {"stride": 4, "combine": "union"}

    @classmethod
    def contract_state(cls) -> StateContract:
        return StateContract(bound=None)  # the A2 set reaches back to the stream's start: the state grows

    # -- streaming (PatternCache, blocked.py) ---------------------------------------------------------
    def stream_refusal(self) -> str | None:
        if self.options.stride == 0:
            return (
                f"attention {self.registry_name!r} with stride=0 picks l = ceil(sqrt(t)) from each call's length, "
                "so a stream fed in pieces would change its pattern; set attention.stride to stream"
            )
        return super().stream_refusal()

    def sets_of_heads(self) -> tuple[bool, bool]:
        """Whether some head of this layer attends to A1, and whether some head attends to A2."""
        patterns = set(self.head_patterns())
        return any("A1" in p for p in patterns), any("A2" in p for p in patterns)

    def state_bound(self) -> int | None:
        """Bounded only when no head of this layer reads A2 (an interleaved layer of A1): A1's bound."""
        return None if self.sets_of_heads()[1] else self.first_bound()

    def shift_period(self) -> int | None:
        """Layers that read only A1 (bounded) repeat with the stride; the others read back to the start."""
        return self.options.stride if self.options.stride and self.state_bound() is not None else None

    def first_bound(self) -> int:
        """Earlier keys A1 lets a query at a position >= o see, at most."""
        raise NotImplementedError

    def first_allowed(self, i: Tensor, j: Tensor, stride: int) -> Tensor:
        """A1 over absolute positions (i query, j key; broadcastable) for stride l."""
        raise NotImplementedError

    def second_allowed(self, i: Tensor, j: Tensor, stride: int) -> Tensor:
        """A2 over absolute positions for stride l."""
        raise NotImplementedError

    def allowed(self, i: Tensor, j: Tensor) -> Tensor:
        """The heads' sets at the configured stride: [c, s], or [h, c, s] when the heads differ (per_head)."""
        rule, heads_differ = self.pair_rule(0)
        h = (
            torch.arange(self.n_heads, device=i.device)[:, None, None]
            if heads_differ
            else torch.zeros((), dtype=torch.long)
        )
        return rule(h, i, j)

    def pair_rule(self, t: int):
        """rule(head, i, j) for a call over t positions (the stride it picks when stride=0): a head's set
        A1, A2 or their union; per_head gives the first half A1 and the rest A2."""
        stride = self.stride_for(t)
        first = functools.partial(self.first_allowed, stride=stride)
        second = functools.partial(self.second_allowed, stride=stride)
        patterns = set(self.head_patterns())
        if patterns == {"A1|A2"}:
            return (lambda h, i, j: first(i, j) | second(i, j)), False
        if len(patterns) == 1:
            part = first if patterns == {"A1"} else second
            return (lambda h, i, j: part(i, j)), False
        half = self.n_heads // 2
        return (lambda h, i, j: torch.where(h < half, first(i, j), second(i, j))), True

    def stride_for(self, t: int) -> int:
        """l for a sequence of length t: the configured stride, or ceil(sqrt(t)) when stride=0."""
        return self.options.stride or max(1, math.ceil(math.sqrt(t)))

    def set_keys(self, t: int, stride: int) -> tuple[float, float]:
        """Average keys a query sees in A1 and in A2 over a segment of t (each pattern's own rule)."""
        raise NotImplementedError

    def keys_per_query(self, t: int) -> KeysPerQuery:
        """Per the heads' sets (``head_patterns``): union = A1 + A2 (their overlap is a key or two),
        interleaved = this layer's set, per_head = the mean over the heads."""
        a1, a2 = self.set_keys(t, self.stride_for(t))
        keys = {"A1": a1, "A2": a2, "A1|A2": a1 + a2}
        patterns = self.head_patterns()
        names = {"A1": self.set_names[0], "A2": self.set_names[1], "A1|A2": " + ".join(self.set_names)}
        rule = " / ".join(dict.fromkeys(names[p] for p in patterns)) + f" ({self.options.combine})"
        mean = sum(at_most_segment(keys[p], t, self.causal) for p in patterns) / len(patterns)
        return KeysPerQuery(mean, rule)

    def head_patterns(self) -> list[str]:
        """Which set each head attends to: "A1", "A2" or "A1|A2" (union). For tests and logging."""
        combine, h = self.options.combine, self.n_heads
        if combine == "union":
            return ["A1|A2"] * h
        if combine == "interleaved":
            return ["A1" if self.layer_index % 2 == 0 else "A2"] * h
        return ["A1"] * (h // 2) + ["A2"] * (h - h // 2)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, pad_mask: Tensor | None = None) -> Tensor:
        """The pattern's attention on projected heads: q, k, v [b, h, t, k] -> [b, h, t, k]."""
        t = q.shape[2]
        stride = self.stride_for(t)
        self.check_stride(stride)
        length = padded_length(t, stride)  # a length that does not suit the stride is padded, not refused
        q, k, v = (pad_time(x, length) for x in (q, k, v))
        valid = key_validity(pad_mask, t, length, q.device)
        padded = pad_mask is not None
        combine = self.options.combine
        if combine == "union":
            # the two explicit score tensors are recomputed in backward, not kept for every layer (a pair
            # bias goes in as an input, so that its gradient reaches T5's table)
            def merged(q: Tensor, k: Tensor, v: Tensor, valid: Tensor, *biases: Tensor | None) -> Tensor:
                return self.merged(q, k, v, valid, stride, *biases)

            biases = self.merged_biases(length, stride, q.dtype)
            out = recompute_in_backward(merged, q, k, v, valid, *biases, stochastic=self.training and self.dropout > 0)
        elif combine == "interleaved":
            part = self.first if self.layer_index % 2 == 0 else self.second
            out = part(q, k, v, valid, stride, padded)
        else:
            half = slice(None, self.n_heads // 2), slice(self.n_heads // 2, None)
            out = torch.cat(
                [
                    self.first(q[:, half[0]], k[:, half[0]], v[:, half[0]], valid, stride, padded, heads=half[0]),
                    self.second(q[:, half[1]], k[:, half[1]], v[:, half[1]], valid, stride, padded, heads=half[1]),
                ],
                dim=1,
            )
        return out[:, :, :t]

    def check_stride(self, stride: int) -> None:
        """Refuse a stride the pattern cannot use (the fixed pattern needs c <= l)."""

    def merged_biases(self, length: int, stride: int, dtype: torch.dtype) -> tuple[Tensor | None, Tensor | None]:
        """The pair bias of the merged head's two score tensors (see ``merged``), or (None, None)."""
        raise NotImplementedError


@ATTENTION.register("sparse_strided")
class StridedSparseAttention(FactorisedSparseAttention):
    takes_left_padding = True  # its pattern depends on i - j only

    @dataclass
    class Options:
        stride: int = 128  # l; 0 = ceil(sqrt(t)) for each call (the paper's l ~ sqrt(n))
        combine: str = "interleaved"  # interleaved | union | per_head (Section 4.3)
        bias: bool = True  # bias in the q/k/v/output projections
        backend: str = (
            "auto"  # auto (FlexAttention on CUDA) | native (blocked SDPA) | flex (FlexAttention; CPU: forward only)
        )

        def __post_init__(self) -> None:
            check_backend(self.backend, "backend")
            require(
                isinstance(self.stride, int) and self.stride >= 0,
                f"stride must be an int >= 0 (0 = ceil(sqrt(t))), got {self.stride!r}",
            )
            require(self.combine in COMBINE, f"combine must be one of {', '.join(COMBINE)}; got {self.combine!r}")

    set_names = ("band", "column")

    def first_bound(self) -> int:
        return self.options.stride  # A1 = the l previous positions

    def first_allowed(self, i: Tensor, j: Tensor, stride: int) -> Tensor:
        return ((j <= i) & (j >= i - stride)) if self.causal else (i - j).abs() <= stride

    def second_allowed(self, i: Tensor, j: Tensor, stride: int) -> Tensor:
        column = (i - j) % stride == 0
        return column & (j <= i) if self.causal else column

    def set_keys(self, t: int, stride: int) -> tuple[float, float]:
        """A1: the l previous positions and the query (2l + 1 when bidirectional); A2: every l-th
        position, t / l of them in a bidirectional row, half that on average when causal."""
        if self.causal:
            return stride + 1.0, (t / stride) / 2
        return 2.0 * stride + 1.0, t / stride

    def first(
        self, q: Tensor, k: Tensor, v: Tensor, valid: Tensor, stride: int, padded: bool, heads: slice = slice(None)
    ) -> Tensor:
        """A1: the band max(0, i - l) <= j <= i (causal) or |i - j| <= l: blocks of l queries
        attend to their block and the previous one (and the next one when bidirectional)."""
        if self.causal:

            def allowed(qi, d):
                return (d - qi >= -stride) & (d <= qi)
        else:

            def allowed(qi, d):
                return (d - qi).abs() <= stride

        return banded_attention(
            q,
            k,
            v,
            valid,
            block=stride,
            before=1,
            after=0 if self.causal else 1,
            allowed=allowed,
            dropout=self.attn_dropout,
            bias=(lambda distance: self.distance_bias(distance, q.dtype, heads)) if self.has_pair_bias else None,
        )

    def second(
        self, q: Tensor, k: Tensor, v: Tensor, valid: Tensor, stride: int, padded: bool, heads: slice = slice(None)
    ) -> Tensor:
        """A2: (i - j) mod l = 0, i.e. the same column of the R x l grid: attention along columns."""
        qc, kc, vc = (rearrange(x, "b h (r c) k -> b h c r k", c=stride) for x in (q, k, v))
        rows = qc.shape[3]
        grid = torch.arange(rows, device=q.device)
        bias = self.distance_bias((grid[:, None] - grid[None, :]) * stride, q.dtype, heads)  # [h, r, u]: one per column
        if bias is not None:
            mask = rearrange(valid, "b (r c) -> b c r", c=stride)[:, :, None, :]  # [b, c, 1, r]
            if self.causal:
                mask = mask & (grid[:, None] >= grid[None, :])
            out = attend_groups(qc, kc, vc, mask, dropout=self.attn_dropout, bias=bias[:, None])
        elif self.causal and not padded:
            # keys past the end lie in later rows than every real query of their column: the
            # fused causal kernel alone is exact, no mask tensor at all
            out = attend_groups(qc, kc, vc, is_causal=True, dropout=self.attn_dropout)
        else:
            mask = rearrange(valid, "b (r c) -> b c r", c=stride)[:, :, None, :]  # [b, c, 1, r]
            if self.causal:
                mask = mask & torch.ones(rows, rows, dtype=torch.bool, device=q.device).tril()
            out = attend_groups(qc, kc, vc, mask, dropout=self.attn_dropout)
        return rearrange(out, "b h c r k -> b h (r c) k")

    def merged_biases(self, length: int, stride: int, dtype: torch.dtype) -> tuple[Tensor | None, Tensor | None]:
        """The band's template [h, 1, s, w] (distance qi - d) and the columns' [h, r, 1, u] ((r - u) l)."""
        if not self.has_pair_bias:
            return None, None
        width, rows = (2 if self.causal else 3) * stride, length // stride
        qi, d = torch.arange(stride)[:, None], torch.arange(width)[None, :] - stride
        r = torch.arange(rows)
        band = self.distance_bias(qi - d, dtype)[:, None]
        return band, self.distance_bias((r[:, None] - r[None, :]) * stride, dtype)[:, :, None]

    def merged(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        valid: Tensor,
        stride: int,
        band_bias: Tensor | None = None,
        column_bias: Tensor | None = None,
    ) -> Tensor:
        """A1 ∪ A2 under one softmax. A2 keys inside A1 (j = i and j = i - l, or i + l when
        bidirectional) are taken from A1 only: A2 keeps rows at least two away from i's row.
        ``band_bias`` [h, 1, s, w] and ``column_bias`` [h, r, 1, u]: a pair bias on the two parts."""
        scale = q.shape[-1] ** -0.5
        device = q.device
        after = 0 if self.causal else 1
        # part 1, the band: blocks of l queries against the gathered neighbouring blocks
        qb = rearrange(q * scale, "b h (n s) k -> b h n s k", s=stride)
        kw, vw = (windows(x, stride, 1, after, dim=2) for x in (k, v))  # [b, h, n, w, k]
        valid_w = windows(valid, stride, 1, after, dim=1)
        qi = torch.arange(stride, device=device)[:, None]
        d = torch.arange(kw.shape[3], device=device)[None, :] - stride
        band = ((d - qi >= -stride) & (d <= qi)) if self.causal else ((d - qi).abs() <= stride)
        mask1 = band & valid_w[:, None, :, None, :]  # [b, 1, n, s, w]
        scores1 = torch.einsum("bhnsk,bhnwk->bhnsw", qb, kw)
        # part 2, the columns, laid out per query as [row, column, key row] to sit beside part 1
        qc = rearrange(q * scale, "b h (r c) k -> b h c r k", c=stride)
        kc, vc = (rearrange(x, "b h (r c) k -> b h c r k", c=stride) for x in (k, v))
        scores2 = rearrange(torch.einsum("bhcrk,bhcuk->bhcru", qc, kc), "b h c r u -> b h r c u")
        if band_bias is not None:
            scores1, scores2 = scores1 + band_bias.to(q.device), scores2 + column_bias.to(q.device)
        rows = qc.shape[3]
        r, u = torch.arange(rows, device=device)[:, None], torch.arange(rows, device=device)[None, :]
        far = (u <= r - 2) if self.causal else ((r - u).abs() >= 2)  # [r, u]: outside the band
        mask2 = far[:, None, :] & rearrange(valid, "b (u c) -> b c u", c=stride)[:, None, None, :, :]  # [b, 1, r, c, u]
        p1, p2 = joint_softmax([scores1, scores2], [mask1, mask2], dropout=self.dropout, training=self.training)
        out1 = rearrange(torch.einsum("bhnsw,bhnwk->bhnsk", p1, vw), "b h n s k -> b h (n s) k")
        out2 = torch.einsum("bhcru,bhcuk->bhcrk", rearrange(p2, "b h r c u -> b h c r u"), vc)
        return out1 + rearrange(out2, "b h c r k -> b h (r c) k")
