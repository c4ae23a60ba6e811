"""Algorithmic sequence-to-sequence tasks: copy, reverse, integer addition.

The tasks of the Universal Transformer's Table 4 (Dehghani et al. 2019, arXiv:1807.03819,
Section 3.3, after the Neural GPU's set-up): a model is trained on short strings and tested on
longer ones, scored by character accuracy and sequence accuracy.

- ``copy``:     src = x_1 .. x_n            tgt = x_1 .. x_n
- ``reverse``:  src = x_1 .. x_n            tgt = x_n .. x_1
- ``addition``: src = a + b (decimal)       tgt = a + b's value; ``length`` is the digit count of
  each operand. Digits are written least significant first in both source and target (our
  choice, the paper does not state the order): the carry then flows left to right, the direction
  the decoder writes in.

Vocabulary (shared by source and target, so the encoder-decoder can tie all three embeddings):
0 pad, 1 bos, 2 eos, 3 .. 3 + n_symbols - 1 the symbols (digits 0-9 for addition), then ``+``.

``data=algorithmic data.problem=addition`` trains an encoder-decoder on them through the app (the
metric: token accuracy given the true prefix, the answer's eos included); the studies ``ut_length``
and ``universal_algorithmic`` draw batches with :func:`algorithmic_batch` and add sequence
accuracy and greedy decoding.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from zoo.config import IGNORE_INDEX, require
from zoo.data.base import TASK, Task, check_split, seeded_generator

PAD, BOS, EOS, FIRST = 0, 1, 2, 3
TASKS = ("copy", "reverse", "addition")
# the paper's Table 4 (trained on length 40, tested on 400): (task, "transformer" | "ut") -> (char-acc, seq-acc)
PAPER_TABLE4 = {
    ("copy", "transformer"): (0.53, 0.03),
    ("copy", "ut"): (0.91, 0.35),
    ("reverse", "transformer"): (0.13, 0.06),
    ("reverse", "ut"): (0.96, 0.46),
    ("addition", "transformer"): (0.07, 0.0),
    ("addition", "ut"): (0.34, 0.02),
}


def vocab_size(task: str, n_symbols: int = 10) -> int:
    check_task(task)
    return FIRST + (10 + 1 if task == "addition" else n_symbols)


def check_task(task: str) -> None:
    if task not in TASKS:
        raise ValueError(f"task must be one of {', '.join(TASKS)}; got {task!r}")


def _pad(rows: list[Tensor], value: int) -> Tensor:
    width = max(len(r) for r in rows)
    out = torch.full((len(rows), width), value, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


def _digits(n: int, generator: torch.Generator | None) -> Tensor:
    """A random n-digit number, least significant digit first (leading digit non-zero)."""
    d = torch.randint(0, 10, (n,), generator=generator)
    if n > 1 and d[-1] == 0:
        d[-1] = int(torch.randint(1, 10, (1,), generator=generator))
    return d


def _add(a: Tensor, b: Tensor) -> Tensor:
    """Sum of two little-endian digit vectors, little-endian."""
    out, carry = [], 0
    for i in range(max(len(a), len(b))):
        s = (int(a[i]) if i < len(a) else 0) + (int(b[i]) if i < len(b) else 0) + carry
        out.append(s % 10)
        carry = s // 10
    if carry:
        out.append(carry)
    return torch.tensor(out, dtype=torch.long)


def algorithmic_batch(
    task: str,
    batch_size: int,
    min_len: int,
    max_len: int,
    *,
    n_symbols: int = 10,
    generator: torch.Generator | None = None,
) -> dict[str, Tensor]:
    """One padded batch; each example's length is uniform in [min_len, max_len].

    Returns the encoder-decoder's call arguments: ``src`` [b, S], ``tgt`` [b, T] (bos + answer),
    ``targets`` [b, T] (answer + eos, -100 on padding), ``src_pad_mask`` / ``tgt_pad_mask``
    [b, S] / [b, T] bool (True = real)."""
    check_task(task)
    if not (1 <= min_len <= max_len):
        raise ValueError(f"need 1 <= min_len <= max_len; got min_len={min_len}, max_len={max_len}")
    if batch_size < 1 or n_symbols < 1:
        raise ValueError(f"batch_size and n_symbols must be >= 1; got {batch_size}, {n_symbols}")
    lengths = torch.randint(min_len, max_len + 1, (batch_size,), generator=generator).tolist()
    sources, answers = [], []
    for n in lengths:
        if task == "addition":
            a, b = _digits(n, generator), _digits(n, generator)
            plus = torch.tensor([FIRST + 10])
            sources.append(torch.cat([a + FIRST, plus, b + FIRST]))
            answers.append(_add(a, b) + FIRST)
        else:
            x = torch.randint(FIRST, FIRST + n_symbols, (n,), generator=generator)
            sources.append(x)
            answers.append(x if task == "copy" else x.flip(0))
    src = _pad(sources, PAD)
    tgt = _pad([torch.cat([torch.tensor([BOS]), y]) for y in answers], PAD)
    targets = _pad([torch.cat([y, torch.tensor([EOS])]) for y in answers], IGNORE_INDEX)
    return {
        "src": src,
        "tgt": tgt,
        "targets": targets,
        "src_pad_mask": src != PAD,
        "tgt_pad_mask": targets != IGNORE_INDEX,
    }


def score(predicted: Tensor, targets: Tensor) -> tuple[float, float]:
    """(char accuracy, sequence accuracy) of decoded ids against ``targets`` (answer + eos, -100
    padding). Scored over the answer symbols and the eos; a sequence counts only if all match."""
    real = targets != IGNORE_INDEX
    width = targets.shape[1]
    if predicted.shape[1] < width:
        predicted = torch.cat(
            [predicted, predicted.new_full((predicted.shape[0], width - predicted.shape[1]), PAD)], dim=1
        )
    correct = (predicted[:, :width] == targets) & real
    char = correct.sum().item() / max(1, real.sum().item())
    seq = (correct | ~real).all(dim=1).float().mean().item()
    return char, seq


@TASK.register("algorithmic")
class AlgorithmicTask(Task):
    """The Universal Transformer's algorithmic tasks (copy, reverse, addition; Dehghani et al. 2019,
    Table 4) as sequence-to-sequence: strings of data.min_len..trainer.seq_len symbols (addition:
    digits per operand) in training, of data.eval_len in val/test (longer: length generalisation)."""

    kind = "seq2seq"
    metric = "accuracy"

    @dataclass
    class Options:
        problem: str = "copy"  # copy | reverse | addition
        min_len: int = 1  # shortest training string (the longest: trainer.seq_len)
        eval_len: int = 0  # val/test strings of exactly this length; 0 = the training range
        n_symbols: int = 10  # alphabet of copy and reverse (addition always uses the 10 digits)
        eval_size: int = 256  # strings in the val/test splits

        def __post_init__(self) -> None:
            check_task(self.problem)
            require(self.min_len >= 1, f"data.min_len must be >= 1, got {self.min_len}")
            require(self.eval_len >= 0, f"data.eval_len must be >= 0 (0 = the training range), got {self.eval_len}")
            require(self.n_symbols >= 1, f"data.n_symbols must be >= 1, got {self.n_symbols}")
            require(self.eval_size >= 1, f"data.eval_size must be >= 1, got {self.eval_size}")

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        o = self.options
        require(
            o.min_len <= self.seq_len,
            f"algorithmic needs data.min_len <= trainer.seq_len (the longest training string), got "
            f"{o.min_len} > {self.seq_len}",
        )
        self.vocab_size = vocab_size(o.problem, o.n_symbols)

    def num_batches(self, split: str, world_size: int = 1) -> int | None:
        check_split(split, world_size=world_size)
        if split == "train":
            return None
        return max(1, self.options.eval_size // (self.batch_size * world_size))

    def batch(self, split: str, index: int, *, rank: int = 0, world_size: int = 1) -> dict[str, Tensor]:
        check_split(split, index=index, rank=rank, world_size=world_size)
        o = self.options
        low, high = (o.min_len, self.seq_len) if split == "train" or not o.eval_len else (o.eval_len, o.eval_len)
        generator = seeded_generator(self.seed, self.registry_name, split, index, rank, world_size)
        return algorithmic_batch(o.problem, self.batch_size, low, high, n_symbols=o.n_symbols, generator=generator)
