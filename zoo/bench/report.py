"""What a benchmark run writes: markdown tables, log-log plots and CSV, with the fitted slopes and
crossovers (``bench.{csv,md,png}``, ``summary.json``) or the paired speed-ups
(``paired.csv``, ``paired_rounds.csv``, ``paired.md``, ``paired.png``).
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any


def write_csv(path: str | Path, rows: list[dict[str, Any]]) -> Path:
    """``rows`` as CSV, one column per key any row has (first seen first); missing cells empty."""
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for r in rows for k in r)))
        writer.writeheader()
        writer.writerows(rows)
    return Path(path)


def progress_line(row: dict[str, Any]) -> str:
    if row.get("status") != "ok":
        return f"{row['variant']:>28}  L={row['length']:>6}  layers={row['layers']:>2}  {row['status']}"
    timing = f"{row['time_ms']:9.1f} ms  {row['tokens_per_s']:9.0f} tok/s" if "time_ms" in row else "(not timed)"
    return (
        f"{row['variant']:>28}  L={row['length']:>6}  layers={row['layers']:>2}  "
        f"{timing}  act {row['act_mib']:8.1f} MiB"
    )


# the twins of a paired run (zoo.bench.measure.TWINS): (the table's heading, its speed-up column)
TWIN_TABLES = {
    "compile": (
        "torch.compile against eager (eager time / compiled time per round; compilation happens in the warm-up round):",
        "speed-up from compile",
    ),
    "bf16": ("bf16 autocast against fp32 (fp32 time / bf16 time per round):", "speed-up from bf16"),
}


def paired_markdown(summary: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    baseline = summary[0]["baseline"]
    lines = [
        f"# {meta.get('title') or 'zoo.bench --paired: alternating rounds'}",
        "",
        f"Command: `{meta['command']}`",
        "",
        f"Machine: {meta['machine']}; device {meta['device']}, precision {meta.get('precision', 'fp32')}; "
        f"torch {meta['torch']}, {meta['threads']} threads; "
        f"batch {meta['batch']}, d_model {meta['d_model']}, {meta['heads']} heads, {meta['layers']} layers, "
        f"vocab {meta['vocab']}; load average at the end {meta['load']}. One training step = forward + backward; "
        "every round times each variant once, in an order rotated each round, after one unrecorded "
        "warm-up round.",
        "",
    ]
    has_flops = any("flop_share" in s for s in summary)
    for length in dict.fromkeys(s["length"] for s in summary):
        lines += [
            f"## Length {length:,}",
            "",
            f"| variant | median ms | speed-up over `{baseline}` (median of per-round ratios) | min-max "
            "| activation MiB |" + (" FLOP-bound share (min-max) |" if has_flops else ""),
            "|---|---|---|---|---|" + ("---|" if has_flops else ""),
        ]
        for s in (s for s in summary if s["length"] == length):
            share = ""
            if has_flops:
                share = (
                    f" {s['flop_share']:.2f} ({s['flop_share_min']:.2f}-{s['flop_share_max']:.2f}) |"
                    if "flop_share" in s
                    else " |"
                )
            lines.append(
                f"| {s['variant']} | {s['median_ms']:,.1f} | {s['speedup']:.2f}x "
                f"| {s['speedup_min']:.2f}-{s['speedup_max']:.2f} | {s['act_mib']:,.1f} |{share}"
            )
        for twin, (title, column) in TWIN_TABLES.items():
            twins = [s for s in summary if s["length"] == length and f"{twin}_speedup" in s]
            if twins:
                lines += ["", title, "", f"| variant | {column} | min-max |", "|---|---|---|"]
                lines += [
                    f"| {s['variant'].removesuffix('+' + twin)} | {s[twin + '_speedup']:.2f}x | "
                    f"{s[twin + '_speedup_min']:.2f}-{s[twin + '_speedup_max']:.2f} |"
                    for s in twins
                ]
        twins = [s for s in summary if s["length"] == length and "ac_speedup" in s]
        if twins:
            lines += ["", "Activation checkpointing against the first mode (its time / the twin's time per round; "
                      "MiB saved for backward):", "",
                      "| variant | checkpointing | speed-up (min-max) | activation MiB | without | kept |",
                      "|---|---|---|---|---|---|"]  # fmt: skip
            lines += [
                f"| {s['ac_of']} | {s['checkpointing']} | {s['ac_speedup']:.2f}x ({s['ac_speedup_min']:.2f}-"
                f"{s['ac_speedup_max']:.2f}) | {s['act_mib']:,.2f} | {s['ac_act_mib_without']:,.2f} | "
                f"{s['act_mib'] / max(s['ac_act_mib_without'], 1e-12):.0%} |"
                for s in twins
            ]
        for s in (s for s in summary if s["length"] == length and "gflop" in s):
            lines += [
                "",
                f"FLOP bound of one `{s['variant']}` step: {s['gflop']:.1f} GFLOP ({s['flop_parts']}); "
                "share = "
                "that many FLOPs at the round's matmul rate ([t, d] x [d, d_ff] probe) / the step's time.",
            ]
        lines.append("")
    return "\n".join(lines)


def paired_plot(summary: list[dict[str, Any]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lengths = list(dict.fromkeys(s["length"] for s in summary))
    labels = list(dict.fromkeys(s["variant"] for s in summary))
    fig, ax = plt.subplots(figsize=(max(5.0, 1.2 * len(labels) * len(lengths)), 4))
    width = 0.8 / len(lengths)
    for i, length in enumerate(lengths):
        rows = {s["variant"]: s for s in summary if s["length"] == length}
        xs = [j + i * width for j, label in enumerate(labels) if label in rows]
        mid = [rows[label]["speedup"] for label in labels if label in rows]
        low = [rows[label]["speedup"] - rows[label]["speedup_min"] for label in labels if label in rows]
        high = [rows[label]["speedup_max"] - rows[label]["speedup"] for label in labels if label in rows]
        ax.bar(xs, mid, width, yerr=[low, high], capsize=3, label=f"length {length:,}")
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_xticks([j + width * (len(lengths) - 1) / 2 for j in range(len(labels))])
    ax.set_xticklabels(labels, rotation=20, ha="right", fontsize=7)
    ax.set_ylabel(f"speed-up over {summary[0]['baseline']} (median, min-max)")
    ax.legend(fontsize=7)
    ax.grid(axis="y", alpha=0.3)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def write_paired(
    round_rows: list[dict[str, Any]], summary: list[dict[str, Any]], out: Path, meta: dict[str, Any]
) -> dict[str, Path]:
    """``paired.csv`` (one row per length and variant), ``paired_rounds.csv`` (every round),
    ``paired.md``, ``paired.png``."""
    out.mkdir(parents=True, exist_ok=True)
    paths = {
        "csv": out / "paired.csv",
        "rounds": out / "paired_rounds.csv",
        "md": out / "paired.md",
        "png": out / "paired.png",
    }
    write_csv(paths["csv"], summary)
    write_csv(paths["rounds"], round_rows)
    paths["md"].write_text(paired_markdown(summary, meta))
    paired_plot(summary, paths["png"], meta.get("title") or "zoo.bench --paired")
    return paths


# -- slopes, crossovers and the sweep's outputs ------------------------------------------------


def fit_slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of log(y) against log(x); nan with fewer than two points."""
    points = [(math.log(x), math.log(y)) for x, y in zip(xs, ys) if x > 0 and y > 0]
    if len(points) < 2:
        return float("nan")
    mx = sum(p[0] for p in points) / len(points)
    my = sum(p[1] for p in points) / len(points)
    var = sum((p[0] - mx) ** 2 for p in points)
    return sum((p[0] - mx) * (p[1] - my) for p in points) / var if var else float("nan")


def sweep_axis(rows: list[dict[str, Any]]) -> str:
    return "layers" if len({r["layers"] for r in rows}) > 1 and len({r["length"] for r in rows}) == 1 else "length"


def series(rows: list[dict[str, Any]], label: str, axis: str, key: str) -> tuple[list[float], list[float]]:
    ok = [r for r in rows if r["variant"] == label and r.get("status") == "ok" and r.get(key) is not None]
    ok.sort(key=lambda r: r[axis])
    return [r[axis] for r in ok], [r[key] for r in ok]


def crossover(rows: list[dict[str, Any]], label: str, baseline: str, axis: str) -> str:
    """Smallest measured point from which ``label`` is faster than ``baseline`` at every larger one."""
    mine = dict(zip(*series(rows, label, axis, "time_ms")))
    base = dict(zip(*series(rows, baseline, axis, "time_ms")))
    shared = sorted(set(mine) & set(base))
    if not shared:
        return "n/a"
    winner = None
    for x in reversed(shared):
        if mine[x] < base[x]:
            winner = x
        else:
            break
    if winner is None:
        return f"not by {shared[-1]}"
    return f"{winner}" if winner != shared[0] else f"<= {winner}"


def summarise(rows: list[dict[str, Any]], baseline: str | None) -> list[dict[str, Any]]:
    axis = sweep_axis(rows)
    labels = list(dict.fromkeys(r["variant"] for r in rows))
    baseline = baseline if baseline in labels else labels[0]
    summary = []
    for label in labels:
        xs, ts = series(rows, label, axis, "time_ms")
        mxs, ms = series(rows, label, axis, "act_mib")  # its own points: memory may be measured untimed
        entry = dict(variant=label, time_slope=fit_slope(xs, ts), memory_slope=fit_slope(mxs, ms))
        if label != baseline:
            entry["faster_than_baseline_from"] = crossover(rows, label, baseline, axis)
        if ms:
            entry["memory_last_over_first"] = ms[-1] / ms[0] if ms[0] else float("nan")
        summary.append(entry)
    return summary


def markdown(
    rows: list[dict[str, Any]], summary: list[dict[str, Any]], meta: dict[str, Any], baseline: str | None
) -> str:
    axis = sweep_axis(rows)
    points = sorted({r[axis] for r in rows})
    labels = list(dict.fromkeys(r["variant"] for r in rows))
    baseline = baseline if baseline in labels else labels[0]
    lines = [f"# {meta.get('title', 'zoo.bench')}", "", f"Command: `{meta['command']}`", ""]
    lines.append(
        f"Machine: {meta['machine']}; device {meta.get('device', 'cpu')}, precision {meta.get('precision', 'fp32')}; "
        f"torch {meta['torch']}, "
        f"{meta['threads']} threads; batch {meta['batch']}, d_model {meta['d_model']}, {meta['heads']} heads, "
        f"vocab {meta['vocab']}. One training step = forward + backward, median of repeats after warm-up."
    )
    lines.append("")

    def table(key: str, title: str, fmt: str) -> None:
        lines.append(f"## {title}")
        lines.append("")
        lines.append("| variant | " + " | ".join(f"{axis} {p:,}" for p in points) + " |")
        lines.append("|---|" + "---|" * len(points))
        for label in labels:
            cells = []
            for p in points:
                row = next((r for r in rows if r["variant"] == label and r[axis] == p), None)
                if row is None:
                    cells.append("")
                elif row.get("status") != "ok" or row.get(key) is None:
                    cells.append(str(row.get("status", ""))[:40])
                else:
                    cells.append(format(row[key], fmt))
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        lines.append("")

    if any("time_ms" in r for r in rows):  # absent when only memory was measured (--repeats 0)
        table("time_ms", "Time per training step (ms)", ",.1f")
        table("tokens_per_s", "Tokens per second", ",.0f")
    table("act_mib", "Activation memory saved for backward (MiB)", ",.1f")
    if any("gpu_peak_mib" in r for r in rows):
        table("gpu_peak_mib", "Peak CUDA memory allocated in one step (MiB)", ",.0f")
    if any("rss_peak_mib" in r for r in rows):
        table("rss_peak_mib", "Peak RSS of a fresh process running one step (MiB)", ",.0f")
    lines.append(f"## Fitted log-log slopes (against {axis}) and crossover against `{baseline}`")
    lines.append("")
    lines.append(f"| variant | time slope | memory slope | memory last/first | faster than {baseline} from {axis} |")
    lines.append("|---|---|---|---|---|")
    for s in summary:
        lines.append(
            f"| {s['variant']} | {s['time_slope']:.2f} | {s['memory_slope']:.2f} | "
            f"{s.get('memory_last_over_first', float('nan')):.2f} | "
            f"{s.get('faster_than_baseline_from', '(baseline)')} |"
        )
    lines.append("")
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], summary: list[dict[str, Any]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    axis = sweep_axis(rows)
    slopes = {s["variant"]: s for s in summary}
    timed = any("time_ms" in r for r in rows)
    fig, axes = plt.subplots(1, 2 if timed else 1, figsize=(10 if timed else 5.5, 4), squeeze=False)
    ax_t, ax_m = (axes[0][0], axes[0][1]) if timed else (None, axes[0][0])
    for label in dict.fromkeys(r["variant"] for r in rows):
        xs, ts = series(rows, label, axis, "time_ms")
        if xs and ax_t is not None:
            ax_t.loglog(xs, ts, "o-", label=f"{label} (slope {slopes[label]['time_slope']:.2f})")
        xs, ms = series(rows, label, axis, "act_mib")
        if xs:
            ax_m.loglog(xs, ms, "o-", label=f"{label} (slope {slopes[label]['memory_slope']:.2f})")
    if ax_t is not None:
        ax_t.set(xlabel=axis, ylabel="ms per training step", title="time")
    ax_m.set(xlabel=axis, ylabel="MiB saved for backward", title="activation memory")
    for ax in (a for a in (ax_t, ax_m) if a is not None):
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def write_outputs(
    rows: list[dict[str, Any]], out: Path, meta: dict[str, Any], baseline: str | None = None
) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    summary = summarise(rows, baseline)
    paths = {"csv": out / "bench.csv", "md": out / "bench.md", "png": out / "bench.png", "json": out / "summary.json"}
    write_csv(paths["csv"], rows)
    paths["md"].write_text(markdown(rows, summary, meta, baseline))
    paths["json"].write_text(json.dumps({"meta": meta, "summary": summary}, indent=2, default=str))
    plot(rows, summary, paths["png"], meta.get("title", "zoo.bench"))
    return paths
