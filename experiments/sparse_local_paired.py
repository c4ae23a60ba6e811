"""Paired timing: training steps of several variants taken in turn (round robin), same process.

``zoo.bench`` measures one variant after another; on a shared machine whose load drifts by
several times within minutes, that turns the ratio of two variants into a ratio of two load
levels. Here every round times one step of each variant back to back, so each round gives a
ratio under (nearly) the same load; the median over rounds is reported with its spread.
Variants are built by ``zoo.bench.build`` (same shapes, same peers as the harness).

    python experiments/sparse_local_paired.py --attention local_1d --peers local-attention \
        --baseline peer:local-attention --length 8192 --rounds 5 --out results/sparse_local/paired_8k

Variants are given as to ``zoo.bench``: ``--attention``, ``--model``, ``--variant key=value ...``, ``--peers``.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import time
from pathlib import Path

import torch

import zoo  # noqa: F401  (registers mechanisms)
from zoo.bench import _quote, add_variant_arguments, build, variants_from_args


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_variant_arguments(parser)
    parser.add_argument("--baseline", required=True, help="label the ratios are taken against, e.g. peer:local-attention")
    parser.add_argument("--length", type=int, default=8192)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    variants = variants_from_args(args)
    shape = dict(d_model=256, heads=4, layers=2, vocab=256, batch=1, d_ff=1024)
    built = {v.label: build(v, args.length, shape, {}) for v in variants}
    tokens = torch.randint(0, shape["vocab"], (1, args.length + 1), generator=torch.Generator().manual_seed(0))

    def step(label: str) -> float:
        module, loss_fn = built[label]
        module.train()
        start = time.perf_counter()
        loss_fn(tokens).backward()
        elapsed = time.perf_counter() - start
        module.zero_grad(set_to_none=True)
        return elapsed

    for label in built:  # warm-up
        step(label)
    rows = []
    for r in range(args.rounds):
        times = {label: step(label) for label in built}
        rows.append({"round": r, **{f"{label} ms": round(t * 1e3, 1) for label, t in times.items()}})
        print(rows[-1], flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    with (args.out / "paired.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    lines = [
        f"# Paired training steps at length {args.length} (2 layers, d 256, 4 heads, vocab 256, batch 1, {args.threads} threads)",
        "",
        "Command: `python experiments/sparse_local_paired.py " + " ".join(_quote(a) for a in sys.argv[1:]) + "`",
        "",
        f"| variant | median ms | speed-up over {args.baseline}: median of per-round ratios | min / max ratio |",
        "|---|---|---|---|",
    ]
    for label in built:
        ratios = [row[f"{args.baseline} ms"] / row[f"{label} ms"] for row in rows]
        median_ms = statistics.median(row[f"{label} ms"] for row in rows)
        lines.append(f"| {label} | {median_ms:,.0f} | {statistics.median(ratios):.2f}x | {min(ratios):.2f} / {max(ratios):.2f} |")
    (args.out / "paired.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
