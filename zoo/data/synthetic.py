"""Synthetic tasks that need no download.

Duplication task (Kitaev et al. 2020, "Reformer", arXiv:2001.04451, Section 2.1): sequences
``0 w 0 w`` where ``w`` is a random string over symbols 1..n_symbols; a model sees the whole
sequence causally and is scored only on the second copy of ``w`` (it must find the matching
position in the first copy, which is far away: the test of long-range attention).
"""

from __future__ import annotations

import torch
from torch import Tensor


def duplication_batch(
    batch_size: int, length: int, *, n_symbols: int = 127, generator: torch.Generator | None = None
) -> dict[str, Tensor]:
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
    targets[:, :half] = IGNORE_INDEX  # targets[i] = seq[i + 1]: keep only seq[half + 1:], the second w
    return {"tokens": tokens, "targets": targets}


def associative_recall_batch(
    batch_size: int,
    length: int,
    *,
    n_keys: int = 32,
    n_values: int = 32,
    n_pairs: int = 8,
    generator: torch.Generator | None = None,
) -> dict[str, Tensor]:
    """One batch of multi-query associative recall as next-token prediction.

    After Ba et al. 2016 ("Using Fast Weights to Attend to the Recent Past", arXiv:1610.06258) in
    the multi-query form of Arora et al. 2023 ("Zoology", arXiv:2312.04927): the sequence opens with
    ``n_pairs`` key-value pairs ``k1 v1 ... kn vn`` (distinct keys), then repeats queries ``k v``
    drawn from those pairs until ``length``; only the value after each queried key is scored, so the
    model must look back to the pair that bound it (far away for long sequences).
    Vocabulary: 0 (filler), keys 1..n_keys, values n_keys+1..n_keys+n_values.

    Returns ``{"tokens": [b, length], "targets": [b, length]}`` with targets = next token or -100."""
    if n_pairs < 1 or n_pairs > n_keys:
        raise ValueError(f"n_pairs must be in [1, n_keys={n_keys}], got {n_pairs}")
    if length < 2 * n_pairs + 2:
        raise ValueError(f"associative recall length must be >= 2 * n_pairs + 2 = {2 * n_pairs + 2}, got {length}")
    keys = torch.argsort(torch.rand(batch_size, n_keys, generator=generator), dim=1)[:, :n_pairs] + 1  # distinct keys
    values = torch.randint(n_keys + 1, n_keys + n_values + 1, (batch_size, n_pairs), generator=generator)
    context = torch.stack([keys, values], dim=2).flatten(1)  # [b, 2n]: k1 v1 k2 v2 ...
    n_queries = (length - 2 * n_pairs) // 2
    pick = torch.randint(0, n_pairs, (batch_size, n_queries), generator=generator)
    queries = torch.stack([keys.gather(1, pick), values.gather(1, pick)], dim=2).flatten(1)  # [b, 2q]
    filler = torch.zeros(batch_size, length - 2 * n_pairs - 2 * n_queries, dtype=torch.long)
    seq = torch.cat([context, queries, filler], dim=1)
    targets = torch.full_like(seq, IGNORE_INDEX)
    # position of each queried key: the target there is its value (the next token)
    query_keys = 2 * n_pairs + 2 * torch.arange(n_queries)
    targets[:, query_keys] = seq[:, query_keys + 1]
    return {"tokens": seq, "targets": targets}


# -- tasks (the Hydra app's ``data=`` choices) --------------------------------------------------

from dataclasses import dataclass  # noqa: E402

from zoo.config import IGNORE_INDEX, require  # noqa: E402
from zoo.data.base import TASK, Task, check_split, seeded_generator  # noqa: E402


class SyntheticTask(Task):
    """Fresh random sequences per batch, drawn from a generator seeded by (seed, split, index, rank);
    the validation/test splits are a fixed, finite set of batches (``eval_size`` sequences)."""

    metric = "accuracy"

    def num_batches(self, split: str, world_size: int = 1) -> int | None:
        check_split(split, world_size=world_size)
        if split == "train":
            return None
        return max(1, self.options.eval_size // (self.batch_size * world_size))

    def batch(self, split: str, index: int, *, rank: int = 0, world_size: int = 1) -> dict[str, Tensor]:
        check_split(split, index=index, rank=rank, world_size=world_size)
        return self.make(
            self.batch_size, seeded_generator(self.seed, self.registry_name, split, index, rank, world_size)
        )


@TASK.register("duplication")
class DuplicationTask(SyntheticTask):
    """The Reformer duplication task (0 w 0 w; loss and accuracy on the second copy), exactly
    trainer.seq_len tokens per row (the last target, past the sequence, is not scored). Built in."""

    @dataclass
    class Options:
        n_symbols: int = 127  # symbols of w are 1..n_symbols (the paper: 127 + separator 0)
        eval_size: int = 256  # sequences in the val/test splits

        def __post_init__(self) -> None:
            require(self.n_symbols >= 1, f"data.n_symbols must be >= 1, got {self.n_symbols}")
            require(self.eval_size >= 1, f"data.eval_size must be >= 1, got {self.eval_size}")

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        require(
            self.seq_len >= 4 and self.seq_len % 2 == 0,
            f"duplication needs an even trainer.seq_len >= 4, got {self.seq_len}",
        )
        self.vocab_size = self.options.n_symbols + 1

    def make(self, b: int, generator: torch.Generator) -> dict[str, Tensor]:
        # duplication_batch(L) reads seq[:-1] of 0 w 0 w (|w| = L/2 - 1) and predicts seq[1:]; append
        # the last symbol so a row holds exactly seq_len tokens; the target past the end is unscored.
        out = duplication_batch(b, self.seq_len, n_symbols=self.options.n_symbols, generator=generator)
        seq = torch.cat([out["tokens"], out["targets"][:, -1:]], dim=1)  # 0 w 0 w, [b, t]
        targets = torch.cat([out["targets"], torch.full((b, 1), IGNORE_INDEX)], dim=1)
        return {"tokens": seq, "targets": targets}


@TASK.register("associative_recall")
class AssociativeRecallTask(SyntheticTask):
    """Multi-query associative recall: key-value pairs up front, queries after; accuracy on recalled
    values (see :func:`associative_recall_batch`). Built in, no download."""

    @dataclass
    class Options:
        n_keys: int = 32
        n_values: int = 32
        n_pairs: int = 8  # key-value pairs bound at the start of each sequence
        eval_size: int = 256

        def __post_init__(self) -> None:
            require(
                self.n_keys >= 1 and self.n_values >= 1,
                f"data.n_keys and data.n_values must be >= 1, got {self.n_keys}, {self.n_values}",
            )
            require(
                1 <= self.n_pairs <= self.n_keys,
                f"data.n_pairs must be in [1, data.n_keys={self.n_keys}], got {self.n_pairs}",
            )
            require(self.eval_size >= 1, f"data.eval_size must be >= 1, got {self.eval_size}")

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        o = self.options
        require(
            self.seq_len >= 2 * o.n_pairs + 2,
            f"associative_recall needs trainer.seq_len >= 2 * data.n_pairs + 2 = {2 * o.n_pairs + 2}, got "
            f"{self.seq_len}",
        )
        self.vocab_size = 1 + o.n_keys + o.n_values

    def make(self, b: int, generator: torch.Generator) -> dict[str, Tensor]:
        o = self.options
        return associative_recall_batch(
            b, self.seq_len, n_keys=o.n_keys, n_values=o.n_values, n_pairs=o.n_pairs, generator=generator
        )


@TASK.register("reverse")
class ReverseTask(SyntheticTask):
    """A sequence-to-sequence check: the target is the source reversed (encoder-decoder presets).

    Vocabulary: 0 pad, 1 BOS, 2 EOS, symbols 3..n_symbols+2 (the ModelConfig defaults for pad/bos/eos).
    Batches: ``src`` [b, t], ``tgt`` = BOS + reversed source [b, t], ``targets`` = reversed source
    + EOS [b, t]; the metric is token accuracy over the targets (EOS included)."""

    kind = "seq2seq"

    @dataclass
    class Options:
        n_symbols: int = 16
        eval_size: int = 256

        def __post_init__(self) -> None:
            require(self.n_symbols >= 1, f"data.n_symbols must be >= 1, got {self.n_symbols}")
            require(self.eval_size >= 1, f"data.eval_size must be >= 1, got {self.eval_size}")

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        require(self.seq_len >= 2, f"reverse needs trainer.seq_len >= 2, got {self.seq_len}")
        self.vocab_size = self.options.n_symbols + 3

    def make(self, b: int, generator: torch.Generator) -> dict[str, Tensor]:
        n = self.seq_len - 1  # source length: the target adds EOS
        src = torch.randint(3, self.options.n_symbols + 3, (b, n), generator=generator)
        rev = src.flip(1)
        bos, eos = torch.ones(b, 1, dtype=torch.long), torch.full((b, 1), 2, dtype=torch.long)
        return {"src": src, "tgt": torch.cat([bos, rev], 1), "targets": torch.cat([rev, eos], 1)}
