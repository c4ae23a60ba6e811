"""``python -m zoo.bench --generate``: decoding speed and the state's bytes by context, from the parts."""

from __future__ import annotations

import csv

import torch

from zoo.bench import main
from zoo.bench.generate import run_generate, state_bytes
from zoo.bench.variants import Variant


def test_a_bounded_state_keeps_its_bytes_and_a_dense_one_grows_and_a_refusal_is_listed():
    variants = [
        Variant("local_1d", "zoo", "vanilla_lm", {"attention": {"name": "local_1d", "block": 8, "memory": 8}}),
        Variant("vanilla", "zoo", "vanilla_lm", {"attention": "vanilla"}),
        Variant("universal", "zoo", "universal_transformer_act"),  # ACT: refuses a state
    ]
    rounds, summary = run_generate(
        variants,
        [32, 96],
        new_tokens=2,
        rounds=1,
        d_model=16,
        heads=2,
        layers=2,
        vocab=32,
        threads=1,
        progress=lambda line: None,
    )
    rows = {(r["variant"], r["context"]): r for r in summary}
    assert rows["local_1d", 32]["cache_mib"] == rows["local_1d", 96]["cache_mib"]
    assert rows["local_1d", 32]["state_bound"] == 8 + 8 - 1
    assert rows["vanilla", 96]["cache_mib"] == 3 * rows["vanilla", 32]["cache_mib"]  # one K and V per token
    assert rows["vanilla", 32]["state_bound"] is None
    assert rows["universal", 32]["status"].startswith(
        "refused: stack 'universal' keeps no state between calls with act"
    )
    assert rows["universal", 96]["status"].startswith("skipped")
    assert all(r["tokens_per_s"] > 0 for r in summary if r["status"] == "ok")
    assert {r["variant"] for r in rounds} == {"local_1d", "vanilla"}


def test_state_bytes_counts_shared_storage_once():
    x = torch.zeros(4, 8)
    assert state_bytes([x, x, {"a": x}]) == x.nbytes
    assert state_bytes([x, torch.zeros(2)]) == x.nbytes + 8


def test_the_command_line_writes_the_table_plot_and_csv(tmp_path):
    argv = "--generate --attention local_1d --variant attention=sparse_fixed attention.stride=8 --lengths 24,48 "
    argv += f"--d-model 16 --heads 2 --vocab 32 --new-tokens 2 --rounds 1 --threads 1 --out {tmp_path}"
    assert main(argv.split()) == 0
    with open(tmp_path / "generate.csv") as f:
        rows = list(csv.DictReader(f))
    assert {r["variant"] for r in rows} == {"local_1d", "attention=sparse_fixed attention.stride=8"}
    assert all(r["status"] == "ok" for r in rows), [r["status"] for r in rows]
    assert (tmp_path / "generate.png").stat().st_size > 0 and "tokens/s" in (tmp_path / "generate.md").read_text()
