"""One job of a multirun: what it does in its directory, running it, and recording what became of it.

``experiments/train.py`` calls :func:`run_job` for every job of a multirun (a single run goes to
:func:`zoo.app.run.run` directly). What a job does depends on what its directory holds
(:func:`decide`):

- no run: the job runs;
- this job's own run (the same sweep, the same overrides), the launch resuming (``sweep.resume``):
  a finished run is kept as it is (its recorded metric is returned to the sweeper); any other is
  resumed from its own ``last.pt`` (``trainer.resume=auto``: exact, as a single run resumes), or
  started again if it saved none;
- anything else (a run when not resuming, another sweep's or another job's run): the job is
  refused, and nothing is written into the directory.

A job that fails is recorded as failed (its error in ``error.txt``) and the sweep goes on: one
failing variant must not lose the others. Every outcome goes to the sweep's job record
(:mod:`zoo.app.sweep_dir`), and the launch ends non-zero naming the jobs that did not finish.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, open_dict

from zoo.app.run import HYDRA_RECORD, run, save_hydra_record
from zoo.app.sweep_dir import comparable, read_manifest, record_job
from zoo.train.rundir import RUN_ARTEFACTS, RunDirError, claim, write_text

MARKER = "multirun_id"  # in a job's .hydra/: the id of the sweep whose job made the run
FINISHED = ("finished", "resumed", "kept")


@dataclass
class Job:
    """Where a multirun job runs and what it was asked (from Hydra)."""

    num: int
    sweep_dir: Path
    dir: Path
    overrides: list[str]  # the job's overrides less the launch-only ones

    @classmethod
    def from_hydra(cls) -> Job:
        from hydra.core.hydra_config import HydraConfig

        hydra = HydraConfig.get()
        return cls(
            num=int(hydra.job.num),
            sweep_dir=Path(hydra.sweep.dir),
            dir=Path(hydra.runtime.output_dir),
            overrides=comparable(list(hydra.overrides.task)),
        )

    def relative_dir(self) -> str:
        """The job's directory from the sweep directory's (``3``): a sweep directory moved or copied
        elsewhere still finds its jobs, and its summary names no machine path."""
        try:
            return str(self.dir.resolve().relative_to(self.sweep_dir.resolve()))
        except ValueError:  # a hydra.sweep.subdir outside the sweep directory
            return str(self.dir)


def recorded_overrides(job_dir: Path) -> list[str] | None:
    path = job_dir / HYDRA_RECORD / "overrides.yaml"
    return comparable(yaml.safe_load(path.read_text()) or []) if path.is_file() else None


def read_result(job_dir: Path) -> dict[str, Any] | None:
    path = job_dir / "result.json"
    return json.loads(path.read_text()) if path.is_file() else None


def decide(job: Job, sweep_id: str, *, resume: bool) -> tuple[str, str]:
    """(``run`` | ``resume`` | ``keep`` | ``refuse``, why) for ``job`` in its directory."""
    found = [name for name in RUN_ARTEFACTS if os.path.lexists(job.dir / name)]
    if not found:
        return "run", ""
    marker = job.dir / HYDRA_RECORD / MARKER
    if not resume:
        return "refuse", f"{job.dir} already holds a run ({', '.join(found)}); resume the sweep with sweep.resume=true"
    if not marker.is_file() or marker.read_text().strip() != sweep_id:
        return "refuse", f"{job.dir} holds a run of another sweep (or of none); its files are left as they are"
    recorded = recorded_overrides(job.dir)
    if recorded != job.overrides:
        return "refuse", (
            f"{job.dir} holds another job's run ({' '.join(recorded or [])}), not this job's "
            f"({' '.join(job.overrides)}); its files are left as they are"
        )
    result = read_result(job.dir)
    if result is not None and result.get("status") == "finished":
        return "keep", ""
    return "resume", ""


def mark(run_dir: Path, sweep_id: str) -> None:
    """The job's run belongs to sweep ``sweep_id`` (what :func:`decide` reads when it is resumed)."""
    write_text(run_dir, run_dir / HYDRA_RECORD / MARKER, sweep_id + "\n")


def record_failure(job_dir: Path, cfg: DictConfig, exc: BaseException, on_claimed: Any) -> None:
    """``error.txt``, a failed ``result.json`` (and ``config.json`` when the run wrote none), in the
    job's directory, claimed for the writing (a run that took it meanwhile keeps it untouched)."""
    held = claim(job_dir, resuming=True)
    try:
        save_hydra_record(job_dir, cfg)
        if on_claimed is not None:
            on_claimed(job_dir)
        write_text(job_dir, job_dir / "error.txt", traceback.format_exc())
        failed = {
            "status": f"failed: {type(exc).__name__}: {exc}"[:300],
            "model": cfg.model.preset,
            "data": cfg.data.name,
            "final_metric": float("nan"),
        }
        write_text(job_dir, job_dir / "result.json", json.dumps(failed))
        if not (job_dir / "config.json").exists():
            write_text(job_dir, job_dir / "config.json", json.dumps({"run": job_dir.name}))
    finally:
        held.release()


def run_job(cfg: DictConfig) -> float:
    """Run one job of a multirun (see the module's docstring); returns its final metric (NaN when
    it did not finish: failed or refused)."""
    job = Job.from_hydra()
    manifest = read_manifest(job.sweep_dir)  # none: a sweep without the summary callback
    sweep_id = manifest["id"] if manifest else ""
    action, why = decide(job, sweep_id, resume=bool(cfg.sweep.resume)) if manifest else ("run", "")
    entry = dict(overrides=job.overrides, dir=job.relative_dir(), search=cfg.sweep.search)

    def record(status: str) -> None:
        if manifest:  # else nowhere to record
            record_job(job.sweep_dir, job.num, **entry, status=status)

    if action == "refuse":
        print(f"job {job.num} refused: {why}", file=sys.stderr)
        record(status=f"refused: {why}")
        return float("nan")
    if action == "keep":
        record(status="kept")
        return float(read_result(job.dir)["final_metric"])
    if action == "resume":
        with open_dict(cfg):
            cfg.trainer.resume = "auto"
    on_claimed = functools.partial(mark, sweep_id=sweep_id) if manifest else None
    record(status="started")
    try:
        metric = run(cfg, on_claimed=on_claimed)
    except KeyboardInterrupt:  # the job's record stays "started": the next launch resumes it
        print(
            f"\nthe multirun stopped in job {job.num}; continue it with the same command and sweep.resume=true "
            f"(hydra.sweep.dir={job.sweep_dir})",
            file=sys.stderr,
        )
        raise
    except RunDirError as exc:  # another run took the directory first: write nothing into it
        print(f"job {job.num} refused: {exc}", file=sys.stderr)
        record(status=f"refused: {exc}")
        return float("nan")
    except Exception as exc:  # noqa: BLE001 - any failure of one variant: record it, go on
        try:
            record_failure(job.dir, cfg, exc, on_claimed)
        except RunDirError:
            pass  # the directory was taken meanwhile: leave it alone
        print(f"job {job.num} failed ({type(exc).__name__}: {exc}); see {job.dir / 'error.txt'}", file=sys.stderr)
        record(status=f"failed: {type(exc).__name__}: {exc}"[:300])
        return float("nan")
    result = read_result(job.dir) or {}
    record(status="resumed" if result.get("resumed_at_step") is not None else "finished")
    return metric
