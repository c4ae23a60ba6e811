"""The Universal Transformer's other transition function: a depthwise-separable convolution.

Paper: "Universal Transformers", Dehghani et al. 2019, arXiv:1807.03819, Section 2: the
transition function is either a position-wise fully connected network (two affine maps with a ReLU
between, our ``mlp``) or a separable convolution (Chollet 2017, "Xception: Deep Learning with
Depthwise Separable Convolutions", arXiv:1610.02357). A part of the feed-forward axis, selected with
``feed_forward={"name": "sepconv", "kernel_size": k}`` (``feed_forward=sepconv`` in the app) in any
stack; configs written before the axis said ``stack={"name": "universal", "transition": "sepconv",
"kernel_size": k}``, which still builds this part (``zoo.config``).

A separable convolution over time factorises a full convolution into

    depthwise: y[c, i] = sum_j D[c, j] * x[c, i - left + j]   (each channel its own k taps, no bias)
    pointwise: z[o, i] = sum_c P[o, c] * y[c, i] + bias[o]     (a 1 x 1 convolution = per-position linear)

i.e. a full convolution whose weight is W[o, c, j] = P[o, c] * D[c, j], with k * d + d * d_out
parameters instead of k * d * d_out. As the position-wise network it replaces, the transition is
two layers with the activation between: d_model -> d_ff -> d_model,

    transition(x) = SepConv_2(dropout(act(SepConv_1(x)))).

Causality: a causal model pads k - 1 zeros on the left only, so output i reads inputs i - k + 1 .. i
and never the future; a bidirectional one pads (k - 1) // 2 on the left and k // 2 on the right.
Padding: positions marked as padding (pad_mask False) are zeroed before each depthwise convolution,
so what padded positions hold never reaches a real one (their own outputs are not meaningful).

Chunking (``ff_chunk_size``): each slice reads the 2 (k - 1) inputs its two convolutions see beyond
its edges (``halo``), so chunked equals unchunked.

Deviations: the paper gives no kernel size; the default (3) and one size for both layers are ours.
The convolution keeps no cache of the last k - 1 inputs (the Universal Transformer keeps no state
across calls), so a model with it refuses to continue a sequence from a state (``stream_refusal``)
and to split one over ranks (``context_refusal``), with the reason.

Shapes: x [b, t, d]; pad_mask [b, t] bool (True = real); conv layout [b, d, t].
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from zoo.config import DEFAULT_ACTIVATION, require
from zoo.feed_forward.base import BF16_BYTES, FEED_FORWARD, FeedForward
from zoo.feed_forward.mlp import ACTIVATION_FUNCTIONS, check_activation

DEFAULT_KERNEL_SIZE = 3


class SeparableConv1d(nn.Module):
    """Depthwise convolution over time (k taps per channel) followed by a pointwise linear map."""

    def __init__(self, d_in: int, d_out: int, kernel_size: int, *, causal: bool):
        super().__init__()
        self.kernel_size, self.causal = kernel_size, causal
        self.depthwise = nn.Parameter(torch.empty(d_in, 1, kernel_size))  # [d_in, 1, k]: D, one row of taps per channel
        nn.init.kaiming_uniform_(self.depthwise, a=math.sqrt(5))  # nn.Conv1d's default initialisation
        self.pointwise = nn.Linear(d_in, d_out)

    def padding(self) -> tuple[int, int]:
        """(left, right) zeros along time: all on the left for a causal model."""
        k = self.kernel_size
        return (k - 1, 0) if self.causal else ((k - 1) // 2, k // 2)

    def forward(self, x: Tensor, pad_mask: Tensor | None = None) -> Tensor:
        if pad_mask is not None:
            x = x * pad_mask[..., None].to(x.dtype)  # padding contributes zeros, like the border
        channels_first = F.pad(rearrange(x, "b t d -> b d t"), self.padding())  # [b, d, left + t + right]
        mixed = F.conv1d(channels_first, self.depthwise, groups=self.depthwise.shape[0])  # [b, d, t]
        return self.pointwise(rearrange(mixed, "b d t -> b t d"))


@FEED_FORWARD.register("sepconv")
class SeparableConvTransition(FeedForward):
    """d_model -> d_ff -> d_model through two separable convolutions with the activation between."""

    position_wise = False  # output i reads inputs i - k + 1 .. i (causal) or around i

    @dataclass
    class Options:
        activation: str = DEFAULT_ACTIVATION  # relu | gelu; unset in a model config: the model's activation key
        kernel_size: int = DEFAULT_KERNEL_SIZE  # taps over time, both convolutions

        def __post_init__(self) -> None:
            check_activation(self.activation, "feed_forward 'sepconv'")
            require(self.kernel_size >= 1, f"kernel_size must be an int >= 1, got {self.kernel_size!r}")

    def __init__(self, d_model: int, d_ff: int, **kwargs):
        super().__init__(d_model, d_ff, **kwargs)
        kernel_size, causal = self.options.kernel_size, self.causal
        self.conv1 = SeparableConv1d(d_model, d_ff, kernel_size, causal=causal)
        self.conv2 = SeparableConv1d(d_ff, d_model, kernel_size, causal=causal)
        self.activation = ACTIVATION_FUNCTIONS[self.options.activation]

    def transform(self, x: Tensor, pad_mask: Tensor | None) -> Tensor:
        return self.conv2(self.drop(self.activation(self.conv1(x, pad_mask))), pad_mask)

    def halo(self) -> tuple[int, int]:
        left, right = self.conv1.padding()
        return 2 * left, 2 * right  # two convolutions in a row

    def parameter_count(self) -> int:
        k, d, h = self.options.kernel_size, self.d_model, self.d_ff
        return (k * d + d * h + h) + (k * h + h * d + d)

    def forward_flops(self, t: int) -> float:
        """Each convolution's k taps per input channel and its pointwise map: 2 t (k d + d d_ff + k d_ff + d_ff d)."""
        k, d, h = self.options.kernel_size, self.d_model, self.d_ff
        return 2.0 * t * (k * d + d * h + k * h + h * d)

    def activation_bytes_per_token(self) -> float:
        # conv1's pointwise input (d wide), the activation's input, conv2's depthwise and pointwise inputs
        return BF16_BYTES * (self.d_model + 3 * self.d_ff)

    def output_projection(self) -> nn.Linear:
        return self.conv2.pointwise

    def flops_rule(self) -> str:
        return f"sepconv: two separable convolutions (k = {self.options.kernel_size}), 2 t (k d + 2 d d_ff + k d_ff)"

    def stream_refusal(self) -> str:
        return (
            f"feed_forward 'sepconv' reads the {self.options.kernel_size - 1} positions before each one and keeps "
            "no cache of them between calls"
        )

    def context_refusal(self) -> str:
        return (
            f"feed_forward 'sepconv' reads up to {self.options.kernel_size - 1} neighbouring positions, which a chunk "
            "on another rank holds"
        )
