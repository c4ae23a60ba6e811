"""LSH attention continued from a state: the bucket cache behind ``lsh``'s streaming.

Not a mechanism (nothing registers here); ``lsh.py`` calls :func:`stream_lsh` when it is given a
state. In causal use with ``look_back="window"``, same-bucket keys only and a fixed ``n_buckets``,
LSH's key set for query i in hash round r is the ``chunk_size`` most recent earlier items of i's
bucket, plus i itself (scored SELF_SCORE, so it counts only when nothing else is visible): the
sorted chunks of the one-call pass (``sorted_chunks.py``) compute exactly that, and so does this
file from a cache holding, per round and bucket, the ``chunk_size`` most recent items. Each query's
rounds are then combined by their log-sum-exp normalisers, as in the one-call pass. Bucket
hashes depend on the token alone (the rotations are fixed between optimiser steps), so a stream
fed in any pieces equals one call.

The cache is bounded: n_buckets x chunk_size items per round, whatever the stream's length (the
receptive field itself is bounded: a bucket holds at most c visible keys). It is laid out by bucket:
bucket B's items sit in slots [B c, (B + 1) c) of each round, so a decoding step reads only its
bucket's c slots per round (O(R c k), whatever n_buckets), not the whole cache. With the automatic
bucket count, the paper's chunk look-back or keys across buckets, a key set depends on tokens that
come later (the number of chunks, the chunk boundaries), so ``lsh`` refuses a state then.

How a call runs, per round, vectorised over batch, heads and rounds: the cached items and the new
ones are sorted together by (bucket, position); a new item's keys are the c sorted slots before it
that share its bucket; an item stays in the cache while fewer than c later items share its bucket.
New tokens go in pieces of ``PIECE`` so the gathered windows stay small. One token (decoding) needs no
sort: it reads its bucket's slots and overwrites one of them (an empty one, else the oldest).

Shapes: b batch, h heads, R rounds, N = n_buckets x c cached slots, L = N + t items, k head dim.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

from zoo.attention.append import SlotStore, own_slots, write_slots
from zoo.attention.sorted_chunks import MASKED_SCORE, SELF_SCORE

PIECE = 256  # new tokens scored per pass over the cache


@dataclass
class LSHCache:
    """Per round, the ``chunk_size`` (c) most recent items of every bucket, bucket B's in slots
    [B c, (B + 1) c) in any order. keys (unit-length, unscaled) and values [b, h, R, N, k]; bucket and
    position [b, h, R, N] (position -1 = an empty slot, whose bucket n_buckets + 1 sorts after every
    real one); ``next``: the absolute position of the next token."""

    keys: Tensor | None = None
    values: Tensor | None = None
    bucket: Tensor | None = None
    position: Tensor | None = None
    next: int = 0
    # the storage a decode step overwrites in place (zoo/attention/append.py), and this state's write of it
    store: SlotStore | None = field(default=None, compare=False, repr=False)
    version: int = 0
    # the storage a decode from this state last copied it into, refilled by the next one once no state
    # uses it (append.py's write_slots): decoding from one prefilled state again copies into warm memory
    spare: SlotStore | None = field(default=None, compare=False, repr=False)

    @property
    def length(self) -> int:
        """Items the fullest round holds (at most n_buckets x chunk_size)."""
        return 0 if self.position is None else int((self.position >= 0).sum(-1).max())


def empty_cache(b: int, h: int, rounds: int, slots: int, k: int, like: Tensor) -> LSHCache:
    """Every slot empty: an empty slot's bucket (n_buckets + 1 as set by the caller) sorts last."""
    zeros = like.new_zeros(b, h, rounds, slots, k)
    position = torch.full((b, h, rounds, slots), -1, dtype=torch.long, device=like.device)
    return LSHCache(zeros, zeros.clone(), torch.zeros_like(position), position, 0)


def stream_lsh(
    qk: Tensor,
    v: Tensor,
    buckets: Tensor,
    cache: LSHCache,
    *,
    chunk: int,
    n_buckets: int,
    dropout: float = 0.0,
    bias_of: Callable[[Tensor, Tensor], Tensor] | None = None,
) -> tuple[Tensor, LSHCache]:
    """Continue LSH attention over new tokens: qk, v [b, h, t, k] (shared query-key projections and
    values, already rotated when the layer uses rope; qk times the layer's score scale, which reaches
    only the queries: the keys are qk's unit vectors), buckets [b, h, R, t] (padding in bucket
    n_buckets). ``bias_of(distance, head)`` -> the pair bias of each entry (the layer's ``pair_bias``),
    or None. Returns the outputs [b, h, t, k] before the output projection, and the cache to carry
    on (detached)."""
    b, h, t, k = qk.shape
    rounds = buckets.shape[2]
    if cache.keys is None:
        cache = empty_cache(b, h, rounds, n_buckets * chunk, k, qk)
        cache.bucket.fill_(n_buckets + 1)
    elif cache.keys.shape[0] != b:
        raise ValueError(f"lsh: the cache holds batch size {cache.keys.shape[0]}, the input has {b}")
    if t == 1:  # decoding: no sort needed, the cache already holds each bucket's window
        return _one_token(qk, v, buckets, cache, chunk, n_buckets, dropout, bias_of)
    outs = []
    for start in range(0, t, PIECE):
        piece = slice(start, start + PIECE)
        out, cache = _piece(
            qk[:, :, piece], v[:, :, piece], buckets[..., piece], cache, chunk, n_buckets, dropout, bias_of
        )
        outs.append(out)
    return torch.cat(outs, dim=2), cache


def _piece(
    qk: Tensor,
    v: Tensor,
    buckets: Tensor,
    cache: LSHCache,
    c: int,
    n_buckets: int,
    dropout: float,
    bias_of: Callable[[Tensor, Tensor], Tensor] | None,
) -> tuple[Tensor, LSHCache]:
    b, h, t, k = qk.shape
    rounds, slots = buckets.shape[2], cache.keys.shape[3]
    positions = torch.arange(cache.next, cache.next + t, device=qk.device)
    unit = F.normalize(qk, dim=-1)  # shared QK: keys are the unit-length queries
    keys = torch.cat([cache.keys, unit[:, :, None].expand(-1, -1, rounds, -1, -1)], dim=3)  # [b, h, R, L, k]
    values = torch.cat([cache.values, v[:, :, None].expand(-1, -1, rounds, -1, -1)], dim=3)
    bucket = torch.cat([cache.bucket, buckets], dim=3)  # [b, h, R, L]
    position = torch.cat([cache.position, positions.expand(b, h, rounds, t)], dim=3)
    # sort by (bucket, position): within a bucket the sorted order is the position order
    order = (bucket * (position.max() + 2) + position + 1).argsort(dim=-1)
    sorted_bucket, sorted_position = bucket.gather(-1, order), position.gather(-1, order)
    slot_of = torch.empty_like(order).scatter_(
        -1, order, torch.arange(order.shape[-1], device=qk.device).expand_as(order)
    )
    new_slot = slot_of[..., slots:]  # [b, h, R, t]: where each new item sits in the sorted order
    # each new item's window: the c sorted slots before it, then itself (last)
    window = new_slot[..., None] + torch.arange(-c, 1, device=qk.device)  # [b, h, R, t, c + 1]
    inside = window >= 0
    window = window.clamp(min=0)
    same = sorted_bucket.gather(-1, window.flatten(-2)).view_as(window) == buckets[..., None]
    filled = sorted_position.gather(-1, window.flatten(-2)).view_as(window) >= 0
    visible = inside & same & filled
    source = order.gather(-1, window.flatten(-2))  # window slots -> items of keys / values
    window_keys = keys.gather(3, source[..., None].expand(-1, -1, -1, -1, k)).view(*window.shape, k)
    window_values = values.gather(3, source[..., None].expand(-1, -1, -1, -1, k)).view(*window.shape, k)
    scores = torch.einsum("bhtk,bhrtwk->bhrtw", qk, window_keys)
    if bias_of is not None:  # the positions travel with the cached items
        key_position = sorted_position.gather(-1, window.flatten(-2)).view_as(window)
        head = torch.arange(h, device=qk.device).view(1, h, 1, 1, 1)
        scores = scores + bias_of(positions.view(1, 1, 1, t, 1) - key_position, head)
    scores = scores.masked_fill(~visible, MASKED_SCORE)
    scores[..., -1] = SELF_SCORE  # oneself: only when nothing else is visible (the paper's rule)
    lse = torch.logsumexp(scores, dim=-1)  # [b, h, R, t]
    probs = torch.exp(scores - lse[..., None])
    if dropout > 0:
        probs = F.dropout(probs, p=dropout)
    out = torch.einsum("bhrtw,bhrtwk->bhrtk", probs, window_values)
    out = (out * torch.softmax(lse, dim=2)[..., None]).sum(2) if rounds > 1 else out[:, :, 0]
    return out, _kept(keys, values, bucket, position, order, sorted_bucket, c, n_buckets, slots, cache.next + t)


def _one_token(
    qk: Tensor,
    v: Tensor,
    buckets: Tensor,
    cache: LSHCache,
    c: int,
    n_buckets: int,
    dropout: float,
    bias_of: Callable[[Tensor, Tensor], Tensor] | None,
) -> tuple[Tensor, LSHCache]:
    """One new token: its keys in round r are the cached items of its bucket (the cache keeps exactly
    the c most recent ones, in the bucket's c slots), gathered and scored (O(R c k), no sort); it then
    takes an empty slot of its bucket, or the slot of the bucket's oldest item when the bucket is full."""
    b, h, _, k = qk.shape
    bucket = buckets[..., 0]  # [b, h, R]
    rounds = bucket.shape[-1]
    real = bucket < n_buckets  # padding (bucket n_buckets) sees only itself and is never kept
    # the storage this step writes to (the state's own, or a copy of it: append.py's rule), read first
    store = own_slots(cache.store, [cache.keys, cache.values, cache.bucket, cache.position], cache.version, cache.spare)
    if store is not cache.store:  # copied from this state: the next copy from it may reuse that storage
        cache.spare = store
    # bucket B's c slots are row B of each round's [n_buckets, c (k)] block: read as whole rows
    region = torch.arange(b * h * rounds, device=qk.device) * n_buckets + bucket.clamp(max=n_buckets - 1).flatten()

    def bucket_rows(x: Tensor) -> Tensor:  # [b, h, R, N(, k)] (contiguous) -> [b, h, R, c(, k)]
        per_slot = x.shape[4:]
        return x.view(-1, c * math.prod(per_slot)).index_select(0, region).view(b, h, rounds, c, *per_slot)

    keys_kept, values_kept, _, positions_kept = store.tensors
    keys, values, position = bucket_rows(keys_kept), bucket_rows(values_kept), bucket_rows(positions_kept)
    slots = bucket.clamp(max=n_buckets - 1)[..., None] * c + torch.arange(c, device=qk.device)  # [b, h, R, c]
    same = (position >= 0) & real[..., None]  # every filled slot of the region holds its bucket's item
    scores = torch.einsum("bhk,bhrck->bhrc", qk[:, :, 0], keys)
    if bias_of is not None:  # the cached items carry their positions; empty slots are masked below
        head = torch.arange(qk.shape[1], device=qk.device).view(1, -1, 1, 1)
        scores = scores + bias_of(cache.next - position, head)
    scores = scores.masked_fill(~same, MASKED_SCORE)
    scores = torch.cat([scores, torch.full_like(scores[..., :1], SELF_SCORE)], dim=-1)  # oneself, last
    lse = torch.logsumexp(scores, dim=-1)  # [b, h, R]
    probs = torch.exp(scores - lse[..., None])
    if dropout > 0:
        probs = F.dropout(probs, p=dropout)
    out = torch.einsum("bhrc,bhrck->bhrk", probs[..., :-1], values) + probs[..., -1:] * v[:, :, None, 0]
    out = (out * torch.softmax(lse, dim=-1)[..., None]).sum(2) if rounds > 1 else out[:, :, 0]
    # the slot it takes: an empty one of its bucket (position -1, the smallest), else the oldest item's
    slot = slots.gather(-1, position.argmin(-1, keepdim=True))  # [b, h, R, 1]
    at = slot[..., None].expand(-1, -1, -1, -1, k)
    unit = F.normalize(qk[:, :, 0], dim=-1)[:, :, None, None].expand(-1, -1, rounds, -1, -1)
    value = v[:, :, 0][:, :, None, None].expand(-1, -1, rounds, -1, -1)
    keep, now = real[..., None], torch.full_like(slot, cache.next)

    def write(tensors: list[Tensor]) -> None:  # one slot per round overwritten, in place (padding: as it was)
        keys, values, buckets_kept, positions = tensors
        positions.scatter_(-1, slot, torch.where(keep, now, positions.gather(-1, slot)))
        buckets_kept.scatter_(-1, slot, torch.where(keep, bucket[..., None], buckets_kept.gather(-1, slot)))
        keys.scatter_(3, at, torch.where(keep[..., None], unit, keys.gather(3, at)))
        values.scatter_(3, at, torch.where(keep[..., None], value, values.gather(3, at)))

    version = write_slots(store, write)
    return out[:, :, None], LSHCache(*store.views(), cache.next + 1, store=store, version=version)


def _kept(
    keys: Tensor,
    values: Tensor,
    bucket: Tensor,
    position: Tensor,
    order: Tensor,
    sorted_bucket: Tensor,
    c: int,
    n_buckets: int,
    slots: int,
    next_position: int,
) -> LSHCache:
    """The items a later query may see: real (not padding, not empty) and among the c most recent of
    their bucket, i.e. the sorted slot c places on holds another bucket (or lies past the end), laid out
    by bucket: the one e items from its bucket's end goes to slot B c + c - 1 - e; the other slots are
    empty."""
    length = sorted_bucket.shape[-1]
    ahead = F.pad(sorted_bucket[..., c:], (0, min(c, length)), value=-1)[..., :length]
    keep_sorted = (ahead != sorted_bucket) & (sorted_bucket < n_buckets)
    end = torch.searchsorted(sorted_bucket, sorted_bucket, right=True)  # past the last item of each one's bucket
    target = sorted_bucket.clamp(max=n_buckets - 1) * c + c - end + torch.arange(length, device=end.device)
    target = torch.where(keep_sorted, target, slots)  # the others go to one extra slot, dropped
    # per slot, the combined item it takes (``length``: none, the slot is empty)
    taken = order.new_full((*order.shape[:3], slots + 1), length).scatter_(3, target, order)[..., :slots]
    empty = taken == length
    rows = taken.clamp(max=length - 1) + length * torch.arange(
        taken.shape[0] * taken.shape[1] * taken.shape[2], device=taken.device
    ).view(taken.shape[:3] + (1,))

    def laid_out(x: Tensor, fill: float | int) -> Tensor:
        """x [b, h, R, L(, k)] of the combined items -> [b, h, R, N(, k)] by bucket, ``fill`` where empty."""
        per_item = x.shape[4:]
        picked = x.detach().reshape(-1, *per_item).index_select(0, rows.flatten()).view(*taken.shape, *per_item)
        return picked.masked_fill(empty.view(*empty.shape, *(1,) * len(per_item)), fill)

    return LSHCache(
        laid_out(keys, 0.0),
        laid_out(values, 0.0),
        laid_out(bucket, n_buckets + 1),
        laid_out(position, -1),
        next_position,
    )
