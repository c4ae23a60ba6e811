"""zoo.bench --activation-checkpointing: each zoo variant beside its twins under activation checkpointing
(zoo/stacks/checkpointing.py), with their time and activation MiB against the plan-less run."""

from __future__ import annotations

import argparse
import csv

import pytest

import zoo  # noqa: F401  (registers presets)
from zoo import bench


def variants(modes: str) -> list[bench.Variant]:
    args = argparse.Namespace(attention="vanilla", model=None, variant=[], peers="x-transformers", compile=False)
    args.precision, args.activation_checkpointing = "fp32", modes
    return bench.variants_from_args(args)


def test_the_flag_twins_every_zoo_variant_and_refuses_a_bad_mode():
    assert [(v.label, v.checkpointing) for v in variants("none,full,selective:attention")] == [
        ("vanilla", "none"),
        ("vanilla+ac=full", "full"),
        ("vanilla+ac=selective:attention", "selective:attention"),
        ("peer:x-transformers", "none"),  # a peer's model has no zoo stack: no twins
    ]
    assert [v.checkpointing for v in variants("selective")] == ["selective:2", "selective:2"]
    with pytest.raises(ValueError, match="must be one of none, full, selective"):
        variants("none,some")
    shape = dict(d_model=32, heads=2, layers=2, vocab=64, batch=1, d_ff=64)
    peer = bench.Variant("peer:x", "peer", "x_transformers", checkpointing="full")
    with pytest.raises(ValueError, match="applies to zoo stacks, not a peer's model"):
        bench.build(peer, 16, shape, {})
    module, _ = bench.build(bench.Variant("v", "zoo", "vanilla_lm", checkpointing="selective:attention"), 16, shape, {})
    assert all("_attend" in block.__dict__ for block in module.stack.blocks)


@pytest.mark.slow  # a paired run and its plot: seconds, where the flag test above is cheap
def test_paired_checkpointing_twins_on_cpu(tmp_path):
    out = tmp_path / "paired"
    argv = ["--paired", "--attention", "vanilla", "--activation-checkpointing", "none,full", "--lengths", "64"]
    argv += ["--d-model", "32", "--heads", "2", "--rounds", "1", "--device", "cpu", "--threads", "1", "--out", str(out)]
    assert bench.main(argv) == 0
    rows = {r["variant"]: r for r in csv.DictReader(open(out / "paired.csv"))}
    twin = rows["vanilla+ac=full"]
    assert twin["checkpointing"] == "full" and twin["ac_of"] == "vanilla"
    assert float(twin["act_mib"]) < float(rows["vanilla"]["act_mib"]) == float(twin["ac_act_mib_without"])
    assert "Activation checkpointing against the first mode" in (out / "paired.md").read_text()
