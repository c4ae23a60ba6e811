"""The position-wise feed-forward network of the 2017 block (Vaswani et al. 2017, arXiv:1706.03762, eq. 2).

    MLP(x) = act(x W1 + b1) W2 + b2          act = ReLU (the paper's) or GELU

Dropout acts on the hidden activation. ``bias=False`` drops b1 and b2. Parameter names (``w1``,
``w2``) are those of ``zoo.blocks.FeedForward`` before the feed-forward axis, so every checkpoint
written before it loads unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn.functional as F
from torch import Tensor, nn

from zoo.config import ACTIVATIONS, DEFAULT_ACTIVATION, require
from zoo.feed_forward.base import BF16_BYTES, FEED_FORWARD, FeedForward

ACTIVATION_FUNCTIONS = {"relu": F.relu, "gelu": F.gelu}  # the names zoo.config.ACTIVATIONS allows


def check_activation(activation: str, what: str) -> None:
    require(
        activation in ACTIVATIONS, f"{what}: activation must be one of {', '.join(ACTIVATIONS)}, got {activation!r}"
    )


@FEED_FORWARD.register("mlp")
class MLP(FeedForward):
    @dataclass
    class Options:
        activation: str = DEFAULT_ACTIVATION  # relu | gelu; unset in a model config: the model's activation key
        bias: bool = True  # b1, b2

        def __post_init__(self) -> None:
            check_activation(self.activation, "feed_forward 'mlp'")

    def __init__(self, d_model: int, d_ff: int, **kwargs):
        super().__init__(d_model, d_ff, **kwargs)
        bias = self.options.bias
        self.w1, self.w2 = nn.Linear(d_model, d_ff, bias=bias), nn.Linear(d_ff, d_model, bias=bias)
        self.activation = ACTIVATION_FUNCTIONS[self.options.activation]

    def transform(self, x: Tensor, pad_mask: Tensor | None) -> Tensor:
        # pad_mask is unused: a position-wise network cannot carry padding into real positions
        return self.w2(self.drop(self.activation(self.w1(x))))

    def parameter_count(self) -> int:
        return 2 * self.d_model * self.d_ff + (self.d_ff + self.d_model if self.options.bias else 0)

    def forward_flops(self, t: int) -> float:
        return 2.0 * t * 2 * self.d_model * self.d_ff

    def activation_bytes_per_token(self) -> float:
        return 2 * BF16_BYTES * self.d_ff  # the activation's input and W2's input

    def output_projection(self) -> nn.Linear:
        return self.w2

    def flops_rule(self) -> str:
        return "mlp: W1, W2 = 4 t d d_ff"
