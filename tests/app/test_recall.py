"""Zoology's Figure 2 and the recall / decoding-state frontier (zoo/app/recall.py, sweep=mqar_figure2):
the sweep runs at toy size and reports each cell with the state its model returns."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

pytest.importorskip("hydra")

from support.app_cli import train_main  # noqa: E402

from zoo.app.recall import decoding_state, figure2_cells, main, pareto_front, verdicts  # noqa: E402

TOY = [
    "sweep=mqar_figure2",
    "logger=csv",
    "experiment=mqar/len64,mqar/len128",
    "attention=vanilla,linear",
    "model.d_model=32",
    "optim.lr=1e-3",
    "seed=0",
    "trainer.max_steps=1",
    "trainer.eval_every=0",
    "trainer.eval_batches=1",
    "trainer.batch_size=2",
    "data.eval_size=2",
    "trainer.progress=false",
    "trainer.device=cpu",
    "trainer.checkpoints=false",
]


def read(path: Path) -> list[dict[str, str]]:
    with open(path) as f:
        return list(csv.DictReader(f))


def test_toy_sweep_writes_figure2_and_the_frontier_with_measured_state(tmp_path, monkeypatch):
    """Two lengths x two mechanisms: the dense cache holds K and V for every token (2 t d float32 bytes
    per layer, doubling with the length), linear attention's state does not grow."""
    sweep = tmp_path / "sweep"
    assert train_main(["-m", *TOY, f"hydra.sweep.dir={sweep}"], monkeypatch) == 0
    cells = {(r["mechanism"], int(r["seq_len"])): r for r in read(sweep / "frontier.csv")}
    assert set(cells) == {(m, t) for m in ("vanilla", "linear") for t in (64, 128)}
    assert {int(cells["vanilla", t]["num_kv_pairs"]) for t in (64, 128)} == {4, 8}  # the paper's panels
    for t in (64, 128):
        assert float(cells["vanilla", t]["state_bytes_per_layer"]) == 2 * t * 32 * 4
    assert cells["linear", 64]["state_bytes_per_layer"] == cells["linear", 128]["state_bytes_per_layer"]
    assert (sweep / "figure2.png").is_file() and (sweep / "frontier.png").is_file()
    assert "Pareto front" in (sweep / "recall.md").read_text()
    # the grid split over two sweep directories re-renders as one report
    again = tmp_path / "again"
    main([str(sweep), str(sweep), "--out", str(again)])
    assert len(read(again / "recall_rows.csv")) == 2 * len(read(sweep / "recall_rows.csv"))
    assert "length 128, **linear**" in (again / "recall.md").read_text()


def cell(mechanism, accuracy, state, seq_len=64):
    return dict(mechanism=mechanism, seq_len=seq_len, accuracy=accuracy, state_bytes_per_layer=state)


def test_pareto_front_keeps_what_no_smaller_state_beats():
    cells = [
        cell("a", 0.9, 1000),
        cell("b", 0.5, 100),
        cell("c", 0.4, 500),
        cell("d", 0.95, None),
        cell("e", 0.3, 10, 128),
    ]
    assert {c["mechanism"] for c in pareto_front(cells)} == {"a", "b", "e"}  # c is beaten by b; d has no state


def test_figure2_cells_take_the_best_rate_per_seed():
    rows = [
        dict(
            mechanism="m",
            seq_len=64,
            num_kv_pairs=4,
            d_model=64,
            lr=lr,
            seed=seed,
            accuracy=acc,
            state_bytes_per_layer=8,
        )
        for lr, seed, acc in [(1e-3, 0, 0.2), (3e-3, 0, 0.6), (1e-3, 1, 0.8), (3e-3, 1, 0.1)]
    ]
    (only,) = figure2_cells(rows)
    assert only["accuracy"] == pytest.approx(0.7) and only["seeds"] == 2 and only["best_lrs"] == "0.003 0.001"
    assert only["per_seed"] == "0.600 / 0.800"


def test_a_model_that_cannot_decode_has_no_state():
    config = dict(name="vanilla_lm", vocab_size=16, d_model=16, n_layers=1, n_heads=2, d_ff=32, attention="lsh")
    state, why = decoding_state(config, 32)
    assert state is None and "cannot continue" in why


def width(mechanism, d_model, accuracy, low=None, high=None, seeds=1):
    return dict(mechanism=mechanism, seq_len=64, d_model=d_model, accuracy=accuracy, low=low, high=high, seeds=seeds)


def test_verdicts_say_from_which_width_a_mechanism_recalls():
    cells = [width("a", 64, 0.99, 0.98, 1.0, 3), width("a", 128, 1.0, 1.0, 1.0, 3),
             width("g", 64, 0.30), width("g", 128, 0.95),
             width("l", 64, 0.25), width("l", 128, 0.26),
             width("o", 64, 0.95), width("o", 128, 0.5)]
    said = {line.split("**")[1]: line for line in verdicts(cells)}
    assert "recalls at every width tried" in said["a"] and "[0.980, 1.000] (3 seeds)" in said["a"]
    assert "recalls from d_model 128 on" in said["g"]
    assert "does not recall at any width tried" in said["l"]
    assert "recalls at d_model 64 only" in said["o"]
