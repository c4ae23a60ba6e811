"""Packed against padded documents: training tokens per second counting real tokens only.

``python -m zoo.bench.packing --data shakespeare_lines --path <file> --seq-len 128``: one model per attention
(``--attention``), trained a step at a time on the same task laid out two ways, one document per padded row
(``data.pack=false``) and whole documents packed into full rows (``data.pack=true``, zoo/data/packing.py),
in paired rounds (:func:`zoo.bench.timing.paired_rounds`: the two layouts alternate, the order rotated each
round, one warm-up round unrecorded), each round on the next training batch of its layout. Reported per
layout: real (non-padding) tokens per second over the recorded rounds, the share of positions that are real,
and packed's speed-up per round (its real tokens/s over padded's) as the median with its min-max. The machine
and its load are printed with the table; ``--out`` also writes ``packing.csv`` and ``packing.md``.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from pathlib import Path
from typing import Any

import torch

from zoo.bench.machine import describe_machine, load_average
from zoo.bench.timing import clocked, paired_rounds, pick_device
from zoo.data.base import create_task
from zoo.presets.factory import build_model_for_task

PRESETS = {"lm": "vanilla_lm", "classifier": "vanilla_classifier"}


def layout_steps(attention: str, args: argparse.Namespace, device: torch.device) -> tuple[dict, dict]:
    """(step per layout, real tokens of each recorded step per layout) for one attention: a model per layout
    with the same initial weights, each stepping through its own layout's training batches."""
    steps, real = {}, {}
    for pack in (False, True):
        label = "packed" if pack else "padded"
        options = {"path": args.path, "pack": pack}
        task = create_task(args.data, batch_size=args.batch, seq_len=args.seq_len, seed=args.seed, **options)
        torch.manual_seed(args.seed)
        overrides: dict[str, Any] = {"attention": attention, "n_layers": args.layers, "d_model": args.d_model}
        overrides.update(n_heads=args.heads, d_ff=4 * args.d_model, dropout=0.0)
        model = build_model_for_task(PRESETS[task.kind], task, **overrides).to(device).train()
        batches = [{k: v.to(device) for k, v in task.batch("train", i).items()} for i in range(args.rounds + 1)]
        counts: list[int] = []
        real[label] = counts

        def step(model=model, batches=batches, counts=counts) -> None:
            batch = batches[len(counts) % len(batches)]
            counts.append(int(batch["pad_mask"].sum()))
            model(**batch).loss.backward()
            model.zero_grad(set_to_none=True)

        steps[label] = clocked(step, device)
    return steps, real


def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    torch.set_num_threads(args.threads)
    device = pick_device(args.device)
    rows = []
    for attention in args.attention.split(","):
        try:
            steps, real = layout_steps(attention, args, device)
        except ValueError as refusal:  # a mechanism that cannot pack (or cannot serve this head) says why
            print(f"{attention}: not measured: {refusal}")
            continue
        rounds = paired_rounds(steps, args.rounds, progress=lambda line, name=attention: print(f"{name}: {line}"))
        tokens = {label: counts[1:] for label, counts in real.items()}  # the warm-up round's step is not recorded
        per_round = {label: [n / r[label] for n, r in zip(tokens[label], rounds)] for label in steps}
        speedups = [b / a for a, b in zip(per_round["padded"], per_round["packed"])]
        positions = args.batch * args.seq_len
        for label in steps:
            rows.append(
                {
                    "data": args.data,
                    "attention": attention,
                    "layout": label,
                    "seq_len": args.seq_len,
                    "batch": args.batch,
                    "real_tokens_per_s": sum(tokens[label]) / sum(r[label] for r in rounds),
                    "real_share": sum(tokens[label]) / (positions * len(rounds)),
                    "median_step_s": statistics.median(r[label] for r in rounds),
                    "speedup": statistics.median(speedups) if label == "packed" else 1.0,
                    "speedup_min": min(speedups) if label == "packed" else 1.0,
                    "speedup_max": max(speedups) if label == "packed" else 1.0,
                }
            )
    return rows


def markdown(rows: list[dict[str, Any]], command: str) -> str:
    lines = [
        f"`{command}`",
        "",
        f"Machine: {describe_machine()}; load average {load_average()} (a shared machine: read ratios, not times).",
        "",
        "| data | attention | layout | real tokens/s | real share of positions | step (median) | packed speed-up |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        speedup = f"{r['speedup']:.2f}x ({r['speedup_min']:.2f}-{r['speedup_max']:.2f})"
        speedup = speedup if r["layout"] == "packed" else ""
        lines.append(
            f"| {r['data']} | {r['attention']} | {r['layout']} | {r['real_tokens_per_s']:,.0f} | "
            f"{r['real_share']:.0%} | {r['median_step_s'] * 1e3:,.0f} ms | {speedup} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m zoo.bench.packing", description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default="lines_lm", help="a task with a pack option: lines_lm or imdb")
    parser.add_argument("--path", required=True, help="its data file (data.path)")
    parser.add_argument("--attention", default="vanilla", help="comma-separated mechanisms that pack")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", default="", help="a folder for packing.csv and packing.md")
    args = parser.parse_args(argv)
    rows = measure(args)
    command = "python -m zoo.bench.packing " + " ".join(argv if argv is not None else sys.argv[1:])
    text = markdown(rows, command)
    print(text)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "packing.md").write_text(text)
        with open(out / "packing.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
