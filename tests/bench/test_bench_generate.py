"""``python -m zoo.bench --generate``: decoding speed and the state's bytes by context, from the parts."""

from __future__ import annotations

import csv

import pytest
import torch

from zoo.bench import main
from zoo.bench.generate import generate_markdown, run_generate, state_bytes
from zoo.bench.variants import Variant, peer_variant


def tiny_run(variants, contexts, **options):
    shape = dict(d_model=16, heads=2, layers=2, vocab=32, threads=1)
    return run_generate(variants, contexts, **shape, **options, progress=lambda line: None)


# what the command line records about a run, as generate_markdown reads it
META = {**dict.fromkeys(("command", "machine", "device", "torch", "load_before", "load"), "test"), "threads": 1}
META.update(batch=1, d_model=16, heads=2, layers=2, vocab=32, new_tokens=3)


def test_a_bounded_state_keeps_its_bytes_and_a_dense_one_grows_and_a_refusal_is_listed():
    variants = [
        Variant("local_1d", "zoo", "vanilla_lm", {"attention": {"name": "local_1d", "block": 8, "memory": 8}}),
        Variant("vanilla", "zoo", "vanilla_lm", {"attention": "vanilla"}),
        Variant("universal", "zoo", "universal_transformer_act"),  # ACT: refuses a state
    ]
    rounds, summary = tiny_run(variants, [32, 96], new_tokens=2, rounds=1)
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


def test_peers_decode_beside_ours_with_the_bandwidth_bound():
    """HF's LlamaForCausalLM.generate() from its DynamicCache and from a StaticCache (cropped back to the prompt
    every round) and x-transformers' cached decoding, of the same shape as ours; every row carries the bound:
    batch x copy bandwidth / the state's bytes, and the step time at that bound."""
    pytest.importorskip("transformers")
    pytest.importorskip("x_transformers")
    peers = [peer_variant(name) for name in ("hf_llama", "hf_llama_static", "x_transformers")]
    variants = [Variant("vanilla", "zoo", "vanilla_lm", {"attention": "vanilla"}), *peers]
    _, summary = tiny_run(variants, [32, 64], new_tokens=3, rounds=1, batch=2)
    rows = {(r["variant"], r["context"]): r for r in summary}
    assert all(r["status"] == "ok" and r["tokens_per_s"] > 0 for r in summary), [r["status"] for r in summary]
    hf_32, hf_64 = rows["peer:hf_llama", 32], rows["peer:hf_llama", 64]
    assert hf_64["cache_mib"] == pytest.approx(hf_32["cache_mib"] * 63 / 31)  # K and V per prompt token but the last
    static = rows["peer:hf_llama_static", 64]  # sized once for the prompt and the new tokens
    assert static["cache_mib"] == pytest.approx(hf_32["cache_mib"] * (64 + 3) / 31)
    x_32, ours_32 = rows["peer:x_transformers", 32], rows["vanilla", 32]
    assert x_32["cache_mib"] == pytest.approx(ours_32["cache_mib"])  # the same shape: one K and V per token
    for row in summary:
        bytes_read = row["cache_mib"] * 2**20
        assert row["bound_tokens_per_s"] == pytest.approx(2 * row["bandwidth_gib_s"] * 2**30 / bytes_read)
        assert row["bound_ms_per_step"] == pytest.approx(bytes_read / (row["bandwidth_gib_s"] * 2**30) * 1e3)
        assert row["batch"] == 2
    table = generate_markdown(summary, {**META, "batch": 2})
    assert "bandwidth bound tokens/s (ms/step)" in table and "| peer:x_transformers | 2 | 64 |" in table


def test_the_command_line_decodes_at_each_batch(tmp_path):
    argv = "--generate --attention local_1d --lengths 24 --batch 1,2 --d-model 16 --heads 2 --vocab 32 "
    argv += f"--new-tokens 2 --rounds 1 --threads 1 --out {tmp_path}"
    assert main(argv.split()) == 0
    with open(tmp_path / "generate.csv") as f:
        assert [(r["batch"], r["status"]) for r in csv.DictReader(f)] == [("1", "ok"), ("2", "ok")]


def test_the_bound_of_a_state_a_step_reads_in_part_counts_only_that_part():
    """LSH's bucket cache: a step reads its bucket's slots, one bucket in n_buckets, so its bound is n_buckets times
    the whole state's; dense attention reads its whole cache."""
    lsh = Variant("lsh", "zoo", "vanilla_lm", {"attention": {"name": "lsh", "n_buckets": 4, "chunk_size": 8}})
    variants = [Variant("vanilla", "zoo", "vanilla_lm", {"attention": "vanilla"}), lsh]
    _, summary = tiny_run(variants, [32], new_tokens=2, rounds=1)
    rows = {r["variant"]: r for r in summary}
    assert [rows[v]["read_share"] for v in ("vanilla", "lsh")] == [1.0, 0.25], [r["status"] for r in summary]
    for row in summary:
        bytes_read = row["cache_mib"] * 2**20 * row["read_share"]
        assert row["bound_ms_per_step"] == pytest.approx(bytes_read / (row["bandwidth_gib_s"] * 2**30) * 1e3)
