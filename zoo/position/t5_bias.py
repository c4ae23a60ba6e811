"""T5's relative position bias: a learned scalar per head and distance bucket, shared by the layers.

Paper: "Exploring the Limits of Transfer Learning with a Unified Text-to-Text Transformer", Raffel,
Shazeer, Roberts, Lee, Narang, Matena, Zhou, Li and Liu 2020, arXiv:1910.10683, Section 2.1
("Each 'embedding' is simply a scalar added to the corresponding logit ... we share the position
embedding parameters across all layers ... each attention head uses a different learned position
embedding ... 32 embeddings for all of our models with ranges that increase in size logarithmically
up to an offset of 128 beyond which we assign all relative positions to the same embedding").

The bucket of a distance n = i - j (query minus key), as in the released code
(``_relative_position_bucket``):

- bidirectional: half the buckets for keys before the query, half for keys after it; causal: every
  bucket for keys before it (later keys are masked anyway);
- within a half of B buckets: distances 0 ... B/2 - 1 get one bucket each; larger ones
  B/2 + floor(log(n / (B/2)) / log(max_distance / (B/2)) x (B - B/2)), capped at B - 1.

The table [buckets, heads] belongs to the model's position part and every layer reads it (one
table for the stack, as in T5; the encoder-decoder gives its decoder a table of its own, as T5 does).

``cache_positions``: distances by place in a decoding cache (StreamingLLM's rule), not in the stream.

Deviations: the bias is added to the scaled score q . k / sqrt(k) (T5 has no 1/sqrt(k): its
initialisation absorbs it); the table starts at N(0, d_model^-1/2) as in T5's initialisation. The
bias is computed per distance and gathered for the pairs a mechanism computes, never as a [t, t]
matrix unless the mechanism builds one anyway.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from zoo.config import require
from zoo.position.base import POSITION, Position


def relative_bucket(distance: Tensor, *, causal: bool, buckets: int, max_distance: int) -> Tensor:
    """T5's bucket of each distance i - j (long [...]) -> long [...] in [0, buckets)."""
    n = distance
    offset = torch.zeros_like(n)
    if not causal:
        buckets //= 2
        offset = (n < 0).long() * buckets  # keys after the query take the upper half
        n = n.abs()
    else:
        n = n.clamp(min=0)
    exact = buckets // 2
    small = n < exact
    # log(0) never reaches the result (those distances are small); clamp keeps the float finite
    scaled = torch.log(n.clamp(min=1).float() / exact) / math.log(max_distance / exact) * (buckets - exact)
    large = (exact + scaled.long()).clamp(max=buckets - 1)
    return offset + torch.where(small, n, large)


@POSITION.register("t5_bias")
class T5RelativeBias(Position):
    adds_signal = False
    pair_bias = True

    @dataclass
    class Options:
        buckets: int = 32  # distance buckets (per direction: half of them when bidirectional)
        max_distance: int = 128  # distances from here on share the last bucket
        cache_positions: bool = False  # distances by place in a decoding cache (StreamingLLM)

        def __post_init__(self) -> None:
            require(
                isinstance(self.buckets, int) and self.buckets >= 4, f"buckets must be an int >= 4, got {self.buckets}"
            )
            require(
                isinstance(self.max_distance, int) and self.max_distance > self.buckets // 2,
                f"max_distance ({self.max_distance}) must exceed the exact buckets (buckets // 2 = "
                f"{self.buckets // 2})",
            )

    def __init__(self, d_model: int, max_len: int, **options):
        super().__init__(d_model, max_len, **options)
        self.table = nn.Parameter(torch.randn(self.options.buckets, self.n_heads) * d_model**-0.5)

    @classmethod
    def contract_options(cls) -> dict:
        return {"buckets": 8, "max_distance": 20}  # log-spaced buckets within the contract lengths

    def bias(self, distance: Tensor, *, causal: bool) -> Tensor:
        """table[bucket(i - j)]: distance long [...] -> [h, ...] in the table's dtype (differentiable in it)."""
        o = self.options
        bucket = relative_bucket(distance, causal=causal, buckets=o.buckets, max_distance=o.max_distance)
        values = self.table[bucket.to(self.table.device)]  # [..., h]
        return values.movedim(-1, 0)
