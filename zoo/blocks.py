"""The one block skeleton every variant shares.

A :class:`Block` receives its parts (attention, optional cross-attention, a feed-forward part of the
feed-forward axis, :mod:`zoo.feed_forward`) and a
residual policy factory; it never branches on which mechanism it holds. Each sub-layer runs as its
residual policy's two steps: ``h = residual.sublayer_input(x)``, ``x = residual.join(x, f(h))``.
A mechanism that remembers its layer's inputs across calls (``remembers_inputs``: Transformer-XL
memory, the adaptive-span cache) also gets the raw stream and that ``sublayer_input`` map
(``LayerInput``), so it stores x and normalises what it remembers with the current weights: a
pre-norm layer attends over LayerNorm([StopGrad(M), E]) as in GTrXL (Parisotto et al. 2019).

Stacks compose blocks in depth through ``forward`` (the whole block) and, when they rearrange the
residual stream (reversible), through the additive view at the end of the class: ``additive``,
``attention_branch``, ``feed_forward_branch``, ``feed_forward_slices``, ``branch_parameters``.
``at_depth`` lets a stack that re-applies one block (universal) run it as layer n.

Stats come back named ``attn/<name>`` and ``cross/<name>`` (stacks prefix ``layer<i>/``); aux
losses keep the mechanism's name and are summed.

Shapes: x [b, t, d]; pad_mask [b, t] bool (True = real); context [b, c, d]; context_pad_mask [b, c];
documents [b, t] long (a packed row's document ids, zoo/attention/documents.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor, nn

from zoo.attention.base import Attention, AttnOutput, LayerInput
from zoo.config import require
from zoo.feed_forward.base import FeedForward
from zoo.parallel.chunk import active_chunk
from zoo.residual.base import Residual


@dataclass
class BlockState:
    """Per-layer state: the self-attention's and the cross-attention's (each opaque)."""

    attention: Any = None
    cross: Any = None


@dataclass
class BlockOutput:
    x: Tensor
    state: BlockState | None = None
    aux: dict[str, Tensor] = field(default_factory=dict)
    stats: dict[str, Tensor] = field(default_factory=dict)


def merge_into(total: dict[str, Tensor], extra: dict[str, Tensor]) -> dict[str, Tensor]:
    """Add ``extra``'s named losses into ``total`` (same name: summed)."""
    for key, value in extra.items():
        total[key] = total[key] + value if key in total else value
    return total


def prefixed(prefix: str, stats: dict[str, Tensor]) -> dict[str, Tensor]:
    """{"span_mean": v} -> {"<prefix>/span_mean": v}"""
    return {f"{prefix}/{key}": value for key, value in stats.items()}


class Block(nn.Module):
    """attention -> [cross-attention] -> feed-forward, each joined by its own residual policy."""

    def __init__(
        self,
        attention: Attention,
        feed_forward: FeedForward,
        make_residual: Callable[[], Residual],
        cross_attention: Attention | None = None,
    ):
        super().__init__()
        self.attention = attention
        self.cross_attention = cross_attention
        self.feed_forward = feed_forward
        self.attention_residual = make_residual()
        self.cross_residual = make_residual() if cross_attention is not None else None
        self.feed_forward_residual = make_residual()

    def init_state(self, batch_size: int) -> BlockState | None:
        own = self.attention.init_state(batch_size)
        cross = self.cross_attention.init_state(batch_size) if self.cross_attention is not None else None
        return None if own is None and cross is None else BlockState(own, cross)

    def _attend(self, x: Tensor, pad_mask: Tensor | None, state: Any, documents: Tensor | None = None) -> AttnOutput:
        """The self-attention sub-layer on the stream x (before its residual join). While a sequence is
        split over ranks (``zoo.parallel``), the mechanism's ``attend_chunk`` reads what it needs of the
        other ranks' chunks. ``documents`` [b, t]: a packed row's document ids, given only to a mechanism
        that keeps documents apart (``packs_documents``; the model refuses packing otherwise). Activation
        checkpointing of the attention alone recomputes this method (``zoo.stacks.checkpointing``: an instance
        attribute of the same name runs it through a checkpoint)."""
        residual = self.attention_residual
        h = residual.sublayer_input(x)
        extra: dict[str, Any] = {}
        if documents is not None:
            reason = self.attention.packing_refusal()
            if reason is not None:
                raise ValueError(reason)
            require(active_chunk() is None, "packed documents do not run over a sequence split across ranks")
            extra["documents"] = documents
        if self.attention.remembers_inputs:
            version = tuple((p.data_ptr(), p._version) for p in residual.parameters())
            extra["layer_input"] = LayerInput(x, residual.sublayer_input, version)
        chunk = active_chunk()
        if chunk is not None:
            return self.attention.attend_chunk(h, chunk, pad_mask=pad_mask, state=state, **extra)
        return self.attention(h, pad_mask=pad_mask, state=state, **extra)

    def forward(
        self,
        x: Tensor,
        *,
        pad_mask: Tensor | None = None,
        state: BlockState | None = None,
        context: Tensor | None = None,
        context_pad_mask: Tensor | None = None,
        documents: Tensor | None = None,
    ) -> BlockOutput:
        state = state or BlockState()
        own = self._attend(x, pad_mask, state.attention, documents)
        x = self.attention_residual.join(x, own.out)
        aux = merge_into({}, own.aux)
        stats = prefixed("attn", own.stats)
        cross_state = None
        if self.cross_attention is not None:
            if context is None:
                raise ValueError("this block has cross-attention: pass context=[b, c, d] (the encoder output)")
            h = self.cross_residual.sublayer_input(x)
            cross = self.cross_attention(h, context=context, pad_mask=context_pad_mask, state=state.cross)
            x = self.cross_residual.join(x, cross.out)
            cross_state = cross.state
            merge_into(aux, cross.aux)
            stats.update(prefixed("cross", cross.stats))
        x = self.feed_forward_residual(x, lambda h: self.feed_forward(h, pad_mask=pad_mask))
        new_state = None if own.state is None and cross_state is None else BlockState(own.state, cross_state)
        return BlockOutput(x, new_state, aux, stats)

    @contextmanager
    def at_depth(self, layer_index: int) -> Iterator[None]:
        """Run this block as layer ``layer_index`` (for depth-dependent patterns, e.g. interleaved
        sparse attention) while the context lasts: a stack that re-applies one block passes the step."""
        attentions = [a for a in (self.attention, self.cross_attention) if a is not None]
        before = [a.layer_index for a in attentions]
        for attention in attentions:
            attention.layer_index = layer_index
        try:
            yield
        finally:
            for attention, index in zip(attentions, before):
                attention.layer_index = index

    # -- the additive view, for stacks that rearrange the residual stream (reversible) ---------
    @property
    def additive(self) -> bool:
        """Every sub-layer joins as x + branch(x), so a layer's input can be recovered."""
        residuals = (self.attention_residual, self.cross_residual, self.feed_forward_residual)
        return all(r.additive for r in residuals if r is not None)

    @property
    def carries_segment_memory(self) -> bool:
        """An attention here carries memory from one training segment to the next (XL memory, a
        bounded KV cache), as opposed to a decoding cache that only generation threads."""
        return any(a is not None and a.carries_segment_memory() for a in (self.attention, self.cross_attention))

    @property
    def has_cross(self) -> bool:
        return self.cross_attention is not None

    def describe(self) -> str:
        """The parts by registry name, for error messages: "attention 'lsh', residual 'pre_norm'"."""
        return f"attention {self.attention.registry_name!r}, residual {self.attention_residual.registry_name!r}"

    def attention_branch(
        self,
        x: Tensor,
        *,
        pad_mask: Tensor | None = None,
        state: BlockState | None = None,
        documents: Tensor | None = None,
    ) -> tuple[Tensor, dict[str, Tensor], dict[str, Tensor], BlockState | None]:
        """F(x) with x + F(x) = the attention half of ``forward`` (additive residuals only), with
        the mechanism's aux losses, its stats (named as ``forward`` names them) and, given this
        layer's ``state``, the state to carry on (None otherwise)."""
        if not self.additive:
            raise TypeError(f"this block ({self.describe()}) is not additive: no attention branch F with y = x + F(x)")
        result = self._attend(x, pad_mask, None if state is None else state.attention, documents)
        new_state = None if result.state is None else BlockState(result.state)
        return self.attention_residual.update(result.out), dict(result.aux), prefixed("attn", result.stats), new_state

    def feed_forward_branch(self, x: Tensor) -> Tensor:
        """G(x) with x + G(x) = the feed-forward half of ``forward``; position-wise, so it may be
        computed on any slice of positions (``feed_forward_slices``)."""
        return self.feed_forward_residual.branch(x, self.feed_forward)

    def feed_forward_slices(self, t: int) -> list[slice]:
        """The slices of t positions the feed-forward runs on (``FeedForward.chunk_size``; a stack that runs
        the feed-forward on them, reversible, refuses one that is not ``position_wise``)."""
        size = getattr(self.feed_forward, "chunk_size", 0) or t
        return [slice(s, min(s + size, t)) for s in range(0, t, size)]

    def branch_parameters(self, branch: str) -> list[nn.Parameter]:
        """The parameters one branch uses ("attention" or "feed_forward"): sub-layer and residual."""
        require(branch in ("attention", "feed_forward"), f"branch must be attention or feed_forward, got {branch!r}")
        if branch == "attention":
            modules = [self.attention, self.attention_residual]
        else:
            modules = [self.feed_forward, self.feed_forward_residual]
        return [p for module in modules for p in module.parameters()]
