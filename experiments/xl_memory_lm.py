"""Memory helps? Character-level LM on tiny Shakespeare: Transformer-XL with memory, without, and vanilla.

Dai et al. 2019 (arXiv:1901.02860) show that segment-level recurrence lowers perplexity/bpc at a
fixed segment length (Tables 6-7 ablations: recurrence and the relative encoding both matter).
Here, at one small scale and the same training budget (same steps, batch and segment length):

- ``transformer_xl`` with memory: state carried across consecutive segments in training and
  evaluation (mem_len = segment), and at evaluation also with a longer memory (``--eval-mem``);
- ``transformer_xl`` with memory off (mem_len = 0): each segment alone, relative positions only;
- ``vanilla_lm`` (absolute sinusoidal positions) on the same segments.

Data: the file at ``--data`` (default ../shared/data/tinyshakespeare/input.txt, relative to the
project root), read as bytes (vocab 256); first 90% train, last 10% evaluation. Training reads
``--batch`` contiguous streams, one segment of each per step (the reference code's ordering, so
consecutive steps see consecutive text and memory is meaningful). Evaluation: bits per character
on the first ``--eval-chars`` characters of the held-out split, read as 8 contiguous streams,
reported over all positions and over the first quarter of each segment (where memory helps most).

Scale-down: 2 layers, d 128, 4 heads, FFN 512, segment 64, batch 16, ``--steps`` Adam steps at
lr 1e-3 with warm-up, 1 thread: a few CPU-minutes per model, far below the paper's enwik8 models.

    python experiments/xl_memory_lm.py --out results/xl_memory_lm
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
import time
from pathlib import Path

import torch

import zoo
from zoo.train.steps import schedule, train_step


def load_bytes(path: Path) -> torch.Tensor:
    if not path.exists():
        raise SystemExit(f"data file not found: {path} (pass --data PATH to tiny Shakespeare's input.txt)")
    return torch.tensor(list(path.read_bytes()), dtype=torch.long)


def streams(data: torch.Tensor, n: int) -> torch.Tensor:
    """[n, len // n]: n contiguous streams."""
    per = data.numel() // n
    return data[: n * per].view(n, per)


def make_model(kind: str, args) -> torch.nn.Module:
    size = dict(
        vocab_size=256,
        d_model=args.d_model,
        n_layers=args.layers,
        n_heads=4,
        d_ff=4 * args.d_model,
        dropout=args.dropout,
    )
    if kind == "vanilla_lm":
        return zoo.create_model("vanilla_lm", **size, max_len=args.segment)
    mem = args.segment if kind == "xl_memory" else 0
    return zoo.create_model("transformer_xl", **size, attention={"mem_len": mem})


def train(kind: str, data: torch.Tensor, args, log) -> tuple[torch.nn.Module, list[float], float]:
    torch.manual_seed(args.seed)
    model = make_model(kind, args).train()
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    sched = schedule(opt, "cosine", warmup=args.steps // 20, total=args.steps)
    source = streams(data, args.batch)
    state, pos, losses = None, 0, []
    start = time.perf_counter()
    for _ in range(args.steps):
        if pos + args.segment + 1 > source.shape[1]:
            pos, state = 0, None
        chunk = source[:, pos : pos + args.segment + 1]
        pos += args.segment
        batch = {"tokens": chunk[:, :-1], "targets": chunk[:, 1:]}
        out, _ = train_step(model, batch, opt, scheduler=sched, clip=0.25, state=state)
        state = out.state if kind == "xl_memory" else None  # carried (detached) only with memory on
        losses.append(out.loss.item() / math.log(2))
    seconds = time.perf_counter() - start
    log(
        f"{kind}: trained {args.steps} steps in {seconds:.0f}s, last-50 train bpc "
        f"{sum(losses[-50:]) / len(losses[-50:]):.3f}"
    )
    return model, losses, seconds


@torch.no_grad()
def evaluate(model, kind: str, data: torch.Tensor, args, mem_len: int | None = None) -> tuple[float, float]:
    """(bpc over all positions, bpc over the first quarter of each segment)."""
    model.eval()
    if mem_len is not None:
        zoo.attention.xl_rel.set_eval_memory(model, mem_len)
    source = streams(data[: args.eval_chars + 8], 8)
    state = model.init_state(8) if kind == "xl_memory" else None
    total, early, n_total, n_early = 0.0, 0.0, 0, 0
    quarter = args.segment // 4
    for pos in range(0, source.shape[1] - 1, args.segment):
        chunk = source[:, pos : pos + args.segment + 1]
        if chunk.shape[1] < 2:
            break
        out = model(chunk[:, :-1], state=state) if state is not None else model(chunk[:, :-1])
        state = out.state if kind == "xl_memory" else None
        nll = torch.nn.functional.cross_entropy(out.logits.transpose(1, 2), chunk[:, 1:], reduction="none")  # [8, t]
        total += nll.sum().item()
        n_total += nll.numel()
        early += nll[:, :quarter].sum().item()
        n_early += nll[:, :quarter].numel()
    model.train()
    return total / n_total / math.log(2), early / n_early / math.log(2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="../shared/data/tinyshakespeare/input.txt")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--segment", type=int, default=64)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--dropout", type=float, default=0.0)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--eval-chars", type=int, default=32768)
    parser.add_argument(
        "--eval-mem",
        type=int,
        default=256,
        help="longer evaluation memory for the XL model trained with memory (0 = skip)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--models", default="xl_memory,xl_no_memory,vanilla_lm")
    parser.add_argument("--load", default="", help="comma-separated runs.json files to summarise instead of training")
    parser.add_argument("--out", default="results/xl_memory_lm")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if not args.load:
        data = load_bytes(Path(args.data))
        split = int(0.9 * data.numel())
        train_data, eval_data = data[:split], data[split:]
    command = "python " + " ".join(["experiments/xl_memory_lm.py", *(argv if argv is not None else sys.argv[1:])])
    commands = [command]
    lines: list[str] = []

    def log(text: str) -> None:
        print(text, flush=True)
        lines.append(text)

    rows, curves = [], {}
    if args.load:  # summarise runs made by earlier invocations (e.g. one process per model)
        for path in args.load.split(","):
            saved = json.loads(Path(path).read_text())
            rows += saved["rows"]
            curves.update(saved["curves"])
            lines += saved["log"]
            commands.insert(-1, saved["command"])
    for kind in [] if args.load else args.models.split(","):
        model, losses, seconds = train(kind, train_data, args, log)
        curves[kind] = losses
        bpc, bpc_early = evaluate(model, kind, eval_data, args)
        rows.append(
            dict(
                model=kind,
                eval_memory=args.segment if kind == "xl_memory" else 0,
                eval_bpc=bpc,
                eval_bpc_first_quarter=bpc_early,
                train_seconds=seconds,
            )
        )
        log(f"{kind}: eval bpc {bpc:.3f} (first quarter of segments {bpc_early:.3f})")
        if kind == "xl_memory" and args.eval_mem:
            bpc, bpc_early = evaluate(model, kind, eval_data, args, mem_len=args.eval_mem)
            rows.append(
                dict(
                    model=kind,
                    eval_memory=args.eval_mem,
                    eval_bpc=bpc,
                    eval_bpc_first_quarter=bpc_early,
                    train_seconds=seconds,
                )
            )
            log(f"{kind} with eval memory {args.eval_mem}: eval bpc {bpc:.3f} (first quarter {bpc_early:.3f})")
    if not args.load:
        (out / "runs.json").write_text(json.dumps(dict(rows=rows, curves=curves, log=lines, command=command)))
    with open(out / "results.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.5))
    window = 25
    for kind, losses in curves.items():
        smooth = [
            sum(losses[max(0, i - window + 1) : i + 1]) / len(losses[max(0, i - window + 1) : i + 1])
            for i in range(len(losses))
        ]
        ax.plot(smooth, label=kind)
    ax.set_xlabel("step")
    ax.set_ylabel(f"train bpc (moving mean of {window})")
    ax.set_ylim(top=min(4.5, ax.get_ylim()[1]))
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "train_curves.png", dpi=100)
    shown = "; ".join(f"`{c}`" for c in commands)
    md = [
        f"# Memory helps: tiny Shakespeare, bits per character\n\nCommand(s): {shown}  \n{args.layers} layers, d "
        f"{args.d_model}, 4 heads, FFN {4 * args.d_model}, segment {args.segment}, batch {args.batch} streams, "
        f"{args.steps} steps, lr {args.lr} (cosine), dropout {args.dropout}, seed {args.seed}, 1 thread. "
        f"Evaluation: first {args.eval_chars} held-out characters (last 10% of the file), 8 streams.\n"
    ]
    md.append(
        "| model | eval memory | eval bpc | bpc, first quarter of each segment | train seconds |\n|---|---|---|---|---|"
    )
    for r in rows:
        md.append(
            f"| {r['model']} | {r['eval_memory']} | {r['eval_bpc']:.3f} | {r['eval_bpc_first_quarter']:.3f} | "
            f"{r['train_seconds']:.0f} |"
        )
    md.append("\nLog:\n\n```\n" + "\n".join(lines) + "\n```\n")
    (out / "README.md").write_text("\n".join(md))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
