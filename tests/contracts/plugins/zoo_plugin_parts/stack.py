"""A researcher's own stack: blocks shared in pairs (layers 2i and 2i + 1 run the same weights, as
ALBERT-style sharing), applied in order. Registered as ``plugin_stack`` when imported. It answers
none of the stack's knowledge questions (``block_applications``, ``kept_layers``), so cost
estimates of a model on it are unknown."""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from zoo.blocks import merge_into, prefixed
from zoo.stacks.base import STACK, BlockFactory, Stack, StackOutput


@STACK.register("plugin_stack")
class PairSharedStack(Stack):
    keeps_state = False  # one block serves two layers: a per-layer cache would be overwritten

    def __init__(self, make_block: BlockFactory, n_layers: int, d_model: int, **options: Any):
        super().__init__(make_block, n_layers, d_model, **options)
        self.blocks = nn.ModuleList(make_block(i) for i in range(0, n_layers, 2))

    def forward(self, x: Tensor, *, pad_mask=None, state=None, context=None, context_pad_mask=None) -> StackOutput:
        if state is not None and any(s is not None for s in state):
            raise ValueError("stack 'plugin_stack' keeps no state; pass state=None")
        aux, stats = {}, {}
        for layer in range(self.n_layers):
            block = self.blocks[layer // 2]
            with block.at_depth(layer):
                out = block(x, pad_mask=pad_mask, context=context, context_pad_mask=context_pad_mask)
            x = out.x
            merge_into(aux, out.aux)
            stats.update(prefixed(f"layer{layer}", out.stats))
        return StackOutput(x, None, aux, stats)
