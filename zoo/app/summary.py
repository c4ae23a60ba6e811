"""Gathering a multirun into one comparison: ``summary.csv``, ``summary.md`` and ``summary.png``.

``SweepSummary`` is a Hydra callback registered in ``conf/config.yaml``; it reads the
``result.json`` every run writes (status, final metric, tokens/s, memory, parameters),
``config.json`` (the run's name) and Hydra's ``.hydra/overrides.yaml`` (what the job was asked).
Every key whose value differs between the jobs (``residual=...``, ``attention.max_span=...``,
``seed=...``, any override) becomes a column, so a sweep reads as one table.

Only this multirun's jobs are summarised: ``on_multirun_start`` writes a fresh id into the sweep
directory and every job copies it into its own ``.hydra/`` at start, so runs left in the same
``hydra.sweep.dir`` by an earlier sweep (other job numbers, or a job that died before writing its
result) never reach the table. It also works after the fact, on the latest multirun of a directory:
``python -c "from zoo.app.summary import write_summary; write_summary('multirun/...')"``.
"""

from __future__ import annotations

import csv
import json
import math
import uuid
from pathlib import Path
from typing import Any

try:  # the callback base class; the module stays importable without Hydra for write_summary
    from hydra.experimental.callback import Callback
except ImportError:  # pragma: no cover
    Callback = object  # type: ignore[misc,assignment]

# throughput and memory as zoo.bench names and measures them (zoo.train.meter): tokens_per_s = tokens of a
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
    "tokens_per_s",
    "act_mib",
    "gpu_peak_mib",
    "params",
    "wall_s",
]
LEGACY_KEYS = {"act_mib": "activations_mb", "gpu_peak_mib": "peak_mb"}  # result.json written before the rename


MULTIRUN_ID = "multirun_id"  # in the sweep directory, and in each job's .hydra/ (Hydra's output_subdir)


def job_marker(job_dir: Path) -> Path:
    return job_dir / ".hydra" / MULTIRUN_ID if (job_dir / ".hydra").is_dir() else job_dir / MULTIRUN_ID


def of_multirun(result_path: Path, multirun_id: str) -> bool:
    """The result was written by a job of multirun ``multirun_id``: the job's marker names it, and
    the result is not older than the marker (a job of this multirun that died before writing its
    result, in a directory reused from an earlier sweep, leaves that sweep's result behind)."""
    marker = job_marker(result_path.parent)
    if not marker.is_file() or marker.read_text().strip() != multirun_id:
        return False
    return result_path.stat().st_mtime >= marker.stat().st_mtime


def job_overrides(job_dir: Path) -> dict[str, str]:
    """``{"residual": "pre_norm", "seed": "1"}`` from the job's ``.hydra/overrides.yaml``."""
    path = job_dir / ".hydra" / "overrides.yaml"
    if not path.is_file():
        return {}
    import yaml

    out = {}
    for item in yaml.safe_load(path.read_text()) or []:
        key, _, value = str(item).partition("=")
        out[key.lstrip("+~")] = value
    return out


def gather(sweep_dir: str | Path, multirun_id: str | None = None) -> list[dict[str, Any]]:
    """One row per ``result.json`` under ``sweep_dir``: all of them, or only those of one multirun
    (``multirun_id``; default: the latest multirun started in ``sweep_dir``, when one left its id)."""
    sweep_dir = Path(sweep_dir)
    if multirun_id is None and (sweep_dir / MULTIRUN_ID).is_file():
        multirun_id = (sweep_dir / MULTIRUN_ID).read_text().strip()
    rows = []
    for result_path in sorted(sweep_dir.rglob("result.json"), key=lambda p: (len(p.parts), str(p))):
        if multirun_id and not of_multirun(result_path, multirun_id):
            continue
        result = json.loads(result_path.read_text())
        config_path = result_path.with_name("config.json")
        run = (
            json.loads(config_path.read_text()).get("run", result_path.parent.name)
            if config_path.is_file()
            else result_path.parent.name
        )
        row = {key: result.get(key, result.get(LEGACY_KEYS.get(key, key))) for key in COLUMNS}
        row.update(run=run, dir=str(result_path.parent))
        row["overrides"] = job_overrides(result_path.parent)
        rows.append(row)
    return rows


def varied_keys(rows: list[dict[str, Any]]) -> list[str]:
    """The override keys whose value is not the same in every job (in first-seen order): what the
    sweep compares. Each becomes a column holding the job's value (blank where a job lacks it)."""
    keys = list(dict.fromkeys(k for r in rows for k in r.get("overrides", {})))
    return [k for k in keys if len({r.get("overrides", {}).get(k) for r in rows}) > 1]


def add_varied_columns(rows: list[dict[str, Any]]) -> list[str]:
    """Put each varied key's value into its rows; returns the new column names (the result's own
    model/attention/data/seed columns already hold what ran for those keys)."""
    varied = varied_keys(rows)
    extra = [k for k in varied if k not in COLUMNS]
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


def _fmt(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def sort_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Best final metric first (accuracy: higher; bpc/ppl/loss: lower); failed runs last."""
    higher = any(r.get("metric_name", "") and str(r["metric_name"]).endswith("accuracy") for r in rows)

    def key(r: dict[str, Any]) -> tuple:
        v = r.get("final_metric")
        bad = v is None or (isinstance(v, float) and math.isnan(v))
        return (bad, 0.0 if bad else (-v if higher else v))

    return sorted(rows, key=key)


def markdown_table(rows: list[dict[str, Any]], varied: list[str] = ()) -> str:
    """The comparison: run, model, attention, every other key the sweep varied, then the results."""
    cols = ["run", "model", "attention", *(k for k in varied if k not in ("run", "model", "attention"))]
    cols += ["final_metric", "steps", "tokens_per_s", "act_mib"]
    cols += ["gpu_peak_mib"] if any(r.get("gpu_peak_mib") is not None for r in rows) else []
    cols += ["params", "wall_s", "status"]
    metric = next((r["metric_name"] for r in rows if r.get("metric_name")), "metric")
    header = [c if c != "final_metric" else metric for c in cols]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(_fmt(r.get(c)) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: Path) -> Path | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import EngFormatter

    ok = [r for r in rows if isinstance(r.get("final_metric"), (int, float))]
    if not ok:
        return None
    metric = ok[0].get("metric_name") or "metric"
    panels = [
        ("final_metric", metric),
        ("tokens_per_s", "tokens / s (forward + backward)"),
        ("act_mib", "activation MiB (saved for backward, one step)"),
        ("params", "parameters"),
    ]
    labels = [str(r["run"]) for r in ok]
    fig, axes = plt.subplots(1, 4, figsize=(18, 0.45 * len(ok) + 1.8), sharey=True)
    for ax, (key, title) in zip(axes, panels):
        values = [float(r[key]) if isinstance(r.get(key), (int, float)) else 0.0 for r in ok]
        ax.barh(range(len(ok)), values, color="tab:blue" if key == "final_metric" else "tab:gray")
        ax.set_title(title, fontsize=9)
        if key != "final_metric":
            ax.xaxis.set_major_formatter(EngFormatter(sep=""))  # 12k, 1.5M: readable at any scale
        ax.tick_params(labelsize=8)
        ax.grid(axis="x", alpha=0.3)
    axes[0].set_yticks(range(len(ok)))
    axes[0].set_yticklabels(labels, fontsize=8)
    axes[0].invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def write_summary(sweep_dir: str | Path, multirun_id: str | None = None) -> dict[str, Path] | None:
    """Write summary.csv/.md/.png into ``sweep_dir`` from one multirun's jobs (see :func:`gather`);
    None when it holds no finished run (stale summary files are removed then)."""
    sweep_dir = Path(sweep_dir)
    paths = {"csv": sweep_dir / "summary.csv", "md": sweep_dir / "summary.md", "png": sweep_dir / "summary.png"}
    rows = sort_rows(gather(sweep_dir, multirun_id))
    if not rows:
        for path in paths.values():
            path.unlink(missing_ok=True)
        return None
    extra = add_varied_columns(rows)
    short_names(rows)
    with open(paths["csv"], "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS + extra + ["dir"], extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    data = sorted({str(r.get("data")) for r in rows})
    varied = varied_keys(rows)
    listed = ", ".join(f"`{k}`" for k in varied) or "nothing (one configuration)"
    paths["png"].unlink(missing_ok=True)
    paths["md"].write_text(
        f"# Sweep summary: {sweep_dir}\n\nTask: {', '.join(data)}; varied: {listed}; best first.\n\n"
        f"{markdown_table(rows, varied)}\n"
    )
    if plot(rows, paths["png"]) is None:
        paths.pop("png")
    return paths


class SweepSummary(Callback):
    """Hydra callback: at the end of a multirun, summarise every job of this multirun."""

    def on_multirun_start(self, config: Any, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        self.multirun_id = uuid.uuid4().hex
        (sweep_dir / MULTIRUN_ID).write_text(self.multirun_id + "\n")

    def on_job_start(self, config: Any, **kwargs: Any) -> None:
        """Runs where the job runs (maybe another process or node): copy the id the sweep
        directory holds into the job's own Hydra subdirectory."""
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        hydra = HydraConfig.get()
        if hydra.mode != RunMode.MULTIRUN:
            return
        source = Path(hydra.sweep.dir) / MULTIRUN_ID
        if not source.is_file():
            return
        job_dir = Path(hydra.runtime.output_dir)
        marker = job_dir / hydra.output_subdir / MULTIRUN_ID if hydra.output_subdir else job_dir / MULTIRUN_ID
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(source.read_text())

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        paths = write_summary(config.hydra.sweep.dir, getattr(self, "multirun_id", None))
        if paths:
            print(
                f"\n{paths['md'].read_text()}\nsummary: {paths['csv']}"
                + (f"\nplot: {paths['png']}" if "png" in paths else ""),
                flush=True,
            )
