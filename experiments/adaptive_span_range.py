"""Does adaptive span learn the range the data needs? Ours beside the authors' code, on a task whose range is known.

Claim (Sukhbaatar et al. 2019, arXiv:1905.07799, Figure 3 and the span tables): each head learns
its own span, long only where the data rewards it. Task (``zoo/data/copy_at_distance.py``):
Markov text over 16 letters in which every position copies the letter D = ``--distance`` back
with probability 0.5, so a head must see D - 1 tokens back to use the copies; a window shorter
than that can only learn the chain (oracle bpc for both is in the report).

Runs (each trains on the same text, same batch streams, same seed, same steps):

- ``ours-adaptive``: ``adaptive_span_lm`` with learned spans (max S = ``--max-span``, ramp R, L1) and,
  by default, the paper's learned relative key embeddings (``--positions relative``; ``sinusoidal``
  gives the absolute signal the preset used before, which never learned the copy here);
- ``ours-fixed``: the same model with every span fixed at S;
- ``ours-small``: fixed span ``--small-span`` (< D);
- ``ref-adaptive`` / ``ref-fixed``: the authors' ``TransformerSeq`` (facebookresearch/adaptive-span)
  imported from ``--ref`` and trained by their ``trainer.train_iteration`` on the files their
  ``data.py`` reads. Same sizes, span, ramp, L1, init, optimiser (Adam + our cosine schedule: the
  paper's Adagrad is not used, so the optimiser is not a difference between the two).

Each finished run appends its row to ``summary.csv`` and its span trajectory to ``spans.csv``;
a run whose row exists is skipped (resumable). ``--merge`` writes ``results.md`` and ``spans.png``.
Attention FLOPs per token are analytic (``attention_flops``): 6 d_head w per head and layer
(q . k, q . p and the sum over v, 2 FLOPs per multiply-add), w = keys with a non-zero mask
(the "paper" convention, per head); the "kernel" column is the window each code computes, one
per layer.

    python experiments/adaptive_span_range.py --ref ../ref/adaptive-span            # train (resumable)
    python experiments/adaptive_span_range.py --merge                               # report
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from pathlib import Path

import torch

import zoo
from zoo.app.csv_rows import append_rows, read_rows
from zoo.bench import import_checkout
from zoo.data import copy_at_distance
from zoo.train.steps import schedule, train_step

RUNS = ("ours-adaptive", "ours-fixed", "ours-small", "ref-adaptive", "ref-fixed")
SUMMARY = ["run", "val_bpc", "steps", "cpu_minutes", "span_mean", "span_max", "flops_paper", "flops_kernel", "spans"]


def task_options(args) -> dict:
    return dict(distance=args.distance, copy_prob=args.copy_prob, n_symbols=args.symbols, successors=3, chain_seed=0)


def prepare_data(args) -> dict[str, str]:
    """Write the splits once (the authors' format); read them back for ours."""
    folder = Path(args.data_dir)
    if not (folder / "test.txt").is_file():
        copy_at_distance.write_splits(
            folder, (args.train_chars, args.valid_chars, args.valid_chars), **task_options(args)
        )
    return {name: copy_at_distance.read_split(folder / f"{name}.txt") for name in ("train", "valid")}


def streams(text: str, chars: list[str], batch: int) -> torch.Tensor:
    """Text -> [batch, n // batch] ids: parallel streams read left to right (the paper's batching)."""
    index = {c: i for i, c in enumerate(chars)}
    ids = torch.tensor([index[c] for c in text], dtype=torch.long)
    n = ids.numel() // batch
    return ids[: n * batch].view(batch, n)


def attention_flops(spans: list[list[float]], args, run: str) -> tuple[float, float]:
    """Per-token attention FLOPs: 6 d_head w per head and layer (q . k, q . p and the weighted sum of
    v over w keys, 2 FLOPs per multiply-add). "paper": w per head, the keys with a non-zero mask,
    min(S, ceil(z + R) - 1) (a fixed run: its span). "kernel": what the code computes, one window per
    layer for every head: ours min(S, ceil(max z + R) - 1); the authors' trim the cache to
    S - 64 floor((S - min(S, ceil(max z) + R)) / 64) keys."""
    d_head = args.d_model // args.heads
    paper = kernel = 0.0
    for row in spans:
        if "adaptive" not in run:
            windows, longest = [round(z) for z in row], round(max(row))
        else:
            windows = [min(args.max_span, max(0, math.ceil(z + args.ramp) - 1)) for z in row]
            longest = max(windows)
            if run.startswith("ref"):
                shown = min(args.max_span, math.ceil(max(row)) + args.ramp)
                longest = args.max_span - 64 * ((args.max_span - shown) // 64)
        paper += sum(6 * d_head * w for w in windows)
        kernel += len(row) * 6 * d_head * longest
    return paper, kernel


def optimiser(params, args):
    opt = torch.optim.Adam(params, lr=args.lr, betas=(0.9, 0.98), eps=1e-9)
    return opt, schedule(opt, "cosine", warmup=args.warmup, total=args.steps)


# -- ours ----------------------------------------------------------------------------------------
def ours_spans(model) -> list[list[float]]:
    return [[float(z) for z in block.attention.spans(torch.zeros(1, 1, 1)).detach()] for block in model.stack.blocks]


@torch.no_grad()
def ours_bpc(model, data: torch.Tensor, segment: int) -> float:
    model.eval()
    state = model.init_state(data.shape[0])
    total = count = 0.0
    for start in range(0, data.shape[1] - 1, segment):
        end = min(start + segment, data.shape[1] - 1)
        out = model(data[:, start:end], data[:, start + 1 : end + 1], state=state)
        state = out.state
        total += float(out.loss) * (end - start)
        count += end - start
    model.train()
    return total / count / math.log(2)


def train_ours(run: str, args, texts, log) -> dict:
    chars = sorted(set(texts["train"]))
    data, val = streams(texts["train"], chars, args.batch), streams(texts["valid"], chars, args.batch)
    mode = {"ours-adaptive": "learned", "ours-fixed": "fixed", "ours-small": "fixed"}[run]
    span = args.small_span if run == "ours-small" else args.max_span
    torch.manual_seed(args.seed)
    model = zoo.create_model(
        "adaptive_span_lm",
        vocab_size=len(chars),
        n_layers=args.layers,
        d_model=args.d_model,
        n_heads=args.heads,
        d_ff=4 * args.d_model,
        dropout=0.0,
        attention={
            "mode": mode,
            "max_span": span,
            "ramp": args.ramp,
            "l1": args.l1,
            "span_init": args.span_init * span if mode == "learned" else 0.0,
            "relative_keys": args.positions == "relative",
        },
        **({"position": {"name": "none"}} if args.positions == "relative" else {}),
    )
    opt, sched = optimiser(model.parameters(), args)
    state, position, c0 = model.init_state(args.batch), 0, time.process_time()
    for step in range(1, args.steps + 1):
        if position + args.segment + 1 > data.shape[1]:
            position, state = 0, model.init_state(args.batch)
        batch = {
            "tokens": data[:, position : position + args.segment],
            "targets": data[:, position + 1 : position + args.segment + 1],
        }
        position += args.segment
        out, _ = train_step(model, batch, opt, scheduler=sched, clip=args.clip, state=state)
        state = out.state  # detached by train_step
        if step % args.log_every == 0 or step == args.steps:
            log(step, float(out.loss.detach()) / math.log(2), ours_spans(model))
    return dict(bpc=ours_bpc(model, val, args.segment), spans=ours_spans(model), cpu=time.process_time() - c0)


# -- the authors' code ---------------------------------------------------------------------------
def import_reference(path: str | None):
    """The authors' modules from a checkout of facebookresearch/adaptive-span, or a clear exit."""
    if not path or not (Path(path) / "adaptive_span.py").is_file():
        raise SystemExit(
            f"--ref {path!r}: not a checkout of facebookresearch/adaptive-span (no adaptive_span.py there); "
            "fetch it, pass its folder with --ref, or run only the ours-* runs (--runs ours-adaptive,ours-fixed,...)"
        )
    ref_data, ref_models, ref_trainer = import_checkout(path, "data", "models", "trainer")  # their top-level names
    return ref_data, ref_models, ref_trainer


class Wrapped(torch.nn.Module):
    """Their trainer reads ``model.module`` (they wrap in DataParallel, which needs CUDA)."""

    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)


def ref_spans(model, args) -> list[list[float]]:
    return [
        [float(z) * args.max_span for z in layer.attn.attn.adaptive_span._mask.current_val.detach().flatten()]
        for layer in model.module.layers
    ]


def train_ref(run: str, args, log) -> dict:
    ref_data, ref_models, ref_trainer = import_reference(args.ref)
    adaptive = run == "ref-adaptive"
    corpus = ref_data.Corpus(args.data_dir, False)  # their reader (get_train_val_test_data caches a pickle)
    train, val, _ = ref_data._get_train_val_test_data(corpus, args.batch)
    vocab = corpus.vocab_size
    torch.manual_seed(args.seed)
    model = Wrapped(
        ref_models.TransformerSeq(
            vocab_size=vocab,
            hidden_size=args.d_model,
            nb_heads=args.heads,
            nb_layers=args.layers,
            attn_span=args.max_span,
            emb_dropout=0.0,
            inner_hidden_size=4 * args.d_model,
            dropout=0.0,
            block_size=args.segment,
            adapt_io_params={"adapt_io_enabled": False},
            adapt_span_params={
                "adapt_span_enabled": adaptive,
                "adapt_span_loss": args.l1,
                "adapt_span_ramp": args.ramp,
                "adapt_span_init": args.span_init,
                "adapt_span_cache": False,
            },
            pers_mem_params={"pers_mem_size": 0},
        )
    )
    opt, sched = optimiser(model.parameters(), args)
    opt.grad_clip = args.clip  # their trainer clips the global norm when optimizer.grad_clip > 0
    cache = [torch.zeros(args.batch, args.max_span, args.d_model) for _ in range(args.layers)]
    position, step, c0 = 0, 0, time.process_time()
    spans = (
        (lambda: ref_spans(model, args)) if adaptive else (lambda: [[float(args.max_span)] * args.heads] * args.layers)
    )
    while step < args.steps:
        n = min(args.log_every, args.steps - step)
        loss, position, cache = ref_trainer.train_iteration(
            model, opt, sched, train, n, args.segment, False, position, cache, 1
        )
        step += n
        log(step, loss / math.log(2), spans())
    with torch.no_grad():
        bpc = ref_trainer.full_eval(model, opt, sched, val, args.segment, args.d_model) / math.log(2)
    return dict(bpc=bpc, spans=spans(), cpu=time.process_time() - c0)


# -- driver --------------------------------------------------------------------------------------
def run_one(run: str, args, texts) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    trajectory = []

    def log(step, bpc, spans):
        trajectory.append((step, bpc, spans))
        flat = [z for row in spans for z in row]
        print(
            f"{run} step {step} train bpc {bpc:.3f} spans mean {statistics.mean(flat):.1f} max {max(flat):.1f}",
            flush=True,
        )

    torch.set_num_threads(args.threads)
    result = train_ours(run, args, texts, log) if run.startswith("ours") else train_ref(run, args, log)
    flat = [z for row in result["spans"] for z in row]
    paper, kernel = attention_flops(result["spans"], args, run)
    span_rows = [
        dict(run=run, step=step, train_bpc=f"{bpc:.4f}", layer=layer, head=head, span=f"{z:.2f}")
        for step, bpc, spans in trajectory
        for layer, row in enumerate(spans)
        for head, z in enumerate(row)
    ]
    append_rows(out / "spans.csv", span_rows, ["run", "step", "train_bpc", "layer", "head", "span"])
    summary_row = dict(
        run=run,
        val_bpc=f"{result['bpc']:.4f}",
        steps=args.steps,
        cpu_minutes=f"{result['cpu'] / 60:.2f}",
        span_mean=f"{statistics.mean(flat):.1f}",
        span_max=f"{max(flat):.1f}",
        flops_paper=int(paper),
        flops_kernel=int(kernel),
        spans=" ".join(f"{z:.1f}" for z in flat),
    )
    append_rows(out / "summary.csv", [summary_row], SUMMARY)
    print(f"{run}: val bpc {result['bpc']:.4f}, spans {[[round(z) for z in r] for r in result['spans']]}", flush=True)


def merge(args) -> None:
    out = Path(args.out)
    summary = read_rows(out / "summary.csv")
    if not summary:
        raise SystemExit(f"nothing to merge: no {out / 'summary.csv'} (train first)")
    texts = {"valid": copy_at_distance.read_split(Path(args.data_dir) / "valid.txt")}
    oracle = copy_at_distance.oracle_bits(texts["valid"], **task_options(args))
    lines = [
        "| run | val bpc | attention FLOPs/token (paper) | (kernel) | mean span per layer | spans per layer (heads) |",
        "|---|---|---|---|---|---|",
    ]
    for r in summary:
        flat = [float(z) for z in r["spans"].split()]
        rows_of_heads = [flat[i : i + args.heads] for i in range(0, len(flat), args.heads)]
        paper, kernel = attention_flops(rows_of_heads, args, r["run"])  # recomputed: one convention for all rows
        per_layer = " / ".join(
            " ".join(f"{z:.0f}" for z in flat[i : i + args.heads]) for i in range(0, len(flat), args.heads)
        )
        lines.append(
            f"| {r['run']} | {float(r['val_bpc']):.3f} | {int(paper):,} | "
            f"{int(kernel):,} | {' / '.join(f'{sum(h) / len(h):.0f}' for h in rows_of_heads)} | {per_layer} |"
        )
    lines += [
        "",
        f"Oracle on the validation text: {oracle['full']:.3f} bpc with the whole past, "
        f"~{oracle['short']:.3f} bpc without the copies (window < D).",
    ]
    (out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    plot(read_rows(out / "spans.csv"), args, out / "spans.png")


def plot(spans: list[dict], args, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [r for r in dict.fromkeys(row["run"] for row in spans) if "adaptive" in r]
    if not runs:
        return
    fig, axes = plt.subplots(1, len(runs), figsize=(5.5 * len(runs), 3.8), squeeze=False)
    for ax, run in zip(axes[0], runs):
        mine = [row for row in spans if row["run"] == run]
        for layer in sorted({int(row["layer"]) for row in mine}):
            for head in sorted({int(row["head"]) for row in mine}):
                points = [
                    (int(r["step"]), float(r["span"]))
                    for r in mine
                    if int(r["layer"]) == layer and int(r["head"]) == head
                ]
                ax.plot(*zip(*points), color=f"C{layer}", alpha=0.8, label=f"layer {layer}" if head == 0 else None)
        ax.axhline(args.distance - 1, color="k", ls="--", lw=0.8, label=f"needed: D - 1 = {args.distance - 1}")
        ax.set_ylim(0, args.max_span)
        ax.set_xlabel("step")
        ax.set_ylabel("span z (tokens)")
        ax.set_title(f"{run}: span of every head")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="results/adaptive_span_range")
    p.add_argument("--data-dir", default="runs/copy_at_distance", help="where the splits are written (git-ignored)")
    p.add_argument("--ref", default=None, help="folder of a facebookresearch/adaptive-span checkout (ref-* runs)")
    p.add_argument("--runs", default=",".join(RUNS), help=f"comma-separated, from {', '.join(RUNS)}")
    p.add_argument("--merge", action="store_true", help="only write results.md and spans.png from the CSVs")
    p.add_argument("--distance", type=int, default=200)
    p.add_argument("--copy-prob", type=float, default=0.5)
    p.add_argument("--symbols", type=int, default=16)
    p.add_argument("--train-chars", type=int, default=400_000)
    p.add_argument("--valid-chars", type=int, default=16_384)
    p.add_argument("--steps", type=int, default=1500)
    p.add_argument("--segment", type=int, default=64)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--max-span", type=int, default=256)
    p.add_argument("--small-span", type=int, default=64)
    p.add_argument("--ramp", type=int, default=32)
    p.add_argument("--l1", type=float, default=2e-6)
    p.add_argument("--span-init", type=float, default=0.0, help="initial span as a fraction of S (paper: 0)")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--clip", type=float, default=0.5)
    p.add_argument("--log-every", type=int, default=50)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--positions",
        choices=("relative", "sinusoidal"),
        default="relative",
        help="ours: the paper's learned relative key embeddings (no absolute signal), or absolute sinusoids",
    )
    args = p.parse_args(argv)
    if args.merge:
        merge(args)
        return 0
    runs = [r.strip() for r in args.runs.split(",") if r.strip()]
    unknown = [r for r in runs if r not in RUNS]
    if unknown:
        raise SystemExit(f"--runs: unknown {', '.join(unknown)}; allowed: {', '.join(RUNS)}")
    if any(r.startswith("ref") for r in runs):
        import_reference(args.ref)  # fail before training anything
    texts = prepare_data(args)
    done = {r["run"] for r in read_rows(Path(args.out) / "summary.csv")}
    for run in runs:
        if run in done:
            print(f"{run}: already in {args.out}/summary.csv, skipped", flush=True)
            continue
        run_one(run, args, texts)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
