"""lra_setting=nystromformer: the PyTorch LRA re-implementations' setting is what each task runs (their
per-task table reaches the trainer, the model is theirs parameter for parameter), and its rows sit in
Table 1 beside the figures reported for it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from zoo.app.compose import compose
from zoo.app.paper import count_parameters, meta_model
from zoo.app.resolve import as_dict, model_config
from zoo.data import TASK

REF = (
    Path(os.environ.get("ZOO_REF_DIR", Path(__file__).resolve().parents[3] / "ref")) / "Nystromformer" / "LRA" / "code"
)
# mlpen/Nystromformer LRA/code/lra_config.py @ 56893131: task -> (steps, batch, warm-up, length, eval every, batches)
THEIRS = {
    "lra_listops": (5000, 32, 1000, 2048, 50, 62),  # their datasets/listops.py pads 2,000 tokens with 48 zeros
    "lra_text": (20000, 32, 8000, 1000, 500, 781),
    "lra_retrieval": (30000, 32, 800, 4000, 300, 565),
    "lra_image": (35000, 256, 175, 1024, 175, 20),
    "lra_pathfinder": (62400, 256, 312, 1024, 312, 312),
}

# the length their datasets/*.py pad each input to (and their position table's): a power of 2
PADDED_TO = {"lra_listops": 2048, "lra_text": 1024, "lra_retrieval": 4096, "lra_image": 1024, "lra_pathfinder": 1024}


def resolved(task: str, *extra: str) -> dict:
    return as_dict(compose([f"experiment={task}", "lra_setting=nystromformer", *extra]))


@pytest.mark.parametrize("task", sorted(THEIRS))
def test_each_task_gets_their_steps_batch_length_and_schedule(task):
    config = resolved(task)
    steps, batch, warmup, length, every, batches = THEIRS[task]
    t, o, m = config["trainer"], config["optim"], config["model"]
    assert (t["max_steps"], t["batch_size"], t["seq_len"], t["eval_every"], t["eval_batches"]) == (
        steps,
        batch,
        length,
        every,
        batches,
    )
    assert (o["name"], o["lr"], o["betas"], o["eps"], o["weight_decay"], o["schedule"], o["warmup"]) == (
        "adamw",
        1e-4,
        [0.9, 0.999],
        1e-6,
        0.0,
        "one_cycle",
        warmup,
    )
    assert t["clip"] == 0.0 and config["lra_setting"]["name"] == "nystromformer"
    assert (m["n_layers"], m["d_model"], m["n_heads"], m["d_ff"], m["activation"], m["head"]) == (
        2,
        64,
        2,
        128,
        "gelu",
        "mlp",
    )
    assert config["experiment"] == task  # the tables still file the run under its task
    # their pickles pad to a power of 2 (ListOps 2,000 + 48, Text 1,000 + 24, Retrieval 4,000 + 96): the
    # padded mean divides by that length, the input's own where it is padded to it here, and the model gets it
    assert m["max_len"] == PADDED_TO[task] == (m["pool_length"] or t["seq_len"])
    assert _ours(task).config.pool_length == (PADDED_TO[task] if t["seq_len"] < PADDED_TO[task] else 0)


def test_the_command_line_still_wins():
    config = resolved("lra_listops", "trainer.max_steps=7", "optim.warmup=2", "model.n_layers=3")
    assert (config["trainer"]["max_steps"], config["optim"]["warmup"], config["model"]["n_layers"]) == (7, 2, 3)


def _ours(task: str):
    config = resolved(task)
    data = dict(config["data"])
    task_cls = TASK.get(data.pop("name"))
    vocab, _ = task_cls.nominal_vocab_size(data)
    binding = {"vocab_size": vocab, "n_classes": task_cls.n_classes}
    return meta_model(model_config(config, binding, min_len=config["trainer"]["seq_len"]))


@pytest.mark.skipif(not REF.is_dir(), reason="mlpen/Nystromformer not fetched to ../ref/Nystromformer")
@pytest.mark.parametrize("task", ["lra_listops", "lra_retrieval"])
def test_parameters_equal_their_model_built_beside_ours(task):
    """Their ModelForSC / ModelForSCDual and ours on the meta device: equal outside the token table (their
    vocab_size is a padded 32 / 512 rows for 16 / 257 ids here)."""
    from zoo.bench.peers import import_checkout

    lra_config, wrapper = import_checkout(REF, "lra_config", "model_wrapper")
    name = {"lra_listops": "listops", "lra_retrieval": "retrieval"}[task]
    their_config = {**lra_config.config[name]["model"], "mixed_precision": False, "attn_type": "softmax"}
    their_config.update(lra_config.config[name]["extra_attn_config"]["softmax"])
    their_config["max_seq_len"] = 2 ** (their_config["max_seq_len"] - 1).bit_length()  # as run_tasks.py rounds it
    with torch.device("meta"):
        theirs = (wrapper.ModelForSCDual if task == "lra_retrieval" else wrapper.ModelForSC)(their_config)
    ours = _ours(task)
    their_total = sum(p.numel() for p in theirs.parameters())
    their_tokens = theirs.model.embeddings.word_embeddings.weight.numel()
    our_tokens = ours.embed.weight.numel()
    assert count_parameters(ours)["params"] - our_tokens == their_total - their_tokens


def test_table1_files_the_setting_beside_its_reported_figures(tmp_path):
    from zoo.app.lra import table1

    reported = resolved("lra_listops")["lra_setting"]["reported"]
    rows = [
        {
            "experiment": "lra_listops",
            "attention": "vanilla",
            "accuracy": 30.0,
            "setting": None,
            "setting_reported": None,
        },
        {
            "experiment": "lra_listops",
            "attention": "vanilla",
            "accuracy": 35.0,
            "setting": "nystromformer",
            "setting_reported": reported,
        },
        {
            "experiment": "lra_listops",
            "attention": "sparse_fixed",
            "accuracy": 20.0,
            "setting": "nystromformer",
            "setting_reported": reported,
        },
    ]
    _, out = table1(rows)
    labels = [r[0] for r in out]
    assert labels.index("vanilla (ours, nystromformer setting)") + 1 == labels.index(
        "Transformer (nystromformer setting, reported)"
    )
    row = out[labels.index("Transformer (nystromformer setting, reported)")]
    assert row[1:6] == ["37.10", "65.00", "79.40", "38.20", "74.20"] and row[-1] == "58.78"
    assert out[labels.index("vanilla (ours)")][1] == "30.00" and "sparse_fixed (ours, nystromformer setting)" in labels
    json.dumps(out)
