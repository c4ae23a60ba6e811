"""ListOps, regenerated with the Long Range Arena generator's grammar and length limits.

Tasks: Nangia & Bowman 2018 ("ListOps", arXiv:1804.06028); the LRA variant of Tay et al. 2020
("Long Range Arena", arXiv:2011.04006): nested ``[MIN``, ``[MAX``, ``[MED``, ``[SM`` (sum mod 10)
over digits, up to depth 10 and 10 arguments, sequences of 500-2000 tokens, 10 classes.

Grammar and sampling (the LRA generator, restated from its description; our own code):
a tree at depth ``d`` is a leaf digit with probability 0.75 (always at ``max_depth``), otherwise an
operator node with ``k ~ U{2..max_args}`` children, generated *before* the operator is drawn
uniformly. Its length counts digits, operators and one ``]`` per operator (no parentheses); a tree
is kept only if ``min_length < length < max_length`` (strict), else redrawn.

Released files: ``data.path`` = the directory of LRA's ``basic_{train,val,test}.tsv`` (``lra_release/listops-1000``;
columns ``Source`` and ``Target``, a header row) reads those sequences instead, tokenised as LRA's input
pipeline does (parentheses dropped, ``]`` kept as a token, split on whitespace) and cut at
``trainer.seq_len`` as its ``[:max_length]``; the check against that pipeline on the same files is
``results/lra_nystromformer/README.md``.

Deviations: LRA dedups 100k trees through an unseeded Python set; we draw each sequence from a
generator seeded by (seed, split, index), so runs are reproducible and the splits are disjoint
streams (not deduplicated across each other; collisions are negligible at these lengths). Tokens
drop the parentheses and keep ``]`` (as the PyTorch ports of LRA do); ``to_string`` gives LRA's
parenthesised text for inspection.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch
from torch import Tensor

from zoo.config import require
from zoo.data.base import TASK, DataFileNotFound, Task, check_split, find_directory, seed_int

OPERATORS = ("[MIN", "[MAX", "[MED", "[SM")
END = "]"
VALUE_P = 0.25  # probability of branching (the generator's constant; leaves take the rest)
# vocabulary: 0 = padding, digits 0-9 -> 1..10, operators -> 11..14, ']' -> 15
VOCAB = ["<pad>"] + [str(d) for d in range(10)] + list(OPERATORS) + [END]
TOKEN_ID = {tok: i for i, tok in enumerate(VOCAB)}

Tree = int | tuple  # a digit, or (operator, [children])
TSV_FILES = {"train": "basic_train.tsv", "val": "basic_val.tsv", "test": "basic_test.tsv"}


def source_tokens(source: str) -> list[str]:
    """LRA's ListOps tokenisation of a ``Source`` string: parentheses dropped, whitespace split."""
    return source.replace("(", " ").replace(")", " ").split()


def read_listops_tsv(path, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(token ids [n, seq_len], zero-padded and cut at seq_len; labels [n]) from one released TSV file."""
    rows, labels = [], []
    with open(path, encoding="utf-8") as f:
        header = f.readline().rstrip("\r\n").split("\t")
        require(header[:2] == ["Source", "Target"], f"{path}: expected the header Source<TAB>Target, got {header}")
        for line_no, line in enumerate(f, start=2):
            fields = line.rstrip("\r\n").split("\t")
            if fields == [""]:
                continue
            require(len(fields) >= 2, f"{path}:{line_no}: expected Source<TAB>Target")
            unknown = sorted({tok for tok in source_tokens(fields[0]) if tok not in TOKEN_ID})
            require(not unknown, f"{path}:{line_no}: tokens outside the ListOps vocabulary: {unknown[:5]}")
            rows.append([TOKEN_ID[tok] for tok in source_tokens(fields[0])][:seq_len])
            labels.append(int(fields[1]))
    require(rows, f"{path} holds no sequences")
    tokens = torch.zeros(len(rows), seq_len, dtype=torch.long)
    for row, ids in enumerate(rows):
        tokens[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
    return tokens, torch.tensor(labels, dtype=torch.long)


def generate_tree(rng: random.Random, depth: int, max_depth: int, max_args: int) -> tuple[Tree, int]:
    """One random tree and its length (digits + operators + closing brackets)."""
    r = rng.random() if depth < max_depth else 1.0
    if r > VALUE_P:
        return rng.randint(0, 9), 1
    n_args = rng.randint(2, max_args)
    children, length = [], 2  # the operator and its ']'
    for _ in range(n_args):
        child, child_length = generate_tree(rng, depth + 1, max_depth, max_args)
        children.append(child)
        length += child_length
    return (rng.choice(OPERATORS), children), length


def evaluate(tree: Tree) -> int:
    if isinstance(tree, int):
        return tree
    op, children = tree
    values = [evaluate(c) for c in children]
    if op == "[MIN":
        return min(values)
    if op == "[MAX":
        return max(values)
    if op == "[SM":
        return sum(values) % 10
    values.sort()
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else int((values[mid - 1] + values[mid]) / 2)  # np.median, truncated


def to_tokens(tree: Tree) -> list[str]:
    if isinstance(tree, int):
        return [str(tree)]
    op, children = tree
    out = [op]
    for child in children:
        out += to_tokens(child)
    return out + [END]


def to_string(tree: Tree) -> str:
    """LRA's text: the tree left-nested into pairs, each pair written as ``( a b )``."""
    if isinstance(tree, int):
        return str(tree)
    op, children = tree
    text = op
    for child in children:
        text = f"( {text} {to_string(child)} )"
    return f"( {text} {END} )"


def sample(
    rng: random.Random,
    *,
    min_length: int = 500,
    max_length: int = 2000,
    max_depth: int = 10,
    max_args: int = 10,
    max_tries: int = 100_000,
) -> tuple[Tree, int]:
    """Draw trees until one has ``min_length < length < max_length``; returns (tree, label)."""
    for _ in range(max_tries):
        tree, length = generate_tree(rng, 1, max_depth, max_args)
        if min_length < length < max_length:
            return tree, evaluate(tree)
    raise ValueError(
        f"no ListOps tree with {min_length} < length < {max_length} in {max_tries} draws; widen "
        "data.min_length/data.max_length"
    )


@TASK.register("listops")
class ListOpsTask(Task):
    """ListOps regenerated with the LRA generator's grammar and limits (500 < length < 2000, depth 10,
    10 args): 10-way classification of its expressions, padded to trainer.seq_len tokens; needs
    trainer.seq_len >= 1999 (see experiment=lra_listops) or a smaller data.max_length."""

    kind = "classifier"
    metric = "accuracy"
    rows_by_global_index = True  # rank r reads rows r*b ... of every rank's w*b (file_rows)

    @dataclass
    class Options:
        min_length: int = 500  # LRA: 500 < length < 2000
        max_length: int = 2000
        max_depth: int = 10
        max_args: int = 10
        eval_size: int = 2000  # sequences in val/test (LRA: 2000 each)
        path: str = ""  # LRA's released basic_{train,val,test}.tsv directory; empty = generate (above)

        def __post_init__(self) -> None:
            require(
                0 <= self.min_length < self.max_length - 1,
                f"need 0 <= data.min_length < data.max_length - 1; got {self.min_length}, {self.max_length}",
            )
            require(
                self.max_depth >= 1 and self.max_args >= 2,
                f"need data.max_depth >= 1 and data.max_args >= 2; got {self.max_depth}, {self.max_args}",
            )
            require(self.eval_size >= 1, f"data.eval_size must be >= 1, got {self.eval_size}")

    vocab_size = len(VOCAB)
    n_classes = 10

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.files: dict[str, tuple[Tensor, Tensor]] | None = None
        if self.options.path:  # the released files, cut at seq_len as LRA's [:max_length]
            directory = find_directory(self.options.path)
            missing = [name for name in TSV_FILES.values() if not (directory / name).is_file()]
            if missing:
                raise DataFileNotFound(f"{directory} lacks {', '.join(missing)} (LRA's listops-1000 directory)")
            self.files = {split: read_listops_tsv(directory / name, self.seq_len) for split, name in TSV_FILES.items()}
            return
        require(
            self.seq_len >= self.options.max_length - 1,
            f"listops sequences reach data.max_length - 1 = {self.options.max_length - 1} tokens; set "
            "trainer.seq_len >= that (or lower data.max_length)",
        )

    def num_batches(self, split: str, world_size: int = 1) -> int | None:
        check_split(split, world_size=world_size)
        size = self.options.eval_size if self.files is None else len(self.files[split][1])
        return None if split == "train" else max(1, size // (self.batch_size * world_size))

    def batch(self, split: str, index: int, *, rank: int = 0, world_size: int = 1) -> dict[str, Tensor]:
        check_split(split, index=index, rank=rank, world_size=world_size)
        if self.files is not None:
            return self._file_batch(split, index, rank, world_size)
        o = self.options
        rng = random.Random(seed_int(self.seed, "listops", split, index, rank, world_size))
        tokens = torch.zeros(self.batch_size, self.seq_len, dtype=torch.long)
        labels = torch.zeros(self.batch_size, dtype=torch.long)
        for row in range(self.batch_size):
            tree, labels[row] = sample(
                rng, min_length=o.min_length, max_length=o.max_length, max_depth=o.max_depth, max_args=o.max_args
            )
            ids = [TOKEN_ID[tok] for tok in to_tokens(tree)]
            tokens[row, : len(ids)] = torch.tensor(ids)
        return {"tokens": tokens, "targets": labels, "pad_mask": tokens != 0}

    def _file_batch(self, split: str, index: int, rank: int, world_size: int) -> dict[str, Tensor]:
        tokens, labels = self.files[split]
        pick = self.file_rows(len(labels), split, index, rank, world_size)
        return {"tokens": tokens[pick], "targets": labels[pick], "pad_mask": tokens[pick] != 0}

    def decode(self, tokens: list[int]) -> str:
        return " ".join(VOCAB[int(t)] for t in tokens if int(t) != 0)
