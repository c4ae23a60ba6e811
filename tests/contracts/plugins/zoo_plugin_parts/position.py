"""A researcher's own position signal: the sinusoid times a learned gain (one scalar). Registered as
``plugin_position`` when imported."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from zoo.position.base import POSITION, Position, sinusoid_table


@POSITION.register("plugin_position")
class GainedSinusoid(Position):
    def __init__(self, d_model: int, max_len: int, **options):
        super().__init__(d_model, max_len, **options)
        self.gain = nn.Parameter(torch.ones(()))

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        positions = self.positions(x, offset)  # [1, t]
        signal = sinusoid_table(positions.flatten(), self.d_model, dtype=x.dtype)
        return x + self.gain * signal.view(*positions.shape, self.d_model)
