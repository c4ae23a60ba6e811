"""``summary.png`` of a sweep: one line per variant (seeds aggregated), every seed a point.

Panels: the final metric (each seed's value, the mean and its 95% interval as an error bar); with a
baseline, each variant's difference to it with its interval against a zero line (the verdict, seen);
throughput; activation memory. A sweep without variants (every job a search trial) plots its jobs.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from zoo.app.aggregate import label


def _value(row: dict[str, Any], key: str) -> float | None:
    value = row.get(key)
    return float(value) if isinstance(value, (int, float)) and not math.isnan(value) else None


def _points(ax: Any, variants: list[dict[str, Any]], key: str) -> None:
    for y, v in enumerate(variants):
        xs = [x for r in v["rows"] if (x := _value(r, key)) is not None]
        ax.scatter(xs, [y] * len(xs), s=14, color="tab:gray", alpha=0.7, zorder=2)


def _interval(ax: Any, y: int, interval: Any, color: str) -> None:
    if interval is None or interval.n == 0:
        return
    if interval.low is not None:
        error = [[interval.mean - interval.low], [interval.high - interval.mean]]
        ax.errorbar([interval.mean], [y], xerr=error, fmt="o", color=color, capsize=4, zorder=3)
    else:
        ax.plot([interval.mean], [y], "o", color=color, zorder=3)


def plot(rows: list[dict[str, Any]], variants: list[dict[str, Any]], path: Path) -> Path | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import EngFormatter

    if not variants:  # a pure search: one line per job
        variants = [{"key": (("job", r["run"]),), "rows": [r], "overrides": {}} for r in rows]
    if not any(_value(r, "final_metric") is not None for v in variants for r in v["rows"]):
        return None
    metric = next((r["metric_name"] for r in rows if r.get("metric_name")), "metric")
    compared = any("difference" in v for v in variants)
    panels = ["final", *(["difference"] if compared else []), "tokens_per_s", "act_mib"]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 0.5 * len(variants) + 2.0), sharey=True)
    for ax, panel in zip(axes, panels):
        if panel == "final":
            _points(ax, variants, "final_metric")
            for y, v in enumerate(variants):
                _interval(ax, y, v.get("final_metric"), "tab:blue")
            ax.set_title(f"{metric}: seeds (gray), mean and 95% interval", fontsize=9)
        elif panel == "difference":
            ax.axvline(0.0, color="black", linewidth=0.8)
            for y, v in enumerate(variants):
                diff = v.get("difference")
                if diff is not None:
                    color = {"better": "tab:green", "worse": "tab:red"}.get(diff.verdict, "tab:gray")
                    _interval(ax, y, diff.interval, color)
            ax.set_title("difference to the baseline, 95% interval", fontsize=9)
        else:
            _points(ax, variants, panel)
            if panel == "tokens_per_s":
                ax.xaxis.set_major_formatter(EngFormatter(sep=""))  # 12k, 1.5M: readable at any scale
            ax.set_title(
                {"tokens_per_s": "tokens / s (forward + backward)"}.get(panel, "activation MiB (one step)"), fontsize=9
            )
        ax.tick_params(labelsize=8)
        ax.grid(axis="x", alpha=0.3)
    axes[0].set_yticks(range(len(variants)))
    axes[0].set_yticklabels(
        [label(v, variants) if "final_metric" in v else v["key"][0][1] for v in variants], fontsize=8
    )
    axes[0].invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path
