"""Attention under a pair bias b_h(i - j) (ALiBi, T5 buckets) without a [t, s] bias tensor.

Not a mechanism (nothing registers here). :func:`attend_groups_biased` and :func:`banded_biased` are
the blocked patterns' kernels (``blocked.py``) with a bias; :func:`biased_sdpa` is dense attention's.

Dense: ``vanilla`` calls :func:`biased_sdpa` when its position part adds a bias. The fused SDPA
kernel takes an additive float mask; the whole [h, t, s] mask would be a t x t tensor that dense
attention never builds otherwise (its causal kernel needs no mask at all). So the queries go in
blocks of ``QUERY_BLOCK``, and a causal block reads only the keys up to its last query. When the
queries and keys sit at consecutive positions (no eviction), no block's mask is built at all: with
the keys in reverse order (a copy of k and v, O(s d)), the bias of query i and reversed key j'
depends on i + j' only, so every block's [h, c, e] mask is a strided view (strides 1, 1) of one
vector g_h(d) over the distances the call meets, -inf where a key lies in the query's future
(measured: the attention call 1.09x plain causal SDPA at 4K, forward and backward, where writing
each block's mask out cost 1.35x). Otherwise (a cache that evicted, a decoding step) each block's
bias is gathered for its pairs (``Position.distance_bias``: computed once per distinct distance).

A bias with a gradient (T5's table) cannot go through the fused kernel's backward: each block is
then recomputed in backward (``recompute.py``), so no block's weights are kept.

Shapes: q [b, h, t, k] at absolute positions q_pos long [t]; k, v [b, h, s, k] at k_pos long [s]
(ascending); key_pad [b, s] bool (True = real) or None.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor

from zoo.attention.recompute import recompute_in_backward

QUERY_BLOCK = 256  # queries per block: measured faster than 512 or 1,024 at 4K on a 2-core CPU (torch 2.13)


def consecutive(positions: Tensor) -> bool:
    """True when ascending positions [n] are n consecutive integers."""
    return positions.numel() <= 1 or int(positions[-1] - positions[0]) == positions.numel() - 1


def biased_sdpa(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    bias_of: Callable[[Tensor], Tensor],
    *,
    q_pos: Tensor,
    k_pos: Tensor,
    causal: bool,
    key_pad: Tensor | None = None,
    dropout: float = 0.0,
    block: int = QUERY_BLOCK,
) -> Tensor:
    """softmax(q k^T / sqrt(k) + b(q_pos - k_pos) [+ -inf for future or padded keys]) v -> [b, h, t, k].

    ``bias_of(distance long [...]) -> [h, ...]`` in q's dtype (the layer's ``pair_bias``). A query with no
    key to see (every key padded) returns 0."""
    t, s = q.shape[2], k.shape[2]
    diagonal = t > 1 and consecutive(q_pos) and consecutive(k_pos)
    if diagonal:  # keys reversed: the bias of (i, j') is g(delta + p + i + j' - e + 1), see the module notes
        delta = int(q_pos[0] - k_pos[0])
        low = delta - s + 1  # the smallest distance of the call (first query, last key)
        distance = torch.arange(low, delta + t, device=q.device)
        g = bias_of(distance)
        if causal:
            g = g.masked_fill(distance < 0, float("-inf"))
        g = g.contiguous()  # [h, D]: the storage every block's mask views
        k, v = k.flip(2), v.flip(2)
        key_pad = None if key_pad is None else key_pad.flip(1)
    outs = []
    for p in range(0, t, block):
        rows = min(block, t - p)
        # a causal block sees no key after its last query: keys are ascending, so a prefix of them
        end = int(torch.searchsorted(k_pos, q_pos[p + rows - 1], right=True)) if causal else s
        end = max(end, 1)
        if diagonal:  # keys [0, end) are the reversed keys [s - end, s)
            keys, values = k[:, :, s - end :], v[:, :, s - end :]
            offset = g.storage_offset() + (delta + p - end + 1 - low)
            mask = g.as_strided((1, g.shape[0], rows, end), (0, g.stride(0), 1, 1), offset)
            pad = None if key_pad is None else key_pad[:, s - end :]
        else:
            keys, values = k[:, :, :end], v[:, :, :end]
            distance = q_pos[p : p + rows, None] - k_pos[None, :end]
            mask = bias_of(distance)[None]
            if causal:
                mask = mask.masked_fill(distance < 0, float("-inf"))
            pad = None if key_pad is None else key_pad[:, :end]
        if pad is not None:
            mask = mask.masked_fill(~pad[:, None, None, :], float("-inf"))  # [b, h, c, e]
        # without padding every query sees a key (itself, or any key when bidirectional): no row to guard
        outs.append(_attend(q[:, :, p : p + rows], keys, values, mask, dropout, guard=pad is not None))
    return torch.cat(outs, dim=2) if len(outs) > 1 else outs[0]


def _attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, dropout: float, guard: bool = True) -> Tensor:
    """One block through SDPA under an additive float mask; with ``guard``, a row with no finite entry
    attends to every key instead (no NaN) and returns 0 (the check reads the whole mask: skipped where
    no row can be empty)."""
    mask, has_key = guard_rows(mask) if guard else (mask, None)

    def attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout)

    out = _fused(attend, q, k, v, mask, dropout)
    return out if has_key is None else out * has_key.to(out.dtype)


def guard_rows(bias: Tensor) -> tuple[Tensor, Tensor | None]:
    """(the additive mask with every all -inf row set to 0, so softmax has no NaN; which rows have a key,
    or None when all do): the caller zeroes the output of the rows that had none."""
    has_key = torch.isfinite(bias).any(-1, keepdim=True)
    if bool(has_key.all()):
        return bias, None
    return bias.masked_fill(~has_key, 0.0), has_key


def _fused(attend, q: Tensor, k: Tensor, v: Tensor, bias: Tensor, dropout: float) -> Tensor:
    """``attend(q, k, v, bias)``; a bias with a gradient (T5's table) keeps SDPA off its fused backward, so
    then only the inputs are kept and the call is recomputed in backward (``recompute.py``)."""
    if bias.requires_grad:
        return recompute_in_backward(attend, q, k, v, bias, stochastic=dropout > 0)
    return attend(q, k, v, bias)


def attend_groups_biased(
    q: Tensor, k: Tensor, v: Tensor, bias: Tensor, mask: Tensor | None = None, *, dropout: float = 0.0
) -> Tensor:
    """``blocked.attend_groups`` under an additive bias: every query group attends to its own key set.

    q [b, h, g, l, k]; k, v [b, h, g, w, k], or [b, h, 1, w, k] for one key set shared by all groups
    (``enable_gqa``); bias float broadcastable to [b, h, g, l, w] (-inf = may not attend); mask bool
    broadcastable to [b, g, l, w] (True = may attend) or None. Only the shape the bias and mask need is
    built: a bias shared by the groups ([h, 1, l, w], one block's worth per head) stays that size when
    every key is valid. A row with no allowed key returns 0. Returns [b, h, g, l, k]."""
    b, h, g, rows, _ = q.shape
    bias = bias.reshape((1,) * (5 - bias.dim()) + tuple(bias.shape))  # [b|1, h|1, g|1, l, w]
    if mask is not None:
        mask = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))[:, None]  # [b|1, 1, g|1, l, w]
        if not bool(mask.all()):
            bias = bias.masked_fill(~mask, float("-inf"))
    bias, has_key = guard_rows(bias)
    groups = bias.shape[2]
    bias = rearrange(bias.expand(b, h, groups, rows, bias.shape[-1]), "b h g l w -> (b h) g l w")
    shared = k.shape[2] == 1 and g > 1

    def attend(q: Tensor, k: Tensor, v: Tensor, bias: Tensor) -> Tensor:
        flat = [rearrange(x, "b h g l k -> (b h) g l k") for x in (q, k, v)]
        out = F.scaled_dot_product_attention(*flat, attn_mask=bias, dropout_p=dropout, enable_gqa=shared)
        return rearrange(out, "(b h) g l k -> b h g l k", b=b)

    out = _fused(attend, q, k, v, bias, dropout)
    return out if has_key is None else out * has_key.to(out.dtype)


def banded_biased(
    qb: Tensor,
    kw: Tensor,
    vw: Tensor,
    valid_w: Tensor,
    static: Tensor,
    template: Tensor,
    *,
    shared: tuple[Tensor, Tensor, Tensor, Tensor] | None = None,
    dropout: float = 0.0,
) -> Tensor:
    """The blocked band of ``blocked.banded_attention`` under a distance bias. Every block sees its
    keys at the same distances, so the bias is one template [h, s, w] (-inf outside the static pattern
    ``static`` [s, w]); only the blocks whose window holds a missing key (before the sequence, past its
    end, padding) need a mask of their own: the leading and trailing ones get it, the blocks between
    share the template. qb [b, h, n, s, k]; kw, vw [b, h, n, w, k]; valid_w [b|1, n, w]. ``shared`` =
    (k_s, v_s [b, h, e, k], allowed_s [b|1, n, e], bias_s [h, n, s, e], or [b, h, n, s, e] where rows of
    the batch sit at different positions: Longformer's residue classes): extra keys behind every window
    (attention sinks) with their own bias; then every block's mask is built. -> [b, h, n, s, k]."""
    template = template.masked_fill(~static, float("-inf"))[:, None]  # [h, 1, s, w]
    n = qb.shape[2]
    if shared is not None:
        k_s, v_s, allowed_s, bias_s = shared
        kw, vw = (torch.cat([w, x[:, :, None].expand(-1, -1, n, -1, -1)], dim=3) for w, x in ((kw, k_s), (vw, v_s)))
        band = template.expand(*bias_s.shape[:-4], -1, n, -1, -1)  # [(b,) h, n, s, w]
        bias = torch.cat([band, bias_s], dim=-1)  # [(b,) h, n, s, w + e]
        mask = torch.cat(
            [
                valid_w[:, :, None, :].expand(-1, -1, bias.shape[-2], -1),
                allowed_s[:, :, None, :].expand(-1, -1, bias.shape[-2], -1),
            ],
            dim=-1,
        )
        return attend_groups_biased(qb, kw, vw, bias, mask, dropout=dropout)
    clean = valid_w.all(-1).all(0)  # [n]: every key of the block's window is real, in every row
    inside = clean.nonzero().squeeze(1)
    if inside.numel() == 0 or not bool(clean[int(inside[0]) : int(inside[-1]) + 1].all()):
        return attend_groups_biased(qb, kw, vw, template, valid_w[:, :, None, :], dropout=dropout)
    first, last = int(inside[0]), int(inside[-1]) + 1
    parts = []
    for part in (slice(0, first), slice(first, last), slice(last, n)):
        if part.stop > part.start:
            mask = None if part.start == first else valid_w[:, part, None, :]
            parts.append(
                attend_groups_biased(qb[:, :, part], kw[:, :, part], vw[:, :, part], template, mask, dropout=dropout)
            )
    return torch.cat(parts, dim=2) if len(parts) > 1 else parts[0]
