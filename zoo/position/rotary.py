"""Rotary position embedding (RoPE): queries and keys rotated by their absolute positions.

Paper: "RoFormer: Enhanced Transformer with Rotary Position Embedding", Su, Lu, Pan, Murtadha, Wen
and Liu 2021, arXiv:2104.09864, Section 3.2 (eq. 34).

Each pair of a head's rotated dimensions is a point in the plane, turned by the angle m theta_i at
position m, theta_i = base^(-2i / r), i = 0 ... r/2 - 1 (r = rotated dimensions):

    (x_a, x_b) -> (x_a cos m theta_i - x_b sin m theta_i,  x_a sin m theta_i + x_b cos m theta_i)

so q_m . k_n depends on the content and on m - n only (eq. 16): a relative position carried by
absolute rotations. The mechanism rotates every query and key at its absolute position in the
stream, and a cache keeps keys already rotated, so a token's rotation never depends on how the
sequence was cut (segments with a state == one call, exactly).

Options: ``base`` (10,000 in the paper; 500,000 in Llama 3); ``fraction`` of each head's dimensions
rotated, the rest passing unchanged (GPT-J/NeoX's partial rotary; the paper rotates all);
``layout`` of the pairs: ``pairs`` = (x_2i, x_2i+1), the paper's eq. 34 and x-transformers';
``halves`` = (x_i, x_{i + r/2}), HF Llama's and GPT-NeoX's ``rotate_half`` (the same maths on
permuted dimensions: a model converted between the two permutes the rows of W_q and W_k).
``cache_positions``: StreamingLLM's rule (Xiao et al. 2023, Section 3.2) for a decoding cache that
evicts: keys are cached un-rotated and rotated by their place in the cache on every call, queries
by theirs, so distances stay those a trained model has seen after eviction (then a stream no longer
equals one call once the cache has evicted, by design; before, it does).

Deviations: angles are computed in float64 and cast (float32 angles m theta at m ~ 10^5 are off by
~10^-2 rad); r is the largest even number <= fraction x head dim.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from einops import rearrange
from torch import Tensor

from zoo.config import require
from zoo.position.base import POSITION, Position

LAYOUTS = ("pairs", "halves")


@POSITION.register("rope")
class RotaryPosition(Position):
    adds_signal = False
    rotary = True

    @dataclass
    class Options:
        base: float = 10000.0  # theta_i = base^(-2i / r)
        fraction: float = 1.0  # share of each head's dimensions rotated (the rest pass unchanged)
        layout: str = "pairs"  # pairs: (x_2i, x_2i+1) as the paper; halves: (x_i, x_{i+r/2}) as HF Llama
        cache_positions: bool = False  # number cached keys by their place in the cache (StreamingLLM)

        def __post_init__(self) -> None:
            require(self.base > 1.0, f"base must be > 1, got {self.base}")
            require(0.0 < self.fraction <= 1.0, f"fraction must lie in (0, 1], got {self.fraction}")
            require(self.layout in LAYOUTS, f"layout must be one of {', '.join(LAYOUTS)}; got {self.layout!r}")

    def __init__(self, d_model: int, max_len: int, **options):
        super().__init__(d_model, max_len, **options)
        require(d_model % self.n_heads == 0, f"rope: d_model ({d_model}) must be divisible by n_heads ({self.n_heads})")
        head_dim = d_model // self.n_heads
        self.rotated = 2 * int(self.options.fraction * head_dim / 2)
        require(
            self.rotated >= 2,
            f"rope: fraction={self.options.fraction} of a head of {head_dim} dimensions rotates no pair; raise it",
        )
        # theta_i in float64 (see the module notes); a buffer, so it follows the model's device
        exponent = torch.arange(0, self.rotated, 2, dtype=torch.float64) / self.rotated
        self.register_buffer("inv_freq", torch.exp(-exponent * math.log(self.options.base)), persistent=False)

    @classmethod
    def contract_options(cls) -> dict:
        return {"fraction": 0.5}  # a partial rotation, so the pass-through dimensions are exercised

    def angles(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """cos and sin of m theta_i: positions long [n] -> two [n, r/2] in ``dtype``."""
        inv_freq = self.inv_freq
        if inv_freq.device.type == "mps":  # no float64 there
            inv_freq = inv_freq.float()
        angle = positions.to(inv_freq)[:, None] * inv_freq[None, :]
        return angle.cos().to(dtype), angle.sin().to(dtype)

    def rotate(self, x: Tensor, positions: Tensor) -> Tensor:
        """x [..., n, k] at positions long [n] -> rotated [..., n, k]."""
        r = self.rotated
        cos, sin = self.angles(positions, x.dtype)
        turned, rest = x[..., :r], x[..., r:]
        if self.options.layout == "pairs":
            a, b = rearrange(turned, "... (i two) -> two ... i", two=2)
        else:
            a, b = rearrange(turned, "... (two i) -> two ... i", two=2)
        pair = (a * cos - b * sin, a * sin + b * cos)
        if self.options.layout == "pairs":
            turned = rearrange(torch.stack(pair), "two ... i -> ... (i two)")
        else:
            turned = torch.cat(pair, dim=-1)
        return torch.cat([turned, rest], dim=-1) if rest.shape[-1] else turned
