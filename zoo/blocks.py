"""The one block skeleton every variant shares, and the position-wise feed-forward network.

A :class:`Block` receives its parts (attention, optional cross-attention, feed-forward) and a
residual policy factory; it never branches on which mechanism it holds. Stacks compose blocks in
depth (sequentially, reversibly, or recurrently with ACT) through the two entry points here:
``forward`` (the whole block) and the ``*_branch`` methods (the additive residual branches the
reversible stack needs).

Shapes: x [b, t, d]; pad_mask [b, t] bool (True = real); context [b, c, d]; context_pad_mask [b, c].
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from zoo.attention.base import Attention, AttnOutput
from zoo.config import require
from zoo.residual import Residual


class FeedForward(nn.Module):
    """FFN(x) = act(x W1 + b1) W2 + b2 (Vaswani et al. 2017, eq. 2; act = ReLU, or GELU).

    ``chunk_size`` > 0 applies the network to slices of that many positions at a time (Reformer,
    Kitaev et al. 2020, Section 3), so the forward pass never holds the [b, t, d_ff] activation of
    the whole sequence at once; under a recomputing stack (reversible) that is the peak saved."""

    def __init__(self, d_model: int, d_ff: int, *, activation: str = "relu", dropout: float = 0.0, chunk_size: int = 0):
        super().__init__()
        require(activation in ("relu", "gelu"), f"activation must be relu or gelu, got {activation!r}")
        require(chunk_size >= 0, f"chunk_size must be >= 0 (0 = unchunked), got {chunk_size}")
        self.w1, self.w2 = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model)
        self.activation = F.relu if activation == "relu" else F.gelu
        self.drop = nn.Dropout(dropout)
        self.chunk_size = chunk_size

    def position_wise(self, x: Tensor) -> Tensor:
        return self.w2(self.drop(self.activation(self.w1(x))))

    def forward(self, x: Tensor, pad_mask: Tensor | None = None) -> Tensor:
        # pad_mask is unused: a position-wise network cannot carry padding into real positions (a
        # transition that mixes positions, zoo/separable_conv.py, reads it)
        if not self.chunk_size or x.shape[1] <= self.chunk_size:
            return self.position_wise(x)
        return torch.cat([self.position_wise(piece) for piece in x.split(self.chunk_size, dim=1)], dim=1)


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


class Block(nn.Module):
    """attention -> [cross-attention] -> feed-forward, each joined by its own residual policy."""

    def __init__(self, attention: Attention, feed_forward: nn.Module, make_residual: Callable[[], Residual], cross_attention: Attention | None = None):
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

    def forward(self, x: Tensor, *, pad_mask: Tensor | None = None, state: BlockState | None = None, context: Tensor | None = None, context_pad_mask: Tensor | None = None) -> BlockOutput:
        state = state or BlockState()
        results: list[AttnOutput] = []

        def attend(h: Tensor) -> Tensor:
            result = self.attention(h, pad_mask=pad_mask, state=state.attention)
            results.append(result)
            return result.out

        x = self.attention_residual(x, attend)
        own = results[-1]
        cross_state = None
        if self.cross_attention is not None:
            if context is None:
                raise ValueError("this block has cross-attention: pass context=[b, c, d] (the encoder output)")

            def cross_attend(h: Tensor) -> Tensor:
                result = self.cross_attention(h, context=context, pad_mask=context_pad_mask, state=state.cross)
                results.append(result)
                return result.out

            x = self.cross_residual(x, cross_attend)
            cross_state = results[-1].state
        x = self.feed_forward_residual(x, lambda h: self.feed_forward(h, pad_mask=pad_mask))
        aux: dict[str, Tensor] = {}
        stats: dict[str, Tensor] = {}
        for result in results:
            merge_into(aux, result.aux)
            stats.update(result.stats)
        new_state = None if own.state is None and cross_state is None else BlockState(own.state, cross_state)
        return BlockOutput(x, new_state, aux, stats)

    # -- additive branches, for stacks that rearrange the residual (reversible) ----------------
    def attention_branch(self, x: Tensor, *, pad_mask: Tensor | None = None) -> tuple[Tensor, AttnOutput]:
        """F(x) with x + F(x) = the attention half of ``forward`` (additive residuals only)."""
        results: list[AttnOutput] = []

        def attend(h: Tensor) -> Tensor:
            results.append(self.attention(h, pad_mask=pad_mask))
            return results[-1].out

        return self.attention_residual.branch(x, attend), results[-1]

    def feed_forward_branch(self, x: Tensor) -> Tensor:
        """G(x) with x + G(x) = the feed-forward half of ``forward``."""
        return self.feed_forward_residual.branch(x, self.feed_forward)
