"""The Universal Transformer study without training: each model's settings reach the app (ACT capped, the fixed
stack without ACT, the vanilla model at half the width), and the verdict compares the best UT with vanilla."""

from __future__ import annotations

from zoo.studies import StudyPaths, create_study
from zoo.studies.universal_algorithmic import UniversalAlgorithmic


def test_each_models_settings_reach_the_app(tmp_path):
    study = create_study("universal_algorithmic", StudyPaths(out=tmp_path, runs=tmp_path), d_model=64, steps=50)
    act = study.train_overrides("reverse", "universal_transformer_act")
    assert {"data.problem=reverse", "stack=universal", "stack.max_steps=8", "model.d_model=64"} <= set(act)
    assert "optim.warmup=5" in act
    assert "stack.act=false" in study.train_overrides("copy", "universal_transformer")
    vanilla = study.train_overrides("copy", "vanilla_seq2seq")
    assert {"model=vanilla_seq2seq", "model.d_model=32", "model.d_ff=128"} <= set(vanilla)


def test_verdict_compares_the_best_universal_transformer_with_vanilla():
    rows = [dict(task=t, model=m, test_char_acc=str(a)) for t, m, a in (
        ("copy", "universal_transformer_act", 0.6), ("copy", "universal_transformer", 0.4),
        ("copy", "vanilla_seq2seq", 0.5),
        ("reverse", "universal_transformer", 0.1), ("reverse", "vanilla_seq2seq", 0.2))]
    verdict = UniversalAlgorithmic.verdict(rows)
    assert "better on 1 of 2 tasks" in verdict and "better on copy (0.60 vs 0.50)" in verdict
    assert "not on reverse" in verdict
