"""Smoke test of experiments/ut_length.py (UT length generalisation with randomised offsets, beside
torch.nn.Transformer): a few steps per model, then the report step."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import pytest
import torch
from support.script_modules import load_script

SCRIPT = Path(__file__).parents[2] / "experiments" / "ut_length.py"


def load():
    return load_script(SCRIPT)


def test_runs_every_model_resumes_and_reports(tmp_path, monkeypatch):
    ut_length = load()
    options = (
        "--tasks reverse --seeds 0 --train-steps 3 --d-model 16 --steps-t 4 --train-max 6 --offset-max 10 "
        "--test-lengths 6,12 --n-test 4 --greedy-lengths 12 --n-greedy 2 --curve-every 2"
    )
    argv = ["ut_length.py", *options.split(), "--out", str(tmp_path)]
    monkeypatch.setattr(sys, "argv", argv)
    ut_length.main()
    with open(tmp_path / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["model"] for r in rows] == list(ut_length.MODELS)
    for r in rows:
        assert 0.0 <= float(r["char_12"]) <= 1.0 and 0.0 <= float(r["greedy_char_12"]) <= 1.0
    params = [int(r["params"]) for r in rows]
    assert max(params) < 1.2 * min(params)  # equal budget: UT at d, vanilla/torch at d/2 with T = 4 layers
    monkeypatch.setattr(sys, "argv", argv)
    ut_length.main()  # resumable: nothing re-run
    with open(tmp_path / "results.csv") as f:
        assert len(list(csv.DictReader(f))) == len(rows)
    assert "| reverse | ut | 10 |" in (tmp_path / "results.md").read_text()
    assert (tmp_path / "char_acc_vs_length.png").exists()
    with open(tmp_path / "curve.csv") as f:
        assert [int(r["step"]) for r in csv.DictReader(f)] == [2] * len(rows)  # step 2 of 3, once per model


def test_teacher_forced_sequence_accuracy_is_greedy_decodings():
    """seq-acc from one teacher-forced pass equals greedy decoding's (the report relies on it)."""
    ut_length = load()
    from zoo.data.algorithmic import algorithmic_batch

    args = type("A", (), {"d_model": 16, "heads": 2, "steps_t": 2, "offset_max": 0})()
    torch.manual_seed(0)
    model = ut_length.build("vanilla", "copy", args)
    batch = algorithmic_batch("copy", 8, 3, 3, generator=torch.Generator().manual_seed(0))
    # make the model right on some strings: train a few steps on this batch
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(60):
        optimizer.zero_grad()
        model(batch["src"], batch["tgt"], batch["targets"], src_pad_mask=batch["src_pad_mask"]).loss.backward()
        optimizer.step()
    teacher_seq = ut_length.score_teacher_forced(model, batch)[1]
    assert teacher_seq == ut_length.score_greedy(model, batch)[1]
    assert teacher_seq > 0


@pytest.mark.parametrize("name", ["torch", "ut"])
def test_offsets_reach_the_models_in_training_only(name):
    ut_length = load()
    args = type("A", (), {"d_model": 16, "heads": 2, "steps_t": 2, "offset_max": 50})()
    torch.manual_seed(0)
    model = ut_length.build(name, "copy", args)
    from zoo.data.algorithmic import algorithmic_batch

    batch = algorithmic_batch("copy", 4, 5, 5, generator=torch.Generator().manual_seed(0))
    model.eval()
    torch.testing.assert_close(ut_length.logits_of(model, batch), ut_length.logits_of(model, batch))
    model.train()
    torch.manual_seed(1)
    first = ut_length.logits_of(model, batch)
    torch.manual_seed(2)
    assert not torch.allclose(ut_length.logits_of(model, batch), first)


def test_torch_reference_trains_through_zoo_steps_as_its_plain_loop_did(monkeypatch, tmp_path):
    """torch.nn.Transformer now trains through zoo.train.steps.train_step like our models; its losses
    over a few steps equal those of the plain loop it had (cross-entropy, backward, clip 1.0, Adam +
    cosine schedule), bitwise."""
    from zoo.data.algorithmic import algorithmic_batch
    from zoo.train.steps import adam, optimizer_step, schedule, train_step

    ut_length = load()
    seen = []

    def recording(*args, **kwargs):
        out, loss = train_step(*args, **kwargs)
        seen.append(float(loss))
        return out, loss

    monkeypatch.setattr(ut_length, "train_step", recording)
    options = "--tasks copy --models torch --seeds 0 --train-steps 4 --d-model 16 --steps-t 2 --train-max 5"
    options += " --offset-max 10 --test-lengths 5 --n-test 2 --greedy-lengths= --batch 4"
    monkeypatch.setattr(sys, "argv", ["ut_length.py", *options.split(), "--out", str(tmp_path)])
    ut_length.main()
    args = type("A", (), {"d_model": 16, "heads": 4, "steps_t": 2, "offset_max": 10})()
    torch.manual_seed(0)
    model = ut_length.build("torch", "copy", args)
    optimizer = adam(model, lr=3e-3)
    scheduler = schedule(optimizer, "cosine", warmup=0, total=4)
    g = torch.Generator().manual_seed(1)
    expected = []
    for _ in range(4):
        batch = algorithmic_batch("copy", 4, 1, 5, generator=g)
        model.train()
        optimizer.zero_grad(set_to_none=True)
        logits = ut_length.logits_of(model, batch)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch["targets"].flatten(), ignore_index=-100)
        loss.backward()
        optimizer_step(model, optimizer, scheduler=scheduler, clip=1.0)
        expected.append(float(loss.detach()))
    assert seen == expected
