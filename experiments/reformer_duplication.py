"""Reformer duplication task (Kitaev et al. 2020, arXiv:2001.04451, Section 2.1, Table 2), CPU-sized.

Sequences ``0 w 0 w``; the loss and the accuracy count the second copy of ``w`` only. A 1-layer
shared-QK model is trained with full attention and with LSH attention at 1, 2 and 4 hashes, then
each trained model is evaluated with full attention and with LSH at 1, 2, 4 and 8 hashes (the
weights carry over: ``lsh`` and ``shared_qk`` share their parameter names).

The paper: length 1024, 127 symbols, d_model = d_ff = 256, 4 heads, 150K steps. Here by default:
length 64 (w of 31 symbols), 127 symbols, d_model = d_ff = 128, 4 heads, a few thousand
sequences per model, chunk 8 and 8 buckets (the paper's ratio of length to chunk), learned
positions, a plain (sequential) stack: a 1-layer model gains nothing from reversibility and the
recompute would cost CPU time. Usage::

    python experiments/reformer_duplication.py --out results/reformer_duplication
"""

from __future__ import annotations

import argparse
import csv
import json
import time
from pathlib import Path

import torch

from zoo.config import IGNORE_INDEX
from zoo.data.synthetic import duplication_batch
from zoo.presets.reformer import duplication_model
from zoo.train.steps import train_step

PAPER = {  # Table 2: rows = attention in training, columns = attention in evaluation
    "full": {"full": 100.0, "lsh8": 94.8, "lsh4": 92.5, "lsh2": 76.9, "lsh1": 52.5},
    "lsh4": {"full": 0.8, "lsh8": 100.0, "lsh4": 99.9, "lsh2": 99.4, "lsh1": 91.9},
    "lsh2": {"full": 0.8, "lsh8": 100.0, "lsh4": 99.9, "lsh2": 98.1, "lsh1": 86.8},
    "lsh1": {"full": 0.8, "lsh8": 99.9, "lsh4": 99.6, "lsh2": 94.8, "lsh1": 77.9},
}
EVALS = ["full", "lsh8", "lsh4", "lsh2", "lsh1"]


def build(mode: str, args: argparse.Namespace) -> torch.nn.Module:
    return duplication_model(
        mode, n_symbols=args.n_symbols, length=args.length, d_model=args.d_model, n_heads=args.heads, chunk=args.chunk
    )


@torch.no_grad()
def accuracy(model, batches) -> float:
    model.eval()
    right = total = 0
    for batch in batches:
        keep = batch["targets"] != IGNORE_INDEX
        predicted = model(batch["tokens"]).logits.argmax(-1)
        right += int((predicted[keep] == batch["targets"][keep]).sum())
        total += int(keep.sum())
    return 100.0 * right / total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--n-symbols", type=int, default=127)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--chunk", type=int, default=8)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=800)
    parser.add_argument("--lr", type=float, default=5e-3)
    parser.add_argument("--train", default="full,lsh4,lsh2,lsh1")
    parser.add_argument("--eval-sequences", type=int, default=512)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="results/reformer_duplication")
    parser.add_argument(
        "--merge",
        default="",
        help="comma-separated output folders of runs with one --train each: combine them into --out",
    )
    args = parser.parse_args()
    if args.merge:
        merge(args)
        return
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    g_eval = torch.Generator().manual_seed(10_000 + args.seed)
    eval_batches = [
        duplication_batch(64, args.length, n_symbols=args.n_symbols, generator=g_eval)
        for _ in range(args.eval_sequences // 64)
    ]

    results: dict[str, dict[str, float]] = {}
    log_rows = []
    for mode in args.train.split(","):
        torch.manual_seed(args.seed)
        model = build(mode, args)
        optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
        g = torch.Generator().manual_seed(args.seed)
        start = time.time()
        for step in range(1, args.steps + 1):
            batch = duplication_batch(args.batch, args.length, n_symbols=args.n_symbols, generator=g)
            _, loss = train_step(model, batch, optimizer, clip=1.0)  # its post-step hook: LSH's fresh rotations
            if step % 100 == 0 or step == args.steps:
                acc = accuracy(model, eval_batches[:2])
                log_rows.append(
                    dict(
                        train=mode,
                        step=step,
                        loss=round(loss.item(), 4),
                        accuracy=round(acc, 2),
                        seconds=round(time.time() - start, 1),
                    )
                )
                print(
                    f"{mode:>5} step {step:5d} loss {loss.item():.4f} acc {acc:6.2f}% ({time.time() - start:.0f} s)",
                    flush=True,
                )
        state = model.state_dict()
        results[mode] = {}
        for evaluation in EVALS:
            evaluator = build(evaluation, args)
            mismatched = evaluator.load_state_dict(state, strict=False)  # only LSH's rotation step may differ
            assert all(k.endswith("hash_step") for k in mismatched.missing_keys + mismatched.unexpected_keys), (
                mismatched
            )
            for module in evaluator.modules():  # evaluate with the rotations of the last training step
                if hasattr(module, "hash_step"):
                    module.hash_step.fill_(args.steps)
            results[mode][evaluation] = accuracy(evaluator, eval_batches)
        print(mode, {k: round(v, 1) for k, v in results[mode].items()}, flush=True)
        write_outputs(out, results, log_rows, args)  # after every model: a cut-short run keeps what it has


def merge(args: argparse.Namespace) -> None:
    """Combine runs that each trained one model (in parallel processes) into one table."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict[str, float]] = {}
    log_rows: list[dict] = []
    commands = []
    for folder in args.merge.split(","):
        folder = Path(folder)
        with open(folder / "duplication.csv") as f:
            for row in csv.DictReader(f):
                results.setdefault(row["train"], {})[row["eval"]] = float(row["accuracy_percent"])
        with open(folder / "training_log.csv") as f:
            log_rows.extend(csv.DictReader(f))
        commands.append((folder / "README.md").read_text().split("Command: ", 1)[1].strip())
        run_args = argparse.Namespace(**json.loads((folder / "config.json").read_text()))
    order = [m for m in ("full", "lsh4", "lsh2", "lsh1") if m in results]
    results = {m: results[m] for m in order}
    run_args.merge, run_args.out = args.merge, args.out
    write_outputs(out, results, log_rows, run_args, commands)


def write_outputs(
    out: Path, results: dict, log_rows: list, args: argparse.Namespace, commands: list[str] | None = None
) -> None:
    with open(out / "duplication.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["train", "eval", "accuracy_percent", "paper_percent"])
        for mode, row in results.items():
            for evaluation, value in row.items():
                writer.writerow([mode, evaluation, f"{value:.2f}", PAPER[mode][evaluation]])
    with open(out / "training_log.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(log_rows[0]))
        writer.writeheader()
        writer.writerows(log_rows)
    (out / "config.json").write_text(
        json.dumps({k: v for k, v in vars(args).items() if k not in ("merge", "train")}, indent=2)
    )
    steps = {row["train"]: int(row["step"]) for row in log_rows}
    write_markdown(out, results, args, commands, steps)
    plot(out, results)


def write_markdown(
    out: Path,
    results: dict,
    args: argparse.Namespace,
    commands: list[str] | None = None,
    steps: dict[str, int] | None = None,
) -> None:
    names = {"full": "full", "lsh8": "LSH-8", "lsh4": "LSH-4", "lsh2": "LSH-2", "lsh1": "LSH-1"}
    lines = ["| train \\ eval | " + " | ".join(names[e] for e in EVALS) + " |", "|---|" + "---|" * len(EVALS)]
    for mode, row in results.items():
        cells = [f"**{row[e]:.1f}%** ({PAPER[mode][e]}%)" for e in EVALS]
        lines.append(f"| {names[mode]} ({(steps or {}).get(mode, args.steps)} steps) | " + " | ".join(cells) + " |")
    text = [
        "# Duplication task (Reformer, Table 2), CPU-sized",
        "",
        f"Ours in bold, the paper's in brackets. Length {args.length} (paper: 1024), {args.n_symbols} symbols, 1 "
        "layer, "
        f"d_model = d_ff = {args.d_model} (paper: 256), {args.heads} heads, chunk {args.chunk}, steps of batch "
        f"{args.batch} as listed per row "
        f"(paper: 150K steps), Adam lr {args.lr}. Accuracy over {args.eval_sequences} held-out sequences, second "
        "copy only.",
        "",
        *lines,
        "",
    ]
    own = (
        "python experiments/reformer_duplication.py "
        + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k not in ("out", "merge"))
        + f" --out {args.out}"
    )
    if commands:
        text += [
            "Commands (one process per trained model, then merged):",
            "",
            *[f"    {c.strip('`')}" for c in commands],
        ]
        text += [
            "",
            "    python experiments/reformer_duplication.py --merge "
            f"{args.merge if hasattr(args, 'merge') and args.merge else '...'} --out {out}",
        ]
    else:
        text.append(f"Command: `{own}`")
    (out / "README.md").write_text("\n".join(text) + "\n")


def plot(out: Path, results: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = list(results)
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.2))
    for ax, title, table in ((axes[0], "ours (CPU-sized)", results), (axes[1], "paper, Table 2", PAPER)):
        data = [[table[r][e] for e in EVALS] for r in rows]
        ax.imshow(data, vmin=0, vmax=100, cmap="viridis")
        ax.set_xticks(range(len(EVALS)), EVALS)
        ax.set_yticks(range(len(rows)), rows)
        for i, row in enumerate(data):
            for j, value in enumerate(row):
                ax.text(j, i, f"{value:.0f}", ha="center", va="center", color="w" if value < 60 else "k", fontsize=8)
        ax.set_title(title)
        ax.set_xlabel("evaluated with")
    axes[0].set_ylabel("trained with")
    fig.tight_layout()
    fig.savefig(out / "duplication.png", dpi=80)


if __name__ == "__main__":
    main()
