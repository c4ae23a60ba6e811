"""Word-level language modelling: WikiText-103, WikiText-2 and Penn Treebank, in their published files.

Data: Merity et al. 2017 ("Pointer Sentinel Mixture Models", arXiv:1609.07843) for WikiText
(``wiki.{train,valid,test}.tokens``); Mikolov et al. 2010's preprocessing of the Penn Treebank
(``ptb.{train,valid,test}.txt``). ``data.path`` is the directory as distributed.

Protocol (as Transformer-XL's and Merity et al.'s code read these files): each line is split on
whitespace and ends with ``<eos>`` (an empty line is just ``<eos>``); ``<unk>`` is an ordinary
token of the files. The vocabulary comes from the training file only: ``<eos>`` first, then words by
decreasing frequency (ties in order of first appearance), so frequency-based adaptive-softmax
cutoffs apply to the ids directly. A validation or test word outside it becomes ``<unk>``; how many
did is counted and reported (``oov`` in :meth:`describe`). Metric: perplexity.

Batches are contiguous lanes as in :mod:`zoo.data.text` (row j of consecutive batches continues one
stream, so Transformer-XL's memory carries). Evaluation scores the whole split: the last batch of
each lane is shorter instead of dropped, so every token but the last (n - 1) mod rows is scored.
"""

from __future__ import annotations

import warnings
from array import array
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor

from zoo.config import require
from zoo.data.base import SPLITS, TASK, DataFileNotFound, check_split
from zoo.data.splits import named_split_files, resolve_directory
from zoo.data.text import TextLMTask

EOS, UNK = "<eos>", "<unk>"


def words(path: Path) -> Iterator[list[str]]:
    """Each line's words plus <eos>, streamed (WikiText-103's 103M words never sit in lists)."""
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            yield line.split() + [EOS]


def build_vocab(path: Path) -> list[str]:
    """<eos> first, then by decreasing count; ties keep their order of first appearance."""
    counts: Counter[str] = Counter()
    for line in words(path):
        counts.update(line)
    counts.pop(EOS, None)
    vocab = [EOS] + [w for w, _ in sorted(counts.items(), key=lambda item: -item[1])]  # sort is stable
    if UNK not in counts:
        vocab.append(UNK)  # so unseen words of valid/test have somewhere to go
    return vocab


def encode(path: Path, stoi: dict[str, int]) -> tuple[np.ndarray, int]:
    """(ids of the file, how many words were outside the vocabulary and became <unk>)."""
    ids = array("l")
    for line in words(path):
        ids.extend(stoi.get(word, -1) for word in line)
    out = np.frombuffer(ids, dtype=np.int64).copy() if ids.itemsize == 8 else np.asarray(ids, dtype=np.int64)
    oov = int((out < 0).sum())
    out[out < 0] = stoi[UNK]
    return out, oov


class WordLMTask(TextLMTask):
    """Word-level LM over a directory of split files (subclasses name the files)."""

    metric = "ppl"
    contiguous = True
    FILES: ClassVar[dict[str, str]] = {}
    STANDARD_VOCAB: ClassVar[int] = 0  # the vocabulary of the standard training file (describe without data)

    @dataclass
    class Options:
        path: str = ""  # the directory holding the three split files

    @classmethod
    def nominal_vocab_size(cls, options: dict[str, Any]) -> tuple[int, str]:
        name = cls.registry_name
        return cls.STANDARD_VOCAB, f"the standard {name} vocabulary (the training file sets the real one)"

    def __init__(self, **kwargs):
        super(TextLMTask, self).__init__(**kwargs)  # Task's checks; the file reading is ours
        directory = resolve_directory(self.options.path)
        if directory is None:
            expected = ", ".join(self.FILES.values())
            raise DataFileNotFound(
                f"data.path={self.options.path!r} is not a directory; data={self.registry_name} reads a directory "
                f"holding {expected}"
            )
        self.path = directory
        files = named_split_files(directory, self.FILES)
        self.itos = build_vocab(files["train"])
        self.stoi = {w: i for i, w in enumerate(self.itos)}
        self.vocab_size = len(self.itos)
        parts, self.oov = [], {}
        for split in SPLITS:
            ids, self.oov[split] = encode(files[split], self.stoi)
            parts.append(ids)
            if self.oov[split]:
                warnings.warn(
                    f"data {self.registry_name}: {self.oov[split]:,} words of {files[split].name} are not in the "
                    f"training vocabulary; read as {UNK}",
                    stacklevel=2,
                )
        self.split_tokens = {split: len(p) for split, p in zip(SPLITS, parts)}
        self.data = np.concatenate(parts)
        self.bounds, start = {}, 0
        for split, part in zip(SPLITS, parts):
            self.bounds[split] = (start, start + len(part))
            start += len(part)
        require(self.split_tokens["train"] > 1, f"{files['train']} holds no tokens (data.path)")

    def _eval_layout(self, split: str, world_size: int) -> tuple[int, int, int]:
        """(start, lane length, batches) covering the whole lane, the last batch shorter."""
        check_split(split)
        start, end = self.bounds[split]
        rows = self.batch_size * world_size
        lane = (end - start - 1) // rows
        require(
            lane >= 1,
            f"the {split} split of {self.path} ({end - start:,} tokens) is too small for {rows} rows; lower the "
            f"batch size",
        )
        return start, lane, -(-lane // self.seq_len)

    def num_batches(self, split: str, world_size: int = 1) -> int:
        if split == "train":
            return super().num_batches(split, world_size)
        return self._eval_layout(split, world_size)[2]

    def batch(self, split: str, index: int, *, rank: int = 0, world_size: int = 1) -> dict[str, Tensor]:
        if split == "train":
            return super().batch(split, index, rank=rank, world_size=world_size)
        start, lane, batches = self._eval_layout(split, world_size)
        index %= batches
        t = min(self.seq_len, lane - index * self.seq_len)
        rows = np.arange(rank * self.batch_size, (rank + 1) * self.batch_size)
        offsets = start + rows * lane + index * self.seq_len  # [b]
        window = torch.from_numpy(np.asarray(self.data[offsets[:, None] + np.arange(t + 1)[None, :]], dtype=np.int64))
        return {"tokens": window[:, :-1].contiguous(), "targets": window[:, 1:].contiguous()}

    def decode(self, tokens: list[int]) -> str:
        return " ".join(self.itos[int(t)] for t in tokens)

    def encode(self, text: str) -> list[int]:
        return [self.stoi.get(word, self.stoi[UNK]) for word in text.split()]

    def describe(self) -> dict:
        info = super().describe()
        info.update(tokens=dict(self.split_tokens), oov=dict(self.oov), path=str(self.path))
        return info


@TASK.register("wikitext103")
class WikiText103(WordLMTask):
    """WikiText-103 (Merity et al. 2017), word level, read in its published layout: data.path = the
    directory with wiki.{train,valid,test}.tokens. Vocabulary from the training file (267,735 words
    with <eos>), <eos> at every line end, perplexity."""

    data_dir_path = "wikitext-103"

    FILES = {"train": "wiki.train.tokens", "val": "wiki.valid.tokens", "test": "wiki.test.tokens"}
    STANDARD_VOCAB = 267_735


@TASK.register("wikitext2")
class WikiText2(WordLMTask):
    """WikiText-2 (Merity et al. 2017), word level, ~2M training words: data.path = the directory with
    wiki.{train,valid,test}.tokens; vocabulary from the training file, perplexity."""

    data_dir_path = "wikitext-2"

    FILES = {"train": "wiki.train.tokens", "val": "wiki.valid.tokens", "test": "wiki.test.tokens"}
    STANDARD_VOCAB = 33_278


@TASK.register("ptb_word")
class PennTreebankWords(WordLMTask):
    """Penn Treebank, word level (Mikolov's preprocessing, 10K words): data.path = the directory with
    ptb.{train,valid,test}.txt; vocabulary from the training file, perplexity."""

    data_dir_path = "ptb"

    FILES = {"train": "ptb.train.txt", "val": "ptb.valid.txt", "test": "ptb.test.txt"}
    STANDARD_VOCAB = 10_000
