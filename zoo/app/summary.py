"""Gathering a multirun into one comparison: ``summary.md``, ``summary.csv`` (one row per job),
``summary_variants.csv`` (one row per variant, seeds aggregated) and ``summary.png``.

``SweepSummary`` is a Hydra callback registered in ``conf/config.yaml``. At the start of a multirun
it opens the sweep's record (:mod:`zoo.app.sweep_dir`: a launch that would mix two sweeps in one
directory is refused there, before anything is written); at the end it writes the summary of every
job of the sweep, finished in this launch or an earlier one, each once, with its status, and ends
the launch non-zero naming the jobs that did not finish.

A job's row is its ``result.json`` (status, final and best metric, tokens/s, memory, parameters),
its ``config.json`` (tags) and its overrides. Every key whose value differs between the jobs
(``residual=...``, ``attention.max_span=...``, ``seed=...``, any override) becomes a column.
Jobs differing only by ``seed`` are one variant: :mod:`zoo.app.aggregate` gives each its mean and
95% interval, and with ``sweep.baseline`` its difference to the baseline and the verdict.

It also works after the fact: ``python -c "from zoo.app.summary import write_summary;
write_summary('multirun/...', baseline='attention:vanilla')"`` (a directory written before the
sweep record existed: every ``result.json`` in it, or one multirun's by its ``multirun_id``).
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

try:  # the callback base class; the module stays importable without Hydra for write_summary
    from hydra.experimental.callback import Callback
except ImportError:  # pragma: no cover
    Callback = object  # type: ignore[misc,assignment]

from zoo.app.aggregate import FINISHED, VARIANT_FREE, aggregate, parse_baseline
from zoo.app.sweep_dir import (
    LaunchRefused,
    SweepIncomplete,
    open_sweep,
    override_key,
    read_jobs,
    read_manifest,
    sweep_identity,
    unfinished,
)
from zoo.app.sweep_plot import plot
from zoo.app.sweep_tables import job_table, search_tables, variant_rows, variant_table, verdict_lines

# throughput and memory as zoo.bench names and measures them (zoo.train.activation_meter): tokens_per_s = tokens of a
# forward + backward over its seconds, median after the first step; act_mib = MiB saved for backward
# in one step (ActivationMeter); gpu_peak_mib = CUDA max allocated (blank on CPU). Process RSS is
# shared by every run of an in-process sweep, so it cannot compare runs and is not a column.
COLUMNS = [
    "run",
    "model",
    "attention",
    "data",
    "seed",
    "status",
    "metric_name",
    "final_metric",
    "best_metric",
    "steps",
    "stop_reason",
    "tokens_per_s",
    "act_mib",
    "gpu_peak_mib",
    "params",
    "wall_s",
    "tags",
]
LEGACY_KEYS = {"act_mib": "activations_mb", "gpu_peak_mib": "peak_mb"}  # result.json written before the rename
MULTIRUN_ID = "multirun_id"  # a job's .hydra/ marker (and the sweep directory's, before the sweep record)


def overrides_dict(overrides: list[str]) -> dict[str, str]:
    """``["residual=pre_norm", "seed=1"]`` -> ``{"residual": "pre_norm", "seed": "1"}``."""
    return {override_key(o): str(o).partition("=")[2] for o in overrides}


def read_json(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.is_file() else None


def result_row(result: dict[str, Any], job_dir: Path) -> dict[str, Any]:
    row = {key: result.get(key, result.get(LEGACY_KEYS.get(key, key))) for key in COLUMNS}
    config = (read_json(job_dir / "config.json") or {}).get("config") or {}
    row["tags"] = " ".join(config.get("tags") or []) or None
    return row


def job_status(entry: dict[str, Any], result: dict[str, Any] | None) -> str:
    status = entry["status"]
    if status == "kept":
        return "finished (kept from an earlier launch)"
    if status == "resumed":
        return f"finished (resumed at step {(result or {}).get('resumed_at_step')})"
    if status == "started":  # the job died: before its result, or (rarely) just after it
        if result and result.get("status") == "finished":
            return "finished"
        return "interrupted (no result: the job died; sweep.resume=true continues it)"
    if status.startswith("failed") and result and str(result.get("status", "")).startswith("failed"):
        return str(result["status"])
    return status


def job_row(sweep_dir: Path, entry: dict[str, Any]) -> dict[str, Any]:
    """A job of the sweep record: its result (none for a refused job, whose directory holds another
    run), its status, its overrides."""
    job_dir = sweep_dir / entry["dir"]
    status = entry["status"]
    result = None if status.startswith("refused") else read_json(job_dir / "result.json")
    row = result_row(result, job_dir) if result else {key: None for key in COLUMNS}
    overrides = overrides_dict(entry["overrides"])
    for key in ("model", "attention", "data", "seed"):
        if row.get(key) is None and key in overrides:
            row[key] = overrides[key]
    row.update(run=f"{entry['num']}:{','.join(entry['overrides'])}", dir=str(job_dir), overrides=overrides)
    row["status"] = job_status(entry, result)
    row["higher_is_better"] = (result or {}).get("higher_is_better")
    row["search"] = entry.get("search") or ""
    return row


def job_marker(job_dir: Path) -> Path:
    return job_dir / ".hydra" / MULTIRUN_ID if (job_dir / ".hydra").is_dir() else job_dir / MULTIRUN_ID


def of_multirun(result_path: Path, multirun_id: str) -> bool:
    """(Directories without a sweep record.) The result was written by a job of multirun
    ``multirun_id``, and is not older than the job's marker."""
    marker = job_marker(result_path.parent)
    if not marker.is_file() or marker.read_text().strip() != multirun_id:
        return False
    return result_path.stat().st_mtime >= marker.stat().st_mtime


def gather_unrecorded(sweep_dir: Path, multirun_id: str | None = None) -> list[dict[str, Any]]:
    """One row per ``result.json`` under a sweep directory that has no sweep record: all of them,
    or one multirun's (``multirun_id``; default: the one the directory names, if any)."""
    import yaml

    if multirun_id is None and (sweep_dir / MULTIRUN_ID).is_file():
        multirun_id = (sweep_dir / MULTIRUN_ID).read_text().strip()
    rows = []
    for result_path in sorted(sweep_dir.rglob("result.json"), key=lambda p: (len(p.parts), str(p))):
        if multirun_id and not of_multirun(result_path, multirun_id):
            continue
        result = json.loads(result_path.read_text())
        row = result_row(result, result_path.parent)
        row.update(run=(read_json(result_path.with_name("config.json")) or {}).get("run", result_path.parent.name))
        overrides_path = result_path.parent / ".hydra" / "overrides.yaml"
        overrides = yaml.safe_load(overrides_path.read_text()) if overrides_path.is_file() else []
        row.update(dir=str(result_path.parent), overrides=overrides_dict(overrides or []))
        row["higher_is_better"] = result.get("higher_is_better")
        config = (read_json(result_path.with_name("config.json")) or {}).get("config") or {}
        row["search"] = (config.get("sweep") or {}).get("search") or ""
        rows.append(row)
    return rows


def gather(sweep_dir: str | Path, multirun_id: str | None = None) -> list[dict[str, Any]]:
    """One row per job of the sweep (its record), else per result found (see :func:`gather_unrecorded`)."""
    sweep_dir = Path(sweep_dir)
    jobs = read_jobs(sweep_dir)
    return [job_row(sweep_dir, entry) for entry in jobs] if jobs else gather_unrecorded(sweep_dir, multirun_id)


def varied_keys(rows: list[dict[str, Any]]) -> list[str]:
    """The override keys whose value is not the same in every job (in first-seen order): what the
    sweep compares. Each becomes a column holding the job's value (blank where a job lacks it)."""
    keys = list(dict.fromkeys(k for r in rows for k in r.get("overrides", {})))
    return [k for k in keys if len({r.get("overrides", {}).get(k) for r in rows}) > 1]


def add_varied_columns(rows: list[dict[str, Any]]) -> list[str]:
    """Put each varied key's value into its rows; returns the new column names (the result's own
    model/attention/data/seed columns already hold what ran for those keys)."""
    extra = [k for k in varied_keys(rows) if k not in COLUMNS]
    for r in rows:
        for key in extra:
            r[key] = r.get("overrides", {}).get(key, "")
    return extra


def short_names(rows: list[dict[str, Any]]) -> None:
    """Drop the overrides every run shares from the run names (``3:model=x,trainer.max_steps=300``
    -> ``3:model=x``): the table shows what varies."""
    split = []
    for r in rows:
        num, _, rest = str(r["run"]).partition(":") if ":" in str(r["run"]) else ("", "", str(r["run"]))
        split.append((num, [item for item in rest.split(",") if item]))
    if len(rows) < 2:
        return
    common = set.intersection(*(set(items) for _, items in split))
    for r, (num, items) in zip(rows, split):
        kept = ",".join(i for i in items if i not in common) or str(r.get("model"))
        r["run"] = f"{num}:{kept}" if num else kept


def sort_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Best final metric first (accuracy: higher; bpc/ppl/loss: lower); jobs without one last."""
    higher = any(r.get("metric_name", "") and str(r["metric_name"]).endswith("accuracy") for r in rows)

    def key(r: dict[str, Any]) -> tuple:
        v = r.get("final_metric")
        bad = not isinstance(v, (int, float)) or math.isnan(v)
        return (bad, 0.0 if bad else (-v if higher else v))

    return sorted(rows, key=key)


def write_csv(path: Path, rows: list[dict[str, Any]], fields: list[str]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def write_summary(sweep_dir: str | Path, multirun_id: str | None = None, baseline: str = "") -> dict[str, Path] | None:
    """Write the summary files into ``sweep_dir`` from its jobs (see :func:`gather`); ``baseline``:
    the variant the others are compared with (``attention:vanilla``). None, touching nothing, when
    the directory holds no job."""
    sweep_dir = Path(sweep_dir)
    rows = sort_rows(gather(sweep_dir, multirun_id))
    if not rows:
        return None
    paths = {k: sweep_dir / f"summary{s}" for k, s in (("csv", ".csv"), ("md", ".md"), ("png", ".png"))}
    paths["variants_csv"] = sweep_dir / "summary_variants.csv"
    extra = add_varied_columns(rows)
    variants, note = aggregate(rows, baseline)
    varied = varied_keys(rows)
    short_names(rows)
    write_csv(paths["csv"], rows, COLUMNS + extra + ["dir"])
    variant_varied = [k for k in varied if k not in VARIANT_FREE]
    if variants:
        csv_rows, fields = variant_rows(variants, variant_varied)
        write_csv(paths["variants_csv"], csv_rows, fields)
    else:
        paths.pop("variants_csv")
    data = sorted({str(r.get("data")) for r in rows if r.get("data")})
    listed = ", ".join(f"`{k}`" for k in varied) or "nothing (one configuration)"
    done = sum(str(r["status"]).split(" ")[0] in FINISHED for r in rows)
    parts = [
        f"# Sweep summary: {sweep_dir}\n",
        f"Task: {', '.join(data) or '?'}; varied: {listed}; {len(rows)} jobs, {done} finished.\n",
    ]
    if variants:
        parts.append("## Variants: seeds aggregated (mean and 95% interval, Student's t)\n")
        lines = verdict_lines(variants, note)
        parts += [lines[0] + "\n", "\n".join(lines[1:]) + "\n"] if len(lines) > 1 else [f"{line}\n" for line in lines]
        parts.append(variant_table(variants, variant_varied) + "\n")
    parts += search_tables(rows)
    parts += ["## Every job (best first)\n", job_table(rows, varied) + "\n"]
    paths["md"].write_text("\n".join(parts))
    paths["png"].unlink(missing_ok=True)
    if plot(rows, variants, paths["png"]) is None:
        paths.pop("png")
    return paths


def sweep_keys(config: Any) -> set[str]:
    """The keys a multirun sets: its command line's, its sweeper's ``params`` and (sweep=tuned_compare)
    ``compare``."""
    keys = {override_key(o) for o in config.hydra.overrides.task}
    params = config.hydra.sweeper.get("params") or {}
    keys |= {str(k) for k in params}
    compare = config.hydra.sweeper.get("compare")
    if compare:
        keys.add(str(compare))
    return keys | {"model", "attention", "data"}


def check_baseline(config: Any) -> None:
    """``sweep.baseline`` names keys this sweep sets, in the form it takes; else the launch is refused."""
    text = config.sweep.baseline
    if not text:
        return
    try:
        wanted = parse_baseline(text)
    except ValueError as exc:
        raise LaunchRefused(str(exc)) from None
    keys = sweep_keys(config)
    missing = sorted(set(wanted) - keys)
    if missing:
        raise LaunchRefused(
            f"sweep.baseline={text!r}: this sweep does not set {', '.join(missing)} (it sets: "
            f"{', '.join(sorted(keys))}); name the baseline by keys it varies, e.g. sweep.baseline=attention:vanilla"
        )


def check_sweeper(config: Any) -> None:
    """A sweeper that can tell a launch it cannot run (a ``check_launch(config)`` raising ValueError
    or ImportError: sweep=tuned_compare) refuses it here, before anything is written."""
    from hydra.utils import get_class

    target = config.hydra.sweeper.get("_target_")
    check = getattr(get_class(target), "check_launch", None) if target else None
    if check is None:
        return
    try:
        check(config)
    except ImportError as exc:
        raise LaunchRefused(f"{exc}: this sweep needs hydra-optuna-sweeper (pip install -e '.[tune]')") from None
    except ValueError as exc:
        raise LaunchRefused(str(exc)) from None


class SweepSummary(Callback):
    """Hydra callback: the sweep's record at the start, its summary at the end (see the module's docstring)."""

    def on_multirun_start(self, config: Any, **kwargs: Any) -> None:
        check_baseline(config)
        check_sweeper(config)
        identity = sweep_identity(config)
        open_sweep(config.hydra.sweep.dir, identity, resume=bool(config.sweep.resume), baseline=config.sweep.baseline)

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        baseline = config.sweep.baseline or (read_manifest(sweep_dir) or {}).get("baseline", "")
        paths = write_summary(sweep_dir, baseline=baseline)
        if paths:
            print(
                f"\n{paths['md'].read_text()}\nsummary: {paths['csv']}"
                + (f"\nplot: {paths['png']}" if "png" in paths else ""),
                flush=True,
            )
        jobs = read_jobs(sweep_dir)
        bad = unfinished(jobs)
        if bad:
            shared = set.intersection(*(set(j["overrides"]) for j in jobs))  # named by what sets each apart
            named = {j["num"]: " ".join(o for o in j["overrides"] if o not in shared) for j in bad}
            listed = "\n".join(f"  job {j['num']} ({named[j['num']]}): {j['status']}"[:400] for j in bad)
            raise SweepIncomplete(
                f"{len(bad)} job(s) of the sweep in {sweep_dir} did not finish:\n{listed}\n"
                f"the summary lists every job with its status: {sweep_dir / 'summary.md'}"
            )
