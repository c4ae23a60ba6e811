"""experiments/export.py CKPT OUT: a training checkpoint becomes a shareable model folder whose card
reports the run (data, steps, the latest evaluation) and whose model is the checkpoint's exactly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("hydra")

from support.app_overrides import TINY, script  # noqa: E402

import zoo  # noqa: E402
from zoo.app.compose import compose  # noqa: E402
from zoo.app.run import load_run, run  # noqa: E402
from zoo.train.checkpoints.format import CheckpointError  # noqa: E402


def test_a_checkpoint_exports_to_a_folder_that_loads_its_model(tmp_path, text_file):
    run_dir = tmp_path / "run"
    overrides = ["model=transformer_xl", "data=char_lm", f"data.path={text_file}", "trainer.precision=bf16"]
    run(compose([*TINY, *overrides]), run_dir=run_dir)
    result = json.loads((run_dir / "result.json").read_text())
    checkpoint = run_dir / "checkpoints" / "last.pt"

    summary = script("export").main([str(checkpoint), str(tmp_path / "shared")])
    folder = Path(summary["folder"])
    _, task, trained, _ = load_run(checkpoint)
    loaded = zoo.from_pretrained(folder)
    tokens = task.batch("val", 0)["tokens"]
    with torch.no_grad():
        assert torch.equal(loaded(tokens).logits, trained.eval()(tokens).logits)

    training = json.loads((folder / "config.json").read_text())["training"]
    evaluation = {"step": 4, "metric": "val/bpc", "value": result["final_metric"]}
    assert training["evaluation"] == evaluation and training["best"]["value"] == result["best_metric"]
    assert (training["data"], training["steps"], training["seq_len"], training["precision"]) == (
        "char_lm",
        4,
        16,
        "bf16",
    )
    card = (folder / "README.md").read_text()
    assert f"val/bpc = **{result['final_metric']:.4f}** at step 4" in card and "`char_lm`" in card
    assert str(tmp_path) not in (folder / "config.json").read_text() + card  # no path of the run goes out


def test_export_refuses_a_corrupt_checkpoint(tmp_path):
    bad = tmp_path / "last.pt"
    bad.write_bytes(b"not a checkpoint")
    # without a checksum it is read (with a warning, issue 28), and refused for what it holds
    with pytest.warns(UserWarning, match="no checksum file"), pytest.raises(CheckpointError, match="last.pt"):
        script("export").main([str(bad), str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()
