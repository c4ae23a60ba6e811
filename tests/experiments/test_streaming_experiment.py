"""experiments/streaming.py (StreamingLLM's claim): the four modes see what they claim to see.

A one-layer model makes the modes comparable exactly: its keys and values come from the embeddings
alone, so a window cache holds exactly what re-computing on the window would, and every mode agrees
while the stream is shorter than the window."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import numpy as np
from support.script_modules import load_script

import zoo

PROJECT_ROOT = Path(__file__).resolve().parents[2]


def script():
    return load_script(PROJECT_ROOT / "experiments" / "streaming.py")


def trained_checkpoint(tmp_path: Path) -> Path:
    text = tmp_path / "text.txt"
    rng = np.random.default_rng(0)
    text.write_text("".join(rng.choice(list("abcdefgh \n"), size=6000)))
    run_dir = tmp_path / "run"
    subprocess.run(
        [
            sys.executable,
            str(PROJECT_ROOT / "experiments" / "train.py"),
            "experiment=tiny",
            "data=char_lm",
            f"data.path={text}",
            "model=vanilla_lm",
            "position=none",
            "model.n_layers=1",
            "model.d_model=16",
            "model.n_heads=2",
            "model.d_ff=32",
            "model.dropout=0.0",
            "trainer.max_steps=2",
            "trainer.batch_size=2",
            "trainer.seq_len=32",
            "data.split=[0.5,0.25,0.25]",
            "trainer.eval_every=2",
            "logger=none",
            f"hydra.run.dir={run_dir}",
        ],
        check=True,
        capture_output=True,
        cwd=PROJECT_ROOT,
    )
    return run_dir / "checkpoints" / "last.pt"


def test_the_modes_see_what_they_claim_and_the_window_caches_stay_constant(tmp_path):
    exp = script()
    checkpoint = trained_checkpoint(tmp_path)
    out = tmp_path / "out"
    exp.main([str(checkpoint), "--tokens", "90", "--window", "12", "--sinks", "3", "--chunk", "30", "--out", str(out)])
    with open(out / "streaming.csv") as f:
        rows = list(csv.DictReader(f))
    assert {r["mode"] for r in rows} == set(exp.MODES) and len(rows) == 3 * len(exp.MODES)
    # one layer: a window cache of W keys is exactly the recomputed window of W + 1 tokens
    _, task, model, _ = exp.load_run(checkpoint)
    stream = exp.torch.from_numpy(exp.split_stream(task, "test")[:91])
    runs = {mode: exp.Stream(mode, m, 12) for mode, m in exp.mode_models(model, 12, 3).items()}
    for run in runs.values():
        run.run(stream, 0, 90)
    nll = {mode: np.asarray(run.nll) for mode, run in runs.items()}
    np.testing.assert_allclose(nll["window"], nll["recompute"], rtol=1e-4, atol=1e-5)
    for mode in ("window", "sinks", "recompute"):  # within the window every mode sees the whole past
        np.testing.assert_allclose(nll[mode][:13], nll["dense"][:13], rtol=1e-4, atol=1e-5)
    assert not np.allclose(nll["sinks"][20:], nll["window"][20:])  # past the window the sinks are seen
    cache = {mode: [float(r["cache_mib"]) for r in rows if r["mode"] == mode] for mode in exp.MODES}
    assert cache["window"][0] == cache["window"][-1] and cache["sinks"][0] == cache["sinks"][-1]
    assert cache["dense"][-1] == 3 * cache["dense"][0] and cache["recompute"] == [0.0] * 3
    assert "| sinks |" in (out / "summary.md").read_text() and (out / "streaming.png").stat().st_size > 0


def test_a_rotary_model_numbers_its_rolled_cache_by_the_place_in_it():
    """With position=rope the window and sinks modes renumber the cache (StreamingLLM's rule); dense and
    recompute count the stream, and a model without a renumbering position is left as it is."""
    streaming = script()
    rotary = zoo.create_model("vanilla_lm", vocab_size=12, position="rope", d_model=16, n_layers=1, n_heads=2, d_ff=32)
    modes = streaming.mode_models(rotary, window=8, sinks=2)
    renumbered = {mode: model.position.cache_positions for mode, model in modes.items()}
    assert renumbered == {"dense": False, "window": True, "sinks": True, "recompute": False}
    plain = zoo.create_model("vanilla_lm", vocab_size=12, position="none", d_model=16, n_layers=1, n_heads=2, d_ff=32)
    assert not any(model.position.cache_positions for model in streaming.mode_models(plain, 8, 2).values())
