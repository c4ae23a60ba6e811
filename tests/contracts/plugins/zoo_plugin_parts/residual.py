"""A researcher's own residual policy: x + sigmoid(g) * Sublayer(Norm(x)), one learned gate g per
channel (a "gated pre-norm"; Norm the model's norm axis, built with ``make_norm``). Registered as
``plugin_residual`` when imported."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from zoo.residual.base import RESIDUAL, AdditiveResidual


@RESIDUAL.register("plugin_residual")
class GatedPreNorm(AdditiveResidual):
    final_norm = True

    def __init__(self, d_model: int, dropout: float = 0.0, **options):
        super().__init__(d_model, dropout, **options)
        self.norm = self.make_norm()
        self.gate = nn.Parameter(torch.zeros(d_model))  # sigmoid(0) = 1/2: half of each update at first

    def sublayer_input(self, x: Tensor) -> Tensor:
        return self.norm(x)

    def update(self, y: Tensor) -> Tensor:
        return torch.sigmoid(self.gate) * self.drop(y)
