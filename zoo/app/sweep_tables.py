"""The tables of a sweep summary (:mod:`zoo.app.summary`): the variants with their intervals and
verdicts, the trials of each search, and every job; markdown, and the variants' CSV rows."""

from __future__ import annotations

import math
from typing import Any

from zoo.app.aggregate import Interval, label, mean_interval, variant_key


def fmt(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def value_cell(text: Any) -> Any:
    """An override's value for a table: a long float (a searched learning rate) as a number, to
    four figures; anything else as written (the CSVs keep the exact value)."""
    try:
        return float(text) if "." in str(text) or "e" in str(text).lower() else text
    except (TypeError, ValueError):
        return text


def fmt_interval(interval: Interval) -> str:
    """``0.512 [0.48, 0.54]``; the mean alone below two values."""
    if interval.n == 0:
        return ""
    if interval.low is None:
        return fmt(interval.mean)
    return f"{fmt(interval.mean)} [{fmt(interval.low)}, {fmt(interval.high)}]"


def markdown(header: list[str], body: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(fmt(c) for c in row) + " |" for row in body]
    return "\n".join(lines)


def metric_name(rows: list[dict[str, Any]]) -> str:
    return next((r["metric_name"] for r in rows if r.get("metric_name")), "metric")


def job_table(rows: list[dict[str, Any]], varied: list[str] = ()) -> str:
    """Every job: run, model, attention, every other key the sweep varied, then its results."""
    cols = ["run", "model", "attention", *(k for k in varied if k not in ("run", "model", "attention"))]
    cols += ["final_metric", "steps", "tokens_per_s", "act_mib"]
    cols += ["gpu_peak_mib"] if any(r.get("gpu_peak_mib") is not None for r in rows) else []
    cols += ["tags"] if any(r.get("tags") for r in rows) else []
    cols += ["params", "wall_s", "status"]
    header = [c if c != "final_metric" else metric_name(rows) for c in cols]
    return markdown(header, [[r.get(c) for c in cols] for r in rows])


def verdict_lines(variants: list[dict[str, Any]], note: str) -> list[str]:
    """One sentence per variant compared with the baseline, read from its interval."""
    if note:
        return [f"Baseline: {note}."]
    base = next((v for v in variants if v.get("baseline")), None)
    if base is None:
        return []
    metric = metric_name([r for v in variants for r in v["rows"]])
    lines = [f"Baseline `{label(base, variants)}`; difference = variant - baseline in {metric}, 95% interval:"]
    for v in variants:
        diff = v.get("difference")
        if diff is None:
            continue
        how = f"paired over seeds {', '.join(map(str, diff.seeds))}" if diff.paired else "unpaired (Welch)"
        if diff.interval.low is None:
            how = "one seed on a side: no interval"
        lines.append(f"- `{label(v, variants)}`: **{diff.verdict}** ({fmt_interval(diff.interval)}; {how})")
    return lines


def variant_columns(variants: list[dict[str, Any]], varied: list[str]) -> list[str]:
    keys = [k for k in varied if any(k in v["overrides"] for v in variants)]
    return keys or ["variant"]


def variant_table(variants: list[dict[str, Any]], varied: list[str]) -> str:
    """One row per variant: its keys, n, final and best metric with intervals, std, the difference
    to the baseline and the verdict, steps, throughput and memory."""
    keys = variant_columns(variants, varied)
    metric = metric_name([r for v in variants for r in v["rows"]])
    compared = any("difference" in v for v in variants)
    header = [*keys, "n", f"{metric} [95% CI]", "std", "best [95% CI]"]
    header += ["difference [95% CI]", "verdict"] if compared else []
    header += ["steps", "tokens_per_s", "act_mib"]
    body = []
    for v in variants:
        cells = [value_cell(v["overrides"].get(k, v.get(k))) if k != "variant" else label(v, variants) for k in keys]
        final = v["final_metric"]
        cells += [f"{final.n}/{v['n_jobs']}", fmt_interval(final), final.std, fmt_interval(v["best_metric"])]
        if compared:
            diff = v.get("difference")
            cells += (
                ["(baseline)", ""]
                if v.get("baseline")
                else ([fmt_interval(diff.interval), diff.verdict] if diff else ["", ""])
            )
        cells += [v["steps"], v["tokens_per_s"], v["act_mib"]]
        body.append(cells)
    return markdown(header, body)


def variant_rows(variants: list[dict[str, Any]], varied: list[str]) -> tuple[list[dict[str, Any]], list[str]]:
    """(rows, fields) of ``summary_variants.csv``: the numbers behind :func:`variant_table`."""
    keys = [k for k in variant_columns(variants, varied) if k != "variant"]
    fields = ["variant", *keys, "n", "jobs", "seeds"]
    for name in ("final", "best", "difference"):
        fields += [f"{name}_mean", f"{name}_std", f"{name}_ci_low", f"{name}_ci_high"]
    fields += ["paired", "verdict", "steps", "tokens_per_s", "act_mib", "gpu_peak_mib"]
    rows = []
    for v in variants:
        row = {"variant": label(v, variants), **{k: v["overrides"].get(k, "") for k in keys}}
        row.update(n=v["final_metric"].n, jobs=v["n_jobs"], seeds=" ".join(map(str, v["seeds_finished"])))
        diff = v.get("difference")
        for name, interval in (
            ("final", v["final_metric"]),
            ("best", v["best_metric"]),
            ("difference", diff and diff.interval),
        ):
            if interval is not None:
                row.update({f"{name}_mean": interval.mean, f"{name}_std": interval.std})
                row.update({f"{name}_ci_low": interval.low, f"{name}_ci_high": interval.high})
        row.update(
            paired=diff.paired if diff else "",
            verdict="baseline" if v.get("baseline") else (diff.verdict if diff else ""),
        )
        row.update({k: v[k] for k in ("steps", "tokens_per_s", "act_mib", "gpu_peak_mib")})
        rows.append(row)
    return rows, fields


def best_first(interval: Interval, higher_is_better: bool) -> tuple[bool, float]:
    """Sort key: finished trials first, the best of them first."""
    if interval.n == 0:
        return (True, 0.0)
    return (False, -interval.mean if higher_is_better else interval.mean)


def search_tables(rows: list[dict[str, Any]]) -> list[str]:
    """Per search (a job's ``search``): its trials best first (a trial run over several seeds is one
    line: their mean), the keys that vary between its trials, and its best trial."""
    metric = metric_name(rows)
    parts = []
    for search in sorted({r["search"] for r in rows if r.get("search")}):
        trials: dict[tuple, list[dict[str, Any]]] = {}
        for r in rows:
            if r.get("search") == search:
                trials.setdefault(variant_key(r), []).append(r)
        keys = list(dict.fromkeys(k for key in trials for k, _ in key))
        keys = [k for k in keys if len({dict(key).get(k) for key in trials}) > 1]  # what the search varied
        higher = any(r.get("higher_is_better") for group in trials.values() for r in group)
        scored = []
        for key, group in trials.items():
            values = [x for r in group if isinstance(x := r.get("final_metric"), (int, float)) and not math.isnan(x)]
            scored.append((mean_interval(values), dict(key), len(group)))
        scored.sort(key=lambda trial: best_first(trial[0], higher))
        body = [
            [value_cell(params.get(k)) for k in keys] + [jobs, value.mean if value.n else None]
            for value, params, jobs in scored
        ]
        top, params, _ = scored[0]
        best = ", ".join(f"{k}={params.get(k)}" for k in keys)
        best = f"{best} ({metric} {fmt(top.mean)})" if top.n else "none finished"
        parts.append(f"## Search `{search}`: {len(trials)} trials, best first\n")
        parts.append(f"Best trial: {best}.\n")
        parts.append(markdown([*keys, "jobs", metric], body) + "\n")
    return parts
