"""Reformer against reformer-pytorch at one length, timed alternately (A B, B A, ...) on a shared machine.

On a machine shared with other jobs the load drifts by several times within minutes, so timing
one model after the other (as ``zoo.bench`` does, variant by variant) can put them under
different loads. Here the two training steps alternate, A B A B ..., and the ratio is taken per
pair: both sides of every pair ran under nearly the same load. Same configuration as the peer
figures in BENCHMARKS.md: batch 1, d_model 256, 4 heads, 2 layers, vocab 256, d_ff 1024, LSH
with 4 hashes and chunk (bucket) 64, reversible. Usage::

    python experiments/reformer_speed.py --length 8192 --pairs 3 --out results/reformer_memory/speed
"""

from __future__ import annotations

import argparse
import csv
import statistics
import time
from pathlib import Path

import torch

from zoo.bench import build, named_variant


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--length", type=int, default=8192)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--variants", default="reformer,peer:reformer-pytorch",
                        help="comma-separated presets and peer:<name>")
    parser.add_argument("--out", default="results/reformer_memory/speed")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    shape = dict(d_model=256, heads=4, layers=2, vocab=256, batch=1, d_ff=1024)
    models = {}
    for label in args.variants.split(","):
        variant = named_variant(label)
        module, loss_fn = build(variant, args.length, shape, {})
        module.train()
        models[variant.label] = (module, loss_fn)
    tokens = torch.randint(0, 256, (1, args.length + 1), generator=torch.Generator().manual_seed(0))
    rows = []
    for pair in range(-1, args.pairs):  # pair -1: warm-up, not recorded
        order = list(models.items()) if pair % 2 == 0 else list(models.items())[::-1]  # A B, then B A: drift cancels
        for label, (module, loss_fn) in order:
            start = time.perf_counter()
            loss_fn(tokens).backward()
            elapsed = time.perf_counter() - start
            module.zero_grad(set_to_none=True)
            print(f"pair {pair:2d} {label:>24} {elapsed * 1e3:10.1f} ms", flush=True)
            if pair >= 0:
                rows.append(dict(pair=pair, variant=label, length=args.length, threads=args.threads, ms=round(elapsed * 1e3, 1)))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / f"speed_{args.length}.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    labels = list(models)
    lines = [f"# Alternating timing at length {args.length} ({args.threads} thread(s), batch 1, d 256, 4 heads, 2 layers)", "",
             "| pair | " + " | ".join(f"{label} (ms)" for label in labels) + f" | {labels[-1]} / {labels[0]} |", "|---|" + "---|" * (len(labels) + 1)]
    ratios = []
    for pair in range(args.pairs):
        times = [next(r["ms"] for r in rows if r["pair"] == pair and r["variant"] == label) for label in labels]
        ratios.append(times[-1] / times[0])
        lines.append(f"| {pair} | " + " | ".join(f"{t:,.0f}" for t in times) + f" | {ratios[-1]:.2f} |")
    medians = [statistics.median(r["ms"] for r in rows if r["variant"] == label) for label in labels]
    lines += ["", f"Median ratio per pair: **{statistics.median(ratios):.2f}x** ({labels[-1]} time / {labels[0]} time); medians "
              + ", ".join(f"{label} {m:,.0f} ms" for label, m in zip(labels, medians)) + ".", "",
              f"Command: `python experiments/reformer_speed.py --length {args.length} --pairs {args.pairs} --threads {args.threads} --variants {args.variants} --out {args.out}`"]
    (out / f"speed_{args.length}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
