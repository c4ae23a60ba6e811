"""Gathering a multirun into one comparison: ``summary.csv``, ``summary.md`` and ``summary.png``.

``SweepSummary`` is a Hydra callback (``on_multirun_end``) registered in ``conf/config.yaml``; it
reads the ``result.json`` every run writes (status, final metric, tokens/s, memory, parameters) and
``config.json`` (the run's overrides), so it also works on a sweep directory after the fact:
``python -c "from zoo.app.summary import write_summary; write_summary('multirun/...')"``.
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

COLUMNS = ["run", "model", "attention", "data", "seed", "status", "metric_name", "final_metric", "best_metric", "steps", "tokens_per_s", "peak_mem_mb", "params", "wall_s"]


def _peak(result: dict[str, Any]) -> float | None:
    """GPU peak allocated memory where measured; on CPU the tensors saved for backward in one step
    (process RSS is shared by every run of an in-process sweep, so it cannot compare runs)."""
    return result.get("peak_mb", result.get("activations_mb"))


def gather(sweep_dir: str | Path) -> list[dict[str, Any]]:
    rows = []
    for result_path in sorted(Path(sweep_dir).rglob("result.json"), key=lambda p: (len(p.parts), str(p))):
        result = json.loads(result_path.read_text())
        config_path = result_path.with_name("config.json")
        run = json.loads(config_path.read_text()).get("run", result_path.parent.name) if config_path.is_file() else result_path.parent.name
        row = {key: result.get(key) for key in COLUMNS}
        row.update(run=run, peak_mem_mb=_peak(result), dir=str(result_path.parent))
        rows.append(row)
    return rows


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


def markdown_table(rows: list[dict[str, Any]]) -> str:
    cols = ["run", "model", "attention", "final_metric", "steps", "tokens_per_s", "peak_mem_mb", "params", "wall_s", "status"]
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
    panels = [("final_metric", metric), ("tokens_per_s", "tokens / s (train)"), ("peak_mem_mb", "peak memory, MiB (GPU alloc. or saved activations)"), ("params", "parameters")]
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


def write_summary(sweep_dir: str | Path) -> dict[str, Path] | None:
    """Write summary.csv/.md/.png into ``sweep_dir``; None when it holds no finished run."""
    sweep_dir = Path(sweep_dir)
    rows = sort_rows(gather(sweep_dir))
    if not rows:
        return None
    short_names(rows)
    paths = {"csv": sweep_dir / "summary.csv", "md": sweep_dir / "summary.md", "png": sweep_dir / "summary.png"}
    with open(paths["csv"], "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS + ["dir"])
        writer.writeheader()
        writer.writerows(rows)
    data = sorted({str(r.get("data")) for r in rows})
    paths["md"].write_text(f"# Sweep summary: {sweep_dir}\n\nTask: {', '.join(data)}; best first.\n\n{markdown_table(rows)}\n")
    if plot(rows, paths["png"]) is None:
        paths.pop("png")
    return paths


class SweepSummary(Callback):
    """Hydra callback: at the end of a multirun, summarise every run of the sweep."""

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        paths = write_summary(config.hydra.sweep.dir)
        if paths:
            print(f"\n{paths['md'].read_text()}\nsummary: {paths['csv']}" + (f"\nplot: {paths['png']}" if "png" in paths else ""), flush=True)
