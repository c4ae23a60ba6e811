"""The band kernel of adaptive attention span (Sukhbaatar et al. 2019, arXiv:1905.07799, eq. (4)): the
soft mask m_z and the blocked, cropped attention over the keys 1 ... reach positions before each query.
``adaptive_span.py`` holds the mechanism (spans, cache, penalty) and explains how the saving is made real;
this file holds the arithmetic it runs, which the tests compare with a dense masked reference.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor


def soft_mask(distance: Tensor, span: Tensor, ramp: float) -> Tensor:
    """m_z(x) = clamp((R + z - x) / R, 0, 1) for x >= 0, and 0 for x < 0 (the future).

    ``distance`` and ``span`` broadcast against each other (x = t - r in tokens, z in tokens). The
    window (x = 1 ... S) is applied by the caller, not here. Gradient convention at the two kinks:
    0 at x = z and at x = z + R (only the ramp's interior moves z). ``clamp`` would pass a gradient
    at x = z, so at an integer span every key at distance exactly z would push z although raising
    z does not change m(z); and at x = z + R the log-space kernel cannot pass one (log 0)."""
    ramp_value = (ramp + span - distance) / ramp
    mask = torch.where(
        distance - span <= 0,
        torch.ones_like(ramp_value),
        torch.where(ramp_value <= 0, torch.zeros_like(ramp_value), ramp_value),
    )
    return torch.where(distance >= 0, mask, torch.zeros_like(mask))


def span_reach(max_span: float, ramp: int) -> int:
    """Largest distance with m_z(x) > 0 when the longest span is ``max_span``: ceil(z + R) - 1."""
    return max(0, math.ceil(max_span + ramp) - 1)


def auto_block_size(t: int, reach: int) -> int:
    """Queries per block. A block of a queries costs a * (a + reach) scores, so small blocks waste
    little on the triangle of future keys, but each block is one small matmul: 64 keeps the waste
    under ~6% at reach 1,024 while the batched kernel stays efficient (measured, see the notes)."""
    return min(t, max(64, min(256, reach // 4)))


def blocked_span_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    spans: Tensor,
    ramp: int,
    reach: int,
    key_valid: Tensor | None = None,
    block_size: int = 0,
    dropout: float = 0.0,
    key_position: Tensor | None = None,
    distance_bias: Tensor | None = None,
) -> Tensor:
    """Causal soft-masked attention of t queries over the keys 1 ... ``reach`` positions before each.

    q: [b, h, t, k]; k, v: [b, h, s, k] with s = m + t (the last t keys belong to the queries);
    spans: [h] or [b, h, t] in tokens; reach: the window, keys at distances 1 ... reach (the
    caller caps it at S; every distance with a non-zero mask inside S must lie in it, which
    span_reach guarantees); key_valid: bool [b, s] (True = real key) or None. A query with no key
    to see gets the zero vector (the empty sum of eq. (4)). key_position: [k, >= reach] or None, the
    paper's learned relative key embeddings (column x - 1 for distance x): q . p_x / sqrt(k) is added
    to the score s_tr, as q . k is. distance_bias: [h, >= reach] or None, a position part's pair bias
    b_h(x) (column x - 1), added likewise. Returns [b, h, t, k]."""
    b, h, t, _ = q.shape
    s = k.shape[2]
    m = s - t
    reach = min(reach, s - 1)  # never reach before the first key there is
    a = block_size or auto_block_size(t, reach)
    a = min(a, t)
    n = -(-t // a)
    right = n * a - t  # query padding up to whole blocks
    left = reach - min(m, reach)  # key padding so that block 0 also has `reach` keys before it
    k, v = k[:, :, s - t - min(m, reach) :], v[:, :, s - t - min(m, reach) :]  # drop keys no query reaches
    if key_valid is not None:
        key_valid = key_valid[:, s - t - min(m, reach) :]
    width = a + reach

    def blocks(keys: Tensor) -> Tensor:  # [b, h, left + kept + right, k] -> [b, h, n, a + reach, k]
        keys = F.pad(keys, (0, 0, left, right))
        # contiguous: a strided unfold view sends bmm down a slow generic path (measured ~10x)
        return rearrange(keys.unfold(2, width, a), "b h n k w -> b h n w k").contiguous()

    qb = rearrange(F.pad(q, (0, 0, 0, right)), "b h (n a) k -> b h n a k", a=a)
    kb, vb = blocks(k), blocks(v)
    # distance from query (row) to key (column) inside any block: the same for every block
    rows, columns = torch.arange(a, device=q.device), torch.arange(width, device=q.device)
    # float32: distances run to S (8,192); bf16 holds whole numbers exactly only up to 256, so under
    # autocast the window and the ramp (R = 32 wide) would move by up to 16 tokens
    distance = (rows[:, None] + reach - columns[None, :]).to(torch.promote_types(q.dtype, torch.float32))
    in_window = (distance >= 1) & (distance <= reach)  # [a, w]: the paper's keys t - S ... t - 1, cropped
    itself = distance == 0  # [a, w]: the query's own key, a stand-in for rows with nothing to see
    if spans.dim() == 1:  # one span per head: a [h, a, w] template
        mask = soft_mask(distance, spans[:, None, None], ramp)[None, :, None]  # [1, h, 1, a, w]
    else:  # one span per head and query: [b, h, n, a, 1]
        per_query = rearrange(F.pad(spans, (0, right)), "b h (n a) -> b h n a", a=a)[..., None]
        mask = soft_mask(distance, per_query, ramp)
    relative = 0.0
    if key_position is not None:  # q . p_x over the band: [b, h, n, a, w], as large as the band's scores
        index = distance.long().clamp(1, max(reach, 1)) - 1  # outside the window: masked below anyway
        relative = torch.einsum("bhnak,kaw->bhnaw", qb, key_position[:, index]) * q.shape[-1] ** -0.5
    if distance_bias is not None:  # one [1, h, 1, a, w] template, the band's distances being the same per block
        index = distance.long().clamp(1, max(reach, 1)) - 1
        mask_bias = distance_bias[:, index][None, :, None]
    neg_inf = torch.full((), float("-inf"), dtype=q.dtype, device=q.device)
    tiny = torch.finfo(q.dtype).tiny  # log(m) with -inf where m = 0; the clamp keeps log's gradient finite there

    def attend(part: slice, allowed: Tensor) -> Tensor:
        """SDPA over the blocks ``part`` with the log soft mask on the ``allowed`` keys. A row with
        no allowed key attends to its own key instead (no NaN) and its result is then zeroed."""
        empty = ~allowed.any(-1, keepdim=True)  # [..., a, 1]
        allowed = allowed | (empty & itself)
        score = mask.clamp_min(tiny).log()  # log m(0) = 0 on the stand-in key
        if key_position is not None:
            score = score + relative[:, :, part]
        if distance_bias is not None:
            score = score + mask_bias
        bias = torch.where(allowed, score, neg_inf)
        out = F.scaled_dot_product_attention(
            qb[:, :, part], kb[:, :, part], vb[:, :, part], attn_mask=bias, dropout_p=dropout
        )
        return out.masked_fill(empty, 0.0)

    # Allowed keys: in the window, a non-zero mask, and real (keys left of the cache do not exist,
    # padded keys are masked). Keys right of the segment are only ever in a query's future, which
    # the window already removes.
    allowed = in_window & (mask > 0)  # [1, h, 1, a, w] or [b, h, n, a, w]
    if key_valid is None and spans.dim() == 1:
        # common case: only the first blocks reach before the first key; the others share one
        # [1, h, 1, a, w] bias, broadcast by SDPA instead of materialised per block (with relative
        # keys the q . p term makes it [b, h, n, a, w], the size of the band's scores)
        head = min(n, -(-left // a))
        parts = []
        if head:
            exists = torch.ones(1, k.shape[2], dtype=torch.bool, device=q.device)
            exists = F.pad(exists, (left, right), value=False).unfold(1, width, a)[:, :head]  # [1, head, w]
            parts.append(attend(slice(0, head), allowed & exists[:, None, :, None, :]))
        if head < n:
            parts.append(attend(slice(head, n), allowed))
        out = torch.cat(parts, dim=2) if len(parts) > 1 else parts[0]
    else:
        valid = key_valid if key_valid is not None else torch.ones(1, k.shape[2], dtype=torch.bool, device=q.device)
        valid = F.pad(valid, (left, right), value=False).unfold(1, width, a)  # [b|1, n, w]
        out = attend(slice(0, n), allowed & valid[:, None, :, None, :])
    return rearrange(out, "b h n a k -> b h (n a) k")[:, :, :t]
