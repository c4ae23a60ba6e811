"""Character / byte-level language modelling from any text file, and the enwik8 / text8 splits.

Batches are contiguous: the split is cut into ``batch_size x world_size`` lanes, and batch ``i``
row ``j`` is the ``i``-th segment of lane ``j``, so row ``j`` of consecutive batches continues one
stream and a model's segment memory (Transformer-XL) carries across steps. After the last segment
the lanes start over (``starts_stream``), where the trainer resets the memory.

enwik8 (Hutter prize: the first 10^8 bytes of an English Wikipedia dump) and text8 (10^8
characters of a-z and space) use the standard split of Al-Rfou et al. 2018 / Dai et al. 2019:
the first 90M bytes for training, the next 5M for validation, the last 5M for test. The files are
not shipped: the user gives ``data.path``. The metric is bits per character (byte).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from zoo.config import require
from zoo.data.base import SPLITS, TASK, Task, check_split, resolve_path
from zoo.data.splits import find_split_files, read_char_splits, resolve_directory


def split_bounds(total: int, split: list[float], what: str) -> dict[str, tuple[int, int]]:
    """Cut ``total`` tokens into train/val/test ranges. ``split`` holds three fractions (all <= 1)
    or three sizes in tokens (the standard 90M/5M/5M)."""
    require(len(split) == 3, f"data.split must hold three numbers (train, val, test), got {list(split)}")
    require(all(x >= 0 for x in split), f"data.split must be non-negative, got {list(split)}")
    if all(x <= 1 for x in split):
        require(
            sum(split) <= 1 + 1e-9,
            f"data.split fractions must sum to at most 1 (splits may not overlap), got {list(split)}",
        )
        sizes = [int(total * x) for x in split]
    else:
        require(
            all(float(x).is_integer() for x in split),
            f"data.split must be three fractions (all <= 1) or three whole token counts; got {list(split)}",
        )
        sizes = [int(x) for x in split]
        need = sum(sizes)
        require(
            need <= total,
            f"{what} has {total:,} tokens but data.split asks for {need:,} ({sizes}); set data.split to fractions "
            "(e.g. [0.9,0.05,0.05]) or sizes that fit",
        )
    bounds, start = {}, 0
    for name, size in zip(SPLITS, sizes):
        bounds[name] = (start, start + size)
        start += size
    require(sizes[0] > 1, f"data.split={list(split)} leaves no train split in {what} ({total:,} tokens)")
    return bounds


@TASK.register("char_lm")
class TextLMTask(Task):
    """Character/byte-level LM from any text file: data=char_lm data.path=/path/to/file.txt
    (``vocab=bytes``: 256 byte ids; ``vocab=chars``: the file's own characters, sorted)."""

    setups = {
        "shakespeare": (
            "Tiny Shakespeare (1.1 MB), character-level, read by path from the shared data directory.",
            {"path": "tinyshakespeare/input.txt", "vocab": "chars"},
        )
    }

    metric = "bpc"
    contiguous = True
    rows_by_global_index = True  # rank r reads rows r*b ... of every rank's w*b (lanes of the text)

    @dataclass
    class Options:
        path: str = ""  # a text file, or a directory of train/valid/test files (relative: cwd, then project)
        vocab: str = "bytes"  # bytes | chars
        split: list[float] = field(default_factory=lambda: [0.9, 0.05, 0.05])  # fractions or token counts

        def __post_init__(self) -> None:
            require(self.vocab in ("bytes", "chars"), f"data.vocab must be bytes or chars, got {self.vocab!r}")

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        directory = resolve_directory(self.options.path)
        if directory is not None:  # separate split files (zoo/data/splits.py); data.split is not used
            self.path = directory
            self.data, self.bounds, self.itos = read_char_splits(find_split_files(directory), self.options.vocab)
            self.vocab_size = 256 if self.itos is None else len(self.itos)
            self.stoi = {c: i for i, c in enumerate(self.itos or [])}
            return
        path = resolve_path(self.options.path, "data.path")
        self.path = path
        require(path.stat().st_size > 1, f"data file {path} is empty: a text LM needs at least two tokens (data.path)")
        if self.options.vocab == "bytes":
            self.data = np.memmap(path, dtype=np.uint8, mode="r")  # enwik8-sized files stay on disk
            self.vocab_size, self.itos = 256, None
        else:
            try:
                text = path.read_text(encoding="utf-8")
            except UnicodeDecodeError as exc:
                raise ValueError(
                    f"data file {path} is not UTF-8 text (undecodable byte at offset {exc.start}), but "
                    "data.vocab=chars reads characters; use data.vocab=bytes for binary files"
                ) from None
            self.itos = sorted(set(text))
            self.stoi = {c: i for i, c in enumerate(self.itos)}
            lookup = np.zeros(max(map(ord, self.itos)) + 1, dtype=np.int32)
            lookup[[ord(c) for c in self.itos]] = np.arange(len(self.itos))
            self.data = lookup[np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)]
            self.vocab_size = len(self.itos)
        require(len(self.data) > 1, f"data file {path} is empty (data.path)")
        self.bounds = split_bounds(len(self.data), list(self.options.split), f"data file {path}")

    @classmethod
    def nominal_vocab_size(cls, options: dict[str, Any]) -> tuple[int, str]:
        if options.get("vocab", "bytes") == "bytes":
            return 256, "bytes"
        return super().nominal_vocab_size(options)  # chars: the file decides

    def _layout(self, split: str, world_size: int) -> tuple[int, int, int]:
        """(start of the split, lane length, segments per lane)."""
        check_split(split, world_size=world_size)
        start, end = self.bounds[split]
        rows = self.batch_size * world_size
        lane = (end - start - 1) // rows
        segments = lane // self.seq_len
        require(
            segments >= 1,
            f"the {split} split of {self.path} ({end - start:,} tokens) is too small for {rows} rows x "
            f"trainer.seq_len={self.seq_len} (+1); lower trainer.batch_size or trainer.seq_len, or change data.split",
        )
        return start, lane, segments

    def num_batches(self, split: str, world_size: int = 1) -> int:
        return self._layout(split, world_size)[2]

    def starts_stream(self, index: int, split: str = "train") -> bool:
        return index % self._layout(split, 1)[2] == 0

    def batch(self, split: str, index: int, *, rank: int = 0, world_size: int = 1) -> dict[str, Tensor]:
        check_split(split, index=index, rank=rank, world_size=world_size)
        start, lane, segments = self._layout(split, world_size)
        t = self.seq_len
        rows = np.arange(rank * self.batch_size, (rank + 1) * self.batch_size)
        offsets = start + rows * lane + (index % segments) * t  # [b]
        window = np.asarray(self.data[offsets[:, None] + np.arange(t + 1)[None, :]], dtype=np.int64)  # [b, t + 1]
        window = torch.from_numpy(window)
        return {"tokens": window[:, :-1].contiguous(), "targets": window[:, 1:].contiguous()}

    def decode(self, tokens: list[int]) -> str:
        if self.itos is None:
            return bytes(int(t) for t in tokens).decode("utf-8", errors="replace")
        return "".join(self.itos[int(t)] for t in tokens)

    def encode(self, text: str) -> list[int]:
        if self.itos is None:
            return list(text.encode("utf-8"))
        missing = sorted({c for c in text if c not in self.stoi})
        require(not missing, f"prompt has characters outside the vocabulary of {self.path}: {missing}")
        return [self.stoi[c] for c in text]


STANDARD_SPLIT = [90_000_000, 5_000_000, 5_000_000]


@TASK.register("enwik8")
class Enwik8Task(TextLMTask):
    """enwik8 (first 10^8 bytes of enwiki-20060303), byte-level, standard 90M/5M/5M split. Bring the
    file: data=enwik8 data.path=/path/to/enwik8"""

    data_dir_path = "enwik8"

    @dataclass
    class Options(TextLMTask.Options):
        split: list[float] = field(default_factory=lambda: list(STANDARD_SPLIT))

        def __post_init__(self) -> None:
            super().__post_init__()
            require(self.vocab == "bytes", f"enwik8 is byte-level: data.vocab must be bytes, got {self.vocab!r}")


@TASK.register("text8")
class Text8Task(TextLMTask):
    """text8 (10^8 chars of a-z and space), standard 90M/5M/5M split. Bring the file:
    data.path=/path/to/text8"""

    data_dir_path = "text8"

    @dataclass
    class Options(TextLMTask.Options):
        split: list[float] = field(default_factory=lambda: list(STANDARD_SPLIT))
