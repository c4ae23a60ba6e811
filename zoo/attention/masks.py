"""Masks a mechanism may build its key patterns with (bool, True = may see / real token), and the
dense masked softmax the efficient mechanisms are tested against (a test reference, never used by them).
Shapes as in ``base.py``."""

from __future__ import annotations

import torch
from torch import Tensor


def guard_empty_rows(allowed: Tensor) -> Tensor:
    """Let a query that may see no key (a padded query, an all-padding row) see every key.

    Its output is never used by a real position, but a fully masked softmax row is NaN, and NaN
    leaks into gradients. ``allowed``: bool [..., t, s]."""
    return allowed | ~allowed.any(dim=-1, keepdim=True)


def join_key_padding(cached: Tensor | None, cached_length: int, new: Tensor | None, x: Tensor) -> Tensor | None:
    """The key-padding mask of [cache ; segment] -> bool [b, cached_length + t] (True = real key),
    or None when neither part has padding (so the fused no-mask kernels stay available).

    ``cached``: [b, cached_length] or None (every cached key real); ``new``: [b, t] or None;
    ``x``: the segment [b, t, ...] (batch size, length and device)."""
    if cached is None and new is None:
        return None
    b, t = x.shape[:2]
    if cached is None:
        cached = torch.ones(b, cached_length, dtype=torch.bool, device=x.device)
    if new is None:
        new = torch.ones(b, t, dtype=torch.bool, device=x.device)
    return torch.cat([cached, new], dim=1)


def causal_allowed(t: int, s: int, device: torch.device | None = None) -> Tensor:
    """bool [t, s]: query i (at absolute position s - t + i) may see key j iff j <= s - t + i."""
    offset = s - t
    q = torch.arange(t, device=device)[:, None] + offset
    return torch.arange(s, device=device)[None, :] <= q


def reference_attention(
    q: Tensor, k: Tensor, v: Tensor, allowed: Tensor | None = None, scale: float | None = None
) -> Tensor:
    """Naive softmax(q k^T * scale) v with a boolean ``allowed`` mask ([..., t, s]).

    The plain reference maths the efficient mechanisms are tested against; never used by them.
    q: [..., t, k], k/v: [..., s, k]."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = torch.einsum("...tk,...sk->...ts", q, k) * scale
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return torch.einsum("...ts,...sk->...tk", weights, v)
