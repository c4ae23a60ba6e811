"""Reformer at 8K against reformer-pytorch and dense ``vanilla_lm``, and against its FLOP bound.

One run, alternating rounds (A B C, then C B A, ...) so that every variant of a round ran under
nearly the same load; each round also times a matrix multiplication of the Reformer's own
feed-forward shape, the machine's achievable matmul rate under that round's load. Reported: the
median ratio per round with its min-max, and the share of the FLOP bound reached:

    bound = matmul FLOPs of one Reformer training step / matmul rate,     share = bound / step time

FLOPs counted (multiply-add = 2, per layer, elementwise work not counted): projections to_qk,
to_v, to_out (3 x 2 t d^2), feed-forward (2 x 2 t d d_ff), LSH attention with R hashes and chunk c
(scores and weighted values, each key block 2c wide: 2 x 2 t h R 2c d_k), hashing (2 t h d_k R
n_buckets / 2, no backward). A training step is forward + backward (2x forward) + the reversible
stack's recomputation (one more forward): 4x the forward's differentiable FLOPs, 2x the hashing;
plus the output layer (3 x 2 t d vocab). Same configuration as the peer figures in BENCHMARKS.md:
batch 1, d_model 256, 4 heads, 2 layers, vocab 256, d_ff 1024, 4 hashes, chunk 64. Usage::

    python experiments/reformer_paired.py --length 8192 --rounds 5 --threads 2 --out results/perf/reformer_8k
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import time
from pathlib import Path

import torch

from zoo.bench import build, named_variant

SHAPE = dict(d_model=256, heads=4, layers=2, vocab=256, batch=1, d_ff=1024)


def reformer_step_flops(t: int, d: int = 256, heads: int = 4, layers: int = 2, d_ff: int = 1024, vocab: int = 256, hashes: int = 4, chunk: int = 64) -> dict[str, float]:
    """Matmul FLOPs of one training step of the ``reformer`` preset at this size (see the module doc)."""
    d_k = d // heads
    n_buckets = max(2, (t // chunk) + (t // chunk) % 2)  # the preset's n_buckets = 0 (auto)
    forward = {
        "projections": 3 * 2 * t * d * d,
        "feed_forward": 2 * 2 * t * d * d_ff,
        "lsh_attention": 2 * 2 * t * heads * hashes * (2 * chunk) * d_k,
    }
    hashing = 2 * t * heads * d_k * hashes * (n_buckets // 2)
    flops = {name: 4.0 * layers * f for name, f in forward.items()}
    flops["hashing"] = 2.0 * layers * hashing
    flops["output_layer"] = 3.0 * 2 * t * d * vocab
    flops["total"] = sum(flops.values())
    return flops


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--length", type=int, default=8192)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--variants", default="reformer,peer:reformer-pytorch,vanilla_lm")
    parser.add_argument("--out", default="results/perf/reformer_8k")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    models = {}
    for label in args.variants.split(","):
        variant = named_variant(label)
        module, loss_fn = build(variant, args.length, SHAPE, {})
        models[label] = (module.train(), loss_fn)
    tokens = torch.randint(0, 256, (1, args.length + 1), generator=torch.Generator().manual_seed(0))
    # the matmul probe: the feed-forward's shape at this length, [t, d] x [d, d_ff]
    a, b = torch.randn(args.length, SHAPE["d_model"]), torch.randn(SHAPE["d_model"], SHAPE["d_ff"])
    probe_flops = 2 * a.shape[0] * a.shape[1] * b.shape[1]

    def probe() -> float:
        start = time.perf_counter()
        for _ in range(10):
            torch.mm(a, b)
        return (time.perf_counter() - start) / 10

    rows = []
    for rnd in range(-1, args.rounds):  # round -1: warm-up, not recorded
        order = list(models.items()) if rnd % 2 == 0 else list(models.items())[::-1]
        seconds = {"matmul_probe": probe()}
        for label, (module, loss_fn) in order:
            start = time.perf_counter()
            loss_fn(tokens).backward()
            seconds[label] = time.perf_counter() - start
            module.zero_grad(set_to_none=True)
        seconds["matmul_probe"] = min(seconds["matmul_probe"], probe())
        print(f"round {rnd:2d} " + "  ".join(f"{k} {v * 1e3:,.1f} ms" for k, v in seconds.items()) + f"  load {os.getloadavg()[0]:.1f}", flush=True)
        if rnd >= 0:
            rows.append(dict(round=rnd, load=round(os.getloadavg()[0], 2), **{k: round(v * 1e3, 2) for k, v in seconds.items()}))

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / f"paired_{args.length}.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    labels = list(models)
    base = labels[0]
    flops = reformer_step_flops(args.length)

    def spread(values: list[float]) -> str:
        return f"{statistics.median(values):.2f}x ({min(values):.2f}-{max(values):.2f})"

    lines = [
        f"# Reformer at {args.length}: alternating rounds ({args.threads} threads, batch 1, d 256, 4 heads, 2 layers, d_ff 1024)",
        "",
        "| round | load (1 min) | " + " | ".join(f"{label} (ms)" for label in labels) + " | matmul probe (GFLOP/s) |",
        "|---|---|" + "---|" * (len(labels) + 1),
    ]
    for r in rows:
        lines.append(f"| {r['round']} | {r['load']:.1f} | " + " | ".join(f"{r[label]:,.0f}" for label in labels) + f" | {probe_flops / r['matmul_probe'] / 1e6:.1f} |")
    lines += ["", f"Speed-up of `{base}` per round, median (min-max):", ""]
    for label in labels[1:]:
        lines.append(f"- against `{label}`: {spread([r[label] / r[base] for r in rows])} ({label} time / {base} time)")
    if base == "reformer":
        shares = [flops["total"] / (probe_flops / (r["matmul_probe"] / 1e3)) / (r[base] / 1e3) for r in rows]
        lines += [
            "",
            f"FLOP bound of one `reformer` training step: {flops['total'] / 1e9:.1f} GFLOP ("
            + ", ".join(f"{k.replace('_', ' ')} {v / 1e9:.1f}" for k, v in flops.items() if k != "total")
            + "); share of the bound reached (bound time at the round's matmul rate / step time): "
            + f"{statistics.median(shares):.2f} ({min(shares):.2f}-{max(shares):.2f}).",
        ]
    lines += ["", f"Command: `python experiments/reformer_paired.py --length {args.length} --rounds {args.rounds} --threads {args.threads} --variants {args.variants} --out {args.out}`"]
    (out / f"paired_{args.length}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
