"""The single-rate GTrXL recall study: its training through the shared stream loop equals the plain loop it
replaced (segment i's loss weighted 1 / (i + 1), one step per stream), and its verdict reads the seeds' successes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from zoo.data.delayed_recall import delayed_recall_batch, vocab_size
from zoo.studies import StudyPaths, create_study
from zoo.studies.gtrxl_recall import GTrXLRecall
from zoo.studies.gtrxl_robustness import ours


def test_training_through_the_stream_loop_matches_the_plain_loop_it_replaced(tmp_path):
    study = create_study("gtrxl_recall", StudyPaths(out=tmp_path, runs=tmp_path), steps=3, eval_every=1, batch=4,
                         layers=1, d_model=16, segments=3, segment_len=4, eval_streams=8)
    rows = study.train_one("trxl_i", 0)
    assert [r["kind"] for r in rows] == ["curve"] * 3 + ["run"]
    torch.manual_seed(0)
    model = ours("trxl_i", vocab=vocab_size(8, 16), d_model=16, layers=1, heads=4, d_ff=64, memory=4)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    data = torch.Generator().manual_seed(0)
    expected = []
    for _ in range(3):
        optimizer.zero_grad(set_to_none=True)
        batch = delayed_recall_batch(4, n_segments=3, segment_len=4, generator=data)
        model.reset(4)
        losses = []
        for i, (tokens, targets) in enumerate(zip(batch["tokens"].split(4, 1), batch["targets"].split(4, 1))):
            loss = F.cross_entropy(model(tokens=tokens).logits.flatten(0, 1), targets.flatten(), ignore_index=-100)
            losses.append(float(loss.detach()))
            (loss / (i + 1)).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        expected.append(sum(losses) / len(losses))
    assert [r["loss"] for r in rows[:3]] == pytest.approx(expected, abs=1e-4)  # rows keep 4 decimals


def test_verdict_reads_the_seeds_successes():
    def runs(**successes):
        return [dict(model=m, success="1" if i < n else "0") for m, n in successes.items() for i in range(3)]

    assert "GTrXL is at least" in GTrXLRecall.verdict(runs(gtrxl=3, trxl_i=2))
    assert "is not at least" in GTrXLRecall.verdict(runs(gtrxl=0, trxl_i=2, transformer_xl=0))
    assert "not enough rows" in GTrXLRecall.verdict(runs(trxl_i=2))
