"""The attention contract every mechanism implements, plus the helpers they share.

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
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from einops import rearrange
from torch import Tensor, nn

from zoo.attention.flex import DistanceBias
from zoo.attention.projections import HeadNormedLinear, ProjectionOptions, expand_kv, with_projection_options
from zoo.config import build_options, check_type, require
from zoo.registry import Registry

if TYPE_CHECKING:
    from zoo.position.base import Position


# a state's dataclass field holding one tensor for every row (positions of the kept keys, a pinned feature
# map): ``field(default=None, metadata=NOT_PER_ROW)``, so beam search's reorder_state leaves it as it is
NOT_PER_ROW = {"batch": False}


@dataclass
class AttnOutput:
    out: Tensor  # [b, t, d], already output-projected
    state: Any = None  # new per-layer state (detached, bounded), opaque to the block
    aux: dict[str, Tensor] = field(default_factory=dict)  # weighted scalar losses, e.g. {"span_l1": ...}
    stats: dict[str, Tensor] = field(default_factory=dict)  # logging only, e.g. {"span_mean": ...}


@dataclass
class LayerInput:
    """Where a pre-normalised ``x`` came from, for mechanisms that remember their layer's inputs
    (``remembers_inputs``): ``x = prepare(raw)`` position by position, ``raw`` [b, t, d] being the
    residual stream entering the block. Such a mechanism stores ``raw`` and applies the current
    ``prepare`` to what it remembers on every call, so a pre-norm layer attends over
    LayerNorm([StopGrad(M), E]) (Parisotto et al. 2019, Section 3): the LayerNorm gets gradient
    through memory positions, and memory made before an optimiser step is normalised with today's
    weights. The block passes it (``prepare`` = its residual's ``sublayer_input``); ``version``
    changes whenever ``prepare``'s weights do, for mechanisms that cache projections of it."""

    raw: Tensor
    prepare: Callable[[Tensor], Tensor]
    version: tuple = ()


def remembered(states: Tensor, layer_input: LayerInput | None) -> Tensor:
    """Stored raw layer inputs [b, m, d] as this call's sub-layer sees them."""
    return states if layer_input is None else layer_input.prepare(states)


def to_remember(x: Tensor, layer_input: LayerInput | None) -> Tensor:
    """What to store of this call's input x [b, t, d]: the raw stream when the block gave it."""
    return x if layer_input is None else layer_input.raw


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


@dataclass(frozen=True)
class KeysPerQuery:
    """How many keys a query attends to, averaged over a segment, and the rule that says so."""

    keys: float
    rule: str  # e.g. "memory 512 + causal segment"
    upper_bound: bool = False  # at most this many (learned spans may be shorter, buckets may be smaller)


@dataclass(frozen=True)
class FlopCount:
    """Matmul FLOPs (a multiply-add counts 2; element-wise work is not counted) of one forward call over
    one sequence, by component. ``forward`` is differentiable work (its backward costs about twice it);
    ``no_backward`` is work done without a gradient (LSH's hashing), which backward does not repeat."""

    forward: dict[str, float]
    no_backward: dict[str, float] = field(default_factory=dict)

    @property
    def total(self) -> float:
        return sum(self.forward.values()) + sum(self.no_backward.values())


class Attention(nn.Module):
    """Base class: validates the arguments every mechanism shares and its own ``Options``.

    Subclasses declare ``Options`` (a dataclass of their hyper-parameters with defaults) and read
    them from ``self.options``; the registry name comes from ``@ATTENTION.register``.
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

    def rotate(self, x: Tensor, positions: Tensor) -> Tensor:
        """Queries or keys [..., n, k] at absolute positions long [n], rotated when the layer's position
        part rotates (rope), else x itself."""
        position = self.position
        return x if position is None or not position.rotary else position.rotate(x, positions)

    @property
    def has_pair_bias(self) -> bool:
        return self.position is not None and self.position.pair_bias

    def flex_bias(self, query_positions: Tensor, key_positions: Tensor, dtype: torch.dtype) -> DistanceBias | None:
        """The position part's pair bias as FlexAttention's score_mod (``zoo.attention.flex.DistanceBias``)
        over the distances of these queries [t] and keys [s] (a table of t + s - 1 entries at most), or None."""
        if not self.has_pair_bias or query_positions.numel() == 0 or key_positions.numel() == 0:
            return None
        low = int(query_positions.min() - key_positions.max())
        high = int(query_positions.max() - key_positions.min())
        table = self.pair_bias(torch.arange(low, high + 1, device=query_positions.device), dtype)
        return DistanceBias(table, low, query_positions, key_positions)

    def pair_bias(self, distance: Tensor, dtype: torch.dtype, head: Tensor | None = None) -> Tensor | None:
        """b_h(i - j) of the layer's position part for query-minus-key distances (long [...]) ->
        [h, ...] in ``dtype`` (or [...] with ``head``, see ``Position.distance_bias``); None when the
        part adds no bias."""
        if not self.has_pair_bias:
            return None
        return self.position.distance_bias(distance, causal=self.causal, dtype=dtype, head=head)

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

    def refuse_state(self, state: Any) -> None:
        """Raise, with the reason, when a self-attention ``state`` is given to a layer that cannot
        continue from it (never compute without the earlier context)."""
        if state is not None:
            reason = self.stream_refusal()
            if reason is not None:
                raise ValueError(reason)

    def state_bound(self) -> int | None:
        """Tokens the state of this layer holds at most however long the stream (its receptive field,
        as the cache keeps it); None when it grows with the stream. Asked by the README's streaming
        table, ``zoo.bench --generate`` and the contract suite."""
        return None

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

    def refuse_chunk_state(self, state: Any) -> None:
        """A decoding cache is not continued over a split sequence: refuse one, naming the layer."""
        if state is not None:
            name = self.registry_name or type(self).__name__
            raise ValueError(
                f"attention {name!r} does not continue a state over a sequence split across ranks; feed the whole "
                "sequence (state=None) or run it in one process"
            )

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

    # -- shared input checks -----------------------------------------------------------------
    def check_inputs(self, x: Tensor, context: Tensor | None, pad_mask: Tensor | None, state: Any) -> None:
        """Clear errors for wrong shapes/dtypes instead of a shape error deep inside torch."""
        name = self.registry_name or type(self).__name__
        if not (isinstance(x, Tensor) and x.dim() == 3 and x.is_floating_point()):
            raise ValueError(f"{name}: x must be a float tensor [b, t, d]; got {_describe(x)}")
        if x.shape[-1] != self.d_model:
            raise ValueError(f"{name}: x has d={x.shape[-1]} but the attention was built with d_model={self.d_model}")
        if x.shape[0] == 0 or x.shape[1] == 0:
            raise ValueError(f"{name}: x is empty ({_describe(x)}): attention needs b >= 1 rows of t >= 1 positions")
        weight = next(self.parameters(), None)
        autocast = torch.is_autocast_enabled(x.device.type)  # mixed dtypes are autocast's business
        if weight is not None and x.dtype != weight.dtype and not autocast:
            raise ValueError(
                f"{name}: x has dtype {x.dtype} but the attention's parameters are {weight.dtype}; "
                f"convert one to the other (x.to({weight.dtype}) or attn.to({x.dtype}))"
            )
        if context is not None:
            if not self.supports_cross:
                raise ValueError(
                    f"{name} does not support cross-attention (context=...); mechanisms that do: see "
                    "zoo.list_attention() with supports_cross"
                )
            fits = isinstance(context, Tensor) and context.dim() == 3 and context.shape[0] == x.shape[0]
            fits = fits and context.shape[1] > 0 and context.shape[-1] == self.d_model
            if not (fits and (autocast or context.dtype == x.dtype)):
                raise ValueError(
                    f"{name}: context must be [b={x.shape[0]}, c >= 1, d={self.d_model}] of x's dtype {x.dtype}; "
                    f"got {_describe(context)}"
                )
        if pad_mask is not None:
            keys = context if context is not None else x
            if not (isinstance(pad_mask, Tensor) and pad_mask.dtype == torch.bool):
                raise ValueError(
                    f"{name}: pad_mask must be a bool tensor (True = real token); got {_describe(pad_mask)}"
                )
            if tuple(pad_mask.shape) != tuple(keys.shape[:2]):
                raise ValueError(
                    f"{name}: pad_mask must be [b, {'c' if context is not None else 't'}] = "
                    f"{tuple(keys.shape[:2])}; got {tuple(pad_mask.shape)}"
                )
        if state is not None and not self.supports_memory:
            raise ValueError(f"{name} keeps no state (supports_memory=False) but was given one")
        if state is not None and context is None:
            self.refuse_state(state)

    # -- projections -------------------------------------------------------------------------
    def add_projections(self, bias: bool = True) -> None:
        """The standard separate q/k/v/output projections, shared by every mechanism that does not tie
        them (LSH ties q and k and builds its own): q and output d -> d, k and v d -> n_kv_heads * k
        (grouped-query attention), q and k normalised per head under ``qk_norm`` (projections.py)."""
        d, heads, k, norm = self.d_model, self.n_heads, self.head_dim, self.options.qk_norm
        kv = self.n_kv_heads * k
        if norm == "none":
            self.to_q, self.to_k = nn.Linear(d, d, bias=bias), nn.Linear(d, kv, bias=bias)
        else:
            self.to_q = HeadNormedLinear(d, heads, k, bias=bias, norm=norm)
            self.to_k = HeadNormedLinear(d, self.n_kv_heads, k, bias=bias, norm=norm)
        self.to_v = nn.Linear(d, kv, bias=bias)
        self.to_out = nn.Linear(d, d, bias=bias)

    def expand_kv(self, *tensors: Tensor) -> Tensor | tuple[Tensor, ...]:
        """Grouped keys/values [b, n_kv_heads, ..., k] widened to every query head [b, h, ..., k] (as
        they are when n_kv_heads = n_heads): where a mechanism scores, after it has cached them."""
        out = tuple(expand_kv(x, self.n_heads) for x in tensors)
        return out[0] if len(out) == 1 else out

    # -- head reshapes -----------------------------------------------------------------------
    def split_heads(self, x: Tensor) -> Tensor:
        """[b, t, h*k] -> [b, h, t, k]: h = n_kv_heads for grouped keys and values (width n_kv_heads * head_dim),
        else n_heads. Split by the head count, not the head width: a mechanism whose per-head width is its own
        (Based's feature_dim, RetNet's and GLA's expand_k / expand_v) keeps n_heads heads."""
        grouped = self.n_kv_heads != self.n_heads and x.shape[-1] == self.n_kv_heads * self.head_dim
        return rearrange(x, "b t (h k) -> b h t k", h=self.n_kv_heads if grouped else self.n_heads)

    @staticmethod
    def merge_heads(x: Tensor) -> Tensor:
        """[b, h, t, k] -> [b, t, h*k]"""
        return rearrange(x, "b h t k -> b t (h k)")

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, n_heads={self.n_heads}, causal={self.causal}, options={self.options}"


ATTENTION: Registry[type[Attention]] = Registry("attention", Attention)


def create_attention(name: str, *, d_model: int, n_heads: int, causal: bool = False, **options: Any) -> Attention:
    """Build one registered attention mechanism on its own.

    ``options`` are the mechanism's own (see its ``Options``) plus ``dropout`` and ``layer_index``.
    Called as ``attn(x, *, context=None, pad_mask=None, state=None) -> AttnOutput``."""
    return ATTENTION.get(name)(d_model, n_heads, causal=causal, **options)


def _describe(value: Any) -> str:
    if isinstance(value, Tensor):
        return f"tensor of shape {tuple(value.shape)} and dtype {value.dtype}"
    return type(value).__name__


def require_length(max_len: int, name: str) -> None:
    """Refuse a length-sized mechanism built on its own with ``max_len`` left 0 (only a model knows its length)."""
    require(
        max_len >= 1,
        f"{name}: max_len=0 means the model's max_len, filled in when a model is built; built on its own, give "
        "max_len (the longest sequence it will take)",
    )


def dense_keys(t: int, causal: bool, memory: int = 0) -> KeysPerQuery:
    """Every key: (t + 1) / 2 on average over a causal segment (query i sees i + 1), t otherwise,
    plus ``memory`` keys carried from earlier segments."""
    keys = (t + 1) / 2 if causal else float(t)
    rule = "dense causal" if causal else "dense"
    return KeysPerQuery(memory + keys, f"memory {memory} + {rule}" if memory else rule)


def at_most_segment(keys: float, t: int, causal: bool) -> float:
    """A pattern's keys per query, capped at what a segment of t holds: (t + 1) / 2 on average when
    causal, t otherwise (a window wider than the segment sees every earlier key)."""
    return min(keys, (t + 1) / 2 if causal else float(t))


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
