"""Multi-head scaled dot-product attention.

Paper: "Attention Is All You Need", Vaswani et al. 2017, arXiv:1706.03762, Section 3.2.

Computed through ``torch.nn.functional.scaled_dot_product_attention`` so the fused CPU/GPU kernels
run. The mask passed to it is the cheapest one that expresses the pattern (measured: docs/architecture.md):
``is_causal=True`` when there is no padding and no cache offset, a broadcast key-padding mask
[b, 1, 1, s] when there is padding but no causality, and a full [b, 1, t, s] mask only when causality
and padding (or a cache offset) must be combined.

Deviations: none in the maths. The KV cache (``state``) is ours: incremental decoding keeps the
projected keys/values of earlier tokens (detached) so each new token costs O(s), not O(s^2).
``max_cache`` bounds it to the most recent keys (a sliding window over the stream: a new token
sees the last ``max_cache`` cached ones and its own segment); ``sinks`` keeps the first k keys of
the stream in it besides (Xiao et al. 2023, "Efficient Streaming Language Models with Attention
Sinks", arXiv:2309.17453: the cache keeps the sinks and rolls the window).

Positions inside attention (``zoo/position``): ``rope`` rotates q and k at their absolute positions
in the stream (the cache keeps rotated keys and the position of each, so eviction and sinks keep
every distance); ``alibi`` / ``t5_bias`` add b_h(i - j), through blocks of queries
(``pair_bias.py``) since SDPA takes the bias as a float mask; rope alone keeps the fused causal
kernel. With the part's ``cache_positions`` (StreamingLLM's rule), keys are cached un-rotated and a
call numbers the cache's keys 0 ... s - 1 by their place in it (the queries follow them), so after
eviction the distances are those inside the cache, as the paper does for Llama-2's rotary.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

from zoo.attention.append import AppendStore, append, needs_gradient, new_store, slide
from zoo.attention.base import (
    ATTENTION,
    Attention,
    AttnOutput,
    KeysPerQuery,
    StateContract,
    causal_allowed,
    dense_keys,
    guard_empty_rows,
    join_key_padding,
)
from zoo.attention.document_attention import DocumentAttention
from zoo.attention.flex import DistanceBias, check_backend, flex_attend, use_flex
from zoo.attention.pair_bias import biased_sdpa
from zoo.attention.projections import softcapped_attention
from zoo.config import require


@dataclass
class KVCache:
    """Keys/values of the tokens seen so far. k, v: [b, h, m, k]; pad_mask: [b, m] or None;
    ``next``: the absolute position of the next token; ``sinks``: the cache leads with the stream's
    first ``sinks`` tokens and holds the most recent ones after them (vanilla's eviction), so the
    position of every cached key follows (:meth:`positions`; plain integers, which beam search's
    reordering of batch rows leaves alone).

    ``static`` marks a cross-attention cache (keys/values of the encoder output, computed once).
    ``store``: the buffers k and v are views of when decoding appends in place (zoo/attention/append.py;
    None: they are tensors of their own, and the next append copies them into a store)."""

    k: Tensor | None = None
    v: Tensor | None = None
    pad_mask: Tensor | None = None
    static: bool = False
    next: int = 0
    sinks: int = 0
    store: AppendStore | None = field(default=None, compare=False, repr=False)

    @property
    def length(self) -> int:
        return 0 if self.k is None else self.k.shape[2]

    def positions(self, device: torch.device | None = None) -> Tensor:
        """Absolute positions of the cached keys, long [m], ascending: the first min(sinks, m) of the
        stream, then the most recent ones up to ``next``."""
        m = self.length
        first = min(self.sinks, m)
        return torch.cat([torch.arange(first), torch.arange(self.next - (m - first), self.next)]).to(device)


def extend_cache(
    cache: KVCache, k: Tensor, v: Tensor, pad_mask: Tensor | None, name: str | None
) -> tuple[Tensor, Tensor, Tensor | None, AppendStore | None]:
    """[cached ; new] keys and values [b, h, m + t, k], their key padding [b, m + t] (None when none)
    and the store they are views of, for a dense self-attention continuing a stream; refuses another
    batch size or a cross-attention cache. Without gradient the new entries are appended in place
    (zoo/attention/append.py); a call that needs gradient through them concatenates (store None)."""
    require(not cache.static, f"{name}: a cross-attention cache was passed to self-attention")
    grad = needs_gradient(k, v)
    if cache.k is None:
        if grad:
            return k, v, pad_mask, None
        store, (k, v) = new_store([k, v], [2, 2])
        return k, v, pad_mask, store
    if cache.k.shape[0] != k.shape[0]:
        raise ValueError(f"{name}: KV cache holds batch size {cache.k.shape[0]}, input has {k.shape[0]}")
    pad_mask = join_key_padding(cache.pad_mask, cache.length, pad_mask, k.transpose(1, 2))
    if grad:
        return torch.cat([cache.k, k], dim=2), torch.cat([cache.v, v], dim=2), pad_mask, None
    store, (k, v) = append(cache.store, [cache.k, cache.v], [k, v], [2, 2])
    return k, v, pad_mask, store


def stream_positions(
    cache: KVCache | None, t: int, device: torch.device, keys: bool = True
) -> tuple[Tensor, Tensor | None]:
    """(absolute positions of the t new tokens [t], of the keys [cache ; new] [m + t]) for a dense
    self-attention continuing a stream from ``cache`` (None: a sequence starting at 0). ``keys=False``:
    None for the keys' (a layer that neither biases nor masks by position: a decoding step then builds
    nothing over the whole context)."""
    start = 0 if cache is None else cache.next
    new = torch.arange(start, start + t, device=device)
    if cache is None or cache.k is None:
        return new, new
    return new, torch.cat([cache.positions(device), new]) if keys else None


@ATTENTION.register("vanilla")
class VanillaAttention(DocumentAttention, Attention):
    takes_left_padding = True  # the cache keeps its key padding; sinks excepted (left_padding_refusal)
    supports_memory = True  # KV cache for incremental decoding
    supports_cross = True
    memory_option = "max_cache"
    lra_row = "Transformer"
    position_kinds = ("rotary", "pair_bias")
    numbers_cache = True  # position.cache_positions: StreamingLLM's numbering inside the cache
    projection_features = ("grouped_kv", "qk_norm", "softcap")  # the KV cache keeps the grouped heads
    packs_documents = True  # documents=: attend_documents (document_attention.py) on every path

    @dataclass
    class Options:
        bias: bool = True  # bias in the q/k/v/output projections
        max_cache: int = 0  # keep at most this many cached tokens (0 = unbounded)
        sinks: int = 0  # of those, the stream's first k stay (attention sinks); needs max_cache > k
        backend: str = "auto"  # auto (flex on CUDA) | native (fused SDPA) | flex (FlexAttention; CPU: forward only)

        def __post_init__(self) -> None:
            check_backend(self.backend, "backend")
            require(self.max_cache >= 0, f"max_cache must be >= 0 (0 = unbounded), got {self.max_cache}")
            require(self.sinks >= 0, f"sinks must be >= 0, got {self.sinks}")
            require(
                not self.sinks or self.max_cache > self.sinks,
                f"sinks={self.sinks} keeps the first tokens of a bounded cache: set max_cache > sinks "
                f"(got max_cache={self.max_cache}; 0 = unbounded keeps every token anyway)",
            )

    @classmethod
    def contract_options(cls) -> dict:
        return {"max_cache": 40}  # a bounded cache, so the contract sees it stop growing

    @classmethod
    def contract_state(cls) -> StateContract:
        return StateContract(bound=40, exact_for=40)  # exact while the cache still holds every token

    def __init__(self, d_model: int, n_heads: int, **kwargs):
        super().__init__(d_model, n_heads, **kwargs)
        self.add_projections(bias=self.options.bias)

    def init_state(self, batch_size: int) -> KVCache:
        return KVCache()  # also the cross-attention cache of a decoder (filled once, from the encoder)

    def state_bound(self) -> int | None:
        return self.options.max_cache or None

    def left_padding_refusal(self) -> str | None:
        if self.options.sinks:
            return (
                f"attention 'vanilla' keeps the stream's first sinks={self.options.sinks} positions, which are "
                "padding in a left-padded row rather than its first tokens"
            )
        return super().left_padding_refusal()

    def carries_segment_memory(self) -> bool:
        return self.options.max_cache > 0  # an unbounded KV cache is for decoding, not carried in training

    def memory_keys(self) -> int:
        return self.options.max_cache if self.carries_segment_memory() else 0

    def keys_per_query(self, t: int) -> KeysPerQuery:
        return dense_keys(t, self.causal, self.memory_keys())

    def forward(
        self,
        x: Tensor,
        *,
        context: Tensor | None = None,
        pad_mask: Tensor | None = None,
        state: KVCache | None = None,
        documents: Tensor | None = None,
    ) -> AttnOutput:
        self.check_inputs(x, context, pad_mask, state)
        if documents is not None:  # packed rows (zoo/attention/document_attention.py)
            return self.attend_documents(x, pad_mask, documents)
        q = self.split_heads(self.to_q(x))  # [b, h, t, k]
        dropout = self.dropout if self.training else 0.0
        q_pos = k_pos = None
        if context is not None:  # cross-attention: two timelines, no positions inside attention
            k, v, key_pad, new_state = self._cross_keys(context, pad_mask, state)
            causal = False
        else:
            q, k, v, key_pad, new_state, q_pos, k_pos = self._self_keys(q, x, pad_mask, state)
            causal = self.causal
        t, s = q.shape[2], k.shape[2]
        cached = state is not None and s > t  # a growing cache: a new shape (a new compilation) every call
        grouped = k.shape[1] != q.shape[1]  # grouped keys/values (n_kv_heads): cached grouped, widened to score
        if self.options.softcap:
            k, v = self.expand_kv(k, v)
            out = self.attend_softcapped(q, k, v, key_pad, causal, q_pos, k_pos, dropout)
        elif (self.options.backend == "flex" or not cached) and use_flex(
            self.options.backend, x.device, "vanilla", dropout
        ):
            bias = None if q_pos is None else self.flex_bias(q_pos, k_pos, q.dtype)
            out = self.attend_flex(q, *self.expand_kv(k, v), key_pad, causal, bias)
        elif q_pos is not None and self.has_pair_bias:
            bias_of = lambda d: self.pair_bias(d, q.dtype)  # noqa: E731
            k, v = self.expand_kv(k, v)
            out = biased_sdpa(
                q, k, v, bias_of, q_pos=q_pos, k_pos=k_pos, causal=causal, key_pad=key_pad, dropout=dropout
            )
        else:
            mask, is_causal = _sdpa_mask(t, s, causal, key_pad, x.device)
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, is_causal=is_causal, dropout_p=dropout, enable_gqa=grouped
            )
        return AttnOutput(self.to_out(self.merge_heads(out)), state=new_state)

    def attend_softcapped(
        self, q: Tensor, k: Tensor, v: Tensor, key_pad: Tensor | None, causal: bool, q_pos, k_pos, dropout: float
    ) -> Tensor:
        """Dense attention with Gemma 2's soft-capped scores (``softcap``), written out a block of queries
        at a time (projections.py); causality by the positions the queries and keys stand at."""

        def allowed(start: int, stop: int) -> Tensor | None:
            mask = None if key_pad is None else key_pad[:, None, None, :]
            if causal:
                order = k_pos[None, :] <= q_pos[start:stop, None]  # [c, s]
                mask = order if mask is None else mask & order
            return mask

        def bias(start: int, stop: int) -> Tensor | None:
            if q_pos is None or not self.has_pair_bias:
                return None
            return self.pair_bias(q_pos[start:stop, None] - k_pos[None, :], q.dtype)

        return softcapped_attention(q, k, v, cap=self.options.softcap, allowed=allowed, bias=bias, dropout=dropout)

    def attend_flex(
        self, q: Tensor, k: Tensor, v: Tensor, key_pad: Tensor | None, causal: bool, bias: DistanceBias | None = None
    ) -> Tensor:
        """The same attention through FlexAttention: keys numbered 0 ... s - 1 in cache order, the t
        queries the last t of them (a cache's keys all precede them, sinks included), so causality is j <= i.
        ``bias``: a position part's pair bias over the stream positions it counts by (score_mod)."""
        t, s = q.shape[2], k.shape[2]
        keys = torch.arange(s, device=q.device)
        rule = (lambda h, i, j: j <= i) if causal else (lambda h, i, j: j >= 0)
        return flex_attend(
            q,
            k,
            v,
            rule,
            query_positions=keys[s - t :],
            key_positions=keys,
            valid=key_pad,
            heads_differ=False,
            cache_key=("vanilla", causal),
            bias=bias,
        )

    # -- context parallelism (zoo/parallel): ring attention over the split sequence --------------------
    def context_refusal(self) -> str | None:
        if not self.causal:
            return "attention 'vanilla' is bidirectional here; ring attention is run for causal layers only"
        if self.dropout:
            return (
                f"attention 'vanilla' has attention dropout {self.dropout}: ring attention merges blocks of the "
                "fused kernel without attention-weight dropout; set attention_dropout=0"
            )
        if self.carries_segment_memory():
            return (
                f"attention 'vanilla' with max_cache={self.options.max_cache} carries a KV cache from segment to "
                "segment, which is not continued over a split sequence; set max_cache=0"
            )
        if self.has_pair_bias:
            return (
                f"attention 'vanilla' with position {self.position.registry_name!r}: ring attention merges blocks "
                "without a distance bias; use position=rope (rotated at each chunk's positions) or run in one process"
            )
        if self.options.softcap:
            return (
                f"attention 'vanilla' has softcap={self.options.softcap}: ring attention merges blocks of the fused "
                "kernel, which does not cap scores; set softcap=0 or run in one process"
            )
        if self.options.backend == "flex":
            return (
                "attention 'vanilla' has backend=flex: ring attention runs its own blocks (the fused CPU kernel, "
                "plain matmuls elsewhere), not FlexAttention; set backend=auto or native"
            )
        return None

    def context_layouts(self) -> tuple[str, ...]:
        return ("zigzag", "contiguous")  # dense causal attention: zigzag gives every rank the same work

    def attend_chunk(
        self, x: Tensor, chunk, *, pad_mask: Tensor | None = None, state: KVCache | None = None, **kwargs
    ) -> AttnOutput:
        """Ring attention (Liu et al. 2023): each rank's keys and values go around the ring once. q and k
        are rotated (rope) at this rank's absolute ``chunk.positions`` before they travel, as ``forward``
        rotates them over the whole sequence; a distance bias is refused (``context_refusal``)."""
        self.check_inputs(x, None, pad_mask, None)
        self.refuse_chunk_state(state)
        q, k, v = (self.split_heads(proj(x)) for proj in (self.to_q, self.to_k, self.to_v))
        positions = chunk.positions(x.device)
        q, k = self.rotate(q, positions), self.rotate(k, positions)
        k, v = self.expand_kv(k, v)  # the ring sends every head's keys (grouping them is a later saving)
        return AttnOutput(self.to_out(self.merge_heads(chunk.ring_attention(q, k, v, key_valid=pad_mask))))

    def _self_keys(self, q: Tensor, x: Tensor, pad_mask: Tensor | None, state: KVCache | None):
        """Queries and keys/values of [cache ; segment] with the position part applied, their key
        padding, the cache to carry on, and the positions the part numbers queries and keys by."""
        k, v = self.split_heads(self.to_k(x)), self.split_heads(self.to_v(x))
        # the keys' positions serve a pair bias and the soft-capped path's causality only
        by_position = self.has_pair_bias or bool(self.options.softcap)
        positions, key_positions = stream_positions(state, x.shape[1], x.device, keys=by_position)
        in_cache = state is not None and self.position is not None and self.position.cache_positions
        if not in_cache:  # rotated at their place in the stream, and cached rotated
            q, k = self.rotate(q, positions), self.rotate(k, positions)
        new_state = None
        if state is not None:
            k, v, pad_mask, store = extend_cache(state, k, v, pad_mask, "vanilla")
            cache = KVCache(
                k.detach(), v.detach(), pad_mask, next=int(positions[-1]) + 1, sinks=state.sinks, store=store
            )
            new_state = self.evicted(cache)
        if in_cache:  # StreamingLLM: number the keys by their place in the cache, the queries after them
            s = k.shape[2]
            key_positions = torch.arange(s, device=x.device)
            positions = key_positions[s - x.shape[1] :]
            q, k = self.rotate(q, positions), self.rotate(k, key_positions)
        return q, k, v, pad_mask, new_state, positions, key_positions

    def evicted(self, cache: KVCache) -> KVCache:
        """The cache within ``max_cache``: the stream's first ``sinks`` tokens (they lead the cache from
        the first call on and are never evicted) and the most recent ones."""
        keep, n = self.options.max_cache, cache.length
        if not keep or n <= keep:
            return cache
        sinks = self.options.sinks
        if cache.store is not None and not sinks:  # a rolling window over the store, no copy
            k, v = slide(cache.store, [cache.k, cache.v], keep)
            pad = None if cache.pad_mask is None else cache.pad_mask[:, n - keep :]
            return KVCache(k, v, pad, next=cache.next, store=cache.store)
        index = torch.cat([torch.arange(sinks), torch.arange(n - (keep - sinks), n)]).to(cache.k.device)
        pad = None if cache.pad_mask is None else cache.pad_mask[:, index]
        k, v = cache.k.index_select(2, index), cache.v.index_select(2, index)
        return KVCache(k, v, pad, next=cache.next, sinks=sinks)

    def _cross_keys(self, context: Tensor, pad_mask: Tensor | None, state: KVCache | None):
        if state is not None and state.k is not None:  # encoder keys/values computed once per sequence
            return state.k, state.v, state.pad_mask, state
        k, v = self.split_heads(self.to_k(context)), self.split_heads(self.to_v(context))
        new_state = None if state is None else KVCache(k.detach(), v.detach(), pad_mask, static=True)
        return k, v, pad_mask, new_state


def _sdpa_mask(
    t: int, s: int, causal: bool, key_pad: Tensor | None, device: torch.device
) -> tuple[Tensor | None, bool]:
    """The cheapest SDPA mask for (causality, key padding, cache offset s - t).

    Returns (attn_mask, is_causal). attn_mask is bool, True = may attend, broadcastable to
    [b, h, t, s]."""
    if not causal:
        if key_pad is None:
            return None, False
        return guard_empty_rows(key_pad[:, None, None, :]), False
    if key_pad is None:
        if s == t:
            return None, True  # fused causal kernel, no mask tensor at all
        if t == 1:
            return None, False  # one new token after a cache sees every cached key
        return causal_allowed(t, s, device), False
    allowed = causal_allowed(t, s, device)[None, None] & key_pad[:, None, None, :]
    return guard_empty_rows(allowed), False
