"""Where a run's metrics go: ``metrics.jsonl`` (+ ``metrics.csv`` at the end) always, wandb when asked.

A logger is any object with ``log(metrics, step)`` and ``finish(summary)``; the trainer calls
``cut(step)`` on those that have it when a run resumes, so the file never repeats steps.
"""

from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path
from typing import IO, Any

from zoo.train.rundir import open_append, safe_path, write_text


class MetricsFile:
    """Every logged metric as JSON lines (``metrics.jsonl``), and a CSV of them at the end, so no
    run depends on wandb to be read. Written only inside ``run_dir``: a link there is refused."""

    def __init__(self, run_dir: str | Path):
        self.dir = Path(run_dir)
        self.jsonl = self.dir / "metrics.jsonl"
        self._f: IO | None = None  # opened at the first line, after the trainer has claimed the directory

    def rows(self) -> list[dict[str, Any]]:
        path = safe_path(self.dir, self.jsonl)
        if not path.is_file():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def cut(self, step: int) -> None:
        """Drop the lines logged after ``step`` (a resumed run logs them again)."""
        rows = self.rows()
        keep = [r for r in rows if r.get("step", 0) <= step]
        if len(keep) != len(rows):
            self.close()
            write_text(self.dir, self.jsonl, "".join(json.dumps(r) + "\n" for r in keep))

    def log(self, metrics: dict[str, Any], step: int) -> None:
        if self._f is None:
            self._f = open_append(self.dir, self.jsonl)
        self._f.write(json.dumps({"step": step, **metrics}) + "\n")
        self._f.flush()

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None

    def finish(self, summary: dict[str, Any]) -> None:
        self.close()
        rows = self.rows()
        keys = ["step"] + sorted({k for r in rows for k in r} - {"step"})
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=keys)
        writer.writeheader()
        writer.writerows(rows)
        write_text(self.dir, self.dir / "metrics.csv", buffer.getvalue())


# wandb's own directories (run files, its cache with wandb-core's debug logs, settings, staged data and
# artifacts) default to ~/.cache, ~/.config and ~/.local/share: pointed inside the run directory instead
WANDB_DIRS = {
    "WANDB_DIR": "",
    "WANDB_CACHE_DIR": "wandb/cache",
    "WANDB_CONFIG_DIR": "wandb/config",
    "WANDB_DATA_DIR": "wandb/data",
    "WANDB_ARTIFACT_DIR": "wandb/artifacts",
}
_pointed: dict[str, str] = {}  # the values this process set (a later run re-points them; the user's stay)


def point_wandb_into(run_dir: Path) -> None:
    """Point wandb's directories into ``run_dir`` so a run writes nothing outside it; one the user set
    in the environment is kept (what is set is what runs)."""
    for key, sub in WANDB_DIRS.items():
        if key in os.environ and _pointed.get(key) != os.environ[key]:
            continue
        os.environ[key] = _pointed[key] = str((Path(run_dir) / sub).absolute())


class WandbLogger:
    """wandb, ``mode=offline`` by default (no network, no account): the run is named from the
    command-line overrides, carries the full config, and a sweep's runs share a group. Everything
    wandb writes (its cache and debug logs too) stays inside the run directory (``point_wandb_into``).
    ``options``: the app's ``logger.*`` node (:class:`zoo.app.schema.LoggerOptions`); ``tags``: the
    run's (default: ``options.tags``)."""

    def __init__(
        self,
        options: Any,
        *,
        run_dir: Path,
        name: str,
        group: str,
        config: dict[str, Any],
        tags: list[str] | None = None,
    ):
        self.init_args = dict(
            project=options.project,
            entity=options.entity or None,
            mode=options.mode,
            dir=str(run_dir),
            name=name,
            group=options.group or group or None,
            tags=list(dict.fromkeys(options.tags if tags is None else tags)) or None,
            config=config,
        )
        self._run: Any = None  # started at the first line, after the trainer has claimed the directory

    @property
    def run(self) -> Any:
        if self._run is None:
            os.environ.setdefault("WANDB_SILENT", "true")
            point_wandb_into(Path(self.init_args["dir"]))
            import wandb

            settings = wandb.Settings(silent=True, console="off")
            self._run = wandb.init(**self.init_args, reinit="finish_previous", settings=settings)
        return self._run

    def log(self, metrics: dict[str, Any], step: int) -> None:
        self.run.log(metrics, step=step)

    def finish(self, summary: dict[str, Any]) -> None:
        for key, value in summary.items():
            if isinstance(value, (int, float, str, bool)) or value is None:
                self.run.summary[key] = value
        self.run.finish()
        import wandb

        wandb.teardown()  # its service read this run's directories: the next run starts its own
