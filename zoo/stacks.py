"""Stacks: how blocks are composed in depth.

A stack is built from a block factory ``make_block(layer_index) -> Block`` and called as
``stack(x, *, pad_mask, state, context, context_pad_mask, offset) -> StackOutput``. ``state`` is a
list with one entry per layer (``None`` = start fresh); ``offset`` is the absolute position of
``x[:, 0]`` for stacks that add their own signals (the Universal Transformer's timestep signal).

- ``sequential``: N independent blocks applied in order (Vaswani et al. 2017).
Later stacks (``reversible``, ``universal``) register here too, each in its own file.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from torch import Tensor, nn

from zoo.blocks import Block, merge_into
from zoo.config import NoOptions, build_options, require
from zoo.registry import STACK

BlockFactory = Callable[[int], Block]


@dataclass
class StackOutput:
    x: Tensor
    state: list[Any] | None = None  # one entry per layer; None when no layer keeps state
    aux: dict[str, Tensor] = field(default_factory=dict)
    stats: dict[str, Tensor] = field(default_factory=dict)


class Stack(nn.Module):
    Options: ClassVar[type] = NoOptions
    registry_name: ClassVar[str | None] = None
    keeps_state: ClassVar[bool] = True  # can thread its blocks' caches across calls (universal: no)

    def __init__(self, make_block: BlockFactory, n_layers: int, d_model: int, **options):
        super().__init__()
        require(isinstance(n_layers, int) and n_layers > 0, f"n_layers must be a positive int, got {n_layers!r}")
        self.n_layers, self.d_model = n_layers, d_model
        self.options = build_options(self.Options, options, f"stack {self.registry_name!r}")

    def init_state(self, batch_size: int) -> list[Any] | None:
        return None

    def check_state(self, state: list[Any] | None) -> list[Any]:
        if state is None:
            return [None] * self.n_layers
        if not isinstance(state, (list, tuple)) or len(state) != self.n_layers:
            raise ValueError(f"stack {self.registry_name!r}: state must be a list with one entry per layer ({self.n_layers}); got {type(state).__name__} of length {len(state) if hasattr(state, '__len__') else '?'}")
        return list(state)


@STACK.register("sequential")
class SequentialStack(Stack):
    def __init__(self, make_block: BlockFactory, n_layers: int, d_model: int, **options):
        super().__init__(make_block, n_layers, d_model, **options)
        self.blocks = nn.ModuleList(make_block(i) for i in range(n_layers))

    def init_state(self, batch_size: int) -> list[Any] | None:
        states = [block.init_state(batch_size) for block in self.blocks]
        return None if all(s is None for s in states) else states

    def forward(self, x: Tensor, *, pad_mask: Tensor | None = None, state: list[Any] | None = None, context: Tensor | None = None, context_pad_mask: Tensor | None = None, offset: int = 0) -> StackOutput:
        states = self.check_state(state)
        new_states, aux, stats = [], {}, {}
        for i, (block, layer_state) in enumerate(zip(self.blocks, states)):
            out = block(x, pad_mask=pad_mask, state=layer_state, context=context, context_pad_mask=context_pad_mask)
            x = out.x
            new_states.append(out.state)
            merge_into(aux, out.aux)
            stats.update({f"layer{i}/{key}": value for key, value in out.stats.items()})
        return StackOutput(x, None if all(s is None for s in new_states) else new_states, aux, stats)
