"""The ut_length study (UT length generalisation with randomised offsets, beside torch.nn.Transformer): the four
models at an equal budget, a finished run not trained again, teacher-forced seq-acc equal to greedy decoding's,
offsets in training only, and torch.nn.Transformer trained by the shared loop as by the plain loop it replaced."""

from __future__ import annotations

import pytest
import torch

from zoo.app.csv_rows import read_rows
from zoo.data.algorithmic import algorithmic_batch
from zoo.studies import StudyPaths, create_study
from zoo.studies.ut_length import MODELS, Options, build, logits_of, score_greedy, score_teacher_forced
from zoo.train.steps import adam, optimizer_step, schedule

TINY = dict(tasks=["reverse"], seeds=[0], train_steps=2, d_model=16, steps_t=4, train_max=6, offset_max=10,
            test_lengths=[12], n_test=4, greedy_lengths=[12], n_greedy=2, batch=4)


def test_every_model_at_an_equal_budget_and_a_finished_run_is_not_trained_again(tmp_path, monkeypatch):
    study = create_study("ut_length", StudyPaths(out=tmp_path, runs=tmp_path), **TINY)
    study.run()
    rows = [r for r in read_rows(study.rows_path) if r["kind"] == "result"]
    assert [r["model"] for r in rows] == list(MODELS)
    assert all(0.0 <= float(r["char_12"]) <= 1.0 and 0.0 <= float(r["greedy_char_12"]) <= 1.0 for r in rows)
    params = [int(r["params"]) for r in rows]
    assert max(params) < 1.2 * min(params)  # UT at d, vanilla / torch at d/2 with T = 4 layers
    before = study.rows_path.read_bytes()
    monkeypatch.setattr(study, "train_and_score", lambda *args: pytest.fail("trained again"))
    study.run()
    assert study.rows_path.read_bytes() == before


def test_teacher_forced_sequence_accuracy_is_greedy_decodings():
    """seq-acc from one teacher-forced pass equals greedy decoding's (the report relies on it)."""
    torch.manual_seed(0)
    model = build("vanilla", "copy", Options(d_model=16, heads=2, steps_t=2, offset_max=0))
    batch = algorithmic_batch("copy", 8, 3, 3, generator=torch.Generator().manual_seed(0))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)  # right on some strings: a few steps on this batch
    for _ in range(60):
        optimizer.zero_grad()
        model(batch["src"], batch["tgt"], batch["targets"], src_pad_mask=batch["src_pad_mask"]).loss.backward()
        optimizer.step()
    teacher_seq = score_teacher_forced(model, batch)[1]
    assert teacher_seq == score_greedy(model, batch)[1]
    assert teacher_seq > 0


@pytest.mark.parametrize("name", ["torch", "ut"])
def test_offsets_reach_the_models_in_training_only(name):
    torch.manual_seed(0)
    model = build(name, "copy", Options(d_model=16, heads=2, steps_t=2, offset_max=50))
    batch = algorithmic_batch("copy", 4, 5, 5, generator=torch.Generator().manual_seed(0))
    model.eval()
    torch.testing.assert_close(logits_of(model, batch), logits_of(model, batch))
    model.train()
    torch.manual_seed(1)
    first = logits_of(model, batch)
    torch.manual_seed(2)
    assert not torch.allclose(logits_of(model, batch), first)


def test_torch_reference_trains_through_the_shared_loop_as_its_plain_loop_did(tmp_path, stepped_losses):
    """torch.nn.Transformer trains through the app's train_step in the studies' step loop like our models; its
    losses over a few steps equal those of a plain loop (cross-entropy, backward, clip 1.0, Adam + cosine), bitwise."""
    options = dict(tasks=["copy"], models=["torch"], seeds=[0], train_steps=4, d_model=16, steps_t=2, train_max=5,
                   offset_max=10, test_lengths=[5], n_test=2, greedy_lengths=[], batch=4)
    create_study("ut_length", StudyPaths(out=tmp_path, runs=tmp_path), **options).run()
    torch.manual_seed(0)
    model = build("torch", "copy", Options(**options))
    optimizer = adam(model, lr=3e-3)
    scheduler = schedule(optimizer, "cosine", warmup=0, total=4)
    g = torch.Generator().manual_seed(1)
    expected = []
    for _ in range(4):
        batch = algorithmic_batch("copy", 4, 1, 5, generator=g)
        model.train()
        optimizer.zero_grad(set_to_none=True)
        logits = logits_of(model, batch)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch["targets"].flatten(), ignore_index=-100)
        loss.backward()
        optimizer_step(model, optimizer, scheduler=scheduler, clip=1.0)
        expected.append(float(loss.detach()))
    assert stepped_losses == expected
