"""The recompute-cost study's report from rows alone: the table and the verdict follow the worst median."""

from __future__ import annotations

from zoo.studies import StudyPaths, create_study


def row(attention: str, ratio: float) -> dict[str, str]:
    return dict(attention=attention, length="4096", heads="4", head_dim="64", ratio=str(ratio),
                ratio_min=str(ratio - 0.1), ratio_max=str(ratio + 0.1), rounds="5", threads="1", load_1min="1.0")


def test_the_verdict_reads_the_worst_median(tmp_path):
    study = create_study("recompute_cost", StudyPaths(out=tmp_path, runs=tmp_path))
    report = study.report([row("a", 1.4), row("b", 1.5)])
    assert "| a | 4,096 | 1.40x (1.30-1.50) |" in report and "stays under 2x" in report and "at most 1.50x" in report
    assert "exceeds 2x" in study.report([row("a", 1.4), row("b", 2.1)])
    assert (tmp_path / "recompute_cost.png").stat().st_size > 0
