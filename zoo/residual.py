"""Residual policies: how a sub-layer's output joins the residual stream.

A policy wraps one sub-layer (attention, cross-attention or feed-forward) of a block and is called
as ``policy(x, sublayer) -> y`` where ``sublayer`` maps [b, t, d] -> [b, t, d]. Policies that
compute ``y = x + branch(x)`` are *additive* and also expose ``branch``; only those fit inside
the reversible stack, which needs to subtract the branch to recover its inputs.

- ``post_norm``: LayerNorm(x + Dropout(Sublayer(x))) (Vaswani et al. 2017, Section 5.4).
- ``pre_norm``:  x + Dropout(Sublayer(LayerNorm(x))) (Wang et al. 2019, arXiv:1906.01787); the
  stack then ends in one more LayerNorm (``final_norm``).
- ``rezero``:    x + alpha * Dropout(Sublayer(x)), alpha a learned scalar initialised to 0, so
  every block starts as the identity (Bachlechner et al. 2020, arXiv:2003.04887).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

import torch
from torch import Tensor, nn

from zoo.config import NoOptions, build_options
from zoo.registry import RESIDUAL

Sublayer = Callable[[Tensor], Tensor]


class Residual(nn.Module):
    additive: ClassVar[bool] = False  # y = x + branch(x): usable in the reversible stack
    final_norm: ClassVar[bool] = False  # the stack output needs a final LayerNorm
    Options: ClassVar[type] = NoOptions
    registry_name: ClassVar[str | None] = None

    def __init__(self, d_model: int, dropout: float = 0.0, **options):
        super().__init__()
        self.options = build_options(self.Options, options, f"residual {self.registry_name!r}")
        self.drop = nn.Dropout(dropout)

    def branch(self, x: Tensor, sublayer: Sublayer) -> Tensor:
        raise TypeError(f"residual {self.registry_name!r} is not additive (y != x + branch(x)); the reversible stack needs pre_norm or rezero")

    def forward(self, x: Tensor, sublayer: Sublayer) -> Tensor:
        return x + self.branch(x, sublayer)


@RESIDUAL.register("post_norm")
class PostNorm(Residual):
    def __init__(self, d_model: int, dropout: float = 0.0, **options):
        super().__init__(d_model, dropout, **options)
        self.norm = nn.LayerNorm(d_model)

    def forward(self, x: Tensor, sublayer: Sublayer) -> Tensor:
        return self.norm(x + self.drop(sublayer(x)))


@RESIDUAL.register("pre_norm")
class PreNorm(Residual):
    additive = True
    final_norm = True

    def __init__(self, d_model: int, dropout: float = 0.0, **options):
        super().__init__(d_model, dropout, **options)
        self.norm = nn.LayerNorm(d_model)

    def branch(self, x: Tensor, sublayer: Sublayer) -> Tensor:
        return self.drop(sublayer(self.norm(x)))


@RESIDUAL.register("rezero")
class ReZero(Residual):
    additive = True

    def __init__(self, d_model: int, dropout: float = 0.0, **options):
        super().__init__(d_model, dropout, **options)
        self.alpha = nn.Parameter(torch.zeros(()))

    def branch(self, x: Tensor, sublayer: Sublayer) -> Tensor:
        return self.alpha * self.drop(sublayer(x))
