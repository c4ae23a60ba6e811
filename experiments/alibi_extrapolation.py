"""ALiBi's signature claim beside the paper: train short, test long.

Paper: Press, Smith and Lewis 2022, "Train Short, Test Long: Attention with Linear Biases Enables
Input Length Extrapolation", arXiv:2108.12409, Figure 1 (WikiText-103, models trained at L = 512 and
1,024, evaluated at longer L_valid without overlap): ALiBi's perplexity stays flat or keeps falling
past the training length, the sinusoidal model's rises sharply just past it, rotary and the T5 bias
degrade more slowly.

Here: the same small model (``vanilla_lm``, pre-norm, d 128, 4 layers, 4 heads, d_ff 512, dropout
0.1, max_len 2,048) is trained by the app on Tiny Shakespeare (characters, read in place) at length
128 with each position scheme and seed, the same data order per seed, the same steps; then each
checkpoint is scored on the test split at every evaluation length L with two protocols
(``zoo/train/eval_protocols.py``):

- ``segment``: the split cut into non-overlapping segments of L, each scored on its own (the paper's
  Figure 1 protocol: a token sees the part of its segment before it, on average L / 2 tokens);
- ``sliding``: windows of L moved by L / 2, each scoring only its new tokens (each token sees at least
  L / 2 earlier ones; the paper's sliding-window evaluation, Section 4 and Appendix B).

``learned`` positions have a table of max_len = 2,048 rows, of which only the first 128 are trained:
past 128 a learned model reads untrained rows (that is what "no extrapolation" means for it).

Deviations: characters, not WikiText-103 words; a 0.8M-parameter model trained for minutes on CPU,
not a 247M one for a day; training length 128 (the paper's shortest is 64 in its Table 5 sweep).

Resumable: a trained run (``result.json`` in its directory) is not trained again, a stopped one
resumes from ``last.pt``; evaluation rows already in ``extrapolation.csv`` are kept.

    python experiments/alibi_extrapolation.py --steps 1000 --batch-size 16 --seeds 0,1 \\
        --positions sinusoidal,learned,rope,alibi,t5_bias --runs runs/alibi_extrapolation \\
        --out results/alibi_extrapolation
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

from zoo.app.run import load_run
from zoo.bench.machine import describe_machine
from zoo.train.eval_protocols import ProtocolSettings, evaluate_protocol

ROOT = Path(__file__).resolve().parent.parent
TRAIN_LEN = 128
PROTOCOLS = ("segment", "sliding")
FIELDS = ("position", "seed", "protocol", "eval_len", "bpc", "scored", "step", "seconds", "load_1min")


def train_command(position: str, seed: int, steps: int, batch_size: int, run_dir: Path, threads: int) -> list[str]:
    """The app's command for one run (every setting on the command line: set == runs)."""
    return [
        sys.executable,
        str(ROOT / "experiments" / "train.py"),
        "experiment=shakespeare",
        "model=vanilla_lm",
        f"position={position}",
        "residual=pre_norm",
        "model.d_model=128",
        "model.n_layers=4",
        "model.n_heads=4",
        "model.d_ff=512",
        "model.dropout=0.1",
        "model.max_len=2048",
        f"trainer.seq_len={TRAIN_LEN}",
        f"trainer.batch_size={batch_size}",
        f"trainer.max_steps={steps}",
        f"trainer.eval_every={max(steps // 6, 1)}",
        "trainer.eval_batches=20",
        f"trainer.threads={threads}",
        "trainer.resume=auto",
        f"seed={seed}",
        "logger=csv",
        f"hydra.run.dir={run_dir}",
    ]


def train(position: str, seed: int, args: argparse.Namespace) -> Path:
    run_dir = Path(args.runs).resolve() / f"{position}-seed{seed}"
    if not (run_dir / "result.json").exists():
        command = train_command(position, seed, args.steps, args.batch_size, run_dir, args.threads)
        print(" ".join(command[1:]), flush=True)
        log = run_dir.parent / f"{run_dir.name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "a") as handle:
            subprocess.run(command, check=True, cwd=ROOT, stdout=handle, stderr=subprocess.STDOUT)
    return run_dir / "checkpoints" / "best.pt"


def evaluate(checkpoint: Path, position: str, seed: int, done: set, args: argparse.Namespace) -> list[dict]:
    _, task, model, ckpt = load_run(checkpoint)
    rows = []
    for protocol in PROTOCOLS:
        for length in args.lengths:
            if (position, seed, protocol, length) in done:
                continue
            settings = ProtocolSettings(protocol=protocol, seq_len=length, batch_size=max(1, 8192 // length))
            begin = time.perf_counter()
            result = evaluate_protocol(model, task, args.split, settings)
            rows.append(
                dict(
                    position=position,
                    seed=seed,
                    protocol=protocol,
                    eval_len=length,
                    bpc=result[f"{args.split}/loss"] / math.log(2),
                    scored=result[f"{args.split}/scored"],
                    step=ckpt["step"],
                    seconds=round(time.perf_counter() - begin, 1),
                    load_1min=round(os.getloadavg()[0], 1),
                )
            )
            print(f"{position:>10} seed {seed} {protocol:>7} L={length:>5}: {rows[-1]['bpc']:.3f} bpc", flush=True)
    return rows


def read_rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    with open(path) as handle:
        rows = list(csv.DictReader(handle))
    for row in rows:
        row["seed"], row["eval_len"] = int(row["seed"]), int(row["eval_len"])
        row["bpc"] = float(row["bpc"])
    return rows


def append_rows(path: Path, rows: list[dict]) -> None:
    new = not path.exists()
    with open(path, "a", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=FIELDS)
        if new:
            writer.writeheader()
        writer.writerows(rows)


def aggregate(rows: list[dict]) -> dict[tuple[str, str, int], tuple[float, float, float, int]]:
    """(protocol, position, L) -> (mean, min, max, seeds) of the bpc over seeds."""
    groups: dict[tuple[str, str, int], list[float]] = {}
    for row in rows:
        groups.setdefault((row["protocol"], row["position"], row["eval_len"]), []).append(row["bpc"])
    return {key: (float(np.mean(v)), min(v), max(v), len(v)) for key, v in groups.items()}


def summary_markdown(rows: list[dict], args: argparse.Namespace, meta: dict) -> str:
    stats = aggregate(rows)
    positions = [p for p in args.positions if any(r["position"] == p for r in rows)]
    lines = [
        "# Train short, test long (ALiBi, Press et al. 2022, Figure 1)",
        "",
        f"Bits per character on the Tiny Shakespeare {args.split} split; every model trained at L = {TRAIN_LEN} for "
        f"{args.steps} steps of {args.batch_size} x {TRAIN_LEN} tokens, seeds {', '.join(map(str, args.seeds))} "
        f"(mean, min-max over seeds). {meta['machine']}, "
        f"{args.threads} thread(s), load average at the end {meta['load']}.",
    ]
    for protocol in PROTOCOLS:
        lines += ["", f"## {protocol}", "", "| position | " + " | ".join(f"L = {n:,}" for n in args.lengths) + " |"]
        lines.append("|---|" + "---|" * len(args.lengths))
        for position in positions:
            cells = []
            for length in args.lengths:
                value = stats.get((protocol, position, length))
                cells.append("-" if value is None else f"{value[0]:.3f} ({value[1]:.3f}-{value[2]:.3f})")
            lines.append(f"| {position} | " + " | ".join(cells) + " |")
    lines += ["", "## Change from L = 128 to the longest length (mean over seeds, bpc)", ""]
    longest = max(args.lengths)
    for protocol in PROTOCOLS:
        changes = []
        for position in positions:
            short, long = stats.get((protocol, position, TRAIN_LEN)), stats.get((protocol, position, longest))
            if short and long:
                changes.append(f"{position} {long[0] - short[0]:+.3f}")
        lines.append(f"- {protocol}: " + ", ".join(changes))
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], args: argparse.Namespace, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stats = aggregate(rows)
    fig, axes = plt.subplots(1, len(PROTOCOLS), figsize=(11, 4), sharey=True)
    for axis, protocol in zip(axes, PROTOCOLS):
        for position in args.positions:
            points = [(n, stats[(protocol, position, n)]) for n in args.lengths if (protocol, position, n) in stats]
            if not points:
                continue
            x = [n for n, _ in points]
            mean = np.array([s[0] for _, s in points])
            low, high = np.array([s[1] for _, s in points]), np.array([s[2] for _, s in points])
            axis.plot(x, mean, marker="o", label=position)
            axis.fill_between(x, low, high, alpha=0.2)
        axis.axvline(TRAIN_LEN, color="grey", lw=0.8, ls=":")
        axis.set_xscale("log", base=2)
        axis.set(xlabel="evaluation length L", title=f"{protocol} (trained at L = {TRAIN_LEN})")
    axes[0].set_ylabel(f"bits per character ({args.split})")
    axes[-1].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--positions", default="sinusoidal,learned,rope,alibi,t5_bias")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lengths", default="128,256,512,1024,2048")
    parser.add_argument("--split", default="test", choices=["val", "test"])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--runs", default="runs/alibi_extrapolation")
    parser.add_argument("--out", default="results/alibi_extrapolation")
    parser.add_argument("--summary-only", action="store_true", help="rewrite the table and plot from the CSV")
    args = parser.parse_args(argv)
    args.positions = [p for p in args.positions.split(",") if p]
    args.seeds = [int(s) for s in args.seeds.split(",") if s]
    args.lengths = [int(n) for n in args.lengths.split(",") if n]
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    table = out / "extrapolation.csv"
    if not args.summary_only:
        for seed in args.seeds:  # one seed of every scheme first: a partial sweep still compares them
            for position in args.positions:
                done = {(r["position"], r["seed"], r["protocol"], r["eval_len"]) for r in read_rows(table)}
                checkpoint = train(position, seed, args)
                append_rows(table, evaluate(checkpoint, position, seed, done, args))
    rows = read_rows(table)
    meta = dict(machine=describe_machine(), load=" ".join(f"{x:.1f}" for x in os.getloadavg()))
    (out / "summary.md").write_text(summary_markdown(rows, args, meta))
    plot(rows, args, out / "extrapolation.png")
    (out / "settings.json").write_text(json.dumps({**vars(args), **meta}, indent=2))
    print((out / "summary.md").read_text())


if __name__ == "__main__":
    main()
