"""ALiBi: attention with linear biases, a penalty proportional to the query-key distance.

Paper: "Train Short, Test Long: Attention with Linear Biases Enables Input Length Extrapolation",
Press, Smith and Lewis 2022, arXiv:2108.12409, Section 3.

No position signal at the input; every score gets a head-specific penalty linear in the distance:

    softmax(q_i K^T / sqrt(k) + m_h [-(i - 1), ..., -2, -1, 0])        (the paper's eq. for query i)

i.e. b_h(i - j) = -m_h |i - j|. The slopes are the geometric sequence that starts at 2^(-8/n) and
uses that value as its ratio (n heads: 1/2, 1/4, ..., 1/256 for n = 8). For a head count that is
not a power of two, the paper's code takes the 2^floor(log2 n) slopes of the nearest lower power
of two and fills the rest with every other slope of the next power of two (``slopes``). The slopes
are fixed, not learned (the paper's choice).

Causal and bidirectional: the paper defines the causal form (keys j <= i, so |i - j| = i - j). In a
bidirectional layer the same formula is the symmetric form -m_h |i - j| (a later key is penalised
like an earlier one at the same distance), as x-transformers' ``AlibiPositionalBias`` does.

``cache_positions``: distances measured by the keys' places in a decoding cache (StreamingLLM's
rule, Xiao et al. 2023: "contiguous" biases after eviction), not in the stream.

Deviations: none in the maths. The bias is computed per distance, not as a [t, t] matrix: each
mechanism adds it to the pairs it computes (``Position.distance_bias``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from zoo.position.base import POSITION, Position


def slopes(n_heads: int) -> list[float]:
    """The paper's head slopes m_1 ... m_n (its released code's rule for n not a power of two)."""

    def power_of_two(n: int) -> list[float]:
        start = 2.0 ** (-(2.0 ** -(math.log2(n) - 3)))  # 2^(-8/n)
        return [start * start**i for i in range(n)]

    if math.log2(n_heads).is_integer():
        return power_of_two(n_heads)
    lower = 2 ** math.floor(math.log2(n_heads))
    return power_of_two(lower) + power_of_two(2 * lower)[0::2][: n_heads - lower]


@POSITION.register("alibi")
class ALiBiPosition(Position):
    adds_signal = False
    pair_bias = True

    @dataclass
    class Options:
        cache_positions: bool = False  # distances by place in a decoding cache (StreamingLLM)

    def __init__(self, d_model: int, max_len: int, **options):
        super().__init__(d_model, max_len, **options)
        self.register_buffer("slopes", torch.tensor(slopes(self.n_heads), dtype=torch.float32), persistent=False)

    def bias(self, distance: Tensor, *, causal: bool) -> Tensor:
        """-m_h |i - j|: distance long [...] -> [h, ...] in the slopes' dtype (the same rule causal or not)."""
        magnitude = distance.abs().to(self.slopes)
        return -self.slopes.view(-1, *([1] * distance.dim())) * magnitude
