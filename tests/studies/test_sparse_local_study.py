"""The sparse/local timing study without timing: variants are named as the bench's old labels, and the
verdict reads the slopes and the speed-up at the longest shared length from the rows."""

from __future__ import annotations

from zoo.studies import StudyPaths, create_study
from zoo.studies.sparse_local import spec_variant, variant_label


def test_a_variant_is_its_mechanism_and_options():
    assert variant_label("attention=vanilla") == "vanilla"
    assert variant_label("attention=local_2d attention.width=128") == "local_2d(width=128)"
    variant = spec_variant("attention=lsh attention.n_hashes=2 model=reformer")
    assert (variant.name, variant.overrides) == ("reformer", {"attention": {"name": "lsh", "n_hashes": 2}})


def rows(times: dict[str, list[float]]) -> list[dict[str, str]]:
    return [dict(variant=v, length=str(n), time_ms=str(t), time_min_ms=str(t), act_mib="1.0", layers="2", status="ok")
            for v, ts in times.items() for n, t in zip((1024, 4096, 16384), ts)]


def test_verdict_needs_a_slower_growth_and_a_faster_step(tmp_path):
    study = create_study("sparse_local", StudyPaths(out=tmp_path, runs=tmp_path), fit_from=1024)
    report = study.report(rows({"vanilla": [1, 16, 256], "local_1d": [2, 8, 32], "local_2d": [1, 16, 300]}))
    assert "1 of 2 mechanisms" in report and "not: local_2d" in report
    assert "| local_1d | 2 | 8 | 32 |" in report and (tmp_path / "bench.png").stat().st_size > 0
