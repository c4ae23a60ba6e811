"""Passkey retrieval: a short key hidden in filler, asked for at the end.

Mohtashami & Jaggi 2023, "Landmark Attention: Random-Access Infinite Context Length for
Transformers", arXiv:2305.16300, Section 4.2: a prompt of repeated filler sentences ("The grass is
green. The sky is blue. ...") with "The pass key is 12345. Remember it." at a random place, ending
"What is the pass key? The pass key is"; a model trained at one length is asked at longer ones.

Here as a token task (trained from scratch, no tokenizer):

- vocabulary: digits 0..9 (ids 0-9), ``KEY`` (10, "the pass key is"), ``QUERY`` (11, "what is the
  pass key? the pass key is"), and ``filler_symbols`` filler words (ids 12 ..);
- the filler is one fixed sentence, the words ``12, 13, ..., 12 + filler_symbols - 1`` repeated
  (the paper's repeated sentences: predictable, carrying nothing), or with ``random_filler`` words
  drawn uniformly (a harder, unpredictable background);
- ``KEY d1 .. dn`` (n = ``n_digits``, uniform digits) is inserted into the filler at a uniform
  place, or at the fraction ``depth`` of it (0 = first, 1 = just before the question);
- the sequence ends with ``QUERY d1 .. dn``; the targets are the key's digits, read next-token
  (at ``QUERY`` the first digit, at each digit the next), -100 elsewhere: accuracy is per digit.

``data=passkey`` trains at ``trainer.seq_len``; ``test_seq_len`` draws the validation and test
splits at another length (the paper's 1x .. 16x of the training length), so one run trained at 64
and scored at 1,024 is ``trainer.seq_len=64 data.test_seq_len=1024``. The paper states the key
twice ("... Remember it. 12345 is the pass key."); here it appears once, the stricter form.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from zoo.config import IGNORE_INDEX, require
from zoo.data.base import TASK, check_split, seeded_generator
from zoo.data.synthetic import SyntheticTask

KEY, QUERY, FILLER = 10, 11, 12  # marker ids; filler words start at FILLER


def passkey_batch(
    batch_size: int,
    seq_len: int,
    *,
    n_digits: int = 5,
    filler_symbols: int = 16,
    random_filler: bool = False,
    depth: float = -1.0,
    generator: torch.Generator | None = None,
) -> dict[str, Tensor]:
    """One batch (see the module docstring). ``depth`` < 0: a uniform place per row.

    Returns ``{"tokens": [b, t], "targets": [b, t], "key": [b, n_digits], "where": [b]}``; ``where``
    is the position of each row's ``KEY`` marker."""
    require(n_digits >= 1, f"data.n_digits must be >= 1, got {n_digits}")
    require(filler_symbols >= 1, f"data.filler_symbols must be >= 1, got {filler_symbols}")
    require(depth <= 1.0, f"data.depth must be <= 1 (a fraction of the filler; < 0 = uniform), got {depth}")
    block = 1 + n_digits
    n_filler = seq_len - 2 * block
    require(n_filler >= 0, f"passkey needs a sequence length >= 2 * (1 + data.n_digits) = {2 * block}, got {seq_len}")
    key = torch.randint(0, 10, (batch_size, n_digits), generator=generator)
    if random_filler:
        filler = torch.randint(FILLER, FILLER + filler_symbols, (batch_size, n_filler), generator=generator)
    else:
        filler = (FILLER + torch.arange(n_filler) % filler_symbols).expand(batch_size, n_filler)
    if depth < 0:
        where = torch.randint(0, n_filler + 1, (batch_size,), generator=generator)
    else:
        where = torch.full((batch_size,), round(depth * n_filler))
    # row r: filler[:where] KEY key filler[where:], gathered from [filler | KEY key] by index (no loop)
    marked = torch.cat([filler, torch.full((batch_size, 1), KEY), key], dim=1)  # [b, n_filler + block]
    position = torch.arange(n_filler + block).expand(batch_size, -1)
    offset = position - where[:, None]  # 0 at the KEY marker
    source = torch.where(offset < 0, position, torch.where(offset < block, n_filler + offset, position - block))
    body = marked.gather(1, source)
    question = torch.cat([torch.full((batch_size, 1), QUERY), key], dim=1)
    tokens = torch.cat([body, question], dim=1)
    targets = torch.full_like(tokens, IGNORE_INDEX)
    targets[:, seq_len - block : seq_len - 1] = key  # QUERY -> d1, d1 -> d2, ...
    return {"tokens": tokens, "targets": targets, "key": key, "where": where}


@TASK.register("passkey")
class PasskeyTask(SyntheticTask):
    """Passkey retrieval (Mohtashami & Jaggi 2023, arXiv:2305.16300): a key of data.n_digits digits hidden
    in repeated filler, asked for at the end; accuracy per digit. data.test_seq_len scores val/test at
    another length (trained at trainer.seq_len); data.depth fixes where the key sits. Built in."""

    @dataclass
    class Options:
        n_digits: int = 5  # the paper's keys are numbers up to 50,000: five digits
        filler_symbols: int = 16  # words of the repeated filler sentence
        random_filler: bool = False  # filler words drawn at random instead of the repeated sentence
        depth: float = -1.0  # where the key sits in the filler, 0..1; < 0 = uniform per example
        test_seq_len: int = 0  # val/test sequence length; 0 = trainer.seq_len
        eval_size: int = 512  # sequences in each of the val and test splits

        def __post_init__(self) -> None:
            require(self.n_digits >= 1, f"data.n_digits must be >= 1, got {self.n_digits}")
            require(self.filler_symbols >= 1, f"data.filler_symbols must be >= 1, got {self.filler_symbols}")
            require(self.depth <= 1.0, f"data.depth must be <= 1 (< 0 = uniform), got {self.depth}")
            require(self.test_seq_len >= 0, f"data.test_seq_len must be >= 0 (0 = as trained), got {self.test_seq_len}")
            require(self.eval_size >= 1, f"data.eval_size must be >= 1, got {self.eval_size}")

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        o = self.options
        shortest = 2 * (1 + o.n_digits)
        for key, length in (("trainer.seq_len", self.seq_len), ("data.test_seq_len", self.split_len("test"))):
            require(length >= shortest, f"passkey needs {key} >= 2 * (1 + data.n_digits) = {shortest}, got {length}")
        self.vocab_size = FILLER + o.filler_symbols

    def split_len(self, split: str) -> int:
        return self.seq_len if split == "train" else (self.options.test_seq_len or self.seq_len)

    def batch(self, split: str, index: int, *, rank: int = 0, world_size: int = 1) -> dict[str, Tensor]:
        check_split(split, index=index, rank=rank, world_size=world_size)
        o = self.options
        out = passkey_batch(
            self.batch_size,
            self.split_len(split),
            n_digits=o.n_digits,
            filler_symbols=o.filler_symbols,
            random_filler=o.random_filler,
            depth=o.depth,
            generator=seeded_generator(self.seed, self.registry_name, split, index, rank, world_size),
        )
        return {"tokens": out["tokens"], "targets": out["targets"]}

    def describe(self) -> dict:
        return {**super().describe(), "test_seq_len": self.split_len("test")}
