"""The Universal Transformer's other transition function: a depthwise-separable convolution.

Paper: "Universal Transformers", Dehghani et al. 2019, arXiv:1807.03819, Section 2: the
transition function is either a position-wise fully connected network (two affine maps with a ReLU
between, our :class:`zoo.blocks.FeedForward`) or a separable convolution (Chollet 2017, "Xception:
Deep Learning with Depthwise Separable Convolutions", arXiv:1610.02357). Selected with
``stack={"name": "universal", "transition": "sepconv", "kernel_size": k}``.

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

Deviations: the paper gives no kernel size; the default (3) and one size for both layers are ours.
The Universal Transformer refuses a state with this transition (``UniversalStack.stream_refusal``), so
the convolution needs no cache of the last k - 1 inputs.

Shapes: x [b, t, d]; pad_mask [b, t] bool (True = real); conv layout [b, d, t].
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from zoo.blocks import FeedForward
from zoo.config import require

TRANSITIONS = ("ffn", "sepconv")
DEFAULT_KERNEL_SIZE = 3


def check_transition_options(transition: str, kernel_size: int | None) -> None:
    """Validate the universal stack's ``transition`` / ``kernel_size`` options."""
    choices = ", ".join(TRANSITIONS)
    require(transition in TRANSITIONS, f"transition must be one of {choices}, got {transition!r}")
    valid_size = kernel_size is None or (isinstance(kernel_size, int) and kernel_size >= 1)
    require(valid_size, f"kernel_size must be an int >= 1 (or None = {DEFAULT_KERNEL_SIZE}), got {kernel_size!r}")
    require(
        kernel_size is None or transition == "sepconv",
        f"kernel_size={kernel_size} applies only to transition='sepconv'; this stack's transition is {transition!r}",
    )


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


class SeparableConvTransition(nn.Module):
    """d_model -> d_ff -> d_model through two separable convolutions with the activation between.

    Called like the position-wise network it replaces, plus the padding mask: ``(x, pad_mask=None)``."""

    def __init__(
        self,
        d_model: int,
        d_ff: int,
        kernel_size: int = DEFAULT_KERNEL_SIZE,
        *,
        causal: bool,
        activation=F.relu,
        dropout: float = 0.0,
    ):
        super().__init__()
        self.conv1 = SeparableConv1d(d_model, d_ff, kernel_size, causal=causal)
        self.conv2 = SeparableConv1d(d_ff, d_model, kernel_size, causal=causal)
        self.activation = activation
        self.drop = nn.Dropout(dropout)

    @classmethod
    def replacing(cls, feed_forward: FeedForward, kernel_size: int | None, *, causal: bool) -> SeparableConvTransition:
        """The separable-convolution counterpart of ``feed_forward``: same widths, activation, dropout."""
        d_model, d_ff = feed_forward.w1.in_features, feed_forward.w1.out_features
        return cls(
            d_model,
            d_ff,
            kernel_size or DEFAULT_KERNEL_SIZE,
            causal=causal,
            activation=feed_forward.activation,
            dropout=feed_forward.drop.p,
        )

    def forward_flops(self, t: int) -> float:
        """Matmul FLOPs over t tokens: each convolution's k taps per input channel and its pointwise map."""
        per_token = sum(conv.depthwise.numel() + conv.pointwise.weight.numel() for conv in (self.conv1, self.conv2))
        return 2.0 * t * per_token

    def forward(self, x: Tensor, pad_mask: Tensor | None = None) -> Tensor:
        return self.conv2(self.drop(self.activation(self.conv1(x, pad_mask))), pad_mask)
