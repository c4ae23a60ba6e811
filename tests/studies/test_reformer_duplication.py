"""The Reformer duplication study without training: each mode's attention reaches the app, and the verdict reads
the paper's two patterns (LSH-trained models at 8 hashes, the full model's drop to 1 hash) from the rows."""

from __future__ import annotations

from zoo.studies import StudyPaths, create_study
from zoo.studies.reformer_duplication import ReformerDuplication


def test_each_modes_attention_reaches_the_app(tmp_path):
    study = create_study("reformer_duplication", StudyPaths(out=tmp_path, runs=tmp_path), chunk=16)
    assert "attention=shared_qk" in study.train_overrides("full")
    assert {"attention=lsh", "attention.n_hashes=2", "attention.chunk_size=16"} <= set(study.train_overrides("lsh2"))


def test_verdict_reads_both_patterns():
    def results(lsh8: float, full_drop: float) -> dict:
        return {("lsh4", "lsh8"): dict(accuracy_percent=str(lsh8)), ("full", "lsh8"): dict(accuracy_percent="99"),
                ("full", "lsh1"): dict(accuracy_percent=str(99 - full_drop))}

    assert "2 of 2 checks" in ReformerDuplication.verdict(results(95.0, 40.0))
    verdict = ReformerDuplication.verdict(results(10.0, 0.0))
    assert "0 of 2 checks" in verdict and "lsh4 trained: 10.0% with LSH-8" in verdict
