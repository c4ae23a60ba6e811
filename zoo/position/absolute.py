"""Absolute position signals added to the token embeddings.

These parts set ``adds_signal``; the schemes acting inside attention are ``rotary.py``, ``alibi.py``
and ``t5_bias.py``.

``sinusoidal`` (Vaswani et al. 2017, Section 3.5), ``learned`` (a table of ``max_len`` vectors) and
``none``.

Per-layer learned positions (Al-Rfou et al. 2018, arXiv:1808.04444, Section 3: "we add a separate learned
positional embedding to the input of each layer"): ``learned`` with ``every_layer=true`` keeps one table per
layer, the first added at the embedding as usual, each other added to its block's input by a forward
pre-hook on the stack's blocks (``attach``), at the same positions the input got in this call (the
offset of a cached continuation and the random offsets included). The paper's T12 / T64 parameter totals
(44M / 235M) need these tables (``conf/experiment/paper/al_rfou_*.yaml``). Only a model that attaches
its stack can use it (the causal LM does); a stack without per-layer blocks (universal, reversible) is
refused.

Randomised offsets (Dehghani et al. 2019, Universal Transformer, arXiv:1807.03819, the algorithmic
tasks): with ``random_offset_max = R > 0``, each training sequence starts at its own position
``offset + u`` with u drawn uniformly from 0..R (torch's global generator, so ``torch.manual_seed``
fixes the draws), so a model trained on short sequences has seen the signals of the positions a long
test sequence reaches. Evaluation (``module.eval()``) always uses u = 0.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from zoo.config import require
from zoo.position.base import POSITION, Position, check_random_offset_max, position_end, sinusoid_table


@POSITION.register("sinusoidal")
class SinusoidalPosition(Position):
    @dataclass
    class Options:
        base: float = 10000.0
        random_offset_max: int = 0  # training positions start at a random 0..R (Dehghani et al. 2019)

        def __post_init__(self) -> None:
            require(self.base > 1.0, f"base must be > 1, got {self.base}")
            check_random_offset_max(self.random_offset_max)

    def forward(self, x: Tensor, offset: int | Tensor = 0) -> Tensor:
        positions = self.positions(x, offset)  # [1, t] or [b, t]
        signal = sinusoid_table(positions.flatten(), self.d_model, self.options.base, dtype=x.dtype)
        return x + signal.view(*positions.shape, self.d_model)


@POSITION.register("learned")
class LearnedPosition(Position):
    @dataclass
    class Options:
        random_offset_max: int = 0  # training positions start at a random 0..R (Dehghani et al. 2019)
        every_layer: bool = False  # a separate table at every layer's input (Al-Rfou et al. 2018)
        # the tables' N(0, std): 1 = the scale of our token rows (see below); 0.02 with model.token_init_std=0.02
        # is BERT's and the PyTorch LRA code's pair (lra_setting=nystromformer)
        init_std: float = 1.0

        def __post_init__(self) -> None:
            check_random_offset_max(self.random_offset_max)
            require(self.init_std > 0.0, f"learned positions: init_std must be > 0, got {self.init_std}")

    def __init__(self, d_model: int, max_len: int, **options):
        super().__init__(d_model, max_len, **options)
        shift_max = self.options.random_offset_max
        require(
            shift_max < max_len,
            f"learned positions: random_offset_max={shift_max} must be below "
            f"max_len={max_len} (the table holds positions 0..max_len-1)",
        )
        self.table = nn.Embedding(max_len, d_model)
        # By default at the scale of what it is added to: TokenEmbedding enters at RMS 1 per coordinate (weights
        # d^-0.5 times sqrt(d)), sinusoids at 0.71. GPT-style std 0.02 would leave the positions at 2%
        # of the tokens, nearly invisible after the first norm: a 1-layer model then needs hundreds of
        # steps to find a key by position (results/reformer_table2: duplication stayed at chance).
        nn.init.normal_(self.table.weight, std=self.options.init_std)

        self.layer_tables: nn.Parameter | None = None  # [n_layers - 1, max_len, d]: layers 2 ... n (every_layer)
        self._positions: Tensor | None = None  # this call's positions, for the layers' hooks

    def attach(self, stack: nn.Module) -> None:
        if not self.options.every_layer:
            return
        blocks = stack.layer_blocks()
        require(
            blocks is not None,
            f"learned positions with every_layer=true add a table at each block's input: they need one block per "
            f"layer, each called in turn; stack {stack.registry_name!r} has none (Stack.layer_blocks() is None)",
        )
        self.layer_tables = nn.Parameter(torch.empty(len(blocks) - 1, self.max_len, self.d_model))
        nn.init.normal_(self.layer_tables, std=self.options.init_std)  # the input table's scale (see above)
        for index, block in enumerate(blocks[1:]):
            # a bound method in a partial: a deep copy of the model rebinds it to the copy's tables
            block.register_forward_pre_hook(functools.partial(self._add_layer_signal, index))

    def _add_layer_signal(self, index: int, module: nn.Module, args: tuple) -> tuple:
        require(self._positions is not None, "every_layer positions: the block ran before the position signal")
        x = args[0]
        return (x + F.embedding(self._positions, self.layer_tables[index]).to(x.dtype), *args[1:])

    def length_limit(self) -> int:
        return self.max_len  # the table holds positions 0 .. max_len - 1

    def forward(self, x: Tensor, offset: int | Tensor = 0) -> Tensor:
        require(
            not self.options.every_layer or self.layer_tables is not None,
            "learned positions with every_layer=true need a model that attaches them to its stack (kind lm)",
        )
        shift_max = self.options.random_offset_max if self.training else 0
        end = position_end(offset, self.sequence_length(x)) + shift_max
        if end > self.max_len:
            shifted = f" with random_offset_max={shift_max}" if shift_max else ""
            raise ValueError(
                f"learned positions: sequence reaches position {end}{shifted} but the table holds "
                f"max_len={self.max_len}; raise max_len or use position=sinusoidal"
            )
        positions = self.positions(x, offset)
        if self.options.every_layer:
            self._positions = positions
        return x + F.embedding(positions, self.table.weight).to(x.dtype)


@POSITION.register("none")
class NoPosition(Position):
    """No position at all: for mechanisms that encode position themselves (XL's relative scores)."""

    adds_signal = False
