"""``python -m zoo.bench --kernels``: the chunk kernels alone, beside causal SDPA and fla's naive references."""

from __future__ import annotations

import math

import torch

import zoo
from tests.parts.references import FLA_OPS
from zoo.attention.state_mixer import StateMixer
from zoo.bench import main
from zoo.bench.kernels import kernel_inputs, run_kernels


def test_the_timed_kernel_is_the_layers_own_computation():
    """The leaves and kernel the bench times give the recurrence output the layer reads out (the layer's
    forward with its read-out replaced by the identity returns exactly what the kernel computed)."""
    torch.manual_seed(0)
    for name in ("deltanet", "retention"):
        part = zoo.create_attention(name, d_model=16, n_heads=2, causal=True, chunk_size=4).eval()
        x = torch.randn(1, 12, 16)
        leaves, kernel = kernel_inputs(part, x)
        seen = {}
        if isinstance(part, StateMixer):
            part.read_out = lambda o, mixed, rest, seen=seen: seen.setdefault("o", o)
        else:
            part.finish = lambda x, out, seen=seen: seen.setdefault("o", out)
        with torch.no_grad():
            part(x)
            assert torch.equal(kernel(leaves), seen["o"]), name


def test_kernels_report_time_flop_share_and_the_naive_reference(tmp_path, monkeypatch):
    monkeypatch.setenv("ZOO_REFERENCES", str(FLA_OPS.parents[2]))
    rounds, summary = run_kernels(
        ["deltanet"], [64], rounds=1, d_model=16, heads=2, threads=1, progress=lambda line: None
    )
    rows = {r["kernel"]: r for r in summary}
    assert set(rows) == {"vanilla", "deltanet", "deltanet naive"}
    for label in ("vanilla", "deltanet"):
        assert rows[label]["status"] == "ok" and 0 < rows[label]["flop_share"] < math.inf
    naive = rows["deltanet naive"]
    if FLA_OPS.is_dir():
        assert naive["status"] == "ok" and naive["ours_vs_this"] > 0
    else:
        assert naive["status"].startswith("reference absent")
    assert {r["kernel"] for r in rounds} == {k for k, r in rows.items() if r.get("status") == "ok"}


def test_kernels_cli_writes_its_table(tmp_path, monkeypatch):
    monkeypatch.setenv("ZOO_REFERENCES", str(tmp_path / "nowhere"))
    argv = ["--kernels", "mamba2", "--lengths", "32", "--rounds", "1", "--d-model", "16", "--heads", "2"]
    assert main([*argv, "--threads", "1", "--out", str(tmp_path)]) == 0
    table = (tmp_path / "kernels.md").read_text()
    assert "| mamba2 | 32 |" in table and "reference absent" in table and "python -m zoo.bench --kernels" in table


def test_kernels_cli_can_leave_the_references_out(tmp_path):
    argv = ["--kernels", "deltanet", "--no-naive", "--lengths", "32", "--rounds", "1", "--d-model", "16"]
    assert main([*argv, "--heads", "2", "--threads", "1", "--out", str(tmp_path)]) == 0
    table = (tmp_path / "kernels.md").read_text()
    assert "| deltanet | 32 |" in table and "| deltanet naive |" not in table
