"""Blocked attention: the shared machinery behind the static sparse and local patterns.

Not a mechanism (nothing registers here). The sparse (``sparse.py``) and local (``local.py``)
patterns all reduce to "groups of queries, each attending to a small key set", computed without
ever forming a t x t tensor by the kernels in ``blocked_kernels.py`` (:func:`attend_groups`,
:func:`banded_attention`, :func:`joint_softmax`; importable from here too). This module holds the
patterns' base class, :class:`PatternAttention`, and their streaming cache.

Positions inside attention (``Attention.position_kinds``): every pattern here takes rope (queries and
keys rotated at their absolute positions before the pattern runs; the cache keeps rotated keys) and a
pair bias (ALiBi, T5): the blocked kernels add it through ``pair_bias.py``, from one template per
block shape, since within a pattern's block the distances repeat from block to block.

Streaming (:class:`PatternCache`): a pattern that is a fixed rule over absolute positions continues
a sequence from a state. Each pattern says which key positions a query position may see
(``allowed``) and which kept keys a later query may still need (``state_bound`` for a window,
``still_needed`` otherwise); the first call over a stream runs the blocked pass above, later calls
score their queries against the cache plus their own keys, in chunks of ``STREAM_CHUNK`` queries,
against the union of the chunk's key sets only (:meth:`PatternAttention.attend_cached`).

Shape legend as in ``base.py``; here additionally ``T`` = padded length, ``n`` = number of blocks,
``s`` = block size, ``w`` = window (keys per block), ``g`` = groups, ``l`` = queries per group.
Key validity ``valid`` is bool [b or 1, T]: True for a real key (inside the sequence, not padding).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from zoo.attention.append import AppendStore, append, needs_gradient, slide
from zoo.attention.base import NOT_PER_ROW, Attention, AttnOutput, join_key_padding
from zoo.attention.blocked_kernels import (
    attend_groups,
    attend_masked,
    banded_attention,
    joint_softmax,
    key_validity,
    pad_time,
    padded_length,
    windows,
)
from zoo.attention.flex import Rule, flex_attend, use_flex

__all__ = [
    "STREAM_CHUNK",
    "PatternAttention",
    "PatternCache",
    # the kernels' home is blocked_kernels.py; importable from here as before
    "attend_groups",
    "attend_masked",
    "banded_attention",
    "joint_softmax",
    "key_validity",
    "pad_time",
    "padded_length",
    "windows",
]

STREAM_CHUNK = 256  # queries scored together against the cache: bounds the [chunk, keys] mask


@dataclass
class PatternCache:
    """The keys a static pattern's later queries may still see, carried between calls (causal use).

    k, v [b, h, n, k] and ``position`` [n] (absolute, ascending) of the kept keys; ``valid`` [b, n]
    (False = a padded key) or None when every kept key is real; ``next`` is the absolute position of
    the next token. A pattern with a bounded window keeps its ``sinks`` first positions and the most
    recent ones up to ``state_bound`` (what a ring buffer of the window holds, kept in position
    order; older keys the window no longer reaches are masked by ``allowed``); an unbounded one
    keeps exactly the keys ``still_needed`` names (the strided columns, the fixed summaries)."""

    k: Tensor | None = None
    v: Tensor | None = None
    position: Tensor | None = field(default=None, metadata=NOT_PER_ROW)  # [n], the same for every row
    valid: Tensor | None = None
    next: int = 0
    store: AppendStore | None = field(default=None, compare=False, repr=False)  # k, v, position view it

    @property
    def length(self) -> int:
        return 0 if self.k is None else self.k.shape[2]


class PatternAttention(Attention):
    """Base of the static-pattern mechanisms: q/k/v/output projections (option ``bias``) around
    ``attend(q, k, v, pad_mask)``, which each pattern implements on heads [b, h, t, k].

    Streaming: a causal pattern answers ``allowed(i, j)`` (query position i may see key position j,
    absolute positions) and how much of the past it keeps (``state_bound`` / ``still_needed``); this
    class then continues a sequence from a :class:`PatternCache` exactly (the contract suite checks
    segments == one call == token by token)."""

    no_packing_reason = "its blocked pattern kernel (blocked.py) does not mask keys of another document yet"

    supports_memory = True  # a causal pattern continues a stream through its PatternCache
    position_kinds = ("rotary", "pair_bias")  # on the pairs each pattern computes (see the module notes)
    # grouped keys/values stay grouped in the PatternCache and in what context parallelism sends
    projection_features = ("grouped_kv", "qk_norm")
    no_projection_reason = "its blocked kernels score through fused SDPA and never write the scores out to cap them"

    def __init__(self, d_model: int, n_heads: int, **kwargs):
        super().__init__(d_model, n_heads, **kwargs)
        self.add_projections(bias=self.options.bias)

    def forward(
        self, x: Tensor, *, context: Tensor | None = None, pad_mask: Tensor | None = None, state=None
    ) -> AttnOutput:
        self.check_inputs(x, context, pad_mask, state)
        q, k, v = (self.split_heads(proj(x)) for proj in (self.to_q, self.to_k, self.to_v))
        if state is None:
            positions = torch.arange(x.shape[1], device=x.device)
            q, k = self.rotate(q, positions), self.rotate(k, positions)
            k, v = self.expand_kv(k, v)
            if self.on_flex(x.device):
                out = self.attend_flex(q, positions, k, v, positions, pad_mask)
            else:
                out = self.attend(q, k, v, pad_mask)
            return AttnOutput(self.to_out(self.merge_heads(out)))
        out, new_state = self.continue_stream(q, k, v, pad_mask, state)
        return AttnOutput(self.to_out(self.merge_heads(out)), state=new_state)

    # -- the FlexAttention backend (flex.py): the same rule as allowed(), run by FlexAttention ------------
    def pair_rule(self, t: int) -> tuple[Rule, bool]:
        """(rule(head, i, j), whether the heads differ) for a call over t positions: the pattern as a rule
        over absolute positions, causal or not. Default: ``allowed`` (the same for every head)."""
        return (lambda h, i, j: self.allowed(i, j)), False

    @property
    def backend(self) -> str:
        """Option ``backend``: flex (FlexAttention), native (the blocked path) or auto (flex on CUDA). A
        pattern whose Options has no such option (longformer: its global rows have their own projections,
        which no single rule expresses) keeps its own path."""
        return getattr(self.options, "backend", "native")

    def on_flex(self, device: torch.device) -> bool:
        return use_flex(self.backend, device, self.registry_name, self.attn_dropout)

    def attend_flex(
        self, q: Tensor, positions: Tensor, k: Tensor, v: Tensor, key_positions: Tensor, valid: Tensor | None
    ) -> Tensor:
        rule, heads_differ = self.pair_rule(int(key_positions.max()) + 1)
        options = tuple(sorted(vars(self.options).items()))
        return flex_attend(
            q,
            k,
            v,
            rule,
            query_positions=positions,
            key_positions=key_positions,
            valid=valid,
            heads_differ=heads_differ,
            cache_key=(type(self).__name__, options, self.causal, self.layer_index, self.n_heads),
            bias=self.flex_bias(positions, key_positions, q.dtype),
        )

    def attend(self, q: Tensor, k: Tensor, v: Tensor, pad_mask: Tensor | None = None) -> Tensor:
        """The pattern's attention on projected heads: q, k, v [b, h, t, k] -> [b, h, t, k]."""
        raise NotImplementedError

    def distance_bias(self, distance: Tensor, dtype: torch.dtype, heads: slice = slice(None)) -> Tensor | None:
        """The position part's b_h(i - j) [h', ...] for the heads ``heads`` (per_head patterns split
        them), or None without a pair bias."""
        bias = self.pair_bias(distance, dtype)
        return None if bias is None else bias[heads]

    @property
    def attn_dropout(self) -> float:
        """Dropout on the attention weights: only while training."""
        return self.dropout if self.training else 0.0

    # -- streaming -----------------------------------------------------------------------------------
    def init_state(self, batch_size: int) -> PatternCache:
        super().init_state(batch_size)  # refuses, with the reason, a layer that cannot stream
        return PatternCache()

    def allowed(self, i: Tensor, j: Tensor) -> Tensor:
        """May the query at absolute position i see the key at absolute position j (causal use)?
        i [c, 1], j [1, s] long -> bool [c, s], or [h, c, s] when the heads differ (per_head)."""
        raise NotImplementedError(f"{self.registry_name} does not say which keys a query sees")

    def still_needed(self, j: Tensor, next_position: int) -> Tensor:
        """bool like j: may a query at a position >= ``next_position`` still see key j? Asked only when
        ``state_bound()`` is None; default: every key (a pattern that reaches back without bound)."""
        return torch.ones_like(j, dtype=torch.bool)

    @property
    def sinks(self) -> int:
        """The first positions every query sees (attention sinks), kept in the cache whatever its window."""
        return 0

    def check_stream_position(self, end: int) -> None:
        """Refuse a stream that runs past what the pattern is defined over (an image's last pixel)."""

    def continue_stream(
        self, q: Tensor, k: Tensor, v: Tensor, pad_mask: Tensor | None, cache: PatternCache
    ) -> tuple[Tensor, PatternCache]:
        """Attention of the new queries q [b, h, t, k] (absolute positions cache.next ...) over the
        cached keys and their own, and the cache to carry on."""
        t = q.shape[2]
        self.check_stream_position(cache.next + t)
        if cache.k is not None and cache.k.shape[0] != q.shape[0]:
            raise ValueError(
                f"{self.registry_name}: the cache holds batch size {cache.k.shape[0]}, the input has {q.shape[0]}"
            )
        positions = torch.arange(cache.next, cache.next + t, device=q.device)
        q, k = self.rotate(q, positions), self.rotate(k, positions)  # cached rotated, at their stream positions
        store = None
        if cache.k is None:  # nothing earlier: the pattern's own blocked pass is exact and cheapest
            keys, values, key_positions, valid = k, v, positions, pad_mask
            flex, (k, v) = self.on_flex(q.device), self.expand_kv(k, v)
            out = self.attend_flex(q, positions, k, v, positions, pad_mask) if flex else self.attend(q, k, v, pad_mask)
        else:
            if needs_gradient(k, v):
                keys, values = torch.cat([cache.k, k], dim=2), torch.cat([cache.v, v], dim=2)
                key_positions = torch.cat([cache.position, positions])
            else:  # written in place into the cache's storage (zoo/attention/append.py)
                cached, new = [cache.k, cache.v, cache.position], [k, v, positions]
                store, (keys, values, key_positions) = append(cache.store, cached, new, [2, 2, 0])
            valid = join_key_padding(cache.valid, cache.length, pad_mask, q.transpose(1, 2))
            # a cache grows every call, and each new shape compiles FlexAttention again: only when asked by name
            if self.backend == "flex" and self.on_flex(q.device):
                out = self.attend_flex(q, positions, *self.expand_kv(keys, values), key_positions, valid)
            else:
                out = self.attend_cached(q, positions, *self.expand_kv(keys, values), key_positions, valid)
        return out, self.kept(keys, values, key_positions, valid, cache.next + t, store)

    def attend_cached(
        self, q: Tensor, positions: Tensor, k: Tensor, v: Tensor, key_positions: Tensor, valid: Tensor | None
    ) -> Tensor:
        """q [b, h, t, k] at ``positions`` [t] against k, v [b, h, s, k] at ``key_positions`` [s]
        (valid [b, s] or None). Queries go in chunks of STREAM_CHUNK; each chunk is scored only against
        the keys one of its queries may see, so a decode step costs the keys it attends to (plus an
        O(s) boolean mask), not the whole cache."""
        outs = []
        for start in range(0, q.shape[2], STREAM_CHUNK):
            chunk = positions[start : start + STREAM_CHUNK]
            allowed = self.allowed(chunk[:, None], key_positions[None, :])  # [c, s] or [h, c, s]
            seen = allowed.reshape(-1, allowed.shape[-1]).any(0).nonzero().squeeze(1)
            mask = allowed[..., seen]
            mask = mask[None, None] if mask.dim() == 2 else mask[None]  # [1, h or 1, c, s']
            if valid is not None:
                mask = mask & valid[:, None, None, seen]
            kc, vc = k.index_select(2, seen), v.index_select(2, seen)
            bias = self.distance_bias(chunk[:, None] - key_positions[None, seen], q.dtype)  # [h, c, s'] or None
            qc = q[:, :, start : start + STREAM_CHUNK]
            outs.append(attend_masked(qc, kc, vc, mask, dropout=self.attn_dropout, bias=bias))
        return torch.cat(outs, dim=2)

    def kept_positions(self, j: Tensor, next_position: int) -> Tensor:
        """bool like j (absolute positions, each < ``next_position``): is key j among those ``kept`` holds
        once a stream has reached ``next_position``, i.e. may a later query still see it? The same rule
        as ``kept``, over positions alone: the sinks and the newest ``state_bound()`` keys of a bounded
        pattern, ``still_needed`` for an unbounded one."""
        bound = self.state_bound()
        if bound is None:
            return self.still_needed(j, next_position)
        sinks = min(self.sinks, bound)
        return (j < sinks) | (j >= next_position - (bound - sinks))

    # -- context parallelism (zoo/parallel): this rank's queries read what ``kept`` would hold -------------
    def context_refusal(self) -> str | None:
        if not self.causal:
            return (
                f"attention {self.registry_name!r} is bidirectional here: its queries read later chunks, and only "
                "the causal pattern says which earlier keys it reads"
            )
        return self.stream_refusal()  # a pattern that cannot continue a stream cannot take a halo either

    def shift_period(self) -> int | None:
        """The shift s under which this layer's pattern is the same (allowed(i + s, j + s) == allowed(i, j)
        for every multiple s of it), when it is bounded; None when no shift leaves it alone (sinks are
        absolute positions) or it reads back without bound. Context parallelism then runs the blocked pass
        on a chunk that starts at a multiple of it, as if it started at 0."""
        return None

    def attend_chunk(self, x: Tensor, chunk, *, pad_mask: Tensor | None = None, state=None, **kwargs) -> AttnOutput:
        """This rank's queries over the keys earlier ranks hold that the pattern lets them see, which are
        exactly what a stream's cache would keep after the earlier chunks (``kept_positions``): a halo of
        the window for a bounded pattern (local_1d: its sinks and the l_m + l_q - 1 keys before the chunk),
        the columns or summaries for an unbounded one. The first chunk runs the blocked pass. A later one
        scores its queries against [received keys ; its own] by absolute position (``attend_cached``),
        except where the pattern is bounded and shifts to the chunk's start (``shift_period``): there only
        the first ``state_bound()`` queries can see an earlier key, and the rest take the blocked pass."""
        self.check_inputs(x, None, pad_mask, None)
        self.refuse_chunk_state(state)
        q, k, v = (self.split_heads(proj(x)) for proj in (self.to_q, self.to_k, self.to_v))
        self.check_stream_position(chunk.pieces[-1][1])
        positions = chunk.positions(q.device)
        q, k = self.rotate(q, positions), self.rotate(k, positions)  # rope: sent rotated, as a cache holds them
        (keys, values), key_positions, valid = chunk.earlier([k, v], dim=2, select=self.kept_positions, valid=pad_mask)
        (k, v), (keys, values) = self.expand_kv(k, v), self.expand_kv(keys, values)  # sent grouped, scored widened
        if self.on_flex(q.device):  # FlexAttention (flex.py) takes the rule over any absolute positions
            out = self.attend_flex(q, positions, keys, values, key_positions, valid)
            return AttnOutput(self.to_out(self.merge_heads(out)))
        if chunk.start == 0:  # the first chunk reads nothing earlier: the pattern's own blocked pass
            return AttnOutput(self.to_out(self.merge_heads(self.attend(q, keys, values, valid))))
        period, head = self.shift_period(), q.shape[2]
        if period and chunk.start % period == 0:
            head = min(head, self.state_bound())  # queries past it see only this chunk's keys
        out = self.attend_cached(q[:, :, :head], positions[:head], keys, values, key_positions, valid)
        if head < q.shape[2]:
            n = keys.shape[2] - k.shape[2]  # the own part of [received ; own], whose gradient reaches the senders
            own = self.attend(q, keys[:, :, n:], values[:, :, n:], None if valid is None else valid[:, n:])
            out = torch.cat([out, own[:, :, head:]], dim=2)
        return AttnOutput(self.to_out(self.merge_heads(out)))

    def kept(
        self,
        k: Tensor,
        v: Tensor,
        positions: Tensor,
        valid: Tensor | None,
        next_position: int,
        store: AppendStore | None = None,
    ) -> PatternCache:
        """The cache after a call: a bounded pattern keeps its sinks and the newest ``state_bound()``
        keys, an unbounded one the keys ``still_needed`` names. Detached: no gradient crosses calls.
        ``store``: the storage k, v, positions are views of; a window without sinks slides over it (no copy)."""
        bound, n = self.state_bound(), positions.shape[0]
        if bound is None:
            index = self.still_needed(positions, next_position).nonzero().squeeze(1)
        elif n > bound and store is not None and not self.sinks:
            k, v, positions = slide(store, [k, v, positions], bound)
            valid = None if valid is None else valid[:, n - bound :]
            return PatternCache(k, v, positions, valid, next_position, store)
        elif n > bound:
            sinks = min(int((positions < self.sinks).sum()), bound)
            index = torch.cat(
                [torch.arange(sinks, device=k.device), torch.arange(n - (bound - sinks), n, device=k.device)]
            )
        else:
            index = None
        if index is not None:
            k, v, positions = k.index_select(2, index), v.index_select(2, index), positions[index]
            valid = None if valid is None else valid[:, index]
            store = None
        return PatternCache(k.detach(), v.detach(), positions, valid, next_position, store)
