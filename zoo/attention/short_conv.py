"""The short causal depthwise convolution in front of the recurrence of ``deltanet``, ``gated_deltanet`` and
``mamba2`` (nothing registers here).

Each channel is convolved over time with its own kernel of ``size`` taps (H3, Fu et al. 2022,
arXiv:2212.14052; Mamba, Gu & Dao 2023, arXiv:2312.00752; DeltaNet, Yang et al. 2024, arXiv:2406.06484;
Mamba-2, Dao & Gu 2024, arXiv:2405.21060), then SiLU:

    y_t = silu(b + sum_{i < size} w_i x_{t - i}),   x_{t - i} = 0 before the stream starts.

Its receptive field is ``size`` tokens, so a stream continues from the last size - 1 inputs (the *tail*,
[b, size - 1, c]), and a chunk of a sequence split over ranks reads the same number of positions before it
(:func:`conv_over_ranks`). Shapes: x [b, t, c] -> y [b, t, c]. Padding: the caller zeroes padded inputs
first, so a real token reads a padded position as the zero before a stream.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class ShortConv(nn.Module):
    """Depthwise causal convolution of ``size`` taps over ``channels`` channels, then SiLU (``activation``).
    The weights are an ``nn.Conv1d`` [c, 1, size] (the layout of mamba_ssm, HF and flash-linear-attention)."""

    def __init__(self, channels: int, size: int, *, bias: bool = False, activation: bool = True):
        super().__init__()
        self.size, self.activation = size, activation
        self.conv = nn.Conv1d(channels, channels, size, groups=channels, bias=bias)

    def forward(self, x: Tensor, tail: Tensor | None = None, documents: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """x [b, t, c] and the inputs before it ([b, size - 1, c], None: zeros) -> (y [b, t, c], the last
        size - 1 inputs of [tail ; x], for the next call). ``documents`` [b, t] (packed rows, no tail): a tap
        reads only inputs of its output's own document, as if each document started a stream."""
        keep = self.size - 1
        if tail is None:
            tail = x.new_zeros(x.shape[0], keep, x.shape[2])
        full = torch.cat([tail.to(x.dtype), x], dim=1)
        if documents is None:
            y = self.conv(full.transpose(1, 2)).transpose(1, 2)  # [b, t, c]: 'valid' over the tail-extended input
        else:  # the taps one at a time (size of them), each input masked where it lies in another document
            t, ids = x.shape[1], F.pad(documents, (keep, 0), value=-1)
            weight = self.conv.weight[:, 0]  # [c, size]: tap j reads input t - keep + j
            y = sum(
                full[:, j : j + t] * weight[:, j] * (ids[:, j : j + t] == documents)[..., None]
                for j in range(self.size)
            )
            y = y if self.conv.bias is None else y + self.conv.bias
        y = F.silu(y) if self.activation else y
        return y, full[:, full.shape[1] - keep :]


def conv_over_ranks(conv: ShortConv, x: Tensor, chunk) -> Tensor:
    """``conv`` over this rank's part x [b, t, c] of a sequence split over a context group (``chunk``:
    :class:`zoo.parallel.chunk.Chunk`, contiguous layout): the size - 1 inputs before the part come from
    the earlier ranks (their gradient returns to them), zeros before the sequence starts."""
    keep = conv.size - 1
    (full,), _, _ = chunk.earlier([x], dim=1, select=lambda j, start: j >= start - keep)
    t = x.shape[1]
    received = full[:, : full.shape[1] - t]
    tail = F.pad(received, (0, 0, keep - received.shape[1], 0))  # the first rank: zeros before the sequence
    return conv(full[:, full.shape[1] - t :], tail)[0]
