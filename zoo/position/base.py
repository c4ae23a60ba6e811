"""The position axis: where a token's position enters the model.

A position module is called as ``pos(x, offset=0) -> x + signal`` where ``x`` is [b, t, d] and
``offset`` is the absolute position of ``x[:, 0]`` (non-zero when decoding with a cache).
Relative schemes (Transformer-XL's r_{i-j}) live inside their attention; the Universal
Transformer adds its own timestep signal. Both reuse :func:`sinusoid_table`.
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
from torch import Tensor, nn

from zoo.config import NoOptions, build_options, require
from zoo.registry import Registry


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
        """Options under which tests/contracts/test_position_contract.py exercises this signal (d_model 16)."""
        return {}

    def attach(self, stack: nn.Module) -> None:
        """Called by the model once its stack is built: a signal that enters every layer's input (not only
        the embedding's) hooks into the stack's blocks here. Default: nothing to attach."""

    def length_limit(self) -> int | None:
        """The most positions a sequence may reach in evaluation (a learned table's ``max_len``); None
        when the signal has no limit (sinusoids, no signal). Decoding asks before it starts."""
        return None

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


POSITION: Registry[type[Position]] = Registry("position", Position)
