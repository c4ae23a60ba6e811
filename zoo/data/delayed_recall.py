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

``data=delayed_recall`` trains on it through the app: one segment (``trainer.seq_len`` tokens) per
batch, the streams' segments in order, the memory reset where a new stream starts; the metric is the
recall accuracy over all delays. The studies ``gtrxl_recall`` and ``gtrxl_robustness`` draw whole
streams with :func:`delayed_recall_batch` and report the accuracy per delay.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from zoo.config import IGNORE_INDEX, require
from zoo.data.base import TASK, Task, check_split, seeded_generator


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


@TASK.register("delayed_recall")
class DelayedRecallTask(Task):
    """Delayed recall (GTrXL's memory tasks, supervised): a cue in a stream's first segment, asked for at
    the end of each of its data.n_segments segments of trainer.seq_len tokens; read one segment per
    batch, memory carried within a stream. Built in, no download."""

    metric = "accuracy"
    contiguous = True

    @dataclass
    class Options:
        n_segments: int = 4  # segments per stream: the cue is asked after delays 0..n_segments - 1
        n_cues: int = 8
        n_noise: int = 16
        eval_size: int = 256  # streams in the val/test splits

        def __post_init__(self) -> None:
            require(self.n_segments >= 1, f"data.n_segments must be >= 1, got {self.n_segments}")
            require(self.n_cues >= 2, f"data.n_cues must be >= 2, got {self.n_cues}")
            require(self.n_noise >= 1, f"data.n_noise must be >= 1, got {self.n_noise}")
            require(self.eval_size >= 1, f"data.eval_size must be >= 1, got {self.eval_size}")

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        require(self.seq_len >= 2, f"delayed_recall needs trainer.seq_len >= 2 (a segment), got {self.seq_len}")
        self.vocab_size = vocab_size(self.options.n_cues, self.options.n_noise)

    def num_batches(self, split: str, world_size: int = 1) -> int | None:
        check_split(split, world_size=world_size)
        if split == "train":
            return None
        return max(1, self.options.eval_size // (self.batch_size * world_size)) * self.options.n_segments

    def starts_stream(self, index: int, split: str = "train") -> bool:
        return index % self.options.n_segments == 0

    def batch(self, split: str, index: int, *, rank: int = 0, world_size: int = 1) -> dict[str, Tensor]:
        """Segment ``index % n_segments`` of the streams numbered ``index // n_segments``."""
        check_split(split, index=index, rank=rank, world_size=world_size)
        o = self.options
        stream, segment = divmod(index, o.n_segments)
        streams = delayed_recall_batch(
            self.batch_size,
            n_segments=o.n_segments,
            segment_len=self.seq_len,
            n_cues=o.n_cues,
            n_noise=o.n_noise,
            generator=seeded_generator(self.seed, self.registry_name, split, stream, rank, world_size),
        )
        piece = slice(segment * self.seq_len, (segment + 1) * self.seq_len)
        return {key: streams[key][:, piece].contiguous() for key in ("tokens", "targets")}
