"""zoo.bench's paired mode (alternating rounds, rotated order, median speed-up with min-max), its
--device option, the Reformer FLOP count it reports against, and --compile."""

from __future__ import annotations

import csv
import time

import pytest
import torch

import zoo  # noqa: F401  (registers presets)
from zoo import bench


def test_rotation_order_changes_each_round():
    labels = ["a", "b", "c"]
    assert [bench.rotation(labels, r) for r in range(4)] == [
        ["a", "b", "c"],
        ["b", "c", "a"],
        ["c", "a", "b"],
        ["a", "b", "c"],
    ]


def test_paired_rounds_rotate_and_do_not_record_the_warm_up():
    calls: list[str] = []
    # the warm-up round is slow (compilation, allocator); recorded rounds get distinct fake times
    fake = {"a": iter([9.0, 1.0, 1.0, 1.0]), "b": iter([9.0, 2.0, 4.0, 3.0]), "c": iter([9.0, 0.5, 0.5, 2.0])}

    def step(label):
        def run():
            calls.append(label)
            return next(fake[label])

        return run

    rounds = bench.paired_rounds({k: step(k) for k in fake}, 3, progress=lambda s: None)
    assert len(rounds) == 3 and all(9.0 not in r.values() for r in rounds)
    # warm-up a b c, then b c a, c a b, a b c: nobody always runs first
    assert calls == ["a", "b", "c", "b", "c", "a", "c", "a", "b", "a", "b", "c"]
    ratios = bench.paired_ratios(rounds, "a")
    assert ratios["a"] == dict(median_s=1.0, ratio=1.0, ratio_min=1.0, ratio_max=1.0)
    # b: per-round a/b = 0.5, 0.25, 0.333 -> median 0.333, min 0.25, max 0.5
    assert ratios["b"]["ratio"] == pytest.approx(1 / 3) and ratios["b"]["median_s"] == 3.0
    assert (ratios["b"]["ratio_min"], ratios["b"]["ratio_max"]) == (0.25, 0.5)
    # c: per-round a/c = 2, 2, 0.5 -> median 2, min 0.5
    assert ratios["c"]["ratio"] == 2.0 and ratios["c"]["ratio_min"] == 0.5
    with pytest.raises(ValueError, match="--baseline 'z'.*a, b, c"):
        bench.paired_ratios(rounds, "z")


def test_median_of_ratios_is_not_ratio_of_medians():
    # load drifts 10x between rounds: each round's ratio is 2, whatever the load
    rounds = [{"base": 1.0, "fast": 0.5}, {"base": 10.0, "fast": 5.0}, {"base": 3.0, "fast": 1.5}]
    assert bench.paired_ratios(rounds, "base")["fast"]["ratio"] == pytest.approx(2.0)
    assert bench.paired_ratios(rounds, "base")["fast"]["ratio_max"] == pytest.approx(2.0)


def test_paired_end_to_end_on_cpu(tmp_path):
    out = tmp_path / "paired"
    code = bench.main(
        [
            "--paired",
            "--attention",
            "vanilla,local_1d",
            "--baseline",
            "vanilla",
            "--lengths",
            "32",
            "--d-model",
            "32",
            "--heads",
            "2",
            "--rounds",
            "2",
            "--device",
            "cpu",
            "--threads",
            "1",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    rows = {r["variant"]: r for r in csv.DictReader(open(out / "paired.csv"))}
    assert set(rows) == {"vanilla", "local_1d"} and float(rows["vanilla"]["speedup"]) == 1.0
    local = {k: float(rows["local_1d"][k]) for k in ("speedup_min", "speedup", "speedup_max")}
    assert local["speedup_min"] <= local["speedup"] <= local["speedup_max"]
    assert all(r["device"] == "cpu" for r in rows.values()) and float(rows["local_1d"]["act_mib"]) > 0
    recorded = list(csv.DictReader(open(out / "paired_rounds.csv")))
    assert len(recorded) == 4 and {r["round"] for r in recorded} == {"0", "1"}
    text = (out / "paired.md").read_text()
    assert "speed-up over `vanilla`" in text and "load average" in text and "--paired" in text
    assert (out / "paired.png").stat().st_size > 1000


def test_paired_refuses_a_baseline_that_is_not_measured(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--paired", "--attention", "vanilla", "--baseline", "peer:nothing", "--lengths", "16"])
    assert "--baseline among the variants (vanilla)" in capsys.readouterr().err


def test_device_option(tmp_path):
    assert bench.pick_device("cpu") == torch.device("cpu")
    assert bench.pick_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ValueError, match="--device='nowhere' is not a device"):
        bench.pick_device("nowhere")
    rows = bench.run(
        [bench.Variant("vanilla", "zoo", "vanilla_lm")],
        [16],
        d_model=16,
        heads=2,
        rss=False,
        repeats=1,
        device="cpu",
        progress=lambda s: None,
    )
    assert rows[0]["status"] == "ok" and rows[0]["device"] == "cpu" and "gpu_peak_mib" not in rows[0]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error where CUDA is absent")
def test_cuda_device_without_cuda_is_a_clear_error(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--attention", "vanilla", "--device", "cuda", "--lengths", "16"])
    assert "--device='cuda' but CUDA is not available" in capsys.readouterr().err


def reference_reformer_flops(t, d, heads, layers, d_ff, vocab, hashes, chunk, n_buckets, batch):
    """The Reformer's step FLOPs as zoo/bench.py counted them by hand before the parts answered:
    projections 3 x 2 t d^2, feed-forward 2 x 2 t d d_ff, LSH 2 x 2 t h R 2c d_k, all x4 (forward,
    backward, the reversible stack's recomputation) x layers; hashing 2 t h d_k R n_buckets / 2, x2
    (forward and recomputation); the output layer 3 x 2 t d vocab."""
    d_k = d // heads
    n_buckets = n_buckets or max(2, (t // chunk) + (t // chunk) % 2)
    forward = {
        "projections": 3 * 2 * t * d * d,
        "feed_forward": 2 * 2 * t * d * d_ff,
        "lsh_attention": 2 * 2 * t * heads * hashes * (2 * chunk) * d_k,
    }
    flops = {name: 4.0 * layers * f * batch for name, f in forward.items()}
    flops["hashing"] = 2.0 * layers * 2 * t * heads * d_k * hashes * (n_buckets // 2) * batch
    flops["output_layer"] = 3.0 * 2 * t * d * vocab * batch
    flops["total"] = sum(flops.values())
    return flops


@pytest.mark.parametrize(
    "t, hashes, chunk, n_buckets, batch", [(256, 4, 64, 0, 1), (512, 2, 32, 0, 3), (1024, 8, 64, 8, 2)]
)
def test_reformer_flops_asked_of_the_parts_equal_the_hand_count(t, hashes, chunk, n_buckets, batch):
    sizes = dict(d=64, heads=4, layers=3, d_ff=128, vocab=256)
    expected = reference_reformer_flops(t, **sizes, hashes=hashes, chunk=chunk, n_buckets=n_buckets, batch=batch)
    got = bench.reformer_step_flops(t, **sizes, hashes=hashes, chunk=chunk, n_buckets=n_buckets, batch=batch)
    assert got == pytest.approx(expected, rel=1e-12)
    shape = dict(d_model=64, heads=4, layers=3, vocab=256, batch=batch, d_ff=128)
    lsh = {"attention": {"n_hashes": hashes, "chunk_size": chunk, "n_buckets": n_buckets}}
    reformer, _ = bench.build(bench.Variant("reformer", "zoo", "reformer", lsh), t, shape, {})
    assert bench.step_flops(reformer, t, shape) == pytest.approx(expected, rel=1e-12)  # the built model, asked


def test_flop_count_and_share_where_the_parts_answer():
    shape = dict(d_model=64, heads=4, layers=2, vocab=256, batch=1, d_ff=128)
    reformer, _ = bench.build(bench.named_variant("reformer"), 256, shape, {})
    vanilla, _ = bench.build(bench.named_variant("vanilla_lm"), 256, shape, {})
    count = bench.step_flops(reformer, 256, shape)
    # hand count: LSH attention forward 2 x 2 t h R 2c d_k, x4 for backward + reversible recompute, x layers
    assert count["lsh_attention"] == 4 * 2 * (2 * 2 * 256 * 4 * 4 * 128 * 16)
    assert count["total"] == pytest.approx(sum(v for k, v in count.items() if k != "total"))
    # vanilla answers too: 3 x (4 projections, (t + 1) / 2 causal keys x 2 terms, feed-forward) + the output layer
    dense = bench.step_flops(vanilla, 256, shape)
    per_layer = 256 * (2 * 4 * 64 * 64 + 2 * 2 * 64 * 257 / 2 + 4 * 64 * 128)
    assert dense["total"] == pytest.approx(3 * (2 * per_layer + 2 * 256 * 64 * 256))
    # linear in length at a fixed chunk (hashing grows with the bucket count: left out of this check)
    longer = bench.reformer_step_flops(512, d=64, d_ff=128)
    assert longer["lsh_attention"] == 2 * bench.reformer_step_flops(256, d=64, d_ff=128)["lsh_attention"]
    summary = bench.run_paired(
        [bench.named_variant("reformer"), bench.named_variant("vanilla_lm")],
        [64],
        "vanilla_lm",
        rounds=1,
        d_model=64,
        heads=4,
        d_ff=128,
        flops=True,
        threads=1,
        progress=lambda s: None,
    )[1]
    by_label = {s["variant"]: s for s in summary}
    assert by_label["reformer"]["flop_share"] > 0 and by_label["vanilla_lm"]["flop_share"] > 0


@pytest.mark.slow  # torch.compile of even a one-layer model takes over a minute on the shared 2-core machine
def test_compile_variant_steps_like_eager():
    shape = dict(d_model=32, heads=2, layers=1, vocab=64, batch=2, d_ff=64)
    eager = bench.Variant("vanilla", "zoo", "vanilla_lm")
    compiled = bench.Variant("vanilla+compile", "zoo", "vanilla_lm", compile=True)
    tokens = bench.bench_tokens(64, 2, 16)
    grads = []
    for variant in (eager, compiled):
        module, loss_fn = bench.build(variant, 16, shape, {})
        loss_fn(tokens).backward()
        grads.append([p.grad.clone() for p in module.parameters()])
        start = time.perf_counter()
        assert bench.timed_step(module, loss_fn, tokens) <= time.perf_counter() - start
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_compile_flag_adds_a_compiled_twin_per_variant():
    import argparse

    args = argparse.Namespace(attention="vanilla,lsh", model=None, variant=[], peers="", compile=True)
    variants = bench.variants_from_args(args)
    assert [(v.label, v.compile) for v in variants] == [
        ("vanilla", False),
        ("vanilla+compile", True),
        ("lsh", False),
        ("lsh+compile", True),
    ]


def test_compiled_twin_is_compared_with_its_own_eager_run(monkeypatch):
    # compile replaced by the identity (compilation itself is covered by the slow test): the
    # summary and the markdown carry each twin's speed-up over its own eager variant
    monkeypatch.setattr(torch, "compile", lambda module: module)
    variants = [
        bench.Variant("vanilla", "zoo", "vanilla_lm"),
        bench.Variant("vanilla+compile", "zoo", "vanilla_lm", compile=True),
    ]
    _, summary = bench.run_paired(
        variants, [16], "vanilla", rounds=2, d_model=16, heads=2, threads=1, progress=lambda s: None
    )
    twin = next(s for s in summary if s["variant"] == "vanilla+compile")
    assert twin["compile_speedup_min"] <= twin["compile_speedup"] <= twin["compile_speedup_max"]
    meta = dict(
        command="x",
        machine="m",
        device="cpu",
        torch="t",
        threads=1,
        batch=1,
        d_model=16,
        heads=2,
        layers=2,
        vocab=256,
        load="0",
    )
    assert "| vanilla | " in bench.paired_markdown(summary, meta).split("torch.compile against eager")[1]


def test_paired_steps_a_classifier_on_one_class_per_row(tmp_path):
    """LRA Table 2's shape: a classifier skeleton (each head says what it trains on: one class per row)
    with mechanisms that have no causal form, so the LM skeleton could not hold them."""
    out = tmp_path / "paired"
    args = "--paired --model vanilla_classifier --attention vanilla,linformer --baseline vanilla --lengths 48"
    args += " --d-model 32 --heads 2 --vocab 257 --set n_classes=2 --rounds 1 --device cpu --threads 1"
    assert bench.main([*args.split(), "--out", str(out)]) == 0
    rows = {r["variant"]: r for r in csv.DictReader(open(out / "paired.csv"))}
    assert set(rows) == {"vanilla", "linformer"} and float(rows["linformer"]["act_mib"]) > 0
    model = zoo.create_model("vanilla_classifier", vocab_size=257, n_classes=2, d_model=32, n_heads=2, n_layers=1)
    batch = model.training_batch(torch.randint(0, 257, (3, 9)))
    assert batch["tokens"].shape == (3, 8) and batch["targets"].shape == (3,) and int(batch["targets"].max()) < 2
