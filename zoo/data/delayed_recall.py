"""Delayed recall: a cue early in a stream, asked for again one, two, ... segments later.

A supervised stand-in for the memory tasks of GTrXL (Parisotto et al. 2019, arXiv:1910.06764),
where the reward depends on something seen many segments earlier. A stream is ``n_segments``
segments of ``segment_len`` tokens, read one segment per call with the memory carried between
calls (the model never sees two segments at once):

- segment 0 holds one cue symbol at a random position (``1..n_cues``), among noise symbols;
- the last token of every segment is the query marker ``0``; its target is the cue, so the same
  cue is asked for after a delay of 0, 1, ..., n_segments - 1 segments;
- every other target is ignored (-100), and the answer never appears in the input.

With memory of one segment per layer (mem_len = segment_len), the cue can only reach segment d
through d layers of recurrence, so a model with L layers can answer at most L segments later.

Vocabulary: 0 (query), 1..n_cues (cues), n_cues + 1 .. n_cues + n_noise (noise);
``vocab_size = 1 + n_cues + n_noise``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from zoo.config import IGNORE_INDEX


def delayed_recall_batch(
    batch_size: int,
    *,
    n_segments: int = 4,
    segment_len: int = 16,
    n_cues: int = 8,
    n_noise: int = 16,
    generator: torch.Generator | None = None,
) -> dict[str, Tensor]:
    """One batch of streams. Returns ``{"tokens": [b, n_segments * segment_len] long,
    "targets": same shape, -100 except at the query markers, "cue": [b]}``; split both along
    dim 1 into ``segment_len`` pieces to feed segment by segment."""
    if n_segments < 1 or segment_len < 2:
        raise ValueError(
            f"need n_segments >= 1 and segment_len >= 2; got n_segments={n_segments}, segment_len={segment_len}"
        )
    if n_cues < 2 or n_noise < 1:
        raise ValueError(f"need n_cues >= 2 and n_noise >= 1; got n_cues={n_cues}, n_noise={n_noise}")
    length = n_segments * segment_len
    tokens = torch.randint(1 + n_cues, 1 + n_cues + n_noise, (batch_size, length), generator=generator)
    cue = torch.randint(1, 1 + n_cues, (batch_size,), generator=generator)
    where = torch.randint(0, segment_len - 1, (batch_size,), generator=generator)  # before segment 0's query
    tokens[torch.arange(batch_size), where] = cue
    queries = torch.arange(segment_len - 1, length, segment_len)
    tokens[:, queries] = 0
    targets = torch.full_like(tokens, IGNORE_INDEX)
    targets[:, queries] = cue[:, None]
    return {"tokens": tokens, "targets": targets, "cue": cue}


def vocab_size(n_cues: int = 8, n_noise: int = 16) -> int:
    return 1 + n_cues + n_noise
