"""The experiments' generators as tasks the app trains on: ``data=delayed_recall`` (GTrXL),
``data=algorithmic`` (Universal Transformer, Table 4) and ``data=copy_at_distance`` (adaptive span's
range). Each task serves exactly the data its experiment script draws, so the committed results stay
reproducible, and trains through the app."""

from __future__ import annotations

import json
import math

import pytest
import torch

import zoo
from zoo.data import copy_at_distance, create_task
from zoo.data.algorithmic import EOS, FIRST, algorithmic_batch
from zoo.data.base import seeded_generator
from zoo.data.delayed_recall import delayed_recall_batch
from zoo.train.scoring import evaluate_model


def test_delayed_recall_segments_are_one_stream_in_order():
    task = create_task("delayed_recall", batch_size=3, seq_len=6, seed=5, n_segments=3)
    pieces = [task.batch("train", index) for index in range(3, 6)]  # the second stream
    stream = delayed_recall_batch(
        3, n_segments=3, segment_len=6, generator=seeded_generator(5, "delayed_recall", "train", 1, 0, 1)
    )
    assert torch.equal(torch.cat([p["tokens"] for p in pieces], 1), stream["tokens"])
    for piece in pieces:  # each segment asks for the cue at its end, and only there
        assert torch.equal(piece["targets"][:, -1], stream["cue"])
        assert (piece["targets"][:, :-1] == -100).all()
    assert [task.starts_stream(i) for i in range(7)] == [True, False, False, True, False, False, True]
    assert task.num_batches("val") == (256 // 3) * 3 and task.vocab_size == 1 + 8 + 16


def test_delayed_recall_evaluation_starts_each_stream_from_an_empty_memory():
    """The split's metric is the mean over streams, each read from a fresh memory: the previous
    stream's cue is never in memory (memory that leaked across streams would change the scores)."""
    task = create_task("delayed_recall", batch_size=2, seq_len=4, n_segments=2, eval_size=4)
    torch.manual_seed(0)
    model = zoo.create_model("transformer_xl", vocab_size=task.vocab_size, d_model=16, n_layers=1, n_heads=2, d_ff=32)
    metrics = evaluate_model(model, task, "val")
    nll = count = 0.0
    model.eval()
    with torch.no_grad():
        for stream in range(task.num_batches("val") // 2):
            state = model.init_state(2)
            for segment in range(2):
                batch = task.batch("val", 2 * stream + segment)
                out = model(batch["tokens"], state=state)
                state = out.state
                scored = batch["targets"] != -100
                nll += float(
                    torch.nn.functional.cross_entropy(out.logits[scored], batch["targets"][scored], reduction="sum")
                )
                count += int(scored.sum())
    assert metrics["val/loss"] == pytest.approx(nll / count, rel=1e-5)


def test_algorithmic_lengths_answers_and_refusals():
    task = create_task("algorithmic", batch_size=16, seq_len=6, problem="addition", min_len=2, eval_len=9)
    train, val = task.batch("train", 0), task.batch("val", 0)
    operands = (train["src_pad_mask"].sum(1) - 1) // 2  # a + b: two operands of n digits
    assert operands.min() >= 2 and operands.max() <= 6 and set(((val["src_pad_mask"].sum(1) - 1) // 2).tolist()) == {9}
    row = val["src"][0]
    digits = (row[:9] - FIRST).tolist(), (row[10:19] - FIRST).tolist()  # least significant digit first
    a, b = (sum(d * 10**i for i, d in enumerate(ds)) for ds in digits)
    answer = val["targets"][0][val["targets"][0] != -100].tolist()
    assert answer[-1] == EOS and sum((d - FIRST) * 10**i for i, d in enumerate(answer[:-1])) == a + b
    same = algorithmic_batch(
        "addition", 16, 2, 6, generator=seeded_generator(0, "algorithmic", "train", 0, 0, 1)
    )  # the experiment's generator draws the task's batches
    assert all(torch.equal(train[k], same[k]) for k in same)
    with pytest.raises(ValueError, match="copy, reverse, addition"):
        create_task("algorithmic", batch_size=2, seq_len=4, problem="sort")
    with pytest.raises(ValueError, match="min_len"):
        create_task("algorithmic", batch_size=2, seq_len=4, min_len=5)


def test_copy_at_distance_task_reads_the_texts_the_experiment_writes(tmp_path):
    options = dict(distance=12, n_symbols=6, train_chars=600, eval_chars=200)
    task = create_task("copy_at_distance", batch_size=2, seq_len=8, **options)
    process = {k: v for k, v in options.items() if k in ("distance", "n_symbols")}
    texts = copy_at_distance.write_splits(tmp_path, (600, 200, 200), **process)
    assert task.decode(task.data[:600].tolist()) == texts["train"]
    assert task.decode(task.data[600:800].tolist()) == copy_at_distance.read_split(tmp_path / "valid.txt")
    first, second = task.batch("train", 0), task.batch("train", 1)
    assert torch.equal(first["targets"][:, -1], second["tokens"][:, 0])  # rows continue their stream
    assert task.metric == "bpc" and task.vocab_size == 6


APP = [
    "logger=csv",
    "trainer.max_steps=2",
    "trainer.eval_every=0",
    "trainer.eval_batches=2",
    "trainer.batch_size=2",
    "trainer.progress=false",
    "trainer.device=cpu",
    "model.d_model=16",
    "model.d_ff=32",
    "model.n_heads=2",
    "model.n_layers=1",
    "model.dropout=0.0",
]


@pytest.mark.parametrize(
    "overrides,metric",
    [
        (["data=delayed_recall", "model=transformer_xl", "trainer.seq_len=8"], "accuracy"),
        (["data=algorithmic", "data.problem=reverse", "model=vanilla_seq2seq", "trainer.seq_len=6"], "accuracy"),
        (
            [
                "data=copy_at_distance",
                "data.distance=10",
                "data.train_chars=2000",
                "data.eval_chars=400",
                "model=adaptive_span_lm",
                "trainer.seq_len=16",
            ],
            "bpc",
        ),
    ],  # fmt: skip
    ids=["delayed_recall", "algorithmic", "copy_at_distance"],
)
def test_the_app_trains_on_each(tmp_path, overrides, metric):
    pytest.importorskip("hydra")
    from zoo.app.compose import compose
    from zoo.app.run import run

    value = run(compose(APP + overrides), run_dir=tmp_path / "run")
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert result["status"] == "finished" and result["steps"] == 2 and result["metric"] == metric
    assert math.isfinite(value)
