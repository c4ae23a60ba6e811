"""Multi-query associative recall (MQAR) as Zoology generates it.

Arora, Eyuboglu et al. 2023, "Zoology: Measuring and Improving Recall in Efficient Language
Models", arXiv:2312.04927, Section 3 (the generator of HazyResearch/zoology's
``zoology/data/multiquery_ar.py``, re-written here; a test checks it token for token against that
file for the same seed). One example of length ``t``:

- the context: ``num_kv_pairs`` pairs ``k1 v1 k2 v2 ...``; keys drawn without replacement from
  ``1 .. V/2 - 1`` (each key once per example), values without replacement from ``V/2 .. V - 1``
  (the two halves of the vocabulary never meet);
- the rest, ``t - 2 n`` positions read as ``(t - 2 n) / 2`` slots of two tokens: each key is asked
  once, at the first token of a slot whose index ``g`` (the gap) is drawn without replacement with
  probability proportional to ``a * g'**(a - 1)``, ``g' = g + 1`` (a power law, ``power_a = a``;
  ``a = 1`` is uniform, small ``a`` puts queries near the context, as repeated bigrams are in text);
- every other position holds 0, or with ``random_non_queries`` a token drawn uniformly from the
  whole vocabulary (so a query key may also appear as noise, exactly as in Zoology);
- targets: the value bound to the key at each query position (next-token prediction: the model
  reads the key and answers its value), -100 everywhere else; accuracy is over the queries only.

The random streams are Zoology's: a NumPy ``RandomState(seed)`` draws keys row by row, then values,
then gaps, and a torch generator seeded with ``seed`` draws the random non-queries in one call over
the whole batch. ``num_queries`` below ``num_kv_pairs`` asks only the first keys of each example
(``num_queries = 1`` is the single-query variant, Zoology's Figure 4 ablations and the classic
associative recall of Ba et al. 2016); at ``num_queries = num_kv_pairs`` the tokens are Zoology's.

``data=mqar`` trains on it: every batch is drawn afresh from a seed hashed from (seed, split,
index, rank), so the train split is unbounded and the validation/test splits are fixed.
``test_seq_len`` / ``test_num_kv_pairs`` draw the validation and test splits at another length and
number of pairs than training (the length-extrapolation variant of Zoology's ``ar_extrapolate``:
trained on one configuration, scored on another).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from zoo.config import IGNORE_INDEX, require
from zoo.data.base import TASK, check_split, seed_int
from zoo.data.synthetic import SyntheticTask


def power_law_gaps(space: int, power_a: float) -> np.ndarray:
    """Probability of each of the ``space`` query slots: ``a * g**(a - 1)`` for g = 1..space, normalised."""
    p = power_a * np.arange(1, space + 1) ** (power_a - 1)
    return p / p.sum()


def check_mqar(vocab_size: int, seq_len: int, num_kv_pairs: int, num_queries: int) -> None:
    """Refuse a configuration no example fits, naming the option."""
    require(seq_len % 2 == 0, f"mqar needs an even sequence length, got {seq_len}")
    require(vocab_size > seq_len, f"mqar needs data.vocab_size > sequence length ({seq_len}), got {vocab_size}")
    require(num_kv_pairs >= 1, f"data.num_kv_pairs must be >= 1, got {num_kv_pairs}")
    require(
        num_kv_pairs < vocab_size // 2,
        f"data.num_kv_pairs ({num_kv_pairs}) must be below data.vocab_size / 2 ({vocab_size // 2}): keys are distinct",
    )
    require(
        4 * num_kv_pairs <= seq_len,
        f"mqar needs 4 * data.num_kv_pairs <= sequence length: {num_kv_pairs} pairs need {4 * num_kv_pairs} "
        f"tokens, got {seq_len}",
    )
    require(
        1 <= num_queries <= num_kv_pairs,
        f"data.num_queries must be in [1, data.num_kv_pairs={num_kv_pairs}], got {num_queries}",
    )


def mqar_batch(
    num_examples: int,
    seq_len: int,
    *,
    seed: int,
    vocab_size: int = 8192,
    num_kv_pairs: int = 8,
    power_a: float = 0.01,
    random_non_queries: bool = True,
    num_queries: int | None = None,
) -> dict[str, Tensor]:
    """``num_examples`` MQAR examples (see the module docstring), deterministic in ``seed`` (< 2**32).

    Returns ``{"tokens": [b, t] long, "targets": [b, t] long}`` (targets -100 except at queries)."""
    num_queries = num_kv_pairs if num_queries is None else num_queries
    check_mqar(vocab_size, seq_len, num_kv_pairs, num_queries)
    rng = np.random.RandomState(seed)
    half = vocab_size // 2
    # one draw per example, in Zoology's order (all keys, then all values, then all gaps)
    keys = np.stack([rng.choice(np.arange(1, half), size=num_kv_pairs, replace=False) for _ in range(num_examples)])
    values = np.stack(
        [rng.choice(np.arange(half, vocab_size), size=num_kv_pairs, replace=False) for _ in range(num_examples)]
    )
    context = 2 * num_kv_pairs
    space = (seq_len - context) // 2  # query slots of two tokens after the context
    p = power_law_gaps(space, power_a)
    gaps = np.stack([rng.choice(np.arange(space), size=num_queries, replace=False, p=p) for _ in range(num_examples)])
    tokens = np.zeros((num_examples, seq_len), dtype=np.int64)
    tokens[:, 0:context:2], tokens[:, 1:context:2] = keys, values
    where = context + 2 * gaps  # [b, q]: the query keys' positions
    np.put_along_axis(tokens, where, keys[:, :num_queries], axis=1)
    targets = np.full((num_examples, seq_len), IGNORE_INDEX, dtype=np.int64)
    np.put_along_axis(targets, where, values[:, :num_queries], axis=1)  # read the key, answer its value
    tokens, targets = torch.from_numpy(tokens), torch.from_numpy(targets)
    if random_non_queries:
        noise = torch.randint(vocab_size, tokens.shape, generator=torch.Generator().manual_seed(seed))
        tokens = torch.where(tokens == 0, noise, tokens)
    return {"tokens": tokens, "targets": targets}


@TASK.register("mqar")
class MQARTask(SyntheticTask):
    """Multi-query associative recall as Zoology generates it (arXiv:2312.04927): key-value pairs from
    disjoint halves of the vocabulary, each key asked once at a power-law gap; accuracy over the queries.
    data.test_seq_len / data.test_num_kv_pairs score val/test at another length (Zoology's ar_extrapolate);
    data.num_queries=1 is the single-query variant. Built in, no download."""

    @dataclass
    class Options:
        vocab_size: int = 8192  # Zoology's default: large vocabularies separate the mechanisms
        num_kv_pairs: int = 8
        power_a: float = 0.01  # the gap law's exponent (1.0 = uniform gaps)
        random_non_queries: bool = True  # fill the non-query positions with random tokens (else 0)
        num_queries: int = 0  # keys asked per example; 0 = every key (Zoology), 1 = single query
        test_seq_len: int = 0  # val/test sequence length; 0 = trainer.seq_len
        test_num_kv_pairs: int = 0  # val/test pairs; 0 = data.num_kv_pairs
        eval_size: int = 1024  # sequences in each of the val and test splits

        def __post_init__(self) -> None:
            require(self.power_a > 0, f"data.power_a must be > 0, got {self.power_a}")
            for key in ("num_queries", "test_seq_len", "test_num_kv_pairs"):
                require(getattr(self, key) >= 0, f"data.{key} must be >= 0 (0 = as trained), got {getattr(self, key)}")
            require(self.eval_size >= 1, f"data.eval_size must be >= 1, got {self.eval_size}")

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.vocab_size = self.options.vocab_size
        for split in ("train", "test"):
            check_mqar(self.vocab_size, *self.shape(split))

    def shape(self, split: str) -> tuple[int, int, int]:
        """(sequence length, pairs, queries) of ``split``: the test configuration for val and test."""
        o = self.options
        seq_len, pairs = self.seq_len, o.num_kv_pairs
        if split != "train":
            seq_len, pairs = o.test_seq_len or seq_len, o.test_num_kv_pairs or pairs
        return seq_len, pairs, min(o.num_queries, pairs) if o.num_queries else pairs

    def batch(self, split: str, index: int, *, rank: int = 0, world_size: int = 1) -> dict[str, Tensor]:
        check_split(split, index=index, rank=rank, world_size=world_size)
        o = self.options
        seq_len, pairs, queries = self.shape(split)
        return mqar_batch(
            self.batch_size,
            seq_len,
            seed=seed_int(self.seed, self.registry_name, split, index, rank, world_size) % 2**32,
            vocab_size=o.vocab_size,
            num_kv_pairs=pairs,
            power_a=o.power_a,
            random_non_queries=o.random_non_queries,
            num_queries=queries,
        )

    def describe(self) -> dict:
        seq_len, pairs, queries = self.shape("test")
        return {**super().describe(), "test_seq_len": seq_len, "test_num_kv_pairs": pairs, "num_queries": queries}
