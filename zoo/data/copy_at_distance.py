"""Markov text with copies from a fixed distance: a character task whose useful range is known.

Built to test the claim of adaptive attention span (Sukhbaatar et al. 2019, arXiv:1905.07799)
that each head learns the range the data needs. The text mixes two kinds of structure:

- local: a first-order Markov chain over ``n_symbols`` letters, each letter followed by one of
  ``successors`` letters (probabilities falling geometrically); a window of one character sees it;
- long: every position t >= D is, with probability ``copy_prob``, an exact copy of the character
  at t - D (``distance`` = D); otherwise it is drawn from the chain given character t - 1.

So the next character's distribution given the whole past is
``p [x_t = x_{t-D}] + (1 - p) M(x_t | x_{t-1})``, and a model that cannot see D characters back
can do no better (roughly) than ``p pi(x_t) + (1 - p) M(x_t | x_{t-1})`` (pi: the letter frequencies).
``oracle_bits`` gives both figures for a text. To predict character t + 1 the query at t needs the
key at t + 1 - D: distance D - 1 in attention's terms.

The transition table depends on ``chain_seed`` only, so train, valid and test share one language
and differ in their samples. ``write_splits`` writes the three files in the layout the authors'
code reads (``train.txt``, ``valid.txt``, ``test.txt``: characters separated by spaces, one line);
the ``adaptive_span_range`` study gives them to the authors' code. ``data=copy_at_distance`` generates the same
texts in memory (seeds 1, 2, 3) and reads them as a character LM, like ``char_lm``.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from zoo.config import require
from zoo.data.base import TASK, Task
from zoo.data.text import TextLMTask

ALPHABET = "abcdefghijklmnopqrstuvwxyz"


def transition_table(n_symbols: int, successors: int, chain_seed: int) -> list[list[tuple[int, float]]]:
    """For each letter, its successors and their probabilities (halving from one to the next)."""
    if not 2 <= n_symbols <= len(ALPHABET):
        raise ValueError(f"n_symbols must be in [2, {len(ALPHABET)}], got {n_symbols}")
    if not 1 <= successors <= n_symbols:
        raise ValueError(f"successors must be in [1, n_symbols={n_symbols}], got {successors}")
    rng = random.Random(chain_seed)
    weights = [2.0**-i for i in range(successors)]
    total = sum(weights)
    return [list(zip(rng.sample(range(n_symbols), successors), [w / total for w in weights])) for _ in range(n_symbols)]


def generate(
    length: int,
    *,
    distance: int = 200,
    copy_prob: float = 0.5,
    n_symbols: int = 16,
    successors: int = 3,
    chain_seed: int = 0,
    seed: int = 0,
) -> str:
    """A text of ``length`` letters drawn as the module docstring says."""
    if distance < 2:
        raise ValueError(f"distance must be >= 2, got {distance}")
    if not 0.0 <= copy_prob <= 1.0:
        raise ValueError(f"copy_prob must be in [0, 1], got {copy_prob}")
    table = transition_table(n_symbols, successors, chain_seed)
    rng = random.Random(seed)
    ids = [rng.randrange(n_symbols)]
    for t in range(1, length):
        if t >= distance and rng.random() < copy_prob:
            ids.append(ids[t - distance])
        else:
            nexts, probs = zip(*table[ids[t - 1]])
            ids.append(rng.choices(nexts, probs)[0])
    return "".join(ALPHABET[i] for i in ids)


def oracle_bits(
    text: str,
    *,
    distance: int = 200,
    copy_prob: float = 0.5,
    n_symbols: int = 16,
    successors: int = 3,
    chain_seed: int = 0,
) -> dict[str, float]:
    """Bits per character of the true process on ``text``: ``full`` sees the whole past,
    ``short`` replaces the copied letter x_{t-D} by the letter frequencies (what a window shorter
    than D can know, up to correlations it could exploit through the chain; an approximation)."""
    table = transition_table(n_symbols, successors, chain_seed)
    ids = [ALPHABET.index(c) for c in text]
    frequency = [ids.count(i) / len(ids) for i in range(n_symbols)]
    full = short = 0.0
    for t in range(1, len(ids)):
        chain = dict(table[ids[t - 1]]).get(ids[t], 0.0)
        if t >= distance:
            copied = float(ids[t] == ids[t - distance])
            full -= math.log2(copy_prob * copied + (1 - copy_prob) * chain)
            short -= math.log2(copy_prob * frequency[ids[t]] + (1 - copy_prob) * chain)
        else:
            full -= math.log2(chain)
            short -= math.log2(chain)
    n = len(ids) - 1
    return {"full": full / n, "short": short / n}


def write_splits(directory: str | Path, lengths: tuple[int, int, int], **options) -> dict[str, str]:
    """Write ``train.txt``, ``valid.txt``, ``test.txt`` (``lengths`` letters each, seeds 1, 2, 3)
    as space-separated characters on one line; returns the three texts."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    texts = {}
    for seed, (name, length) in enumerate(zip(("train", "valid", "test"), lengths), start=1):
        texts[name] = generate(length, seed=seed, **options)
        (out / f"{name}.txt").write_text(" ".join(texts[name]) + "\n", encoding="utf-8")
    return texts


def read_split(path: str | Path) -> str:
    """The letters of a file written by ``write_splits``."""
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"no split at {str(file)!r}: write the splits first (write_splits)")
    return "".join(file.read_text(encoding="utf-8").split())


@TASK.register("copy_at_distance")
class CopyAtDistanceTask(TextLMTask):
    """Markov text over data.n_symbols letters in which each letter copies the one data.distance back
    with probability data.copy_prob: a character LM whose useful range is known (adaptive span's claim).
    Generated in memory (the splits write_splits writes), read as contiguous streams. Built in."""

    @dataclass
    class Options:
        distance: int = 200  # D: a copied letter repeats the one D back
        copy_prob: float = 0.5
        n_symbols: int = 16
        successors: int = 3  # letters that may follow each letter in the chain
        chain_seed: int = 0  # the language (transition table); the splits are its samples 1, 2, 3
        train_chars: int = 400_000
        eval_chars: int = 16_384  # each of valid and test

        def __post_init__(self) -> None:
            require(self.train_chars >= 2, f"data.train_chars must be >= 2, got {self.train_chars}")
            require(self.eval_chars >= 2, f"data.eval_chars must be >= 2, got {self.eval_chars}")
            transition_table(self.n_symbols, self.successors, self.chain_seed)  # refuses bad sizes by name

    def __init__(self, **kwargs):
        Task.__init__(self, **kwargs)  # the text is generated, not read: TextLMTask's file reading is skipped
        o = self.options
        process = dict(
            distance=o.distance,
            copy_prob=o.copy_prob,
            n_symbols=o.n_symbols,
            successors=o.successors,
            chain_seed=o.chain_seed,
        )
        lengths = {"train": o.train_chars, "val": o.eval_chars, "test": o.eval_chars}
        texts = {split: generate(n, seed=seed, **process) for seed, (split, n) in enumerate(lengths.items(), 1)}
        self.path = f"data=copy_at_distance (distance {o.distance}, generated)"
        self.itos = list(ALPHABET[: o.n_symbols])
        self.stoi = {c: i for i, c in enumerate(self.itos)}
        self.vocab_size = o.n_symbols
        self.data = np.array([self.stoi[c] for split in lengths for c in texts[split]], dtype=np.int64)
        starts = np.cumsum([0, *lengths.values()])
        self.bounds = {split: (int(starts[i]), int(starts[i + 1])) for i, split in enumerate(lengths)}
