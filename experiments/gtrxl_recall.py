"""Gating stabilises? TrXL vs TrXL-I vs GTrXL on delayed recall, over seeds.

Parisotto et al. 2019 (arXiv:1910.06764) claim that on memory tasks GTrXL (identity-map
reordering + GRU gates, b_g = 2) learns faster and more reliably than TrXL (post-norm) and TrXL-I
(reordering only). Their tasks are reinforcement learning (DMLab memory, Numpad); ours is the
supervised stand-in ``zoo.data.delayed_recall``: a cue in the first segment, asked for at the end
of every segment, with the stream read one segment per call and the memory carried (stop-gradient),
so recalling after d segments needs d hops of recurrence.

Scale-down (CPU, 1 thread, a few minutes per run): 3 layers, d 64, 4 heads, FFN 256, segment 16,
mem_len 16, 4 segments per stream (delays 0..3 segments), batch 32, Adam, constant learning rate,
``--steps`` optimiser steps (one per stream, losses of its 4 segments summed). Success: accuracy
at the longest delay >= ``--threshold`` on held-out streams at the end of training.

    python experiments/gtrxl_recall.py --out results/gtrxl_recall
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from pathlib import Path

import torch

import zoo
from zoo.data.delayed_recall import delayed_recall_batch, vocab_size
from zoo.train.steps import forward_backward, optimizer_step

MODELS = ("transformer_xl", "trxl_i", "gtrxl")


def stream_loss(model, batch, seg_len: int, train: bool):
    """Feed a stream segment by segment with the memory carried.

    Training backpropagates each segment's loss as it comes (zoo.train.steps.forward_backward; truncated
    BPTT: the memory is detached, so each segment's graph ends there), segment i weighted 1 / (i + 1) as
    this experiment's runs always were; the caller takes the optimiser step.
    Returns (mean loss, accuracy per delay [n_segments]).
    """
    b = batch["tokens"].shape[0]
    state = model.init_state(b)
    losses, correct = [], []
    pieces = zip(batch["tokens"].split(seg_len, 1), batch["targets"].split(seg_len, 1))
    for i, (tokens, targets) in enumerate(pieces):
        piece = {"tokens": tokens, "targets": targets}
        if train:
            out, _ = forward_backward(model, piece, state=state, scale=1 / (i + 1))
        else:
            out = model(**piece, state=state)
        state = out.state
        losses.append(out.loss.detach())
        correct.append((out.logits[:, -1].argmax(-1) == batch["cue"]).float().mean())
    return torch.stack(losses).mean(), torch.stack(correct)


def evaluate(model, task: dict, n: int, seed: int) -> torch.Tensor:
    model.eval()
    g = torch.Generator().manual_seed(10_000 + seed)
    with torch.no_grad():
        _, acc = stream_loss(model, delayed_recall_batch(n, generator=g, **task), task["segment_len"], train=False)
    model.train()
    return acc


def run(name: str, seed: int, args, task: dict, log) -> dict:
    torch.manual_seed(seed)
    model = zoo.create_model(
        name,
        vocab_size=vocab_size(task["n_cues"], task["n_noise"]),
        d_model=args.d_model,
        n_layers=args.layers,
        n_heads=4,
        d_ff=4 * args.d_model,
        dropout=0.0,
        attention={"mem_len": task["segment_len"]},
    )
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    g = torch.Generator().manual_seed(seed)
    curve, start = [], time.perf_counter()
    for step in range(1, args.steps + 1):
        opt.zero_grad(set_to_none=True)
        loss, _ = stream_loss(
            model, delayed_recall_batch(args.batch, generator=g, **task), task["segment_len"], train=True
        )
        optimizer_step(model, opt, clip=1.0)
        if step % args.eval_every == 0 or step == args.steps:
            acc = evaluate(model, task, args.eval_streams, seed)
            curve.append(dict(step=step, loss=float(loss), **{f"acc_delay{d}": float(a) for d, a in enumerate(acc)}))
    final = curve[-1]
    longest = f"acc_delay{task['n_segments'] - 1}"
    first_solved = next((c["step"] for c in curve if c[longest] >= args.threshold), None)
    result = dict(
        model=name,
        seed=seed,
        final_loss=final["loss"],
        **{k: v for k, v in final.items() if k.startswith("acc")},
        success=final[longest] >= args.threshold,
        first_step_solved=first_solved,
        diverged=not torch.isfinite(torch.tensor(final["loss"])).item(),
        seconds=time.perf_counter() - start,
        curve=curve,
    )
    log(
        f"{name} seed {seed}: final loss {final['loss']:.3f}, accuracy by delay "
        f"{[round(final[f'acc_delay{d}'], 3) for d in range(task['n_segments'])]}, solved at step {first_solved}, "
        f"{result['seconds']:.0f}s"
    )
    return result


def plot(results: list[dict], path: Path, n_segments: int, threshold: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(r["model"] for r in results))
    fig, axes = plt.subplots(1, len(names), figsize=(4 * len(names), 3.2), sharey=True, squeeze=False)
    axes = axes[0]
    key = f"acc_delay{n_segments - 1}"
    for ax, name in zip(axes, names):
        for r in (r for r in results if r["model"] == name):
            ax.plot([c["step"] for c in r["curve"]], [c[key] for c in r["curve"]], label=f"seed {r['seed']}")
        ax.axhline(threshold, color="grey", ls=":", lw=1)
        ax.set_title(name)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(f"accuracy, delay {n_segments - 1} segments")
    axes[-1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--steps", type=int, default=800)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--segments", type=int, default=4)
    parser.add_argument("--segment-len", type=int, default=16)
    parser.add_argument("--eval-every", type=int, default=50)
    parser.add_argument("--eval-streams", type=int, default=512)
    parser.add_argument("--threshold", type=float, default=0.9)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--load", default="", help="comma-separated runs.json files to summarise instead of training")
    parser.add_argument("--out", default="results/gtrxl_recall")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    task = dict(n_segments=args.segments, segment_len=args.segment_len, n_cues=8, n_noise=16)
    lines: list[str] = []

    def log(text: str) -> None:
        print(text, flush=True)
        lines.append(text)

    if args.load:  # summarise runs made by earlier invocations (e.g. one process per model)
        results = [r for path in args.load.split(",") for r in json.loads(Path(path).read_text())]
        lines.extend(
            line for path in args.load.split(",") for line in json.loads(Path(path).read_text())[0].get("log", [])
        )
    else:
        results = [
            run(name, int(seed), args, task, log) for name in args.models.split(",") for seed in args.seeds.split(",")
        ]
        if results:
            results[0]["log"] = list(lines)
            results[0]["command"] = "python " + " ".join(
                ["experiments/gtrxl_recall.py", *(argv if argv is not None else sys.argv[1:])]
            )
        (out / "runs.json").write_text(json.dumps(results, indent=1))
    args.models = ",".join(dict.fromkeys(r["model"] for r in results))
    longest = f"acc_delay{args.segments - 1}"
    with open(out / "curves.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["model", "seed", "step", "loss", *[f"acc_delay{d}" for d in range(args.segments)]])
        for r in results:
            for c in r["curve"]:
                writer.writerow(
                    [
                        r["model"],
                        r["seed"],
                        c["step"],
                        f"{c['loss']:.4f}",
                        *[f"{c[f'acc_delay{d}']:.4f}" for d in range(args.segments)],
                    ]
                )
    plot(results, out / "curves.png", args.segments, args.threshold)
    command = "python " + " ".join(["experiments/gtrxl_recall.py", *(argv if argv is not None else sys.argv[1:])])
    runs = [r["command"] for r in results if "command" in r]
    shown = "; ".join(f"`{c}`" for c in [*runs, command])
    md = [
        f"# Delayed recall: TrXL vs TrXL-I vs GTrXL\n\nCommand(s): {shown}  \nTask: {args.segments} segments of "
        f"{args.segment_len} tokens, cue in segment 0, asked at the end of every segment (delays "
        f"0..{args.segments - 1}); chance = 1/8. Model: {args.layers} layers, d {args.d_model}, 4 heads, mem_len "
        f"{args.segment_len}; batch {args.batch}, Adam lr {args.lr}, {args.steps} steps, 1 thread. Success: "
        f"accuracy at delay {args.segments - 1} >= {args.threshold} on {args.eval_streams} held-out streams.\n"
    ]
    md.append(
        f"| model | success | per seed: accuracy at delays 0..{args.segments - 1} (final) | first step solved | "
        "final loss |\n|---|---|---|---|---|"
    )
    for name in args.models.split(","):
        runs = [r for r in results if r["model"] == name]
        accs = "; ".join(
            f"s{r['seed']}: " + "/".join(f"{r[f'acc_delay{d}']:.2f}" for d in range(args.segments)) for r in runs
        )
        solved = ", ".join(str(r["first_step_solved"]) for r in runs)
        losses = ", ".join(f"{r['final_loss']:.3f}" for r in runs)
        md.append(f"| {name} | {sum(r['success'] for r in runs)}/{len(runs)} | {accs} | {solved} | {losses} |")
    md.append(
        "\nLearning curves (accuracy at the longest delay, per seed): `curves.png`, all delays in `curves.csv` "
        f"({longest} is the longest).\n\nLog:\n\n```\n" + "\n".join(lines) + "\n```\n"
    )
    (out / "README.md").write_text("\n".join(md))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
