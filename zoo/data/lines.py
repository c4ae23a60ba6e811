"""Byte-level language modelling of a text file's lines, each line a document of its own.

A corpus of short documents: every non-empty line of the file (with its newline) is modelled on its own,
from its first byte, as a corpus of short texts is (Tiny Shakespeare's 32,777 lines average 34 bytes with
their newline, 64 at most). Padded one line per row (``pack=false``), a batch spends most of its positions on padding;
packed (``pack=true``, ``zoo/data/packing.py``) each row holds as many whole lines as fit and the batch
carries ``documents``, so the model keeps each line to itself (or refuses packing with the reason).

Layout: byte ``x`` -> token ``x + 1`` (0 is padding), vocabulary 257. A line of n bytes gives n - 1
predictions (its first byte is read, never predicted; its newline is predicted from its last letter), so the
padded and packed layouts score exactly the same targets. The splits are the file's lines in order (train
first), cut by ``split`` fractions; training rows are drawn in a fresh seeded order every epoch, and the
lines are packed once per split in a seeded order. The metric is bits per byte over the scored targets.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from zoo.config import require
from zoo.data.base import SPLITS, TASK, Task, check_split, resolve_path, seeded_generator
from zoo.data.packing import Rows, lay_out


@TASK.register("lines_lm")
class LinesLMTask(Task):
    """Each non-empty line of a text file a document: data=lines_lm data.path=/path/to/file.txt (data.pack)."""

    setups = {
        "shakespeare_lines": (
            "Tiny Shakespeare's lines, one document each (byte-level), read by path from the shared data directory.",
            {"path": "tinyshakespeare/input.txt"},
        )
    }
    metric = "bpc"
    vocab_size = 257

    @dataclass
    class Options:
        path: str = ""  # a text file
        split: list[float] = field(default_factory=lambda: [0.9, 0.05, 0.05])  # fractions of the lines
        pack: bool = False  # several whole lines per row, kept apart by documents= (zoo/data/packing.py)

        def __post_init__(self) -> None:
            require(
                len(self.split) == 3 and all(0 <= x <= 1 for x in self.split) and sum(self.split) <= 1 + 1e-9,
                f"data.split must be three fractions of the lines summing to at most 1, got {list(self.split)}",
            )

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.path = resolve_path(self.options.path, "data.path")
        lines = [line for line in self.path.read_bytes().split(b"\n") if line.strip()]
        require(len(lines) >= 3, f"{self.path} holds {len(lines)} non-empty lines; lines_lm needs one per split")
        bounds, start = {}, 0
        for name, fraction in zip(SPLITS, self.options.split):
            bounds[name] = (start, start + max(1, int(len(lines) * fraction)))
            start = bounds[name][1]
        self.rows: dict[str, Rows] = {}
        for name, (lo, hi) in bounds.items():
            docs = [torch.frombuffer(bytearray(line + b"\n"), dtype=torch.uint8).long() + 1 for line in lines[lo:hi]]
            docs = [d[: self.seq_len + 1] for d in docs]  # a line longer than a row is cut, as a padded row cuts it
            if self.options.pack:  # a seeded order, so a packed row mixes lines from across the split
                order = torch.randperm(len(docs), generator=seeded_generator(self.seed, f"lines-{name}-pack"))
                docs = [docs[i] for i in order.tolist()]
            inputs, targets = [d[:-1] for d in docs], [d[1:] for d in docs]
            self.rows[name] = lay_out(inputs, self.seq_len, pack=self.options.pack, targets=targets)

    def num_batches(self, split: str, world_size: int = 1) -> int | None:
        check_split(split, world_size=world_size)
        if split == "train":
            return None  # training draws rows in a fresh seeded order every epoch
        return max(1, len(self.rows[split]) // (self.batch_size * world_size))

    def batch(self, split: str, index: int, *, rank: int = 0, world_size: int = 1) -> dict[str, Tensor]:
        check_split(split, index=index, rank=rank, world_size=world_size)
        rows = self.rows[split]
        n, per_step = len(rows), self.batch_size * world_size
        if split == "train":
            per_epoch = max(1, n // per_step)
            epoch, position = divmod(index, per_epoch)
            perm = torch.randperm(n, generator=seeded_generator(self.seed, "lines-train", epoch))
            pick = perm[position * per_step + rank * self.batch_size :][: self.batch_size]
        else:
            pick = (torch.arange(self.batch_size) + index * per_step + rank * self.batch_size) % n
        return rows.batch(pick)

    def decode(self, tokens: list[int]) -> str:
        return bytes(int(t) - 1 for t in tokens if int(t) > 0).decode("utf-8", errors="replace")
