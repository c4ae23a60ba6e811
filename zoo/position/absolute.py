"""Absolute position signals added to the token embeddings.

These parts set ``adds_signal``; the schemes acting inside attention are ``rotary.py``, ``alibi.py``
and ``t5_bias.py``.

``sinusoidal`` (Vaswani et al. 2017, Section 3.5), ``learned`` (a table of ``max_len`` vectors) and
``none``.

Randomised offsets (Dehghani et al. 2019, Universal Transformer, arXiv:1807.03819, the algorithmic
tasks): with ``random_offset_max = R > 0``, each training sequence starts at its own position
``offset + u`` with u drawn uniformly from 0..R (torch's global generator, so ``torch.manual_seed``
fixes the draws), so a model trained on short sequences has seen the signals of the positions a long
test sequence reaches. Evaluation (``module.eval()``) always uses u = 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn.functional as F
from torch import Tensor, nn

from zoo.config import require
from zoo.position.base import POSITION, Position, check_random_offset_max, sinusoid_table


@POSITION.register("sinusoidal")
class SinusoidalPosition(Position):
    @dataclass
    class Options:
        base: float = 10000.0
        random_offset_max: int = 0  # training positions start at a random 0..R (Dehghani et al. 2019)

        def __post_init__(self) -> None:
            require(self.base > 1.0, f"base must be > 1, got {self.base}")
            check_random_offset_max(self.random_offset_max)

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        positions = self.positions(x, offset)  # [1, t] or [b, t]
        signal = sinusoid_table(positions.flatten(), self.d_model, self.options.base, dtype=x.dtype)
        return x + signal.view(*positions.shape, self.d_model)


@POSITION.register("learned")
class LearnedPosition(Position):
    @dataclass
    class Options:
        random_offset_max: int = 0  # training positions start at a random 0..R (Dehghani et al. 2019)

        def __post_init__(self) -> None:
            check_random_offset_max(self.random_offset_max)

    def __init__(self, d_model: int, max_len: int, **options):
        super().__init__(d_model, max_len, **options)
        shift_max = self.options.random_offset_max
        require(
            shift_max < max_len,
            f"learned positions: random_offset_max={shift_max} must be below "
            f"max_len={max_len} (the table holds positions 0..max_len-1)",
        )
        self.table = nn.Embedding(max_len, d_model)
        # At the scale of what it is added to: TokenEmbedding enters at RMS 1 per coordinate (weights
        # d^-0.5 times sqrt(d)), sinusoids at 0.71. GPT-style std 0.02 would leave the positions at 2%
        # of the tokens, nearly invisible after the first norm: a 1-layer model then needs hundreds of
        # steps to find a key by position (results/reformer_table2: duplication stayed at chance).
        nn.init.normal_(self.table.weight, std=1.0)

    def length_limit(self) -> int:
        return self.max_len  # the table holds positions 0 .. max_len - 1

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        shift_max = self.options.random_offset_max if self.training else 0
        end = offset + x.shape[1] + shift_max
        if end > self.max_len:
            shifted = f" with random_offset_max={shift_max}" if shift_max else ""
            raise ValueError(
                f"learned positions: sequence reaches position {end}{shifted} but the table holds "
                f"max_len={self.max_len}; raise max_len or use position=sinusoidal"
            )
        return x + F.embedding(self.positions(x, offset), self.table.weight).to(x.dtype)


@POSITION.register("none")
class NoPosition(Position):
    """No position at all: for mechanisms that encode position themselves (XL's relative scores)."""

    adds_signal = False
