"""The Transformer-XL speed study without timing: its tables and verdicts (Table 9's 300x at L = 800,
training at most half the peer's step) come from the rows, a table per thread count."""

from __future__ import annotations

import pytest

from zoo.studies import StudyPaths, create_study


def rows(speedup: float, ours_ms: float) -> list[dict[str, str]]:
    return [
        dict(kind="eval", threads="1", attention_length="800", segment="128", memory="800", layers="4",
             d_model="256", rounds="5", vanilla_ms="50", xl_ms=str(50 / speedup), speedup=str(speedup),
             speedup_min=str(speedup - 10), speedup_max=str(speedup + 10), load_1min="1.0"),
        dict(kind="train", threads="1", attention_length="", segment="512", memory="512", layers="2",
             d_model="256", rounds="3", xl_ms=str(ours_ms), peer_ms="200", load_1min="1.0"),
    ]


def test_tables_and_verdict_come_from_the_rows(tmp_path, monkeypatch):
    study = create_study("xl_speed", StudyPaths(out=tmp_path, runs=tmp_path))
    monkeypatch.setattr(study, "figure", lambda rows: None)  # drawn in the contract test
    report = study.report(rows(350.0, 80.0))
    assert "| 800 | 50.00 | 0.1429 | 350x | 340-360x | 363x |" in report
    assert "| 512 | 512 | 80 | 200 | 0.40 | 542 |" in report
    assert "evaluation meets >= 300x at L = 800 (350x" in report and "at every size measured (0.40)" in report
    missed = study.report(rows(250.0, 120.0))
    assert "evaluation misses >= 300x" in missed and "except at 512+512 (0.60)" in missed


def test_train_configs_are_segment_plus_memory(tmp_path):
    with pytest.raises(ValueError, match="segment\\+memory"):
        create_study("xl_speed", StudyPaths(out=tmp_path, runs=tmp_path), train_configs=["512x512"])
