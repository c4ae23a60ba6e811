"""Factorised sparse attention: the strided and fixed patterns.

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
            # the two explicit score tensors are recomputed in backward, not kept for every layer
            merged = functools.partial(self.merged, stride=stride)
            out = recompute_in_backward(merged, q, k, v, valid, stochastic=self.training and self.dropout > 0)
        elif combine == "interleaved":
            part = self.first if self.layer_index % 2 == 0 else self.second
            out = part(q, k, v, valid, stride, padded)
        else:
            half = self.n_heads // 2
            out = torch.cat(
                [
                    self.first(q[:, :half], k[:, :half], v[:, :half], valid, stride, padded),
                    self.second(q[:, half:], k[:, half:], v[:, half:], valid, stride, padded),
                ],
                dim=1,
            )
        return out[:, :, :t]

    def check_stride(self, stride: int) -> None:
        """Refuse a stride the pattern cannot use (the fixed pattern needs c <= l)."""


@ATTENTION.register("sparse_strided")
class StridedSparseAttention(FactorisedSparseAttention):
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

    def first(self, q: Tensor, k: Tensor, v: Tensor, valid: Tensor, stride: int, padded: bool) -> Tensor:
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
        )

    def second(self, q: Tensor, k: Tensor, v: Tensor, valid: Tensor, stride: int, padded: bool) -> Tensor:
        """A2: (i - j) mod l = 0, i.e. the same column of the R x l grid: attention along columns."""
        qc, kc, vc = (rearrange(x, "b h (r c) k -> b h c r k", c=stride) for x in (q, k, v))
        if self.causal and not padded:
            # keys past the end lie in later rows than every real query of their column: the
            # fused causal kernel alone is exact, no mask tensor at all
            out = attend_groups(qc, kc, vc, is_causal=True, dropout=self.attn_dropout)
        else:
            rows = qc.shape[3]
            mask = rearrange(valid, "b (r c) -> b c r", c=stride)[:, :, None, :]  # [b, c, 1, r]
            if self.causal:
                mask = mask & torch.ones(rows, rows, dtype=torch.bool, device=q.device).tril()
            out = attend_groups(qc, kc, vc, mask, dropout=self.attn_dropout)
        return rearrange(out, "b h c r k -> b h (r c) k")

    def merged(self, q: Tensor, k: Tensor, v: Tensor, valid: Tensor, stride: int) -> Tensor:
        """A1 ∪ A2 under one softmax. A2 keys inside A1 (j = i and j = i - l, or i + l when
        bidirectional) are taken from A1 only: A2 keeps rows at least two away from i's row."""
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
        rows = qc.shape[3]
        r, u = torch.arange(rows, device=device)[:, None], torch.arange(rows, device=device)[None, :]
        far = (u <= r - 2) if self.causal else ((r - u).abs() >= 2)  # [r, u]: outside the band
        mask2 = far[:, None, :] & rearrange(valid, "b (u c) -> b c u", c=stride)[:, None, None, :, :]  # [b, 1, r, c, u]
        p1, p2 = joint_softmax([scores1, scores2], [mask1, mask2], dropout=self.dropout, training=self.training)
        out1 = rearrange(torch.einsum("bhnsw,bhnwk->bhnsk", p1, vw), "b h n s k -> b h (n s) k")
        out2 = torch.einsum("bhcru,bhcuk->bhcrk", rearrange(p2, "b h r c u -> b h c r u"), vc)
        return out1 + rearrange(out2, "b h c r k -> b h (r c) k")


@ATTENTION.register("sparse_fixed")
class FixedSparseAttention(FactorisedSparseAttention):
    @dataclass
    class Options:
        stride: int = 128  # l, the block length; 0 = ceil(sqrt(t)) for each call
        c: int = 8  # summary positions per block (the paper uses 8, 16 or 32 for l = 128 or 256)
        combine: str = "interleaved"  # interleaved | union | per_head (Section 4.3)
        bias: bool = True
        backend: str = (
            "auto"  # auto (FlexAttention on CUDA) | native (blocked SDPA) | flex (FlexAttention; CPU: forward only)
        )

        def __post_init__(self) -> None:
            check_backend(self.backend, "backend")
            require(
                isinstance(self.stride, int) and self.stride >= 0,
                f"stride must be an int >= 0 (0 = ceil(sqrt(t))), got {self.stride!r}",
            )
            require(isinstance(self.c, int) and self.c >= 1, f"c must be an int >= 1, got {self.c!r}")
            require(
                self.stride == 0 or self.c <= self.stride,
                f"c ({self.c}) must be <= stride l ({self.stride}): a block has only l positions to summarise",
            )
            require(self.combine in COMBINE, f"combine must be one of {', '.join(COMBINE)}; got {self.combine!r}")

    @classmethod
    def contract_options(cls) -> dict:
        return {"stride": 4, "c": 2, "combine": "union"}

    set_names = ("own block", "summary columns")

    def first_bound(self) -> int:
        return self.options.stride - 1  # the own block's positions before the next one

    def first_allowed(self, i: Tensor, j: Tensor, stride: int) -> Tensor:
        block = j // stride == i // stride
        return block & (j <= i) if self.causal else block

    def second_allowed(self, i: Tensor, j: Tensor, stride: int) -> Tensor:
        summary = j % stride >= stride - self.options.c
        return summary & (j <= i) if self.causal else summary

    def still_needed(self, j: Tensor, next_position: int) -> Tensor:
        """Summary positions, forever; the own block's earlier positions while A1 is read."""
        stride = self.options.stride
        summary = j % stride >= stride - self.options.c
        return summary | (j >= (next_position // stride) * stride) if self.sets_of_heads()[0] else summary

    def set_keys(self, t: int, stride: int) -> tuple[float, float]:
        """A1: the query's block (up to itself when causal: (l + 1) / 2 on average); A2: c summary
        positions of each of the t / l blocks (of the blocks before it when causal: half on average)."""
        blocks = t / stride
        if self.causal:
            return (stride + 1) / 2, self.options.c * blocks / 2
        return float(stride), self.options.c * blocks

    def check_stride(self, stride: int) -> None:
        require(
            self.options.c <= stride,
            f"sparse_fixed: c ({self.options.c}) must be <= stride l ({stride}); with stride=0, l = ceil(sqrt(t)) "
            "is too small for this sequence length",
        )

    def first(self, q: Tensor, k: Tensor, v: Tensor, valid: Tensor, stride: int, padded: bool) -> Tensor:
        """A1: the query's own block (up to itself when causal)."""
        qb, kb, vb = (rearrange(x, "b h (n s) k -> b h n s k", s=stride) for x in (q, k, v))
        if self.causal and not padded:  # keys past the end are later than every real query
            out = attend_groups(qb, kb, vb, is_causal=True, dropout=self.attn_dropout)
        else:
            mask = rearrange(valid, "b (n s) -> b n s", s=stride)[:, :, None, :]  # [b, n, 1, s]
            if self.causal:
                mask = mask & torch.ones(stride, stride, dtype=torch.bool, device=q.device).tril()
            out = attend_groups(qb, kb, vb, mask, dropout=self.attn_dropout)
        return rearrange(out, "b h n s k -> b h (n s) k")

    def summaries(self, k: Tensor, v: Tensor, valid: Tensor, stride: int) -> tuple[Tensor, Tensor, Tensor]:
        """The last c positions of every block: keys/values [b, h, n*c, k], validity [b, n*c]."""
        c = self.options.c
        ks, vs = (
            rearrange(
                rearrange(x, "b h (n s) k -> b h n s k", s=stride)[:, :, :, stride - c :], "b h n c k -> b h (n c) k"
            )
            for x in (k, v)
        )
        return ks, vs, rearrange(rearrange(valid, "b (n s) -> b n s", s=stride)[:, :, stride - c :], "b n c -> b (n c)")

    def second(self, q: Tensor, k: Tensor, v: Tensor, valid: Tensor, stride: int, padded: bool) -> Tensor:
        """A2: the summary keys (up to the query when causal). The n*c summary keys are passed
        once and shared by every block of queries."""
        c = self.options.c
        ks, vs, valid_s = self.summaries(k, v, valid, stride)
        ks, vs = ks[:, :, None], vs[:, :, None]  # [b, h, 1, n*c, k]: one key set for all groups
        if not self.causal:
            out = attend_groups(q[:, :, None], ks, vs, valid_s[:, None, None, :], dropout=self.attn_dropout)
            return out[:, :, 0]
        device = q.device
        qb = rearrange(q, "b h (n s) k -> b h n s k", s=stride)
        n = qb.shape[2]
        block = torch.arange(n, device=device)[:, None, None]  # query block [n, 1, 1]
        key_block = (torch.arange(n * c, device=device) // c)[None, None, :]  # [1, 1, n*c]
        earlier = (key_block < block) & valid_s[:, None, None, :]  # [b, n, 1, n*c]
        parts = []
        if stride > c:  # queries before their block's summaries: one mask row per block
            parts.append(attend_groups(qb[:, :, :, : stride - c], ks, vs, earlier, dropout=self.attn_dropout))
        # the last c queries of a block also see their own block's summaries up to themselves
        qi = torch.arange(c, device=device)[None, :, None]  # [1, c, 1]
        key_offset = (torch.arange(n * c, device=device) % c)[None, None, :]
        own = (key_block == block) & (key_offset <= qi) & valid_s[:, None, None, :]
        parts.append(attend_groups(qb[:, :, :, stride - c :], ks, vs, earlier | own, dropout=self.attn_dropout))
        return rearrange(torch.cat(parts, dim=3), "b h n s k -> b h (n s) k")

    def merged(self, q: Tensor, k: Tensor, v: Tensor, valid: Tensor, stride: int) -> Tensor:
        """A1 ∪ A2 under one softmax: own block (part 1) plus other blocks' summaries (part 2;
        the own block's summaries are already in part 1)."""
        c = self.options.c
        scale = q.shape[-1] ** -0.5
        device = q.device
        qb = rearrange(q * scale, "b h (n s) k -> b h n s k", s=stride)
        kb, vb = (rearrange(x, "b h (n s) k -> b h n s k", s=stride) for x in (k, v))
        valid_b = rearrange(valid, "b (n s) -> b n s", s=stride)
        inside = torch.ones(stride, stride, dtype=torch.bool, device=device)
        if self.causal:
            inside = inside.tril()
        mask1 = inside & valid_b[:, None, :, None, :]  # [b, 1, n, s, s]
        scores1 = torch.einsum("bhnsk,bhnuk->bhnsu", qb, kb)
        ks, vs, valid_s = self.summaries(k, v, valid, stride)
        n = qb.shape[2]
        block = torch.arange(n, device=device)[:, None]
        key_block = (torch.arange(n * c, device=device) // c)[None, :]
        other = (key_block < block) if self.causal else (key_block != block)  # [n, n*c]
        mask2 = other[:, None, :] & valid_s[:, None, None, None, :]  # [b, 1, n, 1, n*c]
        scores2 = torch.einsum("bhnsk,bhuk->bhnsu", qb, ks)
        p1, p2 = joint_softmax([scores1, scores2], [mask1, mask2], dropout=self.dropout, training=self.training)
        out = torch.einsum("bhnsu,bhnuk->bhnsk", p1, vb) + torch.einsum("bhnsu,bhuk->bhnsk", p2, vs)
        return rearrange(out, "b h n s k -> b h (n s) k")
