"""Smoke test of experiments/reformer_table2.py: a few steps of ours (and the peer, when installed),
resumed without re-running, then merged into the table, CSV and plots."""

from __future__ import annotations

import csv
import importlib.util
from pathlib import Path

import pytest


def load_script():
    path = Path(__file__).resolve().parents[1] / "experiments" / "reformer_table2.py"
    spec = importlib.util.spec_from_file_location("zoo_reformer_table2", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_runs_resumes_and_merges(tmp_path, capsys):
    script = load_script()
    impls = "ours-window,ours-chunk" + (",peer" if script.peer_module() is not None else "")
    argv = [
        "--impl",
        impls,
        "--train",
        "full,lsh2",
        "--seeds",
        "0",
        "--length",
        "16",
        "--chunk",
        "4",
        "--d-model",
        "16",
        "--heads",
        "2",
        "--n-symbols",
        "8",
        "--batch",
        "4",
        "--steps",
        "2",
        "--log-every",
        "1",
        "--eval-sequences",
        "64",
        "--out",
        str(tmp_path),
    ]
    script.main(argv)
    with open(tmp_path / "results.csv") as f:
        rows = list(csv.DictReader(f))
    n_impls = len(impls.split(","))
    assert len(rows) == n_impls * 2 * len(script.EVALS)
    assert all(0.0 <= float(r["accuracy_percent"]) <= 100.0 and r["steps"] == "2" for r in rows)
    script.main(argv)  # every run's rows exist: nothing is trained again
    assert capsys.readouterr().out.count("skip ") == n_impls * 2
    script.main(["--merge", "--out", str(tmp_path)])
    table = (tmp_path / "table2.md").read_text()
    assert "| LSH-2 | ours-chunk (n=1) |" in table and "| full | paper | 100.0 | 94.8 |" in table
    for name in ("table2.csv", "table2.png", "curves.png"):
        assert (tmp_path / name).stat().st_size > 0


def test_bad_impl_is_refused_by_name(tmp_path):
    with pytest.raises(SystemExit, match="--impl: unknown.*allowed: ours-window"):
        load_script().main(["--impl", "theirs", "--out", str(tmp_path)])
