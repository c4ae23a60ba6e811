"""Reformer duplication task (Kitaev et al. 2020, arXiv:2001.04451, Table 2): ours beside reformer-pytorch.

Sequences ``0 w 0 w``; the loss and the accuracy count the second copy of ``w`` only. A 1-layer
shared-QK model is trained with full attention or LSH at 1, 2 or 4 hashes, then evaluated with
full attention and LSH at 1, 2, 4 and 8 hashes. Implementations (``--impl``):

- ``ours-window`` / ``ours-chunk``: zoo's ``lsh`` with ``look_back="window"`` (strictly causal:
  the chunk_size most recent same-bucket items) or ``"chunk"`` (the paper's own + previous chunk,
  same bucket); full = zoo's ``shared_qk``. Plain pre-norm stack, learned positions, output layer
  untied as in the paper's trax model and the peer (``--tie-embeddings`` ties it, zoo's default).
- ``ours-across``: zoo's ``lsh`` with ``attend_across_buckets=True`` (a query sees every earlier
  key of its own + previous sorted chunk, whatever its bucket), the peer's default.
- ``peer``: reformer-pytorch's ``ReformerLM`` (``pip install reformer-pytorch``; run from the
  installed package, nothing of it is copied here), 1 layer, same width, heads, head size, chunk
  (its ``bucket_size``), learned absolute positions, d_ff = d_model, its defaults otherwise
  (attend across buckets, rotations shared by the heads and redrawn at every call, no QK/V
  bias, GELU). Evaluated by setting ``n_hashes`` / ``use_full_attn`` on its attention modules.
  ``peer-in-bucket`` is the same limited to same-bucket keys (its ``_attend_across_buckets``).

Both sides see the same batches (same generator seed), the same optimiser (Adam, gradient clip
1.0) and the same steps. One CSV row per (impl, train, seed, eval) is appended as each model
ends, and runs whose rows exist are skipped, so a cut-short sweep resumes. ``--merge`` writes
the table (mean and min..max over seeds, beside the paper's figures), steps to 90% and plots.

    python experiments/reformer_table2.py --impl ours-window,peer --train lsh4 --seeds 0 --out runs/t2
    python experiments/reformer_table2.py --merge --out runs/t2
"""

from __future__ import annotations

import argparse
import csv
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from zoo.app.csv_rows import append_rows, read_rows
from zoo.data.synthetic import duplication_batch
from zoo.models.base import ModelOutput
from zoo.models.losses import token_loss
from zoo.presets.reformer import duplication_model
from zoo.studies.reformer_duplication import accuracy
from zoo.train.steps import train_step

PAPER = {  # Table 2: rows = attention in training, columns = attention in evaluation (length 1024, 150K steps)
    "full": {"full": 100.0, "lsh8": 94.8, "lsh4": 92.5, "lsh2": 76.9, "lsh1": 52.5},
    "lsh4": {"full": 0.8, "lsh8": 100.0, "lsh4": 99.9, "lsh2": 99.4, "lsh1": 91.9},
    "lsh2": {"full": 0.8, "lsh8": 100.0, "lsh4": 99.9, "lsh2": 98.1, "lsh1": 86.8},
    "lsh1": {"full": 0.8, "lsh8": 99.9, "lsh4": 99.6, "lsh2": 94.8, "lsh1": 77.9},
}
EVALS = ["full", "lsh8", "lsh4", "lsh2", "lsh1"]
TRAINS = ["full", "lsh4", "lsh2", "lsh1"]
OURS = {
    "ours-window": {"look_back": "window"},
    "ours-chunk": {"look_back": "chunk"},
    "ours-across": {"attend_across_buckets": True},
}
PEERS = {"peer": True, "peer-in-bucket": False}  # value: attend across buckets
IMPLS = [*OURS, *PEERS]
RESULT_FIELDS = ["impl", "train", "seed", "steps", "eval", "accuracy_percent"]
CURVE_FIELDS = ["impl", "train", "seed", "step", "loss", "accuracy_own_percent"]


def hashes(mode: str) -> int:
    return int(mode[3:])


# -- ours ------------------------------------------------------------------------------------
def build_ours(impl: str, mode: str, args: argparse.Namespace) -> torch.nn.Module:
    return duplication_model(
        mode,
        n_symbols=args.n_symbols,
        length=args.length,
        d_model=args.d_model,
        n_heads=args.heads,
        chunk=args.chunk,
        tie_embeddings=args.tie_embeddings,
        **OURS[impl],
    )


# -- the peer (reformer-pytorch) -----------------------------------------------------------------
def peer_module():
    try:
        import reformer_pytorch
    except ImportError:
        return None
    return reformer_pytorch


def build_peer(impl: str, mode: str, args: argparse.Namespace) -> torch.nn.Module:
    reformer_pytorch = peer_module()
    if reformer_pytorch is None:
        raise SystemExit(
            f"--impl {impl} needs reformer-pytorch (pip install reformer-pytorch); the ours-* impls run without it"
        )
    model = reformer_pytorch.ReformerLM(
        num_tokens=args.n_symbols + 1,
        dim=args.d_model,
        depth=1,
        max_seq_len=args.length,
        heads=args.heads,
        dim_head=args.d_model // args.heads,
        bucket_size=args.chunk,
        n_hashes=4 if mode == "full" else hashes(mode),
        use_full_attn=mode == "full",
        causal=True,
        ff_mult=1,
        ff_chunks=1,
        absolute_position_emb=True,
        reverse_thres=args.length + 1,  # one layer: the plain (non-recomputing) path of the same blocks
    )
    for module in model.modules():  # ReformerLM does not pass lsh_attend_across_buckets on to its layers
        if isinstance(module, reformer_pytorch.reformer_pytorch.LSHAttention):
            module._attend_across_buckets = PEERS[impl]
    return model


def set_peer_attention(model: torch.nn.Module, mode: str) -> None:
    """Switch every LSHSelfAttention of a trained peer to ``mode`` (same weights)."""
    for module in model.modules():
        if hasattr(module, "use_full_attn") and hasattr(module, "lsh_attn"):
            module.use_full_attn = mode == "full"
            if mode != "full":
                module.lsh_attn.n_hashes = hashes(mode)


class PeerLM(torch.nn.Module):
    """The peer called like our models: ``(tokens, targets) -> ModelOutput``, scored by the loss our
    models use (zoo.models.losses), so both train through zoo.train.steps alike.

    The peer needs a length divisible by 2 x bucket_size: zero tokens are appended at the end
    (causal, so no earlier output reads them) and their logits are dropped."""

    def __init__(self, peer: torch.nn.Module, multiple: int):
        super().__init__()
        self.peer, self.multiple = peer, multiple

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor | None = None) -> ModelOutput:
        t = tokens.shape[1]
        logits = self.peer(F.pad(tokens, (0, -t % self.multiple)))[:, :t]
        return ModelOutput(logits, None if targets is None else token_loss(logits, targets, None, 0.0)[0])


# -- one implementation behind one interface --------------------------------------------------------
class Runner:
    def __init__(self, impl: str, args: argparse.Namespace):
        if impl not in IMPLS:
            raise SystemExit(f"--impl: unknown {impl!r}; allowed: {', '.join(IMPLS)}")
        self.impl, self.args, self.is_peer = impl, args, impl in PEERS

    def build(self, mode: str) -> torch.nn.Module:
        """A model called as ``model(tokens, targets) -> ModelOutput``, ours or the peer's."""
        if self.is_peer:
            return PeerLM(build_peer(self.impl, mode, self.args), 2 * self.args.chunk)
        return build_ours(self.impl, mode, self.args)

    def evaluator(self, model: torch.nn.Module, mode: str, steps: int) -> torch.nn.Module:
        """The trained weights with attention ``mode``."""
        if self.is_peer:
            set_peer_attention(model, mode)
            return model
        evaluator = self.build(mode)
        mismatched = evaluator.load_state_dict(model.state_dict(), strict=False)  # only LSH's hash step may differ
        assert all(k.endswith("hash_step") for k in mismatched.missing_keys + mismatched.unexpected_keys), mismatched
        for module in evaluator.modules():  # evaluate with the rotations of the last training step
            if hasattr(module, "hash_step"):
                module.hash_step.fill_(steps)
        return evaluator


def train_one(runner: Runner, mode: str, seed: int, args: argparse.Namespace, eval_batches: list[dict], out: Path):
    torch.manual_seed(seed)  # initial weights; the peer also draws its rotations from this stream
    model = runner.build(mode)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    g = torch.Generator().manual_seed(seed)  # the same batches for every impl and mode
    curve = []
    start, step = time.time(), 0
    for step in range(1, args.steps + 1):
        batch = duplication_batch(args.batch, args.length, n_symbols=args.n_symbols, generator=g)
        # the post-step hook gives ours fresh rotations for the next step (the peer redraws per call)
        _, loss = train_step(model, batch, optimizer, clip=1.0)
        if step % args.log_every == 0 or step == args.steps:
            acc = accuracy(model, eval_batches[: args.log_batches])
            curve.append(
                dict(
                    impl=runner.impl,
                    train=mode,
                    seed=seed,
                    step=step,
                    loss=round(loss.item(), 4),
                    accuracy_own_percent=round(acc, 2),
                )
            )
            print(
                f"{runner.impl:>14} {mode:>4} seed {seed} step {step:5d} loss {loss.item():.4f} acc {acc:6.2f}% "
                f"({time.time() - start:.0f} s)",
                flush=True,
            )
            if args.stop_at and acc >= args.stop_at:
                break
    rows = []
    for evaluation in EVALS:
        acc = accuracy(runner.evaluator(model, evaluation, step), eval_batches)
        rows.append(
            dict(impl=runner.impl, train=mode, seed=seed, steps=step, eval=evaluation, accuracy_percent=round(acc, 2))
        )
    print(runner.impl, mode, seed, {r["eval"]: r["accuracy_percent"] for r in rows}, flush=True)
    append_rows(out / "curves.csv", curve, CURVE_FIELDS)
    append_rows(out / "results.csv", rows, RESULT_FIELDS)  # last: its rows mark the run done


def parse_list(text: str, allowed: list[str], flag: str) -> list[str]:
    items = [item for item in text.split(",") if item]
    bad = [item for item in items if item not in allowed]
    if bad:
        raise SystemExit(f"{flag}: unknown {bad}; allowed: {', '.join(allowed)}")
    return items


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--impl", default="ours-window,peer", help=f"comma-separated, of: {', '.join(IMPLS)}")
    parser.add_argument("--train", default=",".join(TRAINS), help="comma-separated, of: full,lsh4,lsh2,lsh1")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--length", type=int, default=32, help="sequence length (the model reads length - 1)")
    parser.add_argument("--n-symbols", type=int, default=127)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--chunk", type=int, default=4, help="our chunk_size = the peer's bucket_size")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=1000, help="step cap, the same for every run")
    parser.add_argument(
        "--stop-at",
        type=float,
        default=0.0,
        help="end a run early once its accuracy (own attention, logged eval) reaches this; 0 = never",
    )
    parser.add_argument("--lr", type=float, default=5e-3)
    parser.add_argument(
        "--tie-embeddings",
        action="store_true",
        help="ours: tie the output projection to the token embedding (zoo's default; the paper's "
        "trax model and the peer do not tie)",
    )
    parser.add_argument("--eval-sequences", type=int, default=256)
    parser.add_argument("--log-every", type=int, default=100)
    parser.add_argument("--log-batches", type=int, default=1, help="eval batches (of 64) for the logged curve")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default="results/reformer_table2")
    parser.add_argument("--merge", action="store_true", help="write the table, steps to 90%% and plots of --out")
    args = parser.parse_args(argv)
    out = Path(args.out)
    if args.merge:
        merge(out)
        return
    impls = parse_list(args.impl, IMPLS, "--impl")
    if any(impl in PEERS for impl in impls) and peer_module() is None:
        print("reformer-pytorch is not installed (pip install reformer-pytorch): running ours only", flush=True)
        impls = [impl for impl in impls if impl not in PEERS]
    modes = parse_list(args.train, TRAINS, "--train")
    seeds = [int(s) for s in args.seeds.split(",")]
    torch.set_num_threads(args.threads)
    out.mkdir(parents=True, exist_ok=True)
    g_eval = torch.Generator().manual_seed(10_000)
    eval_batches = [
        duplication_batch(64, args.length, n_symbols=args.n_symbols, generator=g_eval)
        for _ in range(max(1, args.eval_sequences // 64))
    ]
    done = {(r["impl"], r["train"], r["seed"]) for r in read_rows(out / "results.csv")}
    for seed in seeds:  # seeds outermost: a cut-short sweep still has every cell at seed 0
        for mode in modes:
            for impl in impls:
                if (impl, mode, str(seed)) in done:
                    print(f"skip {impl} {mode} seed {seed}: in {out / 'results.csv'}", flush=True)
                    continue
                train_one(Runner(impl, args), mode, seed, args, eval_batches, out)


# -- report --------------------------------------------------------------------------------------
def summarise(rows: list[dict]) -> dict[tuple[str, str, str], tuple[float, float, float, int]]:
    """(impl, train, eval) -> (mean, min, max, n seeds) of the accuracy."""
    cells: dict[tuple[str, str, str], list[float]] = {}
    for r in rows:
        cells.setdefault((r["impl"], r["train"], r["eval"]), []).append(float(r["accuracy_percent"]))
    return {key: (sum(v) / len(v), min(v), max(v), len(v)) for key, v in cells.items()}


def merge(out: Path) -> None:
    rows = read_rows(out / "results.csv")
    if not rows:
        raise SystemExit(f"--merge: no rows in {out / 'results.csv'}")
    table = summarise(rows)
    impls = [i for i in IMPLS if any(k[0] == i for k in table)]
    names = {"full": "full", "lsh8": "LSH-8", "lsh4": "LSH-4", "lsh2": "LSH-2", "lsh1": "LSH-1"}
    lines = ["| train | impl | " + " | ".join(names[e] for e in EVALS) + " |", "|---|---|" + "---|" * len(EVALS)]
    with open(out / "table2.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["train", "impl", "eval", "mean_percent", "min_percent", "max_percent", "seeds"])
        for mode in [m for m in TRAINS if any(k[1] == m for k in table)]:
            for impl in impls:
                if (impl, mode, "full") not in table:
                    continue
                cells = []
                for e in EVALS:
                    mean, low, high, n = table[(impl, mode, e)]
                    writer.writerow([mode, impl, e, f"{mean:.2f}", f"{low:.2f}", f"{high:.2f}", n])
                    cells.append(f"{mean:.1f} ({low:.1f}-{high:.1f})" if n > 1 else f"{mean:.1f}")
                lines.append(f"| {names[mode]} | {impl} (n={n}) | " + " | ".join(cells) + " |")
            lines.append(f"| {names[mode]} | paper | " + " | ".join(f"{PAPER[mode][e]}" for e in EVALS) + " |")
    curves = read_rows(out / "curves.csv")
    lines += ["", *steps_to(curves, impls, 90.0)]
    (out / "table2.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    plot(out, table, impls, curves)


def steps_to(curves: list[dict], impls: list[str], level: float) -> list[str]:
    """Markdown table: first logged step at which each run's accuracy (own attention) reached ``level``."""
    first: dict[tuple[str, str], list[str]] = {}
    for impl in impls:
        for mode in TRAINS:
            runs = sorted({c["seed"] for c in curves if c["impl"] == impl and c["train"] == mode})
            for seed in runs:
                reached = [
                    int(c["step"])
                    for c in curves
                    if (c["impl"], c["train"], c["seed"]) == (impl, mode, seed)
                    and float(c["accuracy_own_percent"]) >= level
                ]
                first.setdefault((impl, mode), []).append(str(min(reached)) if reached else "never")
    modes = [m for m in TRAINS if any(k[1] == m for k in first)]
    lines = [
        f"First logged step at {level:.0f}% (trained and evaluated with the same attention; one entry per seed)",
        "",
        "| impl | " + " | ".join(modes) + " |",
        "|---|" + "---|" * len(modes),
    ]
    for impl in impls:
        lines.append(f"| {impl} | " + " | ".join(", ".join(first.get((impl, m), ["-"])) for m in modes) + " |")
    return lines


def plot(out: Path, table: dict, impls: list[str], curves: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [*impls, "paper"]
    fig, axes = plt.subplots(1, len(panels), figsize=(3.2 * len(panels), 3.0))
    for ax, impl in zip(axes, panels):
        rows = [m for m in TRAINS if impl == "paper" or (impl, m, "full") in table]
        data = [[PAPER[m][e] if impl == "paper" else table[(impl, m, e)][0] for e in EVALS] for m in rows]
        ax.imshow(data, vmin=0, vmax=100, cmap="viridis", aspect="auto")
        ax.set_xticks(range(len(EVALS)), EVALS, fontsize=7)
        ax.set_yticks(range(len(rows)), rows, fontsize=7)
        for i, row in enumerate(data):
            for j, value in enumerate(row):
                ax.text(j, i, f"{value:.0f}", ha="center", va="center", color="w" if value < 60 else "k", fontsize=7)
        ax.set_title(impl, fontsize=9)
    axes[0].set_ylabel("trained with")
    fig.tight_layout()
    fig.savefig(out / "table2.png", dpi=80)
    plt.close(fig)

    if not curves:
        return
    modes = [m for m in TRAINS if any(c["train"] == m for c in curves)]
    fig, axes = plt.subplots(1, len(modes), figsize=(3.4 * len(modes), 3.0), sharey=True, squeeze=False)
    colours = dict(zip(IMPLS, ["C0", "C2", "C4", "C1", "C3"]))
    for ax, mode in zip(axes[0], modes):
        for impl in impls:
            for seed in sorted({c["seed"] for c in curves if c["impl"] == impl and c["train"] == mode}):
                points = [
                    (int(c["step"]), float(c["accuracy_own_percent"]))
                    for c in curves
                    if c["impl"] == impl and c["train"] == mode and c["seed"] == seed
                ]
                ax.plot(*zip(*points), color=colours[impl], lw=1, alpha=0.8, label=impl if seed == "0" else None)
        ax.axhline(90, color="grey", lw=0.5, ls="--")
        ax.set_title(f"trained and evaluated with {mode}", fontsize=9)
        ax.set_xlabel("step")
    axes[0][0].set_ylabel("held-out accuracy (%)")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "curves.png", dpi=80)
    plt.close(fig)


if __name__ == "__main__":
    main()
