"""The xl_parity study's reading of the reference's log and its report, on rows made here (cheap)."""

from __future__ import annotations

import math

from zoo.studies import STUDY, StudyPaths, create_study
from zoo.studies.xl_parity import reference_losses


def test_reference_log_bpc_lines_are_read_as_nats_per_step(tmp_path):
    log = tmp_path / "train_2.log"
    log.write_text(
        "| epoch   1 step        1 |      1 batches | lr 0.00025 | ms/batch 99.1 | loss  7.24 | bpc  10.45339\n"
        "| Eval   1 at step        1 | time:  1.0s | valid loss  7.0 | bpc   10.1\n"
        "| epoch   1 step        2 |      2 batches | lr 0.00025 | ms/batch 98.0 | loss  7.15 | bpc  10.32927\n"
    )
    assert [round(x / math.log(2), 5) for x in reference_losses(log)] == [10.45339, 10.32927]


def test_report_gives_the_first_step_past_each_threshold_and_says_when_no_log_was_found(tmp_path):
    study = create_study("xl_parity", StudyPaths(out=tmp_path, runs=tmp_path / "runs"))
    rows = [dict(kind="step", run="3", step=str(s), same_length="", lr="0.001", ours_loss="1", reference_loss="1",
                 relative_difference=d) for s, d in ((1, "1e-7"), (2, "2e-5"), (3, "3e-2"))]
    rows += [dict(kind="test", run="3", step="", same_length=k, lr="0.001", bpc="3.0", relative_difference="")
             for k in ("True", "False")]
    text = study.report(rows)
    assert "1e-05: 2, 1e-04: 3, 1e-02: 3" in text and "apart from step 2" in text
    assert (tmp_path / STUDY.get("xl_parity").figures[0]).stat().st_size > 0
    alone = [dict(r, reference_loss="", relative_difference="") for r in rows]
    assert "no reference log was found" in study.report(alone)
