"""IMDb reviews as bytes: the Long Range Arena "Text" task (byte-level sentiment classification).

Data: Maas et al. 2011 ("Learning Word Vectors for Sentiment Analysis", ACL), the 25k/25k
train/test reviews of ``aclImdb_v1`` read straight from the ``.tar.gz`` (``data.path``; never
unpacked or copied). LRA (Tay et al. 2020, arXiv:2011.04006) reads each review as bytes truncated
to a fixed length (4K in the paper) and classifies positive / negative.

Layout used: byte ``x`` -> token ``x + 1`` (0 is padding), so the vocabulary is 257. Validation is
a fixed, seeded ``val_size`` reviews held out of the training set (LRA reports test accuracy). With
``pack=true`` whole reviews are packed several to a row (``zoo/data/packing.py``): a batch then carries
``documents`` and one class per review (targets [n reviews], row-major).
"""

from __future__ import annotations

import re
import tarfile
from dataclasses import dataclass

import torch
from torch import Tensor

from zoo.config import require
from zoo.data.base import TASK, Task, check_split, resolve_path, seeded_generator
from zoo.data.packing import Rows, lay_out

_MEMBER = re.compile(r"(?:^|/)aclImdb/(train|test)/(pos|neg)/\d+_\d+\.txt$")


def read_imdb(path, max_bytes: int) -> dict[str, tuple[list[bytes], list[int]]]:
    """{"train": (texts, labels), "test": (...)} from the tarball, in sorted member order."""
    out: dict[str, list[tuple[str, bytes, int]]] = {"train": [], "test": []}
    try:
        tar = tarfile.open(path, "r:*")
    except tarfile.TarError as exc:
        reason = str(exc).splitlines()[0]
        raise ValueError(
            f"data file {path} is not a readable tar archive ({reason}); "
            "data.path must be aclImdb_v1.tar.gz as distributed"
        ) from None
    with tar:
        for member in tar:
            match = _MEMBER.search(member.name)
            if not match or not member.isfile():
                continue
            split, polarity = match.groups()
            data = tar.extractfile(member).read()[:max_bytes]
            out[split].append((member.name, data, int(polarity == "pos")))
    result = {}
    for split, rows in out.items():
        rows.sort()
        result[split] = ([r[1] for r in rows], [r[2] for r in rows])
    require(
        result["train"][0] and result["test"][0],
        f"{path} holds no aclImdb/{{train,test}}/{{pos,neg}}/*.txt reviews (data.path)",
    )
    return result


@TASK.register("imdb")
class IMDbTask(Task):
    """IMDb reviews as bytes (LRA "Text"), read from the aclImdb tarball by path; binary sentiment."""

    data_dir_path = "imdb/aclImdb_v1_labeled.tar.gz"
    kind = "classifier"
    metric = "accuracy"
    vocab_size = 257
    n_classes = 2

    @dataclass
    class Options:
        path: str = ""  # aclImdb_v1*.tar.gz
        val_size: int = 1000  # reviews held out of train for validation
        pack: bool = False  # several whole reviews per row, kept apart by documents= (zoo/data/packing.py)

        def __post_init__(self) -> None:
            require(self.val_size >= 1, f"data.val_size must be >= 1, got {self.val_size}")

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.path = resolve_path(self.options.path, "data.path")
        raw = read_imdb(self.path, self.seq_len)
        texts, labels = raw["train"]
        require(
            len(texts) > self.options.val_size,
            f"data.val_size={self.options.val_size} leaves no training reviews ({len(texts)} in {self.path})",
        )
        order = torch.randperm(len(texts), generator=seeded_generator(self.seed, "imdb-val")).tolist()
        val = set(order[: self.options.val_size])
        self.splits = {
            "train": self._encode(
                [texts[i] for i in range(len(texts)) if i not in val],
                [labels[i] for i in range(len(texts)) if i not in val],
            ),
            "val": self._encode([texts[i] for i in sorted(val)], [labels[i] for i in sorted(val)]),
            "test": self._encode(*raw["test"]),
        }
        for split in ("val", "test"):  # member order is all neg then all pos: shuffle once (seeded), so
            tokens, labels = self.splits[split]  # a partial evaluation (trainer.eval_batches) sees both classes
            order = torch.randperm(len(labels), generator=seeded_generator(self.seed, f"imdb-{split}-order"))
            self.splits[split] = (tokens[order], labels[order])
        self.packed: dict[str, Rows] = {}
        if self.options.pack:  # whole reviews, packed in a seeded order; a row then holds several classes
            for split, (tokens, labels) in self.splits.items():
                order = torch.randperm(len(labels), generator=seeded_generator(self.seed, f"imdb-{split}-pack"))
                reviews = [tokens[i][tokens[i] != 0] for i in order.tolist()]
                self.packed[split] = lay_out(reviews, self.seq_len, pack=True, labels=labels[order].tolist())

    def rows(self, split: str) -> int:
        """Rows of the split: reviews, or packed rows of several."""
        return len(self.packed[split]) if self.options.pack else len(self.splits[split][1])

    def _encode(self, texts: list[bytes], labels: list[int]) -> tuple[Tensor, Tensor]:
        tokens = torch.zeros(len(texts), self.seq_len, dtype=torch.long)
        for row, text in enumerate(texts):
            if text:
                tokens[row, : len(text)] = torch.frombuffer(bytearray(text), dtype=torch.uint8).long() + 1
        return tokens, torch.tensor(labels, dtype=torch.long)

    def num_batches(self, split: str, world_size: int = 1) -> int | None:
        check_split(split, world_size=world_size)
        n = self.rows(split) // (self.batch_size * world_size)
        if split == "train":
            return None  # training samples with replacement per epoch-less step
        return max(1, n)

    def batch(self, split: str, index: int, *, rank: int = 0, world_size: int = 1) -> dict[str, Tensor]:
        check_split(split, index=index, rank=rank, world_size=world_size)
        n, rows = self.rows(split), self.batch_size * world_size
        if split == "train":  # a fresh seeded permutation per epoch; batch index walks through it
            per_epoch = max(1, n // rows)
            epoch, position = divmod(index, per_epoch)
            perm = torch.randperm(n, generator=seeded_generator(self.seed, "imdb-train", epoch))
            pick = perm[position * rows + rank * self.batch_size :][: self.batch_size]
        else:
            start = (index * rows + rank * self.batch_size) % n
            pick = (torch.arange(self.batch_size) + start) % n
        if self.options.pack:
            return self.packed[split].batch(pick)
        tokens, labels = self.splits[split]
        batch_tokens = tokens[pick]
        return {"tokens": batch_tokens, "targets": labels[pick], "pad_mask": batch_tokens != 0}

    def decode(self, tokens: list[int]) -> str:
        return bytes(int(t) - 1 for t in tokens if int(t) > 0).decode("utf-8", errors="replace")
