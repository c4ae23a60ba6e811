"""The attention contract every mechanism implements: what a mechanism author must learn.

Shape legend (every tensor at a boundary is batch-first):

    b  batch                     t  query length (current segment)
    s  key length = m + t        m  memory / cache length carried from earlier calls
    h  heads                     k  head dim = d / h
    d  model dim                 c  context length (cross-attention keys)

A mechanism is called as ``attn(x, *, context=None, pad_mask=None, state=None) -> AttnOutput``:

- ``x``        [b, t, d] float: the queries' input (and keys'/values' input for self-attention).
- ``context``  [b, c, d] or None: keys/values come from here (cross-attention).
- ``pad_mask`` [b, t] (self) or [b, c] (cross) bool, True = real token. The only mask tensor:
  causality is a constructor flag, so structured mechanisms build their own patterns.
- ``state``    mechanism-specific memory from the previous call (KV cache, XL memory, span cache);
  opaque to the block and the stack, threaded per layer by the model. ``init_state`` makes an
  empty one; ``None`` means "start fresh". A state exposes ``length`` (tokens it remembers), is
  detached, and is bounded: the contract suite checks it through ``contract_state()``.

Capability flags are class attributes: the builder refuses impossible combinations with a clear
error and the tests skip by flag, never by a list of names.

Positions inside attention (``zoo/position/``: ``rope`` rotates queries and keys, ``alibi`` and
``t5_bias`` add b_h(i - j) to each score): a self-attention layer is built with the model's position
part (``position=``) and applies it to exactly the (query, key) pairs it computes, at their absolute
positions in the stream (a state carries where the stream stands, so segments equal one call). A
mechanism lists the kinds it applies in ``position_kinds``; the base class refuses any other kind when
the layer is built, with ``no_position_reason`` (or an option-dependent ``position_refusal``).

What is true of one mechanism is answered by the mechanism, from its own resolved options, and every
consumer (``describe``, the benchmark's FLOP model, the LRA tables, the data checks, the evaluation
protocols) asks instead of switching on its registry name: ``keys_per_query``, ``forward_flops``,
``memory_keys``, ``evaluation_memory``, ``check_layout``, ``lra_row``, ``memory_option``. A question
a mechanism does not answer returns None, and consumers print "unknown", never "dense".

The helpers a mechanism may use live beside it, by concern: ``helpers.py`` (projections, head reshapes,
positions applied to computed pairs, input checks; mixed into ``Attention``), ``masks.py`` (key masks and
the dense test reference), ``costs.py`` (``KeysPerQuery``, ``FlopCount`` and the usual rules) and
``state.py`` (remembered layer inputs, per-row state fields). They stay importable from here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from torch import Tensor, nn

from zoo.attention.costs import FlopCount, KeysPerQuery, at_most_segment, dense_keys
from zoo.attention.helpers import AttentionHelpers, require_length
from zoo.attention.masks import causal_allowed, guard_empty_rows, join_key_padding, reference_attention
from zoo.attention.projections import ProjectionOptions, with_projection_options
from zoo.attention.state import NOT_PER_ROW, LayerInput, remembered, to_remember
from zoo.config import build_options, check_type, require
from zoo.registry import Registry

if TYPE_CHECKING:
    from zoo.position.base import Position

__all__ = [
    "ATTENTION",
    "Attention",
    "AttnOutput",
    "StateContract",
    "create_attention",
    # the helpers' homes are helpers.py, masks.py, costs.py and state.py; importable from here as before
    "NOT_PER_ROW",
    "FlopCount",
    "KeysPerQuery",
    "LayerInput",
    "at_most_segment",
    "causal_allowed",
    "dense_keys",
    "guard_empty_rows",
    "join_key_padding",
    "reference_attention",
    "remembered",
    "require_length",
    "to_remember",
]


@dataclass
class AttnOutput:
    out: Tensor  # [b, t, d], already output-projected
    state: Any = None  # new per-layer state (detached, bounded), opaque to the block
    aux: dict[str, Tensor] = field(default_factory=dict)  # weighted scalar losses, e.g. {"span_l1": ...}
    stats: dict[str, Tensor] = field(default_factory=dict)  # logging only, e.g. {"span_mean": ...}


@dataclass(frozen=True)
class StateContract:
    """A stateful mechanism's promise, under its ``contract_options()``, checked for every
    mechanism with ``supports_memory`` by tests/contracts/test_attention.py (causal use).

    ``bound``: the state never remembers more than this many tokens and its tensors stop growing once
    it has seen that many; None when the receptive field itself is unbounded (dense attention, the
    strided columns, the fixed summaries), where the state may grow with the stream (never past the
    tokens seen). ``exact_for``: threading the state through segments of a stream this long == one
    call over it; None = at any length (the state keeps every key a later query can see)."""

    bound: int | None
    exact_for: int | None = None
    exact_length: bool = True  # state.length == min(tokens seen, bound) exactly (False: <=, e.g. block-aligned windows)


class Attention(AttentionHelpers, nn.Module):
    """Base class: validates the arguments every mechanism shares and its own ``Options``.

    Subclasses declare ``Options`` (a dataclass of their hyper-parameters with defaults) and read
    them from ``self.options``; the registry name comes from ``@ATTENTION.register``. They implement
    ``forward(x, *, context=None, pad_mask=None, state=None) -> AttnOutput``, set the flags below and
    answer the questions that apply; the helpers they may call on themselves (``add_projections``,
    ``split_heads``, ``rotate``, ``check_inputs``, ...) come from :class:`~zoo.attention.helpers.AttentionHelpers`.
    """

    # capability flags
    supports_memory: ClassVar[bool] = False  # segment memory / KV cache across calls
    supports_cross: ClassVar[bool] = False  # keys/values from another sequence
    causal_only: ClassVar[bool] = False  # only defined for causal (decoder) use
    supports_causal: ClassVar[bool] = True  # False: the paper gives no causal form (Linformer's length projection)
    no_causal_reason: ClassVar[str] = ""  # why supports_causal is False, for the refusal
    remembers_inputs: ClassVar[bool] = False  # state keeps past layer inputs: forward takes layer_input=
    no_cross_reason: ClassVar[str] = ""  # why supports_cross is False, for the builder's error
    content_routed: ClassVar[bool] = False  # which keys a query sees depends on content (LSH buckets):
    # changing any token may reshuffle others' key sets, so causality/padding are checked by gradients
    # a left-padded batch decodes row by row as each prompt alone (zoo/models/generation.py): the cache keeps
    # its key padding, padding never updates the state, and which keys a query sees depends on distances only
    takes_left_padding: ClassVar[bool] = False
    no_left_padding_reason: ClassVar[str] = ""  # why takes_left_padding is False, for generate()'s refusal
    Options: ClassVar[type] = ProjectionOptions  # a subclass's own Options gets these fields too (projections.py)
    registry_name: ClassVar[str | None] = None
    # projection options it applies (projections.py): "grouped_kv" (n_kv_heads), "qk_norm", "softcap"
    projection_features: ClassVar[tuple[str, ...]] = ()
    no_projection_reason: ClassVar[str] = ""  # why a feature is missing from projection_features, for the refusal
    # what consumers read instead of the registry name
    score_terms: ClassVar[int] = 2  # products of each query with every key it sees: Q K^T and A V (XL adds Q R^T)
    memory_option: ClassVar[str | None] = None  # the option that sizes the memory kept across calls (XL: mem_len)
    length_option: ClassVar[str | None] = None  # an option sizing parameters by the longest sequence (Linformer's
    # max_len): left 0, the stack builder sets it to the model's max_len (the app raises that to the task's length)
    lra_row: ClassVar[str | None] = None  # the row of Long Range Arena's tables (Tay et al. 2020) it corresponds to
    # positions inside attention it applies to the pairs it computes: "rotary" and/or "pair_bias"
    position_kinds: ClassVar[tuple[str, ...]] = ()
    no_position_reason: ClassVar[str] = ""  # why a kind is missing from position_kinds, for the refusal
    numbers_cache: ClassVar[bool] = False  # applies a part's cache_positions (StreamingLLM numbering)
    # keeps every token of a packed row inside its own document (zoo/attention/documents.py): forward takes
    # documents= long [b, t]; False refuses data.pack with no_packing_reason
    packs_documents: ClassVar[bool] = False
    no_packing_reason: ClassVar[str] = ""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        own = cls.__dict__.get("Options")
        if own is not None and not issubclass(own, ProjectionOptions):
            cls.Options = with_projection_options(own)

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        *,
        causal: bool = False,
        dropout: float = 0.0,
        layer_index: int = 0,
        position: Position | None = None,
        **options: Any,
    ):
        super().__init__()
        name = self.registry_name or type(self).__name__
        arguments = (("causal", causal, bool), ("dropout", dropout, float), ("layer_index", layer_index, int))
        for key, value, tp in arguments:
            check_type(value, tp, key, f"attention {name!r}")
        require(layer_index >= 0, f"{name}: layer_index must be an int >= 0, got {layer_index}")
        require(isinstance(d_model, int) and d_model > 0, f"{name}: d_model must be a positive int, got {d_model!r}")
        require(isinstance(n_heads, int) and n_heads > 0, f"{name}: n_heads must be a positive int, got {n_heads!r}")
        require(d_model % n_heads == 0, f"{name}: d_model ({d_model}) must be divisible by n_heads ({n_heads})")
        require(0.0 <= dropout < 1.0, f"{name}: dropout must be in [0, 1), got {dropout}")
        require(causal or not self.causal_only, f"{name} is causal-only: build it with causal=True")
        self.d_model, self.n_heads, self.head_dim = d_model, n_heads, d_model // n_heads
        self.causal, self.dropout = bool(causal), float(dropout)
        self.layer_index = layer_index  # depth of the block holding this attention (interleaved patterns)
        self.options = build_options(self.Options, options, f"attention {name!r}")
        require(  # after the options, so a mistyped option is named first
            not causal or self.supports_causal,
            f"attention {name!r} has no causal form ({self.no_causal_reason or 'supports_causal=False'}); "
            "build it with causal=False (an encoder), or choose another attention for a decoder",
        )
        reason = self.projection_refusal()
        if reason is not None:
            raise ValueError(f"attention {name!r} cannot take {reason}")
        self.n_kv_heads = self.options.n_kv_heads or n_heads
        require(
            n_heads % self.n_kv_heads == 0,
            f"{name}: n_heads ({n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads}): every key/value "
            "head serves the same number of query heads",
        )
        if position is not None and position.kinds():
            reason = self.position_refusal(position)
            if reason is not None:
                raise ValueError(f"attention {name!r} cannot take position {position.registry_name!r}: {reason}")
        else:
            position = None  # a signal added at the input (or none) is not the attention's business
        # the model's part, shared by every layer (T5's one table): kept out of this module's
        # parameters and state dict, which the model holds once
        self.__dict__["position"] = position

    def projection_refusal(self) -> str | None:
        """Why this layer cannot apply the projection options it was given (``projections.py``), as
        "<option>: <reason>", or None. Default: by ``projection_features`` and ``no_projection_reason``."""
        options = {"grouped_kv": "n_kv_heads", "qk_norm": "qk_norm", "softcap": "softcap"}
        for feature in self.options.features():
            if feature not in self.projection_features:
                why = self.no_projection_reason or f"projection_features has no {feature!r}"
                return f"{options[feature]}={getattr(self.options, options[feature])!r}: {why}"
        return None

    # -- positions inside attention -----------------------------------------------------------
    def position_refusal(self, position: Position) -> str | None:
        """Why this layer, built as it is, cannot apply ``position`` (a part acting inside attention)
        to the pairs it computes, or None. Default: by ``position_kinds`` and ``numbers_cache``."""
        missing = [kind for kind in position.kinds() if kind not in self.position_kinds]
        if missing:
            why = f": {self.no_position_reason}" if self.no_position_reason else ""
            return f"it applies no {' or '.join(missing)} position inside its attention{why}"
        if position.cache_positions and not self.numbers_cache:
            return (
                "cache_positions numbers the keys of a decoding cache by their place in it, which this mechanism's "
                "state does not do (the dense KV cache of vanilla does); leave position.cache_positions=false"
            )
        return None

    # -- hooks for the contract suite (tests/contracts/test_attention.py) -----------------------------
    @classmethod
    def contract_options(cls) -> dict[str, Any]:
        """Small options under which the contract suite exercises this mechanism (d_model 32, 4 heads)."""
        return {}

    @classmethod
    def contract_lengths(cls) -> tuple[int, ...]:
        """Sequence lengths the contract suite uses: include ones that are not multiples of any block."""
        return (7, 19, 33)

    @classmethod
    def contract_state(cls) -> StateContract | None:
        """What the contract suite may expect of the state under ``contract_options()``; required
        when ``supports_memory`` (None: the mechanism keeps no state)."""
        return None

    # -- state -------------------------------------------------------------------------------
    def init_state(self, batch_size: int) -> Any:
        """An empty state that makes the mechanism start caching. Refuses, with the reason, when this
        layer cannot continue a sequence (``stream_refusal``)."""
        reason = self.stream_refusal()
        if reason is not None:
            raise ValueError(reason)
        return None

    def stream_refusal(self) -> str | None:
        """Why this self-attention layer, built as it is, cannot continue a sequence from a state
        (feeding a stream in pieces would drop the earlier context), or None when it can: then
        segments threaded through ``init_state`` equal one call. Mechanisms whose key sets depend on
        the whole sequence (a length-dependent stride, LSH's automatic bucket count) answer per
        their options."""
        name = self.registry_name or type(self).__name__
        if not self.supports_memory:
            return f"attention {name!r} keeps no state between calls (supports_memory=False)"
        if not self.causal and not self.carries_segment_memory():
            # segment memory (XL) is a model of its own in a bidirectional layer; a decoding cache is not
            return (
                f"attention {name!r} is bidirectional here: its queries see later tokens, so a sequence fed in "
                "pieces cannot equal one call; only a causal layer continues a stream"
            )
        return None

    def left_padding_refusal(self) -> str | None:
        """Why this layer, built as it is, cannot decode a left-padded batch so that every row equals its
        prompt decoded alone, or None when it can (``takes_left_padding``). Asked by ``generate(pad_mask=)``."""
        if self.takes_left_padding:
            return None
        name = self.registry_name or type(self).__name__
        return f"attention {name!r} {self.no_left_padding_reason or 'does not keep left padding out of its cache'}"

    def state_bound(self) -> int | None:
        """Tokens the state of this layer holds at most however long the stream (its receptive field,
        as the cache keeps it); None when it grows with the stream. Asked by the README's streaming
        table, ``zoo.bench --generate`` and the contract suite."""
        return None

    def state_read_share(self) -> float:
        """Share of this layer's decoding state one step reads (``zoo.bench --generate``'s bound): all of it."""
        return 1.0

    # -- context parallelism: the sequence split over ranks (zoo/parallel) ---------------------------
    def context_refusal(self) -> str | None:
        """Why this layer cannot run with its sequence split over the ranks of a context group, or None
        when it can: then ``attend_chunk`` computes, for this rank's queries, exactly what ``forward``
        computes over the whole sequence, reading from the other ranks only what its pattern sees."""
        name = self.registry_name or type(self).__name__
        return f"attention {name!r} does not say which keys of other ranks' chunks it reads (no attend_chunk)"

    def context_layouts(self) -> tuple[str, ...]:
        """The chunk layouts (``zoo.parallel.chunk.LAYOUTS``) this layer runs on, the one it prefers first."""
        return ("contiguous",)

    def attend_chunk(
        self, x: Tensor, chunk: Any, *, pad_mask: Tensor | None = None, state: Any = None, **kwargs: Any
    ) -> AttnOutput:
        """``forward`` for this rank's part x [b, t, d] of sequences split over a context group
        (``chunk``: a :class:`zoo.parallel.chunk.Chunk`, its positions and what it may ask of the other
        ranks; every rank of the group calls this together). ``state``: the layer's state for the whole
        sequence (the same on every rank), and the state returned is the whole sequence's too."""
        raise ValueError(self.context_refusal() or f"{type(self).__name__} does not implement attend_chunk")

    def packing_refusal(self) -> str | None:
        """Why this layer, built as it is, cannot keep the documents of a packed row apart, or None when its
        ``forward`` takes ``documents=`` and no token sees another document. Default: by ``packs_documents``;
        segment memory carried across calls would carry one document into the next row's, so it refuses too."""
        name = self.registry_name or type(self).__name__
        if not self.packs_documents:
            why = self.no_packing_reason or "packs_documents=False"
            return f"attention {name!r} cannot keep packed documents apart: {why}"
        if self.carries_segment_memory():
            return f"attention {name!r} carries segment memory from call to call, which would cross documents"
        return None

    def carries_segment_memory(self) -> bool:
        """True when the state kept across calls is bounded segment memory that training and
        evaluation carry from segment to segment (XL memory, span cache). A decoding cache (the
        KV cache, the pattern caches, LSH's bucket cache) answers False: training never threads it."""
        return False

    def share_with(self, first: Attention) -> None:
        """Tie the parameters this mechanism shares across layers to those of ``first`` (the stack's first
        attention); called by the stack builder for every later attention. Default: nothing is shared."""

    # -- what the mechanism sees and costs (None = it does not say: consumers print "unknown") -------------
    def keys_per_query(self, t: int) -> KeysPerQuery | None:
        """Keys a query attends to, averaged over a segment of ``t`` tokens under this layer's
        causality, counting the memory it carries from earlier segments in training (``memory_keys``)."""
        return None

    def memory_keys(self) -> int | None:
        """Keys from earlier segments that a training segment attends to (their keys and values are
        computed again and kept for backward, like the segment's own): Transformer-XL's ``mem_len``.
        0 for a mechanism that carries no segment memory; None when it carries one and does not say."""
        return 0 if not self.carries_segment_memory() else None

    def projection_flops(self) -> float:
        """Matmul FLOPs per token of the weight matrices a token passes through: 2 x the entries of
        every ``nn.Linear`` the mechanism holds (q, k, v, output; XL's W_R). Mechanisms with other
        per-token weights add theirs."""
        return 2.0 * sum(m.weight.numel() for m in self.modules() if isinstance(m, nn.Linear))

    def forward_flops(self, t: int) -> FlopCount | None:
        """Matmul FLOPs of one forward call over a segment of ``t`` tokens (batch 1): the projections,
        and ``score_terms`` products of d_model per key each query attends to. None when
        ``keys_per_query`` is unknown; a mechanism that computes more than it attends to says so."""
        keys = self.keys_per_query(t)
        if keys is None:
            return None
        attention = 2.0 * t * self.score_terms * self.d_model * keys.keys
        return FlopCount({"projections": t * self.projection_flops(), "attention": attention})

    @contextlib.contextmanager
    def evaluation_memory(self, mem_len: int = 0, clamp_len: int = 0, same_length: bool = False) -> Iterator[bool]:
        """For the duration of the ``with`` block, keep ``mem_len`` positions of memory in eval mode, clamp
        relative distances at ``clamp_len`` and give every query the same number of keys (``same_length``;
        the papers' evaluation settings; 0 / False leaves a setting alone); yields whether anything was set,
        and restores the old values afterwards. A mechanism without such settings refuses any, naming itself."""
        if mem_len or clamp_len or same_length:
            name = self.registry_name or type(self).__name__
            raise ValueError(
                f"attention {name!r} has no evaluation memory, distance clamp or same-length window to set (asked "
                f"mem_len={mem_len}, clamp_len={clamp_len}, same_length={same_length}); leave them unset for it, "
                "or use a mechanism with segment memory (xl_rel)"
            )
        yield False

    @classmethod
    def check_layout(cls, options: dict[str, Any], *, rows: int, width: int, data: str) -> None:
        """Refuse, naming both, ``options`` that cannot read ``data`` laid out as a raster of ``rows``
        x ``width`` positions (an image). Default: the mechanism reads any sequence in 1-D order."""

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, n_heads={self.n_heads}, causal={self.causal}, options={self.options}"


ATTENTION: Registry[type[Attention]] = Registry("attention", Attention)


def create_attention(name: str, *, d_model: int, n_heads: int, causal: bool = False, **options: Any) -> Attention:
    """Build one registered attention mechanism on its own.

    ``options`` are the mechanism's own (see its ``Options``) plus ``dropout`` and ``layer_index``.
    Called as ``attn(x, *, context=None, pad_mask=None, state=None) -> AttnOutput``."""
    return ATTENTION.get(name)(d_model, n_heads, causal=causal, **options)
