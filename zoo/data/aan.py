"""ACL Anthology Network citation pairs as bytes: the Long Range Arena "Retrieval" task.

Data: Radev et al. 2013 ("The ACL Anthology Network Corpus", LREC); the LRA task of Tay et al.
2020 (arXiv:2011.04006): given two papers' texts, decide whether one cites the other. LRA reads
each document as bytes truncated to 4K and encodes both with one shared encoder (a two-tower
model, :mod:`zoo.models.two_tower`).

Layout read (as released with LRA): a directory holding ``new_aan_pairs.train.tsv``,
``new_aan_pairs.eval.tsv`` and ``new_aan_pairs.test.tsv``; tab-separated, no header, one pair per
line: ``label  id1  id2  text1  text2`` (the label written as 0/1 or 0.0/1.0).

Batches: ``tokens`` [b, 2, t] (byte ``x`` -> token ``x + 1``, 0 = padding; t = ``trainer.seq_len``
per document), ``pad_mask`` [b, 2, t], ``targets`` [b]. ``eval`` is our ``val`` split.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from zoo.config import require
from zoo.data.base import TASK, DataFileNotFound, Task, check_split, find_directory

FILES = {"train": "new_aan_pairs.train.tsv", "val": "new_aan_pairs.eval.tsv", "test": "new_aan_pairs.test.tsv"}
FIELDS = ("label", "id1", "id2", "text1", "text2")


def read_pairs(path: Path, max_bytes: int) -> tuple[Tensor, Tensor, Tensor]:
    """(bytes [n, 2, max_bytes] uint8, lengths [n, 2], labels [n]) from one TSV file.

    Raw bytes are kept as uint8 (4K x 2 per pair), not as token ids, to keep 150k pairs small."""
    texts: list[tuple[bytes, bytes]] = []
    labels: list[int] = []
    with open(path, "rb") as f:
        for line_no, line in enumerate(f, start=1):
            line = line.rstrip(b"\r\n")
            if not line:
                continue
            fields = line.split(b"\t")
            if len(fields) != len(FIELDS):
                raise ValueError(
                    f"{path}:{line_no}: expected {len(FIELDS)} tab-separated fields ({', '.join(FIELDS)}), "
                    f"got {len(fields)}"
                )
            try:
                label = float(fields[0])
            except ValueError:
                raise ValueError(f"{path}:{line_no}: label {fields[0][:20]!r} is not a number (0 or 1)") from None
            require(label in (0.0, 1.0), f"{path}:{line_no}: label must be 0 or 1, got {label}")
            labels.append(int(label))
            texts.append((fields[3][:max_bytes], fields[4][:max_bytes]))
    require(labels, f"{path} holds no pairs")
    data = torch.zeros(len(texts), 2, max_bytes, dtype=torch.uint8)
    lengths = torch.zeros(len(texts), 2, dtype=torch.long)
    for row, pair in enumerate(texts):
        for side, text in enumerate(pair):
            if text:
                data[row, side, : len(text)] = torch.frombuffer(bytearray(text), dtype=torch.uint8)
            lengths[row, side] = len(text)
    return data, lengths, torch.tensor(labels, dtype=torch.long)


@TASK.register("aan")
class AANRetrievalTask(Task):
    """ACL Anthology Network citation pairs as bytes (LRA "Retrieval"), read from the released TSV
    directory (new_aan_pairs.{train,eval,test}.tsv): binary citation-link classification of document
    pairs (trains a ``pair_classifier``, e.g. model=two_tower_classifier)."""

    data_dir_path = "lra_release/tsv_data"

    kind = "pair_classifier"
    metric = "accuracy"
    rows_by_global_index = True  # rank r reads rows r*b ... of every rank's w*b (file_rows)
    vocab_size = 257
    n_classes = 2

    @dataclass
    class Options:
        path: str = ""  # the directory holding new_aan_pairs.{train,eval,test}.tsv

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        directory = find_directory(self.options.path)
        missing = [name for name in FILES.values() if not (directory / name).is_file()]
        if missing:
            raise DataFileNotFound(
                f"{directory} lacks {', '.join(missing)} (data.path must hold new_aan_pairs.{{train,eval,test}}.tsv)"
            )
        self.splits = {split: read_pairs(directory / name, self.seq_len) for split, name in FILES.items()}

    def model_overrides(self) -> dict:
        return {"vocab_size": self.vocab_size, "n_classes": self.n_classes}

    def num_batches(self, split: str, world_size: int = 1) -> int | None:
        check_split(split)
        if split == "train":
            return None
        return max(1, len(self.splits[split][2]) // (self.batch_size * world_size))

    def batch(self, split: str, index: int, *, rank: int = 0, world_size: int = 1) -> dict[str, Tensor]:
        check_split(split)
        data, lengths, labels = self.splits[split]
        pick = self.file_rows(len(labels), split, index, rank, world_size)
        pad_mask = torch.arange(self.seq_len) < lengths[pick][..., None]  # [b, 2, t]
        tokens = (data[pick].long() + 1) * pad_mask
        return {"tokens": tokens, "targets": labels[pick], "pad_mask": pad_mask}

    def decode(self, tokens: list[int]) -> str:
        return bytes(int(t) - 1 for t in tokens if int(t) > 0).decode("utf-8", errors="replace")
