"""Seeds aggregated with intervals, and verdicts from the interval (issue 28, item 1)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

pytest.importorskip("hydra")

from support.app_cli import TOY, read_csv, train_main  # noqa: E402

from zoo.app.aggregate import compare, mean_interval, t_quantile  # noqa: E402

# two-sided 95% critical values of Student's t, as printed in every statistics table
PUBLISHED_T = {1: 12.706, 2: 4.303, 4: 2.776, 10: 2.228, 30: 2.042}


def test_t_quantile_is_students():
    for df, value in PUBLISHED_T.items():
        assert t_quantile(0.975, df) == pytest.approx(value, abs=5e-4)
    stats = pytest.importorskip("scipy.stats")
    for df in (1, 2, 3, 5.5, 17, 200):
        for p in (0.9, 0.975, 0.995, 0.025):
            assert t_quantile(p, df) == pytest.approx(stats.t.ppf(p, df), rel=1e-9)


def test_the_verdict_comes_from_the_interval_never_the_mean():
    """A higher mean with an interval across zero shows no difference; a small but steady paired
    gain is shown; the direction follows the metric (accuracy up, bpc down)."""
    baseline = {0: 0.50, 1: 0.60, 2: 0.40}
    noisy = {0: 0.62, 1: 0.55, 2: 0.49}  # mean +0.053, but the differences straddle zero
    steady = {0: 0.51, 1: 0.61, 2: 0.41}  # +0.01 on every seed
    difference = compare(noisy, baseline, higher_is_better=True)
    assert difference.interval.mean > 0 and difference.verdict == "no difference shown"
    assert difference.paired and difference.seeds == [0, 1, 2]
    assert compare(steady, baseline, higher_is_better=True).verdict == "better"
    assert compare(steady, baseline, higher_is_better=False).verdict == "worse"
    # seeds that do not match: Welch's interval between the groups, never a pairing by position
    unpaired = compare({5: 0.9, 6: 0.95, 7: 0.92}, baseline, higher_is_better=True)
    assert not unpaired.paired and unpaired.verdict == "better"
    stats = pytest.importorskip("scipy.stats")
    expected = stats.ttest_ind([0.9, 0.95, 0.92], list(baseline.values()), equal_var=False)
    assert unpaired.interval.low > 0 and expected.pvalue < 0.05
    one_seed = compare({0: 0.9}, {0: 0.1}, higher_is_better=True)
    assert one_seed.interval.low is None and one_seed.verdict == "no difference shown"


def test_a_seeded_sweep_reports_each_variant_with_intervals_and_a_paired_verdict(tmp_path, monkeypatch, text_file):
    """attention=vanilla,additive x seeds 0,1,2 on text, baseline vanilla: one variant row each with
    n = 3 and the mean and interval of the jobs' own results; the difference is taken seed by seed;
    the verdict agrees with the interval; the per-job table keeps its 6 rows; the plot is drawn."""
    sweep = tmp_path / "sweep"
    argv = ["-m", *TOY, "trainer.max_steps=3", "data=char_lm", f"data.path={text_file}", "model.dropout=0.1"]
    argv += ["attention=vanilla,additive", "seed=0,1,2", "sweep.baseline=attention:vanilla", f"hydra.sweep.dir={sweep}"]
    assert train_main(argv, monkeypatch) == 0
    jobs = read_csv(sweep / "summary.csv")
    assert len(jobs) == 6
    results = {(r["attention"], r["seed"]): json.loads((Path(r["dir"]) / "result.json").read_text()) for r in jobs}
    variants = {v["attention"]: v for v in read_csv(sweep / "summary_variants.csv")}
    assert sorted(variants) == ["additive", "vanilla"]
    for name, v in variants.items():
        finals = [results[(name, s)]["final_metric"] for s in "012"]
        expected = mean_interval(finals)
        assert (int(v["n"]), v["seeds"]) == (3, "0 1 2")
        assert float(v["final_mean"]) == pytest.approx(sum(finals) / 3, rel=1e-12)
        half = t_quantile(0.975, 2) * expected.std / math.sqrt(3)
        assert float(v["final_ci_high"]) - float(v["final_mean"]) == pytest.approx(half, rel=1e-9) and half > 0
        bests = [results[(name, s)]["best_metric"] for s in "012"]
        assert float(v["best_mean"]) == pytest.approx(sum(bests) / 3, rel=1e-12)
    assert variants["vanilla"]["verdict"] == "baseline"
    additive = variants["additive"]
    differences = [results[("additive", s)]["final_metric"] - results[("vanilla", s)]["final_metric"] for s in "012"]
    paired = mean_interval(differences)
    assert float(additive["difference_mean"]) == pytest.approx(paired.mean, rel=1e-9)
    assert float(additive["difference_ci_low"]) == pytest.approx(paired.low, rel=1e-9)
    low, high = float(additive["difference_ci_low"]), float(additive["difference_ci_high"])
    shown = {True: "worse", False: "better"}[low > 0] if (low > 0 or high < 0) else "no difference shown"  # bpc: lower
    assert additive["verdict"] == shown and additive["paired"] == "True"
    md = (sweep / "summary.md").read_text()
    assert f"- `attention=additive`: **{shown}**" in md and "paired over seeds 0, 1, 2" in md
    assert "## Every job (best first)" in md and (sweep / "summary.png").stat().st_size > 5000
