"""The lra_parity study: our ListOps loop beside mlpen/Nystromformer's (where their checkout is found), their
model trained alone (logged, resumed, scored), and the report made from rows (cheap, no reference needed)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from zoo.app.compose import compose
from zoo.app.csv_rows import read_rows
from zoo.app.run import build
from zoo.studies import StudyPaths, create_study
from zoo.studies.common import number
from zoo.studies.lra_parity import SETTING
from zoo.studies.lra_reference import train_theirs_alone

ROOT = Path(__file__).resolve().parents[2]
REF = Path(os.environ.get("ZOO_REFERENCES", ROOT.parent / "ref")) / "Nystromformer" / "LRA" / "code"
SHORT = ["data.max_length=96", "data.min_length=48", "trainer.seq_len=96", "trainer.batch_size=8"]
needs_reference = pytest.mark.skipif(not REF.is_dir(), reason="mlpen/Nystromformer not fetched ($ZOO_REFERENCES)")


def parity_rows(tmp_path: Path, variant: str) -> tuple[str, list[dict]]:
    """The study run for 6 steps of ``variant`` at 96 tokens: (its report, its rows)."""
    study = create_study("lra_parity", StudyPaths(out=tmp_path / variant, runs=tmp_path / "runs"), reference=str(REF),
                         variants=[variant], steps=6, overrides=SHORT)
    study.run()
    rows = read_rows(study.rows_path)
    return study.report(rows), rows


@pytest.mark.slow
@needs_reference
def test_our_loop_follows_theirs_step_for_step(tmp_path):
    """The setting's model and optimiser beside their ModelForSC, AdamW and OneCycleLR from the same weights on the
    same batches (dropout 0): the losses agree to float rounding; our default RMS-1 token table (read scaled) is
    another model, which parts from theirs from the first update."""
    text, rows = parity_rows(tmp_path, "setting")
    worst = max(number(r, "relative_difference") for r in rows)
    assert len(rows) == 6 and worst < 1e-5 and "our loop is theirs" in text
    _, scaled_rows = parity_rows(tmp_path, "our_tables")
    assert max(number(r, "relative_difference") for r in scaled_rows) > 10 * max(worst, 1e-7)


@pytest.mark.slow
@needs_reference
def test_their_run_alone_logs_resumes_and_scores_its_best_state(tmp_path):
    """Their nystrom-64 on our batches, stopped after 2 steps and resumed to 4; the log carries our metric keys
    (lra_listops_budget reads both), and result.json the test accuracy of the best dev state."""
    short = ["trainer.seq_len=128", "data.max_length=128", "data.min_length=64", "trainer.eval_every=2",
             "trainer.log_every=1", "data.eval_size=64"]
    resolved, task, _ = build(compose(SETTING + short))
    run = tmp_path / "listops_their_nystrom-64_s0"
    train_theirs_alone(REF, "nystrom-64", resolved, task, run, stop_after=2)
    first = (run / "metrics.jsonl").read_text().splitlines()
    with open(run / "metrics.jsonl", "a") as log:  # a row logged after last.pt, by a run killed before its next
        log.write(json.dumps({"step": 3, "train/loss": 9.0}) + "\n")
    resolved, task, _ = build(compose(SETTING + short))
    train_theirs_alone(REF, "nystrom-64", resolved, task, run, stop_after=4)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(first) == 2 and [row["step"] for row in rows] == [1, 2, 3, 4] and rows[2]["train/loss"] != 9.0
    assert [row["step"] for row in rows if "val/accuracy" in row] == [2, 4]
    result = json.loads((run / "result.json").read_text())
    assert result["best_step"] in (2, 4) and 0.0 <= result["test_accuracy"] <= 1.0


def test_report_counts_equal_steps_and_says_when_their_code_is_absent(tmp_path):
    study = create_study("lra_parity", StudyPaths(out=tmp_path, runs=tmp_path / "runs"))
    rows = [dict(kind="step", variant="setting", step=str(s), our_loss="2.1", their_loss="2.1", relative_difference=d)
            for s, d in enumerate(("0.000e+00", "1.0e-07", "0.000e+00"))]
    text = study.report(rows)
    assert "| 3 | 1.0e-07 | 2 of 3 |" in text and "our loop is theirs" in text
    alone = [dict(r, their_loss="", relative_difference="") for r in rows]
    assert "were not found" not in text and "not found" in study.report(alone)
