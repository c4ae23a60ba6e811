"""Reproduction: learned attention spans on tiny Shakespeare (Sukhbaatar et al. 2019, arXiv:1905.07799).

Trains ``adaptive_span_lm`` (scaled down, see below) as a character LM the way the paper does:
the text is cut into ``--batch`` parallel streams read in consecutive segments of ``--segment``
characters, and each layer's span cache (``out.state``) carries the previous segments, so a head
can learn a span longer than the segment. The same model with every span fixed at the maximum
(``mode=fixed``) is the baseline; ``--modes`` can add the dynamic variant. Reports, per mode: the
learned span of every layer and head, validation bits per character, and time per training step
(wall, and CPU seconds of the training process: the fairer figure on a shared machine), as CSV,
markdown and a plot in ``--out``.

Scale-down (the paper: 12 layers, d 512, 8 heads, S 8192, segments of 512, 600K steps of batch 64):
by default 4 layers, d 128, 4 heads, FFN 512, S 256, segments of 64, batch 16, ``--steps`` 600 on one
thread (a few CPU-minutes per mode). Ramp R = 32, L1 coefficient 2e-6, z initialised to 0 as in
the paper; Adam (lr 2e-3, 50 warm-up steps, cosine) instead of the paper's Adagrad; no dropout.

    python experiments/adaptive_span.py ../shared/data/tinyshakespeare/input.txt --out results/adaptive_span
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch

import zoo
from zoo.train.steps import adam, schedule, train_step

DEFAULT_DATA = "../shared/data/tinyshakespeare/input.txt"


def load_text(path: str) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """Characters -> ids; the last 10% is the validation split."""
    file = Path(path)
    if not file.is_file():
        raise SystemExit(f"no text at {path!r}: pass the path of tiny Shakespeare's input.txt (default {DEFAULT_DATA})")
    text = file.read_text(encoding="utf-8")
    chars = sorted(set(text))
    index = {c: i for i, c in enumerate(chars)}
    ids = torch.tensor([index[c] for c in text], dtype=torch.long)
    cut = int(len(ids) * 0.9)
    return ids[:cut], ids[cut:], chars


def streams(ids: torch.Tensor, batch: int) -> torch.Tensor:
    """[n] -> [batch, n // batch]: parallel streams read left to right (the paper's batching)."""
    n = ids.numel() // batch
    return ids[: n * batch].view(batch, n)


def span_table(model) -> list[list[float]]:
    """Mean span (tokens) of every head, per layer: [layers][heads]."""
    rows = []
    for block in model.stack.blocks:
        attn = block.attention
        if attn.options.mode == "dynamic":
            rows.append(attn.last_spans)
        else:
            rows.append([float(z) for z in attn.spans(torch.zeros(1, 1, attn.d_model)).detach()])
    return rows


@torch.no_grad()
def evaluate(model, data: torch.Tensor, segment: int) -> float:
    """Bits per character over ``data`` [b, n], segment by segment with the cache carried."""
    model.eval()
    state = model.init_state(data.shape[0])
    total, count = 0.0, 0
    for start in range(0, data.shape[1] - 1, segment):
        end = min(start + segment, data.shape[1] - 1)
        out = model(data[:, start:end], data[:, start + 1 : end + 1], state=state)
        state = out.state
        total += float(out.loss) * (end - start) * data.shape[0]
        count += (end - start) * data.shape[0]
    model.train()
    return total / count / math.log(2)


def train_in_process(mode: str, args) -> dict:
    """One mode in its own process (``--parallel``), on ``--threads`` threads."""
    torch.set_num_threads(args.threads)
    train_ids, val_ids, chars = load_text(args.data)
    return train(mode, args, train_ids, val_ids, len(chars))


def train(mode: str, args, train_ids, val_ids, vocab: int) -> dict:
    torch.manual_seed(args.seed)
    model = zoo.create_model(
        "adaptive_span_lm",
        vocab_size=vocab,
        n_layers=args.layers,
        d_model=args.d_model,
        n_heads=args.heads,
        d_ff=4 * args.d_model,
        dropout=0.0,
        attention={"mode": mode, "max_span": args.max_span, "ramp": args.ramp, "l1": args.l1},
    )
    if mode == "dynamic":  # remember the per-head mean span of the last step for the report
        for block in model.stack.blocks:
            block.attention.last_spans = []
    opt = adam(model, lr=args.lr, betas=(0.9, 0.98), eps=1e-9)
    sched = schedule(opt, "cosine", warmup=args.warmup, total=args.steps)
    data = streams(train_ids, args.batch)
    val = streams(val_ids[: args.eval_chars], args.batch)
    state = model.init_state(args.batch)
    position = 0
    wall, cpu, curve = [], [], []
    for step in range(1, args.steps + 1):
        if position + args.segment + 1 > data.shape[1]:  # next epoch: start the streams again
            position, state = 0, model.init_state(args.batch)
        tokens = data[:, position : position + args.segment]
        targets = data[:, position + 1 : position + args.segment + 1]
        position += args.segment
        t0, c0 = time.perf_counter(), time.process_time()
        out, _ = train_step(
            model, {"tokens": tokens, "targets": targets}, opt, scheduler=sched, clip=args.clip, state=state
        )
        state = out.state  # detached by train_step: the cache carries the text, not the graph
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        if mode == "dynamic":
            for i, block in enumerate(model.stack.blocks):
                block.attention.last_spans = [float(z) for z in out.stats[f"layer{i}/attn/span"]]
        if step % args.log_every == 0 or step == args.steps:
            spans = span_table(model)
            flat = [z for row in spans for z in row]
            reach = max(float(out.stats[f"layer{i}/attn/span_reach"]) for i in range(args.layers))
            point = dict(
                mode=mode,
                step=step,
                train_bpc=float(out.loss.detach()) / math.log(2),
                span_mean=statistics.mean(flat),
                span_max=max(flat),
                reach_max=reach,
                wall_ms=1e3 * statistics.median(wall[-args.log_every :]),
            )
            curve.append(point)
            print(json.dumps(point), flush=True)
    bpc = evaluate(model, val, args.segment)
    spans = span_table(model)
    return dict(
        mode=mode,
        val_bpc=bpc,
        wall_ms_per_step=1e3 * statistics.median(wall[args.warmup :] or wall),
        cpu_ms_per_step=1e3 * statistics.median(cpu[args.warmup :] or cpu),
        cpu_minutes=sum(cpu) / 60,
        params=sum(p.numel() for p in model.parameters()),
        spans=spans,
        curve=curve,
    )


def write(results: list[dict], args, command: str) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "summary.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(
            ["mode", "val_bpc", "wall_ms_per_step", "cpu_ms_per_step", "cpu_minutes", "params", "span_mean", "span_max"]
        )
        for r in results:
            flat = [z for row in r["spans"] for z in row]
            w.writerow(
                [
                    r["mode"],
                    f"{r['val_bpc']:.4f}",
                    f"{r['wall_ms_per_step']:.1f}",
                    f"{r['cpu_ms_per_step']:.1f}",
                    f"{r['cpu_minutes']:.2f}",
                    r["params"],
                    f"{statistics.mean(flat):.1f}",
                    f"{max(flat):.1f}",
                ]
            )
    with open(out / "spans.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["mode", "layer", "head", "span"])
        for r in results:
            for layer, row in enumerate(r["spans"]):
                for head, z in enumerate(row):
                    w.writerow([r["mode"], layer, head, f"{z:.2f}"])
    with open(out / "curves.csv", "w", newline="") as f:
        keys = list(results[0]["curve"][0])
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        for r in results:
            w.writerows(r["curve"])
    lines = [
        "# Adaptive attention span on tiny Shakespeare",
        "",
        f"Command: `{command}`",
        "",
        f"Scale: {args.layers} layers, d_model {args.d_model}, {args.heads} heads, FFN {4 * args.d_model}, max "
        f"span S = {args.max_span}, ramp R = {args.ramp}, "
        f"L1 {args.l1}, segments of {args.segment} chars x batch {args.batch}, {args.steps} Adam steps (lr "
        f"{args.lr}), 1 thread. "
        f"Validation: the first {args.eval_chars} chars of the last 10% of the text, read in {args.batch} streams "
        "with the cache carried.",
        "",
        "| mode | val bpc | ms/step (wall) | ms/step (CPU) | CPU min (train) | mean span | max span |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        flat = [z for row in r["spans"] for z in row]
        lines.append(
            f"| {r['mode']} | {r['val_bpc']:.3f} | {r['wall_ms_per_step']:.0f} | {r['cpu_ms_per_step']:.0f} | "
            f"{r['cpu_minutes']:.1f} | {statistics.mean(flat):.1f} | {max(flat):.1f} |"
        )
    for r in results:
        if r["mode"] == "fixed":
            continue
        lines += [
            "",
            f"Spans after training, mode {r['mode']} (tokens; rows = layers from the bottom, columns = heads):",
            "",
            "| layer | " + " | ".join(f"head {h}" for h in range(args.heads)) + " |",
            "|---" * (args.heads + 1) + "|",
        ]
        for layer, row in enumerate(r["spans"]):
            lines.append(f"| {layer} | " + " | ".join(f"{z:.0f}" for z in row) + " |")
    lines += [
        "",
        "Times are medians over the run on a shared 2-core machine (other jobs running): compare the modes' "
        "ratio, not the absolute values.",
        "",
    ]
    (out / "results.md").write_text("\n".join(lines))
    plot(results, args, out / "spans.png")
    print("\n".join(lines))


def plot(results: list[dict], args, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    learned = [r for r in results if r["mode"] != "fixed"]
    fig, axes = plt.subplots(1, 2 + len(learned) - 1 if learned else 1, figsize=(5 * (1 + max(1, len(learned))), 3.8))
    axes = list(axes) if hasattr(axes, "__len__") else [axes]
    for ax, r in zip(axes, learned):
        spans = torch.tensor(r["spans"])
        for head in range(spans.shape[1]):
            ax.bar(
                [layer + (head - (spans.shape[1] - 1) / 2) * 0.8 / spans.shape[1] for layer in range(spans.shape[0])],
                spans[:, head].tolist(),
                width=0.8 / spans.shape[1],
                label=f"head {head}",
            )
        ax.set_xlabel("layer")
        ax.set_ylabel("span (tokens)")
        ax.set_xticks(range(spans.shape[0]))
        ax.set_ylim(0, args.max_span)
        ax.set_title(f"{r['mode']} spans (S = {args.max_span}), bpc {r['val_bpc']:.3f}")
        ax.legend(fontsize=7)
    ax = axes[-1]
    for r in results:
        steps = [p["step"] for p in r["curve"]]
        ax.plot(steps, [p["train_bpc"] for p in r["curve"]], label=f"{r['mode']}: {r['wall_ms_per_step']:.0f} ms/step")
    ax.set_xlabel("step")
    ax.set_ylabel("train bpc (segment)")
    ax.set_title("training curves")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "data", nargs="?", default=DEFAULT_DATA, help=f"path of tiny Shakespeare's input.txt (default {DEFAULT_DATA})"
    )
    p.add_argument("--out", default="results/adaptive_span")
    p.add_argument("--modes", default="learned,fixed", help="comma-separated: learned, fixed, dynamic")
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--segment", type=int, default=64)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--max-span", type=int, default=256)
    p.add_argument("--ramp", type=int, default=32)
    p.add_argument("--l1", type=float, default=2e-6)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--clip", type=float, default=0.5)
    p.add_argument("--eval-chars", type=int, default=32768)
    p.add_argument("--log-every", type=int, default=50)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--parallel",
        action="store_true",
        help="train the modes side by side, one process each (each on --threads threads)",
    )
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    modes = [m.strip() for m in args.modes.split(",")]
    if args.parallel:
        import multiprocessing

        with multiprocessing.get_context("spawn").Pool(len(modes)) as pool:
            results = pool.starmap(train_in_process, [(mode, args) for mode in modes])
    else:
        train_ids, val_ids, chars = load_text(args.data)
        results = [train(mode, args, train_ids, val_ids, len(chars)) for mode in modes]
    write(results, args, "python experiments/adaptive_span.py " + " ".join(argv if argv is not None else sys.argv[1:]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
