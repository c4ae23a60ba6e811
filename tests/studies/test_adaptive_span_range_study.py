"""The adaptive-span range study: each run's model reaches the app, the FLOPs count what each code computes, the
authors' runs are skipped with the reason when their checkout is absent, ours resume (slow), and the trainer
logs each head's span so the trajectories come from the app's own log."""

from __future__ import annotations

import pytest
import torch

from zoo.app.csv_rows import read_rows
from zoo.studies import StudyPaths, create_study
from zoo.studies.adaptive_span_range import AdaptiveSpanRange, attention_flops
from zoo.train.scoring import scalar_stats

TINY = dict(distance=6, train_chars=2000, valid_chars=256, steps=2, segment=8, batch=2, layers=1, d_model=16,
            heads=2, max_span=16, small_span=4, ramp=4, log_every=1, ref_path="")


def study(tmp_path, **options) -> AdaptiveSpanRange:
    return create_study("adaptive_span_range", StudyPaths(out=tmp_path, runs=tmp_path), **{**TINY, **options})


def test_each_run_reaches_the_app_as_its_model(tmp_path):
    options = set(study(tmp_path, span_init=1.0).overrides("ours-adaptive"))
    assert "+model.attention={name:adaptive_span,mode:learned,max_span:16,ramp:4,l1:2e-06,span_init:16.0," \
           "relative_keys:true}" in options and "position=none" in options
    small = " ".join(study(tmp_path, positions="sinusoidal").overrides("ours-small"))
    assert "mode:fixed,max_span:4," in small and "relative_keys:false" in small and "position=sinusoidal" in small


def test_flops_count_each_head_and_each_codes_window():
    """A fixed span S costs S / w of a fixed span w; a learned span counts its keys with a non-zero mask,
    min(S, ceil(z + R) - 1), per head, while the kernel computes the longest head's window for every head
    (the authors' trimmed in steps of 64)."""
    fixed, small = attention_flops([[32.0, 32.0]], 8, 32, 4, "ours-fixed"), attention_flops([[8.0, 8.0]], 8, 32, 4,
                                                                                             "ours-small")
    assert fixed[0] == 4 * small[0] and fixed == (fixed[0], fixed[0])
    paper, kernel = attention_flops([[2.0, 100.0]], 8, 256, 32, "ours-adaptive")
    assert paper == 6 * 8 * (33 + 131) and kernel == 2 * 6 * 8 * 131
    assert attention_flops([[2.0, 100.0]], 8, 256, 32, "ref-adaptive")[1] == 2 * 6 * 8 * 192  # 256 - 64


def test_the_authors_runs_are_skipped_with_the_reason_when_absent(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("ADAPTIVE_SPAN_REF", raising=False)
    run = study(tmp_path, runs=["ref-adaptive"], ref_path=str(tmp_path / "absent"))
    run.run()
    assert "skipped" in capsys.readouterr().out
    assert [r["kind"] for r in read_rows(run.rows_path)] == ["oracle"]  # nothing trained


def test_each_head_of_a_per_head_statistic_is_logged():
    logged = scalar_stats({"span": torch.tensor([1.0, 3.0]), "steps": torch.ones(2, 3)}, "train/")
    assert logged == {"train/span": 2.0, "train/span/0": 1.0, "train/span/1": 3.0, "train/steps": 1.0}


def test_verdict_compares_ours_with_the_authors_at_each_initialisation():
    def row(run, init, bpc, span):
        return dict(run=run, span_init=init, val_bpc=str(bpc), span_mean=str(span))

    same = [row("ref-adaptive", "1.0", 1.56, 190), row("ours-adaptive", "1.0", 1.55, 186)]
    assert "ours matches" in AdaptiveSpanRange.verdict(same)
    apart = [*same, row("ref-adaptive", "0.0", 2.5, 3), row("ours-adaptive", "0.0", 2.6, 3)]
    assert "does not match" in AdaptiveSpanRange.verdict(apart)
    assert "no pair" in AdaptiveSpanRange.verdict(same[1:])


@pytest.mark.slow
def test_ours_train_through_the_app_and_resume(tmp_path):
    run = study(tmp_path, runs=["ours-adaptive", "ours-fixed", "ours-small"])
    run.run()
    summary = [r for r in read_rows(run.rows_path) if r["kind"] == "summary"]
    assert [r["run"] for r in summary] == ["ours-adaptive", "ours-fixed", "ours-small"]
    assert float(summary[1]["span_mean"]) == 16 and float(summary[2]["span_mean"]) == 4
    spans = [r for r in read_rows(run.rows_path) if r["kind"] == "span" and r["run"] == "ours-small"]
    assert {(r["step"], r["layer"], r["head"]) for r in spans} == {(s, "0", h) for s in "12" for h in "01"}
    before = run.rows_path.read_text()
    run.run()  # every run's summary is there: nothing runs again
    assert run.rows_path.read_text() == before
