"""Layer normalisation (Ba, Kiros & Hinton 2016, arXiv:1607.06450): the norm of the 2017 block.

    LayerNorm(x) = (x - mean(x)) / sqrt(var(x) + eps) * weight + bias

over the last dimension (biased variance), weight initialised to 1 and bias to 0: ``nn.LayerNorm``'s
maths and parameter names (``weight``, ``bias``), so every checkpoint written before the norm axis
loads into it unchanged. ``bias=False`` drops the bias (as in models that remove every bias).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from zoo.config import require
from zoo.norm.base import NORM, Norm


@NORM.register("layernorm")
class LayerNorm(Norm):
    @dataclass
    class Options:
        bias: bool = True  # the learned shift; False = scale only
        eps: float = 1e-5  # nn.LayerNorm's

        def __post_init__(self) -> None:
            require(self.eps > 0, f"layernorm: eps must be > 0, got {self.eps}")

    def __init__(self, dim: int, **options):
        super().__init__(dim, **options)
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim)) if self.options.bias else None

    @classmethod
    def contract_options(cls) -> dict:
        return {"bias": False}  # the default (bias) runs everywhere else; the suite covers the other case

    def forward(self, x: Tensor) -> Tensor:
        return F.layer_norm(x, (self.dim,), self.weight, self.bias, self.options.eps)

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.options.eps}, bias={self.options.bias}"
