"""A sweep directory's own record, so that a multirun can be resumed and summarised whole.

Hydra cannot resume a multirun (hydra#3328): it knows nothing of a sweep directory once a launch
ends. Two files here keep what it forgets:

- ``sweep.json``, written once by the sweep's first launch (an exclusive create: of two launches
  racing into one directory, one gets it): the sweep's id and *what it sweeps*, i.e. the
  command line's overrides (less :data:`LAUNCH_ONLY`) and the sweeper with its parameters. A
  launch into a directory holding it is refused unless it resumes (``sweep.resume=true``) with the
  same sweep; a changed one is refused with the difference. Refusals write nothing anywhere.
- ``sweep_jobs/<num>.json``, one per job, rewritten by the job as it goes: its overrides, its
  directory (from the sweep directory's), the search it is a trial of, and its status
  (``started``, ``finished``, ``resumed``, ``kept``, ``failed: ...``, ``refused: ...``). The
  summary lists exactly these jobs, so jobs left in the directory by anything else never reach it,
  and a job that died leaves ``started`` behind.

The errors end a launch with a message and an exit status (:func:`zoo.app.compose.launch`). They
derive from ``BaseException`` because Hydra runs callbacks under ``except Exception`` and turns
what they raise into a warning: a refusal raised as an ``Exception`` would let the sweep go on.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

from zoo.train.rundir import write_text

MANIFEST = "sweep.json"
JOBS_DIR = "sweep_jobs"
# overrides that change no job's result: a resumed launch may differ in them
LAUNCH_ONLY = ("sweep.resume", "sweep.baseline", "trainer.progress", "trainer.threads")


class LaunchRefused(BaseException):
    """A launch that would mix two sweeps in one directory; nothing was written. Exit status 2."""


class SweepIncomplete(BaseException):
    """Some jobs of the sweep failed, were refused or died; the summary was written. Exit status 1."""


def override_key(override: str) -> str:
    return str(override).split("=", 1)[0].lstrip("+~")


def comparable(overrides: list[str]) -> list[str]:
    """``overrides`` without the launch-only keys: what decides the jobs' results."""
    return [str(o) for o in overrides if override_key(o) not in LAUNCH_ONLY]


def sweep_identity(config: Any) -> dict[str, Any]:
    """What a multirun sweeps, from Hydra's config at its start: the command line's overrides (less
    the launch-only ones) and the sweeper with its parameters (from a ``sweep=`` file, a
    ``hydra.sweeper.params...`` override or the command line alike)."""
    from omegaconf import OmegaConf

    sweeper = OmegaConf.to_container(config.hydra.sweeper, resolve=False)
    return {
        "overrides": comparable(list(config.hydra.overrides.task)),
        "sweeper": json.loads(json.dumps(sweeper, default=str)),
    }


def identity_diff(before: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """Readable differences between two :func:`sweep_identity` records."""
    out = []
    old, new = before.get("overrides", []), now.get("overrides", [])
    out += [f"- {o}  (first launch only)" for o in old if o not in new]
    out += [f"+ {o}  (this launch only)" for o in new if o not in old]
    if not out and old != new:
        out.append(f"order: first launch {' '.join(old)}; this launch {' '.join(new)}")
    sweeper_old, sweeper_new = before.get("sweeper", {}), now.get("sweeper", {})
    for key in sorted(set(sweeper_old) | set(sweeper_new)):
        if sweeper_old.get(key) != sweeper_new.get(key):
            out.append(
                f"hydra.sweeper.{key}: first launch {sweeper_old.get(key)!r}; this launch {sweeper_new.get(key)!r}"
            )
    return out


def read_manifest(sweep_dir: str | Path) -> dict[str, Any] | None:
    path = Path(sweep_dir) / MANIFEST
    return json.loads(path.read_text()) if path.is_file() else None


def open_sweep(sweep_dir: str | Path, identity: dict[str, Any], *, resume: bool, baseline: str = "") -> dict[str, Any]:
    """The record of the sweep this launch runs: a new one (``baseline``: the summary's, kept for
    the launches that resume it without naming one), or (``resume``) the directory's own when it
    sweeps the same thing. Anything else is refused before anything is written."""
    sweep_dir = Path(sweep_dir)
    manifest = read_manifest(sweep_dir)
    if manifest is not None:
        if not resume:
            swept = " ".join(manifest["overrides"]) or "no overrides"
            raise LaunchRefused(
                f"sweep directory {sweep_dir} already holds a sweep ({swept}); continue it with "
                "sweep.resume=true, or launch into another hydra.sweep.dir"
            )
        diff = identity_diff(manifest, identity)
        if diff:
            raise LaunchRefused(
                f"sweep.resume=true continues the sweep in {sweep_dir} as it was launched, but this launch "
                "sweeps something else:\n  "
                + "\n  ".join(diff)
                + "\nlaunch it as before, or into another hydra.sweep.dir"
            )
        return manifest
    manifest = {"id": uuid.uuid4().hex, **identity, "baseline": baseline}
    sweep_dir.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(sweep_dir / MANIFEST, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
    except FileExistsError:
        raise LaunchRefused(
            f"another launch started a sweep in {sweep_dir} at the same moment; nothing written"
        ) from None
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(manifest, indent=2) + "\n")
    return manifest


def record_job(sweep_dir: str | Path, num: int, **entry: Any) -> None:
    """Write (or rewrite) job ``num``'s entry (atomic: a reader sees the old entry or the new one)."""
    sweep_dir = Path(sweep_dir)
    write_text(sweep_dir, sweep_dir / JOBS_DIR / f"{num}.json", json.dumps({"num": num, **entry}, indent=2))


def read_jobs(sweep_dir: str | Path) -> list[dict[str, Any]]:
    """Every job entry of the sweep, by job number."""
    folder = Path(sweep_dir) / JOBS_DIR
    entries = [json.loads(p.read_text()) for p in folder.glob("*.json")] if folder.is_dir() else []
    return sorted(entries, key=lambda e: e["num"])


def unfinished(jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The jobs that did not end with a result: failed, refused, or died (left ``started``)."""
    return [j for j in jobs if j["status"] not in ("finished", "resumed", "kept")]
