"""The ALiBi study without training: the run it launches carries every setting, and its report (mean and
range over seeds, change past the training length, verdict) is computed from the rows."""

from __future__ import annotations

import pytest

from zoo.studies import StudyPaths, create_study


def study(tmp_path, **options):
    return create_study("alibi_extrapolation", StudyPaths(out=tmp_path, runs=tmp_path / "runs"), **options)


def rows(changes: dict[str, float]) -> list[dict[str, str]]:
    out = []
    for position, change in changes.items():
        for seed, offset in ((0, 0.0), (1, 0.2)):
            for length, bpc in ((128, 3.0), (2048, 3.0 + change)):
                for protocol in ("segment", "sliding"):
                    out.append(
                        dict(
                            position=position,
                            seed=str(seed),
                            protocol=protocol,
                            eval_len=str(length),
                            bpc=str(bpc + offset),
                            load_1min="1.0",
                        )
                    )
    return out


def test_train_overrides_set_the_scheme_seed_and_training_length(tmp_path):
    overrides = study(tmp_path, steps=50, train_len=64, lengths=[64, 128]).train_overrides("alibi", 2)
    assert "position=alibi" in overrides and "seed=2" in overrides
    assert "trainer.seq_len=64" in overrides and "trainer.max_steps=50" in overrides
    assert "model.max_len=128" in overrides


def test_report_aggregates_seeds_and_reads_the_verdict_from_the_changes(tmp_path):
    s = study(tmp_path, positions=["alibi", "rope"], lengths=[128, 2048])
    stats = s.aggregate(rows({"alibi": -0.1, "rope": 0.5}))
    assert stats[("segment", "rope", 2048)] == (pytest.approx(3.6), pytest.approx(3.5), pytest.approx(3.7), 2)
    report = s.report(rows({"alibi": -0.1, "rope": 0.5}))
    assert "| rope | 3.100 (3.000-3.200) | 3.600 (3.500-3.700) |" in report
    assert "the claim shows" in report and (tmp_path / "extrapolation.png").stat().st_size > 0
    assert "does not show" in s.report(rows({"alibi": 0.2, "rope": 0.5}))
    assert "does not show" in s.report(rows({"alibi": -0.1, "rope": -0.05}))


def test_options_are_checked(tmp_path):
    with pytest.raises(ValueError, match="train_len"):
        study(tmp_path, train_len=100)
    with pytest.raises(Exception, match="stepz"):
        study(tmp_path, stepz=1)
