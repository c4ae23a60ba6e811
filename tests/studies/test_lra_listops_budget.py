"""The ListOps full-budget study without training: each run's overrides reach the app, plain ``lsh`` runs as
the setting's reformer-2, runs go to listops_<mechanism>_s<seed>, a finished run is scored on test once, and
the rows (curve and final scores) are read from the runs' own logs."""

from __future__ import annotations

import json

import zoo.studies.lra_listops_budget as study_module
from zoo.studies import StudyPaths, create_study
from zoo.studies.common import Rows


def test_each_runs_overrides_reach_the_app_and_lsh_runs_as_their_reformer_2(tmp_path, monkeypatch):
    trained, scored = [], []

    def fake_train(overrides, run_dir, **_):
        trained.append((run_dir.name, overrides))
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "metrics.jsonl").write_text(
            "\n".join(
                json.dumps(m)
                for m in (
                    {"step": 1, "train/loss": 2.0},
                    {"step": 2, "train/loss": 1.0},
                    {"step": 2, "val/accuracy": 0.25},
                )
            )
        )
        return run_dir

    def fake_score(checkpoint, split):
        scored.append((checkpoint, split))
        return {"test/accuracy": 0.3, "step": 2}

    monkeypatch.setattr(study_module, "train", fake_train)
    monkeypatch.setattr(study_module, "score_checkpoint", fake_score)
    study = create_study(
        "lra_listops_budget",
        StudyPaths(out=tmp_path / "out", runs=tmp_path / "runs"),
        runs=["lsh", "local_1d:attention.block=64:model.dropout=0"],
        seeds=[3],
    )
    study.run()
    (lsh_dir, lsh), (local_dir, local) = trained
    assert lsh_dir == "listops_lsh_s3" and "attention=lsh" in lsh and "seed=3" in lsh
    for option in ("n_hashes=2", "n_buckets=64", "chunk_size=64", "attend_across_buckets=true"):
        assert f"attention.{option}" in lsh
    assert "model.attention_dropout=0" in lsh and "lra_setting=nystromformer" in lsh
    assert local_dir == "listops_local_1d_s3" and "attention.block=64" in local and "model.dropout=0" in local
    assert not any(arg.startswith("attention.n_hashes") for arg in local)
    runs = tmp_path / "runs"
    assert scored == [(runs / d / "checkpoints" / "best.pt", "test") for d in (lsh_dir, local_dir)]
    rows = Rows(study.rows_path, ("run", "kind", "step")).read()
    evals = [r for r in rows if r["kind"] == "eval"]
    assert [(r["run"], r["dev_accuracy"], r["train_loss_since_last_eval"]) for r in evals] == [
        ("listops_lsh_s3", "25.00", "1.5000"),
        ("listops_local_1d_s3", "25.00", "1.5000"),
    ]
    assert {r["test_of_best"] for r in rows if r["kind"] == "final"} == {"30.00% (best checkpoint: step 2)"}
    study.run()  # everything finished and recorded: scored once, no row twice
    assert len(scored) == 2 and len(Rows(study.rows_path, ("run",)).read()) == len(rows)
    report = study.report(rows)
    assert "`lsh_s3` left the plateau (best dev 25.00%" in report
