"""Factorised learned positions of the Sparse Transformer (Child et al. 2019, arXiv:1904.10509).

The paper's "Position embeddings" paragraph (Section 5, as we read it): instead of one learned vector
per position, position i gets the sum of one learned vector per dimension of the attention pattern's
factorisation, embed(x_i) + sum_j o_i^(j) W_j.

For the strided and fixed patterns over a sequence (d_attn = 2, the paper's choice for text) the two
dimensions are the position inside its block of ``stride`` = l and the index of that block:

    p_i = W_within[i mod l] + W_block[floor(i / l)]

so a 12,288-byte context with l = 128 learns 128 + 96 vectors where a plain table learns 12,288 (for the
enwik8 model: 0.11M parameters against 6.3M, which is how the paper's 95M total is made;
``conf/experiment/paper/sparse_enwik8.yaml``). ``stride`` should equal the attention's (the preset sets
both). The tables are initialised as ``learned``'s (N(0, 1) each, so their sum enters at RMS sqrt(2) per
coordinate beside token rows of RMS 1).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn.functional as F
from torch import Tensor, nn

from zoo.config import require
from zoo.position.base import POSITION, Position, position_end


@POSITION.register("factorized")
class FactorizedPosition(Position):
    @dataclass
    class Options:
        stride: int = 128  # l: the attention pattern's block length (the Sparse Transformer's enwik8 model: 128)

        def __post_init__(self) -> None:
            require(
                isinstance(self.stride, int) and self.stride >= 1, f"stride must be an int >= 1, got {self.stride!r}"
            )

    @classmethod
    def contract_options(cls) -> dict:
        return {"stride": 4}

    def __init__(self, d_model: int, max_len: int, **options):
        super().__init__(d_model, max_len, **options)
        stride = self.options.stride
        self.within = nn.Embedding(stride, d_model)  # i mod l
        self.block = nn.Embedding(-(-max_len // stride), d_model)  # floor(i / l)
        nn.init.normal_(self.within.weight, std=1.0)
        nn.init.normal_(self.block.weight, std=1.0)

    def length_limit(self) -> int:
        return self.max_len

    def forward(self, x: Tensor, offset: int | Tensor = 0) -> Tensor:
        end = position_end(offset, self.sequence_length(x))
        if end > self.max_len:
            raise ValueError(
                f"factorized positions: sequence reaches position {end} but the block table covers max_len="
                f"{self.max_len}; raise max_len"
            )
        positions = self.positions(x, offset)
        stride = self.options.stride
        signal = F.embedding(positions % stride, self.within.weight) + F.embedding(
            positions // stride, self.block.weight
        )
        return x + signal.to(x.dtype)
