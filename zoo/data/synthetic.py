"""Synthetic tasks that need no download.

Duplication task (Kitaev et al. 2020, "Reformer", arXiv:2001.04451, Section 2.1): sequences
``0 w 0 w`` where ``w`` is a random string over symbols 1..n_symbols; a model sees the whole
sequence causally and is scored only on the second copy of ``w`` (it must find the matching
position in the first copy, which is far away: the test of long-range attention).
"""

from __future__ import annotations

import torch
from torch import Tensor

IGNORE_INDEX = -100


def duplication_batch(batch_size: int, length: int, *, n_symbols: int = 127, generator: torch.Generator | None = None) -> dict[str, Tensor]:
    """One batch of the duplication task as next-token prediction.

    The sequence ``0 w 0 w`` has ``length`` tokens (``len(w) = length / 2 - 1``); the model reads
    ``tokens = seq[:-1]`` and predicts ``targets = seq[1:]``, with every target before the second
    copy of ``w`` set to -100 (ignored), exactly "loss on the second half" as in the paper.
    Vocabulary: 0 (separator) and 1..n_symbols, so ``vocab_size = n_symbols + 1``.

    Returns ``{"tokens": [b, length - 1] long, "targets": [b, length - 1] long}``."""
    if length < 4 or length % 2:
        raise ValueError(f"duplication length must be even and >= 4, got {length}")
    if n_symbols < 1:
        raise ValueError(f"n_symbols must be >= 1, got {n_symbols}")
    half = length // 2
    w = torch.randint(1, n_symbols + 1, (batch_size, half - 1), generator=generator)
    zero = torch.zeros(batch_size, 1, dtype=torch.long)
    seq = torch.cat([zero, w, zero, w], dim=1)  # [b, length]
    tokens, targets = seq[:, :-1], seq[:, 1:].clone()
    targets[:, : half] = IGNORE_INDEX  # targets[i] = seq[i + 1]: keep only seq[half + 1:], the second w
    return {"tokens": tokens, "targets": targets}
