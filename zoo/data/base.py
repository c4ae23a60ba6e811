"""The task contract every data set implements, and the task registry.

A task turns ``(split, index)`` into a batch, deterministically: batch ``index`` of the training
split is always the same tensors for the same seed, whatever happened before. That is what makes
resume exact (the data position is just the step counter) and data-parallel sharding trivial
(rank ``r`` of ``w`` takes its own rows). Batches are dicts of the model's call arguments:

- LM tasks (``kind = "lm"``): ``tokens`` [b, t] long, ``targets`` [b, t] long (-100 = not scored).
- classifier tasks: ``tokens`` [b, t], ``pad_mask`` [b, t] bool (True = real), ``targets`` [b].

``contiguous`` tasks (text streams) continue each batch row where the previous batch of the same
row stopped, so a model's segment memory (Transformer-XL) can be carried from step to step.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import Tensor

from zoo.config import NoOptions, build_options, check_type, require
from zoo.registry import Registry

SPLITS = ("train", "val", "test")
PROJECT_ROOT = Path(__file__).resolve().parents[2]


class DataFileNotFound(FileNotFoundError):
    """A data file a task needs is missing; the message names the path and the config key."""


def path_candidates(path: str | Path) -> list[Path]:
    """Where ``path`` may be: as given (absolute or relative to the working directory), else
    relative to the project root (so ``../shared/data/...`` works from anywhere)."""
    candidates = [Path(path).expanduser()]
    if not candidates[0].is_absolute():
        candidates.append(PROJECT_ROOT / candidates[0])
    return candidates


def resolve_path(path: str | Path, key: str = "data.path") -> Path:
    """Find the file ``path`` (see :func:`path_candidates`). Missing -> a clear error."""
    if not path:
        raise DataFileNotFound(f"no data file given: set {key}=/path/to/file")
    candidates = path_candidates(path)
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    tried = ", ".join(str(c.resolve()) for c in candidates)
    raise DataFileNotFound(f"data file not found: {path} (looked at {tried}); set {key}=/path/to/file")


def find_directory(path: str, key: str = "data.path") -> Path:
    """The directory ``path`` (as given, else relative to the project root), or a clear error."""
    if not path:
        raise DataFileNotFound(f"no data directory given: set {key}=/path/to/dir")
    for candidate in (Path(path).expanduser(), PROJECT_ROOT / path):
        if candidate.is_dir():
            return candidate
    raise DataFileNotFound(f"data directory not found: {path}; set {key}=/path/to/dir")


def seeded_generator(seed: int, *parts: Any) -> torch.Generator:
    """A torch generator seeded from ``(seed, *parts)`` by hashing, so (split, index, rank)
    streams never overlap and do not depend on the order batches are drawn in."""
    digest = hashlib.sha256(repr((int(seed),) + tuple(parts)).encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & ((1 << 63) - 1))


def seed_int(seed: int, *parts: Any) -> int:
    digest = hashlib.sha256(repr((int(seed),) + tuple(parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little")


class Task:
    """Base class. Subclasses set the class flags, an ``Options`` dataclass, ``vocab_size``
    (and ``n_classes`` for classifiers) and implement :meth:`batch`."""

    kind: ClassVar[str] = "lm"  # the model head it trains: lm | classifier | seq2seq
    metric: ClassVar[str] = "loss"  # the task metric: bpc | ppl | accuracy | loss
    contiguous: ClassVar[bool] = False  # consecutive batches continue the same streams
    # rank r of w ranks reading b rows reads rows r*b ... r*b + b - 1 of the w*b one reader would take, so a
    # run may change its number of ranks keeping b * w (a sharded checkpoint resumed on other ranks)
    rows_by_global_index: ClassVar[bool] = False
    Options: ClassVar[type] = NoOptions
    registry_name: ClassVar[str | None] = None
    # where the data set lives in the shared data directory (the app's ``data_dir``): its generated
    # conf/data/<name>.yaml sets data.path to ${data_dir}/<data_dir_path>; "" = no such default
    data_dir_path: ClassVar[str] = ""
    # named set-ups of this task (not inherited), each a ``data=<choice>`` of the app with its own
    # conf/data/<choice>.yaml: choice -> (what it is, in a line; option values, a ``path`` relative
    # to the data directory)
    setups: ClassVar[dict[str, tuple[str, dict[str, Any]]]] = {}

    vocab_size: int = 256
    n_classes: int = 0

    def __init__(self, *, batch_size: int, seq_len: int, seed: int = 0, **options: Any):
        name = self.registry_name or type(self).__name__
        for key, value in (("trainer.batch_size", batch_size), ("trainer.seq_len", seq_len), ("seed", seed)):
            check_type(value, int, key, f"data {name!r}")
        require(batch_size > 0, f"trainer.batch_size must be a positive int, got {batch_size!r}")
        require(seq_len > 0, f"trainer.seq_len must be a positive int, got {seq_len!r}")
        self.batch_size, self.seq_len, self.seed = batch_size, seq_len, int(seed)
        self.options = build_options(self.Options, options, f"data {name!r}", "data.")

    @property
    def higher_is_better(self) -> bool:
        return metric_higher_is_better(self.metric)

    def batch(self, split: str, index: int, *, rank: int = 0, world_size: int = 1) -> dict[str, Tensor]:
        raise NotImplementedError

    def file_rows(self, n: int, split: str, index: int, rank: int = 0, world_size: int = 1) -> torch.Tensor:
        """Row indices of batch ``index`` over ``n`` examples read from files: in training a seeded
        permutation per epoch walked batch by batch (each example once per epoch), else in order (wrapping)."""
        rows = self.batch_size * world_size
        offset = torch.arange(self.batch_size) + rank * self.batch_size
        if split == "train":
            epoch, position = divmod(index, max(1, n // rows))
            perm = torch.randperm(n, generator=seeded_generator(self.seed, f"{self.registry_name}-train", epoch))
            return perm[(offset + position * rows) % n]
        return (offset + index * rows) % n

    def num_batches(self, split: str, world_size: int = 1) -> int | None:
        """Batches in one pass over ``split`` (None: unbounded, e.g. generated on the fly)."""
        return None

    def starts_stream(self, index: int, split: str = "train") -> bool:
        """True when batch ``index`` of ``split`` of a contiguous task starts its streams over (memory reset)."""
        return index == 0

    def eval_batches(
        self, split: str, max_batches: int | None, *, rank: int = 0, world_size: int = 1
    ) -> Iterator[dict[str, Tensor]]:
        total = self.num_batches(split, world_size)
        n = total if max_batches in (None, 0) else (max_batches if total is None else min(total, max_batches))
        if n is None:
            raise ValueError(
                f"split {split!r} of data {self.registry_name!r} is unbounded: give a number of eval batches"
            )
        for index in range(n):
            yield self.batch(split, index, rank=rank, world_size=world_size)

    def model_overrides(self) -> dict[str, Any]:
        """Model config values the task dictates (vocabulary, classes)."""
        out: dict[str, Any] = {"vocab_size": self.vocab_size}
        if self.kind == "classifier":
            out["n_classes"] = self.n_classes
        return out

    def check_model(self, config: Any) -> None:
        """Refuse a model config this task cannot feed (e.g. a 2D block shape that is not the
        image's); called when the model is built for the task. Default: anything goes."""

    @classmethod
    def nominal_vocab_size(cls, options: dict[str, Any]) -> tuple[int, str]:
        """(vocabulary size, where it comes from) for a task configured with ``options``, without
        reading any file: what ``experiments/describe.py`` builds a model for when the data is absent."""
        return int(cls.vocab_size), f"{cls.registry_name}'s default vocabulary"

    def decode(self, tokens: list[int]) -> str:
        """Token ids -> readable text (for sample.py)."""
        return " ".join(str(t) for t in tokens)

    def encode(self, text: str) -> list[int]:
        raise ValueError(f"data {self.registry_name!r} has no text encoding; prompts need a text task")

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.registry_name,
            "kind": self.kind,
            "metric": self.metric,
            "vocab_size": self.vocab_size,
            "n_classes": self.n_classes,
            "seq_len": self.seq_len,
            "batch_size": self.batch_size,
        }


TASK: Registry[type[Task]] = Registry("task", Task)  # a registered task must subclass Task


def check_split(split: str, *, index: int | None = None, rank: int = 0, world_size: int = 1) -> None:
    """Refuse an unknown split, and (when given) a batch index, rank or world size that no batch has."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}; got {split!r}")
    check_type(world_size, int, "world_size")
    check_type(rank, int, "rank")
    require(
        world_size >= 1 and 0 <= rank < world_size,
        f"need world_size >= 1 and 0 <= rank < world_size; got rank={rank}, world_size={world_size}",
    )
    if index is not None:
        check_type(index, int, "index")
        require(index >= 0, f"batch index must be >= 0, got {index}")


def metric_higher_is_better(metric: str) -> bool:
    """Whether a larger value of the task metric is better (accuracy; bpc, bpd, ppl and loss are lower-better)."""
    return metric == "accuracy"


def metric_value(metric: str, nll_sum: float, correct: float, count: float) -> float:
    """The task metric from summed statistics (nats, correct predictions, scored items)."""
    if count <= 0:
        return float("nan")
    if metric in ("bpc", "bpd"):  # bits per character / per dimension (image intensities)
        return nll_sum / count / math.log(2)
    if metric == "ppl":
        return math.exp(min(nll_sum / count, 50.0))
    if metric == "accuracy":
        return correct / count
    return nll_sum / count


def create_task(name: str, *, batch_size: int, seq_len: int, seed: int = 0, **options: Any) -> Task:
    """Build a registered task: ``create_task("duplication", batch_size=8, seq_len=64)``."""
    return TASK.get(name)(batch_size=batch_size, seq_len=seq_len, seed=seed, **options)


def list_tasks(pattern: str = "*") -> list[str]:
    return TASK.list(pattern)
