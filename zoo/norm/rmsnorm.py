"""RMSNorm, root mean square layer normalisation (Zhang & Sennrich 2019, arXiv:1910.07467).

Eq. 4 of the paper: no mean subtracted and no bias, the norm of Llama and most current models.

    RMSNorm(x) = x / sqrt(mean(x^2) + eps) * weight

over the last dimension, weight initialised to 1. Computed as HF's ``LlamaRMSNorm`` computes it:
in float32 for a narrower input (bf16 / fp16), the normalised x cast back to the input's dtype, then
times the weight. One difference: a float64 input stays float64 here, where ``LlamaRMSNorm`` casts
every input to float32 (so in float64 the two agree to float32 precision, about 1e-7, not 1e-15).
``eps`` defaults to 1e-6, ``LlamaRMSNorm``'s (Llama 2/3 checkpoints set ``rms_norm_eps`` = 1e-5).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from zoo.config import require
from zoo.norm.base import NORM, Norm


@NORM.register("rmsnorm")
class RMSNorm(Norm):
    @dataclass
    class Options:
        eps: float = 1e-6  # added to mean(x^2) inside the square root (HF LlamaRMSNorm's default)

        def __post_init__(self) -> None:
            require(self.eps > 0, f"rmsnorm: eps must be > 0, got {self.eps}")

    def __init__(self, dim: int, **options):
        super().__init__(dim, **options)
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        # float32: mean(x^2) of a bf16 input in bf16 loses the 8 bits its sum needs (as LlamaRMSNorm does)
        wide = x.to(torch.promote_types(x.dtype, torch.float32))
        normalised = wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + self.options.eps)
        return self.weight * normalised.to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.options.eps}"
