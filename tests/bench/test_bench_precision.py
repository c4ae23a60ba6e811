"""zoo.bench --precision: every step under bf16 autocast, or each variant beside its bf16 twin."""

from __future__ import annotations

import argparse
import csv

import pytest
import torch

import zoo  # noqa: F401  (registers presets)
from zoo import bench


def variants(precision: str, compile: bool = False) -> list[bench.Variant]:
    args = argparse.Namespace(attention="vanilla,lsh", model=None, variant=[], peers="", compile=compile)
    args.precision = precision
    return bench.variants_from_args(args)


def test_precision_flag_sets_or_twins_every_variant():
    assert [(v.label, v.precision) for v in variants("bf16")] == [("vanilla", "bf16"), ("lsh", "bf16")]
    assert [(v.label, v.precision) for v in variants("fp32,bf16")] == [
        ("vanilla", "fp32"),
        ("vanilla+bf16", "bf16"),
        ("lsh", "fp32"),
        ("lsh+bf16", "bf16"),
    ]
    assert [v.label for v in variants("fp32,bf16", compile=True)][:4] == [
        "vanilla",
        "vanilla+compile",
        "vanilla+bf16",
        "vanilla+bf16+compile",
    ]
    for bad in ("fp16", "bf16,bf16", ""):
        with pytest.raises(ValueError, match="--precision takes fp32, bf16 or fp32,bf16"):
            variants(bad)


def test_a_bf16_step_runs_in_bf16():
    shape = dict(d_model=32, heads=2, layers=1, vocab=64, batch=2, d_ff=64)
    module, loss_fn = bench.build(bench.Variant("vanilla", "zoo", "vanilla_lm", precision="bf16"), 16, shape, {})
    dtypes = set()
    for m in module.modules():
        if isinstance(m, torch.nn.Linear):
            m.register_forward_hook(lambda m, i, out: dtypes.add(out.dtype))
    loss = loss_fn(bench.bench_tokens(64, 2, 16))
    loss.backward()
    assert dtypes == {torch.bfloat16} and torch.isfinite(loss)
    assert all(p.grad.dtype == torch.float32 for p in module.parameters())  # the weights stay float32


def test_paired_bf16_twins_on_cpu(tmp_path):
    out = tmp_path / "paired"
    argv = ["--paired", "--attention", "vanilla", "--precision", "fp32,bf16", "--lengths", "128", "--d-model", "32"]
    argv += ["--heads", "2", "--rounds", "2", "--device", "cpu", "--threads", "1", "--out", str(out)]
    assert bench.main(argv) == 0
    rows = {r["variant"]: r for r in csv.DictReader(open(out / "paired.csv"))}
    assert {k: r["precision"] for k, r in rows.items()} == {"vanilla": "fp32", "vanilla+bf16": "bf16"}
    twin = rows["vanilla+bf16"]
    assert float(twin["bf16_speedup_min"]) <= float(twin["bf16_speedup"]) <= float(twin["bf16_speedup_max"])
    # activations saved for backward in bf16 (the residual stream and norms stay float32; the meter also
    # counts the bf16 copies of the weights autocast keeps for backward, so at tiny lengths bf16 saves more)
    assert float(twin["act_mib"]) < float(rows["vanilla"]["act_mib"])
    text = (out / "paired.md").read_text()
    assert "bf16 autocast against fp32" in text and "precision fp32,bf16" in text
