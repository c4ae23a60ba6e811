"""The benchmark harness: spec parsing, slope fit, saved-tensor meter, and a tiny end-to-end run."""

from __future__ import annotations

import csv

import pytest
import torch

from zoo import bench


def test_parse_spec_and_set():
    assert bench.parse_spec("lsh(n_hashes=4,bucket_size=64)") == ("lsh", {"n_hashes": 4, "bucket_size": 64})
    assert bench.parse_spec("vanilla") == ("vanilla", {})
    assert bench.parse_set(["attention.n_hashes=8", "residual=pre_norm", "dropout=0.1"]) == {"attention": {"n_hashes": 8}, "residual": "pre_norm", "dropout": 0.1}
    with pytest.raises(ValueError, match="key=value"):
        bench.parse_set(["oops"])


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
    code = bench.main(["--attention", "vanilla", "--lengths", "32,64", "--d-model", "32", "--heads", "2", "--repeats", "1", "--warmup", "0", "--no-rss", "--out", str(out)])
    assert code == 0
    rows = list(csv.DictReader(open(out / "bench.csv")))
    assert [r["length"] for r in rows] == ["32", "64"] and all(r["status"] == "ok" for r in rows)
    assert float(rows[1]["act_mib"]) > float(rows[0]["act_mib"]) > 0
    text = (out / "bench.md").read_text()
    assert "Fitted log-log slopes" in text and "python -m zoo.bench" in text
    assert (out / "bench.png").stat().st_size > 1000


def test_failures_are_recorded_not_raised():
    rows = bench.run([bench.Variant("nope", "attention", "no_such_mechanism")], [16], d_model=16, heads=2, rss=False, progress=lambda s: None)
    assert rows[0]["status"].startswith("error: UnknownNameError")
