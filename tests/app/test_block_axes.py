"""The norm, feed-forward and init axes from the command line: ``norm=``, ``feed_forward=`` and ``init=``
are groups of their own (generated from the registries), a run with them trains and records them, and
the old ``model.activation`` key still reaches the network."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("hydra")

from support.app_cli import train_main  # noqa: E402
from support.app_overrides import TINY  # noqa: E402

from zoo.app.compose import compose  # noqa: E402
from zoo.app.run import build  # noqa: E402
from zoo.feed_forward import FEED_FORWARD  # noqa: E402
from zoo.norm import NORM  # noqa: E402


def test_train_py_trains_vanilla_lm_with_rmsnorm_and_swiglu(tmp_path, monkeypatch):
    """python experiments/train.py experiment=tiny model=vanilla_lm norm=rmsnorm feed_forward=swiglu"""
    argv = [*TINY, "model=vanilla_lm", "norm=rmsnorm", "feed_forward=swiglu", "feed_forward.two_thirds=true"]
    assert train_main([*argv, f"hydra.run.dir={tmp_path}"], monkeypatch) == 0
    record = json.loads((Path(tmp_path) / "config.json").read_text())
    model = record["model_config"]  # the resolved config the run built
    assert model["norm"] == {"name": "rmsnorm"}
    assert model["feed_forward"] == {"name": "swiglu", "two_thirds": True}
    metrics = [json.loads(line) for line in (Path(tmp_path) / "metrics.jsonl").read_text().splitlines()]
    losses = [m["train/loss"] for m in metrics if "train/loss" in m]
    assert losses and all(loss == loss for loss in losses)  # trained, finite


def test_the_groups_reach_the_built_model():
    base = ["experiment=tiny", "trainer.seq_len=16", "trainer.batch_size=2", "trainer.device=cpu"]
    cfg = compose(
        [*base, "model=gtrxl", "norm=rmsnorm", "norm.eps=0.001", "feed_forward=geglu", "feed_forward.bias=true"]
    )
    _, _, model = build(cfg)
    norms = [m for m in model.modules() if isinstance(m, NORM.get("rmsnorm"))]
    assert norms and all(m.options.eps == 0.001 for m in norms)
    assert all(isinstance(b.feed_forward, FEED_FORWARD.get("geglu")) for b in model.stack.blocks)
    assert model.stack.blocks[0].feed_forward.gate_proj.bias is not None
    _, _, model = build(compose([*base, "model=vanilla_lm", "init=gpt2", "init.scale_depth=false"]))
    assert model.config.init == {"name": "gpt2", "scale_depth": False} and model.embed.scale == 1.0
    _, _, model = build(compose([*base, "model=vanilla_lm", "model.activation=gelu"]))
    assert (
        model.config.feed_forward == {"name": "mlp"} and model.stack.blocks[0].feed_forward.options.activation == "gelu"
    )
