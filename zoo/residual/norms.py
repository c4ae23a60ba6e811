"""Residual policies: how a sub-layer's output joins the residual stream.

The three classic ones (Norm: the model's norm axis, LayerNorm unless ``norm=`` names another):

- ``post_norm``: Norm(x + Dropout(Sublayer(x))) (Vaswani et al. 2017, Section 5.4).
- ``pre_norm``:  x + Dropout(Sublayer(Norm(x))) (Wang et al. 2019, arXiv:1906.01787); the
  stack then ends in one more Norm (``final_norm``).
- ``rezero``:    x + alpha * Dropout(Sublayer(x)), alpha a learned scalar initialised to 0, so
  every block starts as the identity (Bachlechner et al. 2020, arXiv:2003.04887).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from zoo.residual.base import RESIDUAL, AdditiveResidual, Residual


@RESIDUAL.register("post_norm")
class PostNorm(Residual):
    def __init__(self, d_model: int, dropout: float = 0.0, **options):
        super().__init__(d_model, dropout, **options)
        self.norm = self.make_norm()

    def join(self, x: Tensor, y: Tensor) -> Tensor:
        return self.norm(x + self.drop(y))


@RESIDUAL.register("pre_norm")
class PreNorm(AdditiveResidual):
    final_norm = True

    def __init__(self, d_model: int, dropout: float = 0.0, **options):
        super().__init__(d_model, dropout, **options)
        self.norm = self.make_norm()

    def sublayer_input(self, x: Tensor) -> Tensor:
        return self.norm(x)

    def update(self, y: Tensor) -> Tensor:
        return self.drop(y)


@RESIDUAL.register("rezero")
class ReZero(AdditiveResidual):
    def __init__(self, d_model: int, dropout: float = 0.0, **options):
        super().__init__(d_model, dropout, **options)
        self.alpha = nn.Parameter(torch.zeros(()))

    def update(self, y: Tensor) -> Tensor:
        return self.alpha * self.drop(y)
