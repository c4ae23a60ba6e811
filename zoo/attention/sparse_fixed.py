"""Factorised sparse attention: the fixed pattern (the strided one, and what both share: ``sparse.py``).

Paper: "Generating Long Sequences with Sparse Transformers", Child, Gray, Radford, Sutskever 2019,
arXiv:1904.10509, Section 4.2-4.3: A1 = {j : floor(j / l) = floor(i / l)} (i's own block), A2 = {j :
j mod l in {l - c, ..., l - 1}} (the last c "summary" positions of every block). How it is computed,
the three combinations and the deviations: ``sparse.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from einops import rearrange
from torch import Tensor

from zoo.attention.base import ATTENTION
from zoo.attention.blocked import attend_groups, joint_softmax
from zoo.attention.flex import check_backend
from zoo.attention.sparse import COMBINE, FactorisedSparseAttention
from zoo.config import require


@ATTENTION.register("sparse_fixed")
class FixedSparseAttention(FactorisedSparseAttention):
    no_left_padding_reason = (
        "fixes its summary columns and blocks at absolute positions (j mod stride), so left padding moves them "
        "within a row"
    )

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

    def first(
        self, q: Tensor, k: Tensor, v: Tensor, valid: Tensor, stride: int, padded: bool, heads: slice = slice(None)
    ) -> Tensor:
        """A1: the query's own block (up to itself when causal)."""
        qb, kb, vb = (rearrange(x, "b h (n s) k -> b h n s k", s=stride) for x in (q, k, v))
        inside = torch.arange(stride, device=q.device)
        bias = self.distance_bias(inside[:, None] - inside[None, :], q.dtype, heads)  # [h, s, s]: every block's
        if bias is not None:
            mask = rearrange(valid, "b (n s) -> b n s", s=stride)[:, :, None, :]  # [b, n, 1, s]
            if self.causal:
                mask = mask & (inside[:, None] >= inside[None, :])
            out = attend_groups(qb, kb, vb, mask, dropout=self.attn_dropout, bias=bias[:, None])
        elif self.causal and not padded:  # keys past the end are later than every real query
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

    def summary_bias(self, n: int, stride: int, dtype: torch.dtype, heads: slice = slice(None)) -> Tensor | None:
        """The pair bias of every query against the n c summary keys: [h, n, s, n c] (query n' l + i,
        key u l + l - c + o for summary u c + o), or None."""
        c = self.options.c
        query = torch.arange(n * stride).view(n, stride, 1)
        summary = torch.arange(n * c)
        return self.distance_bias(query - ((summary // c) * stride + stride - c + summary % c), dtype, heads)

    def second(
        self, q: Tensor, k: Tensor, v: Tensor, valid: Tensor, stride: int, padded: bool, heads: slice = slice(None)
    ) -> Tensor:
        """A2: the summary keys (up to the query when causal). The n*c summary keys are passed
        once and shared by every block of queries."""
        c = self.options.c
        ks, vs, valid_s = self.summaries(k, v, valid, stride)
        ks, vs = ks[:, :, None], vs[:, :, None]  # [b, h, 1, n*c, k]: one key set for all groups
        bias = self.summary_bias(q.shape[2] // stride, stride, q.dtype, heads)
        if bias is not None:
            bias = bias.to(q.device)
        if not self.causal:
            if bias is not None:  # [h, 1, n s, n c]: one group of every query
                bias = rearrange(bias, "h n s u -> h 1 (n s) u")
            out = attend_groups(q[:, :, None], ks, vs, valid_s[:, None, None, :], dropout=self.attn_dropout, bias=bias)
            return out[:, :, 0]
        device = q.device
        qb = rearrange(q, "b h (n s) k -> b h n s k", s=stride)
        n = qb.shape[2]
        block = torch.arange(n, device=device)[:, None, None]  # query block [n, 1, 1]
        key_block = (torch.arange(n * c, device=device) // c)[None, None, :]  # [1, 1, n*c]
        earlier = (key_block < block) & valid_s[:, None, None, :]  # [b, n, 1, n*c]
        parts = []
        early, late = (None, None) if bias is None else (bias[:, :, : stride - c], bias[:, :, stride - c :])
        if stride > c:  # queries before their block's summaries: one mask row per block
            parts.append(
                attend_groups(qb[:, :, :, : stride - c], ks, vs, earlier, dropout=self.attn_dropout, bias=early)
            )
        # the last c queries of a block also see their own block's summaries up to themselves
        qi = torch.arange(c, device=device)[None, :, None]  # [1, c, 1]
        key_offset = (torch.arange(n * c, device=device) % c)[None, None, :]
        own = (key_block == block) & (key_offset <= qi) & valid_s[:, None, None, :]
        parts.append(
            attend_groups(qb[:, :, :, stride - c :], ks, vs, earlier | own, dropout=self.attn_dropout, bias=late)
        )
        return rearrange(torch.cat(parts, dim=3), "b h n s k -> b h (n s) k")

    def merged_biases(self, length: int, stride: int, dtype: torch.dtype) -> tuple[Tensor | None, Tensor | None]:
        """The own block's template [h, 1, s, s] and the summaries' [h, n, s, n c]."""
        if not self.has_pair_bias:
            return None, None
        inside = torch.arange(stride)
        own = self.distance_bias(inside[:, None] - inside[None, :], dtype)[:, None]
        return own, self.summary_bias(length // stride, stride, dtype)

    def merged(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        valid: Tensor,
        stride: int,
        own_bias: Tensor | None = None,
        summary_bias: Tensor | None = None,
    ) -> Tensor:
        """A1 ∪ A2 under one softmax: own block (part 1) plus other blocks' summaries (part 2;
        the own block's summaries are already in part 1). ``own_bias`` [h, 1, s, s] and
        ``summary_bias`` [h, n, s, n c]: a pair bias on the two parts."""
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
        if own_bias is not None:
            scores1, scores2 = scores1 + own_bias.to(q.device), scores2 + summary_bias.to(q.device)
        p1, p2 = joint_softmax([scores1, scores2], [mask1, mask2], dropout=self.dropout, training=self.training)
        out = torch.einsum("bhnsu,bhnuk->bhnsk", p1, vb) + torch.einsum("bhnsu,bhuk->bhnsk", p2, vs)
        return rearrange(out, "b h n s k -> b h (n s) k")
