"""Gated linear units in the feed-forward sub-layer (Shazeer 2020, "GLU Variants Improve Transformer",
arXiv:2002.05202, eqs. 5-6): the hidden layer is the product of an activated gate and a linear map.

    FFN_GLU(x) = (act(x W_gate) * (x V_up)) W_down          swiglu: act = SiLU (Swish_1)
                                                             geglu:  act = GELU
                                                             reglu:  act = ReLU

Dropout acts on the hidden product. The paper drops every bias; ``bias=True`` adds one to each of the
three maps. Parameter names follow HF's Llama MLP (``gate_proj``, ``up_proj``, ``down_proj``).

Hidden width h: ``d_ff`` as given, or with ``two_thirds=True`` the paper's and Llama's convention
for keeping the parameter count of a two-matrix network of width d_ff (three matrices of width
2/3 d_ff): h = floor(2 d_ff / 3), then rounded up to a multiple of ``multiple_of`` (Llama's
``FeedForward``: ``int(2 * hidden_dim / 3)`` then ``multiple_of * ceil(h / multiple_of)``, with its
hidden_dim = 4 d_model and multiple_of 256). ``multiple_of`` rounds d_ff itself when two_thirds is off.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import torch.nn.functional as F
from torch import Tensor, nn

from zoo.config import require
from zoo.feed_forward.base import BF16_BYTES, FEED_FORWARD, FeedForward


def hidden_width(d_ff: int, two_thirds: bool, multiple_of: int) -> int:
    """The rule of the module docstring: d_ff, or floor(2 d_ff / 3), rounded up to a multiple."""
    h = int(2 * d_ff / 3) if two_thirds else d_ff
    return multiple_of * -(-h // multiple_of)


class GatedFeedForward(FeedForward):
    """down(dropout(act(gate(x)) * up(x))); a subclass names its gate activation."""

    gate_activation: ClassVar[Callable[[Tensor], Tensor]]

    @dataclass
    class Options:
        bias: bool = False  # the paper's: none
        two_thirds: bool = False  # hidden width floor(2 d_ff / 3): about a two-matrix network's parameters
        multiple_of: int = 1  # round the hidden width up to a multiple of this (Llama: 256)

        def __post_init__(self) -> None:
            require(self.multiple_of >= 1, f"multiple_of must be an int >= 1, got {self.multiple_of}")

    def __init__(self, d_model: int, d_ff: int, **kwargs):
        super().__init__(d_model, d_ff, **kwargs)
        self.hidden = hidden_width(d_ff, self.options.two_thirds, self.options.multiple_of)
        require(self.hidden >= 1, f"feed_forward {self.registry_name!r}: d_ff={d_ff} leaves no hidden width")
        bias = self.options.bias
        self.gate_proj = nn.Linear(d_model, self.hidden, bias=bias)
        self.up_proj = nn.Linear(d_model, self.hidden, bias=bias)
        self.down_proj = nn.Linear(self.hidden, d_model, bias=bias)

    @classmethod
    def contract_options(cls) -> dict:
        return {"bias": True, "two_thirds": True, "multiple_of": 4}

    def transform(self, x: Tensor, pad_mask: Tensor | None) -> Tensor:
        gate = type(self).gate_activation(self.gate_proj(x))
        return self.down_proj(self.drop(gate * self.up_proj(x)))

    def parameter_count(self) -> int:
        return 3 * self.d_model * self.hidden + (2 * self.hidden + self.d_model if self.options.bias else 0)

    def forward_flops(self, t: int) -> float:
        return 2.0 * t * 3 * self.d_model * self.hidden

    def activation_bytes_per_token(self) -> float:
        return 4 * BF16_BYTES * self.hidden  # the gate's pre-activation, act(gate), up(x), down's input

    def output_projection(self) -> nn.Linear:
        return self.down_proj

    def flops_rule(self) -> str:
        return f"{self.registry_name}: gate, up, down = 6 t d h (h = {self.hidden})"

    def extra_repr(self) -> str:
        return super().extra_repr() + f", hidden={self.hidden}"


@FEED_FORWARD.register("swiglu")
class SwiGLU(GatedFeedForward):
    gate_activation = staticmethod(F.silu)


@FEED_FORWARD.register("geglu")
class GEGLU(GatedFeedForward):
    gate_activation = staticmethod(F.gelu)


@FEED_FORWARD.register("reglu")
class ReGLU(GatedFeedForward):
    gate_activation = staticmethod(F.relu)
