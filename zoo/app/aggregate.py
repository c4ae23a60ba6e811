"""Seeds aggregated into variants, and each variant compared with a baseline beyond seed noise.

A *variant* is a set of jobs whose overrides differ only in ``seed``. For each one the summary
reports n, mean, standard deviation and a 95% interval (Student's t) of the final and the best
metric, its mean throughput and memory, and the steps its runs reached. With a baseline named
(``sweep.baseline=attention:vanilla``), each variant's difference to it is taken seed by seed
where the seeds match (a paired interval over the differences), else between the two groups
(Welch's interval), and the verdict comes from the interval alone: ``better`` or ``worse`` when it
excludes zero, ``no difference shown`` when it does not (or when there is no interval: one seed).

Only jobs that finished count; a job of a search (its ``search``, from ``sweep.search``: a tuning
trial) is no variant.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

CONFIDENCE = 0.95
VARIANT_FREE = ("seed", "sweep.search")  # keys that do not make a variant (its seeds; the search it belongs to)
FINISHED = ("finished", "resumed", "kept")


# -- Student's t, without scipy --------------------------------------------------------------------


def _beta_continued_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz; Numerical Recipes 6.4)."""
    tiny, c, d = 1e-300, 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def regularized_beta(x: float, a: float, b: float) -> float:
    """I_x(a, b), the regularized incomplete beta function."""
    if x <= 0.0 or x >= 1.0:
        return 0.0 if x <= 0.0 else 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_continued_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_continued_fraction(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    tail = 0.5 * regularized_beta(df / (df + t * t), df / 2.0, 0.5)
    return 1.0 - tail if t > 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (bisection on the CDF)."""
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    low, high = 0.0, 1.0
    while t_cdf(high, df) < p:
        high *= 2.0
    for _ in range(200):
        mid = 0.5 * (low + high)
        low, high = (mid, high) if t_cdf(mid, df) < p else (low, mid)
    return 0.5 * (low + high)


# -- intervals -------------------------------------------------------------------------------------


@dataclass
class Interval:
    """Mean of ``n`` values with its sample standard deviation and 95% interval (None below two values)."""

    n: int
    mean: float
    std: float | None
    low: float | None
    high: float | None

    def excludes_zero(self) -> bool:
        return self.low is not None and (self.low > 0 or self.high < 0)


def mean_interval(values: list[float]) -> Interval:
    values = [float(v) for v in values]
    n = len(values)
    if n == 0:
        return Interval(0, math.nan, None, None, None)
    mean = float(np.mean(values))
    if n < 2:
        return Interval(n, mean, None, None, None)
    std = float(np.std(values, ddof=1))
    half = t_quantile(0.5 + CONFIDENCE / 2, n - 1) * std / math.sqrt(n)
    return Interval(n, mean, std, mean - half, mean + half)


def welch_interval(a: list[float], b: list[float]) -> Interval:
    """mean(a) - mean(b) with Welch's 95% interval (unpaired samples, unequal variances)."""
    na, nb = len(a), len(b)
    mean = float(np.mean(a) - np.mean(b))
    if na < 2 or nb < 2:
        return Interval(min(na, nb), mean, None, None, None)
    va, vb = float(np.var(a, ddof=1)) / na, float(np.var(b, ddof=1)) / nb
    if va + vb == 0:
        return Interval(min(na, nb), mean, 0.0, mean, mean)
    df = (va + vb) ** 2 / (va**2 / (na - 1) + vb**2 / (nb - 1))
    half = t_quantile(0.5 + CONFIDENCE / 2, df) * math.sqrt(va + vb)
    return Interval(min(na, nb), mean, math.sqrt(va + vb), mean - half, mean + half)


@dataclass
class Difference:
    """A variant's difference to the baseline (variant - baseline) and what it shows."""

    interval: Interval
    paired: bool  # seed by seed (over ``seeds``) or between the groups (Welch)
    seeds: list[Any]
    verdict: str


def verdict(interval: Interval, higher_is_better: bool) -> str:
    """From the interval alone, never the mean: ``better``/``worse`` when it excludes zero."""
    if not interval.excludes_zero():
        return "no difference shown"
    return "better" if (interval.low > 0) == higher_is_better else "worse"


def compare(variant: dict[Any, float], baseline: dict[Any, float], higher_is_better: bool) -> Difference:
    """``variant`` and ``baseline``: {seed: final metric}. Paired over the seeds both have (when at
    least two), else Welch's interval between the two groups."""
    shared = sorted(set(variant) & set(baseline), key=seed_order)
    if len(shared) >= 2:
        interval = mean_interval([variant[s] - baseline[s] for s in shared])
        return Difference(interval, True, shared, verdict(interval, higher_is_better))
    interval = welch_interval(list(variant.values()), list(baseline.values()))
    return Difference(interval, False, [], verdict(interval, higher_is_better))


# -- variants ---------------------------------------------------------------------------------------


def seed_order(seed: Any) -> tuple[int, Any]:
    """Seeds in numeric order (they arrive as strings from the overrides)."""
    text = str(seed)
    return (0, int(text)) if text.lstrip("-").isdigit() else (1, text)


def variant_key(row: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in row.get("overrides", {}).items() if k not in VARIANT_FREE))


def finished_value(row: dict[str, Any], key: str) -> float | None:
    value = row.get(key)
    if isinstance(value, (int, float)) and not (isinstance(value, float) and math.isnan(value)):
        return float(value)
    return None


def parse_baseline(text: str) -> dict[str, str]:
    """``attention:vanilla,residual:pre_norm`` (or with ``=``) -> {key: value}; refused with the form."""
    out = {}
    for item in (i.strip() for i in text.split(",") if i.strip()):
        sep = "=" if "=" in item else ":"
        key, _, value = item.partition(sep)
        if not key or not value:
            raise ValueError(
                f"sweep.baseline={text!r}: write key:value pairs, e.g. sweep.baseline=attention:vanilla "
                "or sweep.baseline=model:vanilla_lm,seed... (one pair per key the sweep varies)"
            )
        out[key.strip().lstrip("+~")] = value.strip()
    return out


def matches(variant: dict[str, Any], wanted: dict[str, str]) -> bool:
    """Whether a variant is the one ``wanted`` names: its override, else its result column (model,
    attention, data), holds each value."""
    return all(str(variant["overrides"].get(k, variant.get(k))) == v for k, v in wanted.items())


def group_variants(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per variant (rows differing only by seed), in first-seen order, with its jobs."""
    groups: dict[tuple, dict[str, Any]] = {}
    for row in rows:
        if row.get("search"):
            continue
        key = variant_key(row)
        group = groups.setdefault(key, {"key": key, "overrides": dict(key), "rows": []})
        group["rows"].append(row)
        for column in ("model", "attention", "data"):
            group.setdefault(column, row.get(column))
    return list(groups.values())


def aggregate(rows: list[dict[str, Any]], baseline: str = "") -> tuple[list[dict[str, Any]], str]:
    """(the variants with their statistics and, with a baseline, their difference and verdict; a
    note about the baseline: empty when it was found or not asked)."""
    variants = group_variants(rows)
    higher = any(r.get("higher_is_better") for r in rows)
    for v in variants:
        done = [r for r in v["rows"] if str(r.get("status", "")).split(" ")[0] in FINISHED]
        by_seed = {r["overrides"].get("seed", r.get("seed")): r for r in done}
        v["seeds_finished"] = dict(sorted(by_seed.items(), key=lambda item: seed_order(item[0])))
        v["n_jobs"] = len(v["rows"])
        for column in ("final_metric", "best_metric"):
            v[column] = mean_interval([x for r in done if (x := finished_value(r, column)) is not None])
        for column in ("tokens_per_s", "act_mib", "gpu_peak_mib"):
            values = [x for r in done if (x := finished_value(r, column)) is not None]
            v[column] = float(np.mean(values)) if values else None
        steps = sorted({int(r["steps"]) for r in done if isinstance(r.get("steps"), int)})
        v["steps"] = "-".join(map(str, dict.fromkeys([steps[0], steps[-1]]))) if steps else ""  # "300" or "120-300"
    if not baseline:
        return variants, ""
    wanted = parse_baseline(baseline)
    found = [v for v in variants if matches(v, wanted)]
    if len(found) != 1:
        names = "; ".join(label(v, variants) for v in variants)
        how = "none" if not found else f"{len(found)}"
        return variants, f"baseline {baseline!r} matches {how} of the variants ({names}): no comparison made"
    base = found[0]
    base_values = {s: finished_value(r, "final_metric") for s, r in base["seeds_finished"].items()}
    base_values = {s: x for s, x in base_values.items() if x is not None}
    for v in variants:
        if v is base:
            v["baseline"] = True
            continue
        values = {s: finished_value(r, "final_metric") for s, r in v["seeds_finished"].items()}
        v["difference"] = compare({s: x for s, x in values.items() if x is not None}, base_values, higher)
    return variants, ""


def label(variant: dict[str, Any], variants: list[dict[str, Any]]) -> str:
    """The variant's overrides that are not shared by every variant (``attention=lsh``)."""
    common = set.intersection(*(set(v["key"]) for v in variants)) if variants else set()
    kept = [f"{k}={value}" for k, value in variant["key"] if (k, value) not in common]
    return ",".join(kept) or str(variant.get("model") or "all")
