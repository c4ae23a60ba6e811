"""The blocked kernels behind the static sparse and local patterns (:class:`~zoo.attention.blocked.PatternAttention`
and the mechanisms built on it, ``sparse.py``, ``local.py``, ...): "groups of queries, each attending to a small
key set", computed without ever forming a t x t tensor:

- :func:`attend_groups` runs one fused ``scaled_dot_product_attention`` over all groups at once
  (groups go into SDPA's head axis, so the fused CPU/GPU kernels see ordinary 4-D tensors). A key
  set shared by every group (the fixed pattern's summary columns) goes in once with
  ``enable_gqa=True`` instead of being copied per group.
- :func:`banded_attention` cuts queries into blocks that attend to their own block plus a few
  neighbouring blocks (overlapping windows, :func:`windows`, a strided view rather than copies)
  under one static relative mask: the blocked formulation measured in BENCHMARKS.md to run near
  the hardware's bound on CPU.
- :func:`joint_softmax` normalises several score tensors together, for patterns whose key set is a
  union of differently shaped parts (the "merged head" of the Sparse Transformer).

A pair bias (ALiBi, T5) is added through ``pair_bias.py``, from one template per block shape, since within a
pattern's block the distances repeat from block to block.

Shape legend as in ``base.py``; here additionally ``T`` = padded length, ``n`` = number of blocks,
``s`` = block size, ``w`` = window (keys per block), ``g`` = groups, ``l`` = queries per group.
Key validity ``valid`` is bool [b or 1, T]: True for a real key (inside the sequence, not padding).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor

from zoo.attention.masks import guard_empty_rows
from zoo.attention.pair_bias import attend_groups_biased, banded_biased, guard_rows


def padded_length(t: int, multiple: int) -> int:
    """Smallest multiple of ``multiple`` >= t: a length that does not suit a block is padded."""
    return -(-t // multiple) * multiple


def pad_time(x: Tensor, length: int) -> Tensor:
    """[b, h, t, k] -> [b, h, length, k] with zeros appended along t."""
    if x.shape[2] == length:
        return x
    return F.pad(x, (0, 0, 0, length - x.shape[2]))


def key_validity(pad_mask: Tensor | None, t: int, length: int, device: torch.device) -> Tensor:
    """bool [b or 1, length]: True where the key is a real token (position < t, not padding)."""
    valid = (torch.arange(length, device=device) < t)[None]
    if pad_mask is not None:
        valid = valid & F.pad(pad_mask, (0, length - t), value=False)
    return valid


def windows(x: Tensor, block: int, before: int, after: int, dim: int, length: int | None = None) -> Tensor:
    """Overlapping key windows as a view: block i sees blocks i - before ... i + after.

    ``x`` has the time axis at ``dim`` (keys [b, h, T, k] with dim=2, validity [b, T] with
    dim=1), T a multiple of ``block`` (or shorter, with ``length`` the multiple it is padded
    to, in the same copy). The time axis becomes [n, w] with w = (before + 1 +
    after) * block, positions outside the sequence zero (False). One padded copy of ``x`` is
    made; the windows overlap in memory instead of being copied (the fused kernel reads them
    through their strides), so keys and values are stored once, not (before + 1 + after) times."""
    tail = (length or x.shape[dim]) - x.shape[dim]
    pad = [0, 0] * (x.dim() - 1 - dim) + [before * block, tail + after * block]
    width = (before + 1 + after) * block
    out = F.pad(x, pad).unfold(dim, width, block)  # window axis appended last
    return out.movedim(-1, dim + 1)


def attend_masked(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor, *, dropout: float = 0.0, bias: Tensor | None = None
) -> Tensor:
    """Fused attention under a boolean mask that may differ per head: q [b, h, t, k], k, v [b, h, s, k],
    mask broadcastable to [b, h, t, s] (True = may attend); ``bias`` [h, t, s] added to the scores, or
    None. A query row with no allowed key returns 0, as the dense reference and :func:`attend_groups` do."""
    if bias is not None:  # the mask goes into the bias: -inf where a key may not be seen
        biased, has_key = guard_rows(bias[None].masked_fill(~mask, float("-inf")))  # [b|1, h, t, s]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=biased, dropout_p=dropout)
        return out if has_key is None else out * has_key.to(out.dtype)
    has_key = mask.any(-1, keepdim=True)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=guard_empty_rows(mask), dropout_p=dropout)
    return out if bool(has_key.all()) else out * has_key.to(out.dtype)


def attend_groups(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    *,
    is_causal: bool = False,
    dropout: float = 0.0,
    bias: Tensor | None = None,
) -> Tensor:
    """Fused attention of every query group to its own key set.

    q [b, h, g, l, k]; k, v [b, h, g, w, k], or [b, h, 1, w, k] for one key set shared by all
    groups (passed once, ``enable_gqa``); mask bool broadcastable to [b, g, l, w] (True = may
    attend; no head axis, so it is shared by the heads), or None. ``is_causal``: causal inside
    each group (top-left aligned). Returns [b, h, g, l, k]. A query row with no allowed key
    returns 0 (the value the dense reference gives: an empty softmax contributes nothing). ``bias``:
    added to the scores, broadcastable to [b, h, g, l, w] (``pair_bias.attend_groups_biased``; causality
    then goes into the bias or the mask, not ``is_causal``)."""
    if bias is not None:
        return attend_groups_biased(q, k, v, bias, mask, dropout=dropout)
    b, h, g = q.shape[:3]
    shared = k.shape[2] == 1 and g > 1
    flat = [rearrange(x, "b h g l k -> (b h) g l k") for x in (q, k, v)]
    has_key = None
    if mask is not None:
        mask = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))  # [mb, g, l, w]
        any_key = mask.any(-1, keepdim=True)
        if not bool(any_key.all()):
            has_key = any_key  # empty rows: zero them after the kernel, which would return NaN
        mask = guard_empty_rows(mask)
        if mask.shape[0] > 1:  # depends on the batch row (padding): one copy per head
            mask = rearrange(mask[:, None].expand(-1, h, -1, -1, -1), "b h g l w -> (b h) g l w")
    out = F.scaled_dot_product_attention(
        *flat, attn_mask=mask, is_causal=is_causal, dropout_p=dropout, enable_gqa=shared
    )
    out = rearrange(out, "(b h) g l k -> b h g l k", b=b)
    if has_key is not None:
        out = out * has_key[:, None].to(out.dtype)
    return out


def banded_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    valid: Tensor,
    *,
    block: int,
    before: int,
    after: int,
    allowed: Callable[[Tensor, Tensor], Tensor],
    dropout: float = 0.0,
    shared: tuple[Tensor, ...] | None = None,
    bias: Callable[[Tensor], Tensor] | None = None,
) -> Tensor:
    """Queries in blocks of ``block``, each attending to its block and ``before``/``after``
    neighbouring blocks, restricted by a static relative pattern.

    q, k, v [b, h, t, k]; valid [b or 1, T] with T >= t a multiple of ``block``; q, k, v are
    padded to T here (keys and values in the same copy that makes their windows).
    ``allowed(qi, d)``: qi [s, 1] = query offset in its block, d [1, w] = key position minus the
    block's first position (negative for earlier blocks) -> bool [s, w]. The same for every block,
    so it is built once; only key validity (sequence ends, padding) varies per block.
    ``shared`` = (k_s, v_s [b, h, e, k], allowed_s bool [b or 1, n, e]): e extra keys every block may
    see under the same softmax (attention sinks), appended to each block's window (allowed_s must
    leave out keys already in a block's window, or they would count twice); with ``bias`` a fourth
    entry, their bias [h, n, s, e]. ``bias(distance [s, w]) -> [h, s, w]``: a distance bias (query
    minus key position: qi - d), the same for every block (``pair_bias.banded_biased``).
    Returns [b, h, T, k]. Cost: T * (before + 1 + after) * block scores, linear in T."""
    length = valid.shape[1]
    qb = rearrange(pad_time(q, length), "b h (n s) k -> b h n s k", s=block)
    kw, vw = (windows(x, block, before, after, dim=2, length=length) for x in (k, v))  # [b, h, n, w, k]
    valid_w = windows(valid, block, before, after, dim=1)  # [b, n, w]
    device = q.device
    qi = torch.arange(block, device=device)[:, None]
    d = torch.arange(kw.shape[3], device=device)[None, :] - before * block
    if bias is not None:
        out = banded_biased(qb, kw, vw, valid_w, allowed(qi, d), bias(qi - d), shared=shared, dropout=dropout)
        return rearrange(out, "b h n s k -> b h (n s) k")
    mask = allowed(qi, d)[None, None] & valid_w[:, :, None, :]  # [b, n, s, w]
    if shared is not None:  # one copy of the windows with the extra keys behind them
        k_s, v_s, allowed_s = shared[:3]
        n = qb.shape[2]
        kw, vw = (torch.cat([w, x[:, :, None].expand(-1, -1, n, -1, -1)], dim=3) for w, x in ((kw, k_s), (vw, v_s)))
        extra = allowed_s[:, :, None, :].expand(-1, -1, block, -1)  # [b or 1, n, s, e]
        rows = max(mask.shape[0], extra.shape[0])
        # (a bidirectional pattern's mask has no query axis yet: [.., 1, w])
        mask = torch.cat([mask.expand(rows, n, block, -1), extra.expand(rows, -1, -1, -1)], dim=-1)
    out = attend_groups(qb, kw, vw, mask, dropout=dropout)
    return rearrange(out, "b h n s k -> b h (n s) k")


def joint_softmax(
    scores: list[Tensor], masks: list[Tensor], *, dropout: float = 0.0, training: bool = False
) -> list[Tensor]:
    """One softmax over the concatenated last axes of several score tensors.

    scores[i] [..., l, w_i] (same leading shape); masks[i] bool broadcastable to it (True = may
    attend). Returns the probabilities split back into the same parts. Rows with no allowed key
    get all-zero probabilities. Used where a query's key set is a disjoint union of parts laid
    out differently in memory (the merged-head Sparse Transformer)."""
    widths = [s.shape[-1] for s in scores]
    score = torch.cat(scores, dim=-1)
    mask = torch.cat([torch.broadcast_to(m, s.shape) for m, s in zip(masks, scores)], dim=-1)
    has_key = mask.any(-1, keepdim=True)
    probs = torch.softmax(score.masked_fill(~guard_empty_rows(mask), float("-inf")), dim=-1) * has_key
    if dropout and training:
        probs = F.dropout(probs, p=dropout)
    return list(probs.split(widths, dim=-1))
