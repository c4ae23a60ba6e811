"""The benchmark harness: its one override syntax, peers in a registry, slope fit, saved-tensor
meter, and a tiny end-to-end run."""

from __future__ import annotations

import argparse
import csv

import pytest
import torch

import zoo
from zoo import bench
from zoo.bench import PEER


def test_one_override_syntax_dotted_key_value():
    """--set and --variant take the app's dotted key=value items, parsed into merge_config's dicts;
    the old name(key=value,...) form is gone and refused with the new form named."""
    assert bench.parse_set(["attention.n_hashes=8", "residual=pre_norm", "dropout=0.1"]) == {
        "attention": {"n_hashes": 8},
        "residual": "pre_norm",
        "dropout": 0.1,
    }
    named = {"attention": {"name": "lsh", "n_hashes": 4}}
    assert (
        bench.parse_set(["attention=lsh", "attention.n_hashes=4"])
        == named
        == bench.parse_set(["attention.n_hashes=4", "attention=lsh"])
    )
    with pytest.raises(ValueError, match="key=value"):
        bench.parse_set(["oops"])
    # as in the app: null is None, "none" the name of a part (position=none once read as None, refused)
    assert bench.parse_set(["position=none", "attention.seed=null"]) == {
        "position": "none",
        "attention": {"seed": None},
    }
    assert not hasattr(bench, "parse_spec")
    with pytest.raises(SystemExit):
        bench.main(["--attention", "lsh(n_hashes=4)", "--out", "/nonexistent"])


def _args(argv):
    parser = argparse.ArgumentParser()
    bench.add_variant_arguments(parser)
    return parser.parse_args(argv)


def test_variant_and_set_values_reach_the_built_model():
    variants = bench.variants_from_args(
        _args(
            [
                "--attention",
                "vanilla",
                "--variant",
                "attention=adaptive_span",
                "attention.max_span=64",
                "attention.mode=fixed",
                "--variant",
                "model=reformer",
                "stack=sequential",
            ]
        )
    )
    assert [v.label for v in variants] == [
        "vanilla",
        "attention=adaptive_span attention.max_span=64 attention.mode=fixed",
        "model=reformer stack=sequential",
    ]
    shape = dict(d_model=16, heads=2, layers=1, vocab=32, batch=1, d_ff=32)
    model, _ = bench.build(variants[1], 32, shape, {})
    assert model.config.attention == {"name": "adaptive_span", "max_span": 64, "mode": "fixed"}
    model, _ = bench.build(variants[2], 32, shape, {})
    assert (model.config.name, model.config.stack["name"], model.config.attention["name"]) == (
        "reformer",
        "sequential",
        "lsh",
    )
    # --set goes on top of every variant: the mechanism's options reach it, the preset's own are kept
    lsh = bench.variants_from_args(_args(["--attention", "lsh"]))[0]
    model, _ = bench.build(lsh, 32, shape, bench.parse_set(["attention.n_hashes=2", "attention.chunk_size=8"]))
    assert (model.config.attention["n_hashes"], model.config.attention["chunk_size"]) == (2, 8)
    model, _ = bench.build(bench.named_variant("reformer"), 32, shape, bench.parse_set(["attention.n_hashes=2"]))
    assert model.config.attention == {**zoo.preset_config("reformer").attention, "n_hashes": 2}


def test_peers_live_in_a_registry():
    assert PEER.list() == ["hf_llama", "hf_llama_static", "local_attention", "reformer_pytorch", "x_transformers"]
    assert bench.peer_variant("x-transformers").name == bench.peer_variant("x_transformers").name == "x_transformers"
    assert bench.named_variant("peer:x-transformers") == bench.Variant("peer:x-transformers", "peer", "x_transformers")
    assert all(PEER.get(name).__doc__ for name in PEER.list())  # the description tables and --help show
    with pytest.raises(KeyError, match="Did you mean 'reformer_pytorch'"):
        bench.peer_variant("reformer-pytorh")
    assert not hasattr(bench, "register_peer") and not hasattr(bench, "PEERS")


def test_fit_slope_recovers_power_law():
    xs = [256, 512, 1024, 2048]
    assert bench.fit_slope(xs, [3 * x**1.5 for x in xs]) == pytest.approx(1.5)
    assert bench.fit_slope(xs, [7.0 * x for x in xs]) == pytest.approx(1.0)


def test_saved_tensor_meter_counts_activations_not_parameters():
    layer = torch.nn.Linear(64, 64)
    x = torch.randn(10, 64)
    nbytes = bench.activation_bytes(layer, lambda inp: torch.relu(layer(inp)).sum(), x)
    # Linear saves its input (10x64); relu saves its output (10x64): 2 * 640 floats; the weight is excluded
    assert nbytes == 2 * 10 * 64 * 4


def test_crossover_and_summary():
    rows = []
    for length, base, fast in [(1, 10, 20), (2, 20, 25), (4, 40, 30), (8, 80, 35)]:
        rows.append(dict(variant="base", length=length, layers=2, status="ok", time_ms=base, act_mib=length))
        rows.append(dict(variant="fast", length=length, layers=2, status="ok", time_ms=fast, act_mib=1.0))
    assert bench.crossover(rows, "fast", "base", "length") == "4"
    summary = {s["variant"]: s for s in bench.summarise(rows, "base")}
    assert summary["base"]["memory_slope"] == pytest.approx(1.0)
    assert summary["fast"]["memory_slope"] == pytest.approx(0.0)


def test_end_to_end_writes_table_and_plot(tmp_path):
    out = tmp_path / "bench"
    code = bench.main(
        [
            "--attention",
            "vanilla",
            "--lengths",
            "32,64",
            "--d-model",
            "32",
            "--heads",
            "2",
            "--repeats",
            "1",
            "--warmup",
            "0",
            "--no-rss",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    rows = list(csv.DictReader(open(out / "bench.csv")))
    assert [r["length"] for r in rows] == ["32", "64"] and all(r["status"] == "ok" for r in rows)
    assert float(rows[1]["act_mib"]) > float(rows[0]["act_mib"]) > 0
    text = (out / "bench.md").read_text()
    assert "Fitted log-log slopes" in text and "python -m zoo.bench" in text
    assert (out / "bench.png").stat().st_size > 1000


def test_failures_are_recorded_not_raised():
    rows = bench.run(
        [bench.Variant("nope", "zoo", "vanilla_lm", {"attention": "no_such_mechanism"})],
        [16],
        d_model=16,
        heads=2,
        rss=False,
        progress=lambda s: None,
    )
    assert rows[0]["status"].startswith("error: UnknownNameError")
