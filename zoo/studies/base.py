"""The study axis: a reproduction as a registered part, launched like a training run.

A study answers one question (a paper's claim, a comparison) by running things through the zoo's own
machinery and reporting rows. It has three parts, each a method a reader can read top to bottom:

- ``Options``: the dataclass of what can be set (seeds, steps, lengths ...), type-checked like every
  part's options and generated into ``conf/study/<name>.yaml`` by ``experiments/sync_configs.py``.
- ``run()``: what it trains and measures. Training goes through the app (``experiments/train.py``, so
  resume, checkpoints, loggers and ``imports=`` are the training run's) via :func:`zoo.studies.common.train`;
  each finished measurement is appended to ``rows.csv`` at once, so a killed study keeps what it had and
  a restart skips it (:class:`zoo.studies.common.Rows`).
- ``report(rows)``: the table, figures and verdict, from the rows alone, so an hours-long study
  re-renders without re-running (``report_only=true``).

Every study writes ``results/<name>/`` (or ``out=``): ``README.md`` (the hand-written question, setting
and budget, plus the generated block with the exact command, the table and the verdict), ``rows.csv``
and its figures as PNG. ``experiments/study.py study=<name> ...`` launches any of them through Hydra
(overrides, ``-m`` multiruns, launchers, ``imports=``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar

from zoo.config import NoOptions, build_options
from zoo.registry import Registry


@dataclass
class StudyPaths:
    """Where a study writes: ``out`` its committed results, ``runs`` its training runs (not committed)."""

    out: Path
    runs: Path


class Study:
    """Base class of a registered study: ``Options``, ``run()`` (rows), ``report(rows)`` (markdown)."""

    Options: ClassVar[type] = NoOptions
    registry_name: ClassVar[str | None] = None
    question: ClassVar[str] = ""  # one line: what the study answers (shown in the generated README block)
    figures: ClassVar[tuple[str, ...]] = ()  # the PNG files report() writes into out/, by name
    # options that run the whole study (train, measure, report) in seconds: the contract test runs every
    # registered study with them, through the same code path as the full size
    toy_options: ClassVar[dict[str, Any]] = {}

    def __init__(self, options: Any, paths: StudyPaths, *, threads: int = 1, command: str = ""):
        self.options = options
        self.paths = paths
        self.threads = threads
        self.command = command or f"python experiments/study.py study={self.registry_name}"

    @property
    def rows_path(self) -> Path:
        return self.paths.out / "rows.csv"

    def run(self) -> None:
        """Train and measure, appending each finished row to ``rows.csv`` (skipping rows already there)."""
        raise NotImplementedError(f"study {self.registry_name!r} does not say what it runs")

    def report(self, rows: list[dict[str, str]]) -> str:
        """Figures into ``paths.out`` and the markdown block (table + verdict) from ``rows`` alone."""
        raise NotImplementedError(f"study {self.registry_name!r} does not say how it reports")

    def settings(self) -> dict[str, Any]:
        """The study's options as plain values (what the report states as its setting)."""
        return asdict(self.options)


STUDY: Registry[Study] = Registry("study", Study)


def create_study(name: str, paths: StudyPaths, *, threads: int = 1, command: str = "", **options: Any) -> Study:
    """Build the registered study ``name`` with its options checked (unknown keys: did-you-mean)."""
    cls = STUDY.get(name)
    built = build_options(cls.Options, options, f"study {name!r}", key_prefix="study.")
    return cls(built, paths, threads=threads, command=command)
