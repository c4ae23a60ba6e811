"""Absolute position signals added to the token embeddings.

Relative schemes (Transformer-XL's r_{i-j}) live inside their attention; the Universal
Transformer adds its own timestep signal. Both reuse :func:`sinusoid_table`.

A position module is called as ``pos(x, offset=0) -> x + signal`` where ``x`` is [b, t, d] and
``offset`` is the absolute position of ``x[:, 0]`` (non-zero when decoding with a cache).

Randomised offsets (Dehghani et al. 2019, Universal Transformer, arXiv:1807.03819, the algorithmic
tasks): with ``random_offset_max = R > 0``, each training sequence starts at its own position
``offset + u`` with u drawn uniformly from 0..R (torch's global generator, so ``torch.manual_seed``
fixes the draws), so a model trained on short sequences has seen the signals of the positions a long
test sequence reaches. Evaluation (``module.eval()``) always uses u = 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from zoo.config import NoOptions, build_options, require
from zoo.registry import POSITION


def sinusoid_table(
    positions: Tensor, d_model: int, base: float = 10000.0, dtype: torch.dtype = torch.float32
) -> Tensor:
    """The paper's signal (Vaswani et al. 2017, Section 3.5), computed in log space:

        PE(pos, 2i) = sin(pos / base^(2i/d)),  PE(pos, 2i+1) = cos(pos / base^(2i/d))

    base^(-2i/d) is exp(-2i * ln(base) / d): no large powers, so no overflow for long sequences.
    Always computed in float64, then cast to ``dtype``: pass the model's. In float32 the angle
    pos * freq is rounded before the sine, an error of ~1e-4 by position 4K that a float64 model
    would otherwise inherit.
    positions: [n] (any real values, e.g. XL's relative distances) -> [n, d] in ``dtype``.
    Odd d_model: the last cosine column is dropped."""
    half = (d_model + 1) // 2
    device = positions.device if positions.device.type != "mps" else torch.device("cpu")  # MPS has no float64
    inv_freq = torch.exp(torch.arange(half, dtype=torch.float64, device=device) * (-2.0 * math.log(base) / d_model))
    angles = positions.to(device=device, dtype=torch.float64)[:, None] * inv_freq[None, :]  # [n, half]
    table = torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(1)  # interleave sin, cos
    return table[:, :d_model].to(device=positions.device, dtype=dtype)


class Position(nn.Module):
    Options: ClassVar[type] = NoOptions
    registry_name: ClassVar[str | None] = None

    def __init__(self, d_model: int, max_len: int, **options):
        super().__init__()
        self.d_model, self.max_len = d_model, max_len
        self.options = build_options(self.Options, options, f"position {self.registry_name!r}")

    @classmethod
    def contract_options(cls) -> dict:
        """Options under which tests/test_position_contract.py exercises this signal (d_model 16)."""
        return {}

    def positions(self, x: Tensor, offset: int) -> Tensor:
        """Absolute positions of ``x`` [b, t, d]: offset + index, [1, t] (broadcast over the batch); in
        training with random_offset_max > 0, [b, t] with a random start u_b in 0..R per sequence."""
        b, t = x.shape[:2]
        index = torch.arange(offset, offset + t, device=x.device)
        shift_max = getattr(self.options, "random_offset_max", 0)
        if not (self.training and shift_max):
            return index[None]
        shifts = torch.randint(0, shift_max + 1, (b, 1)).to(x.device)
        return index + shifts


def check_random_offset_max(value: int) -> None:
    require(
        isinstance(value, int) and value >= 0,
        f"random_offset_max must be an int >= 0 (0 = positions start at 0 in training too), got {value!r}",
    )


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
    """No absolute signal: for mechanisms that encode position themselves (XL's relative scores)."""

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        return x
