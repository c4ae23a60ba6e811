"""Stacks: how blocks are composed in depth.

``sequential``: N independent blocks applied in order (Vaswani et al. 2017)."""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from zoo.blocks import Block, merge_into, prefixed
from zoo.stacks.base import STACK, BlockFactory, Stack, StackOutput


@STACK.register("sequential")
class SequentialStack(Stack):
    packs_documents = True  # blocks one after another: each keeps a packed row's documents apart itself

    def __init__(self, make_block: BlockFactory, n_layers: int, d_model: int, **options):
        super().__init__(make_block, n_layers, d_model, **options)
        self.blocks = nn.ModuleList(make_block(i) for i in range(n_layers))

    def block_applications(self) -> list[Block]:
        return list(self.blocks)

    def layer_blocks(self) -> list[Block]:
        return list(self.blocks)

    def kept_layers(self) -> int:
        return self.n_layers

    def recompute_passes(self) -> float:
        return 0.0

    def context_refusal(self) -> None:
        return None  # blocks one after another: each runs on the chunk as it would on the whole sequence

    def init_state(self, batch_size: int) -> list[Any] | None:
        states = [block.init_state(batch_size) for block in self.blocks]
        return None if all(s is None for s in states) else states

    def forward(
        self,
        x: Tensor,
        *,
        pad_mask: Tensor | None = None,
        state: list[Any] | None = None,
        context: Tensor | None = None,
        context_pad_mask: Tensor | None = None,
        documents: Tensor | None = None,
    ) -> StackOutput:
        states = self.check_state(state)
        new_states, aux, stats = [], {}, {}
        for i, (block, layer_state) in enumerate(zip(self.blocks, states)):
            out = block(
                x,
                pad_mask=pad_mask,
                state=layer_state,
                context=context,
                context_pad_mask=context_pad_mask,
                documents=documents,
            )
            x = out.x
            new_states.append(out.state)
            merge_into(aux, out.aux)
            stats.update(prefixed(f"layer{i}", out.stats))
        return StackOutput(x, None if all(s is None for s in new_states) else new_states, aux, stats)
