"""Zoo variants as sequence backbones on vectors: recall the input from k steps back, across segments.

The task is regression on random vectors: at step t the input is x_t ~ N(0, I) (``--features``
wide) and the target is x_{t-k}. The stream is read one segment of ``--segment`` steps per call,
as an agent or a streaming model reads it, so for k longer than a segment the answer lies in an
earlier call. Each variant is a backbone (``head="none"``) between two small linear maps of ours:
features -> d_model (``embeds=``) and ``out.hidden`` -> features. The state returned by one call is
fed to the next (stop-gradient memory, truncated back-propagation through one segment).

- ``transformer_xl`` and ``gtrxl`` carry a segment memory (``mem_len`` >= the largest k);
- ``vanilla_lm`` is called with ``state=None`` on every segment: no memory, so it can only solve
  the positions whose source lies inside the current segment.

Reported: mean squared error on held-out streams over positions t >= k (predicting zero scores 1.0),
split by where the source x_{t-k} lies: in the current segment or in an earlier one.

    python experiments/backbone_memory.py --out results/backbone_memory
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

import torch
from torch import Tensor, nn

import zoo
from zoo.models.base import ModelOutput
from zoo.stacks.build import attention_class
from zoo.train.steps import carries_memory, train_step

PRESETS = ("gtrxl", "transformer_xl", "vanilla_lm")


class Regressor(nn.Module):
    """features -> d_model -> zoo backbone -> features: what a user writes around a zoo model.

    Called like a zoo model (``ModelOutput``: the prediction as ``logits``, the mean squared error over
    the ``scored`` positions as ``loss`` when ``targets`` are given), so zoo.train.steps trains it."""

    def __init__(self, preset: str, features: int, args):
        super().__init__()
        overrides = dict(d_model=args.d_model, n_layers=args.layers, n_heads=args.heads, d_ff=2 * args.d_model)
        overrides["dropout"] = 0.0
        overrides["head"] = "none"  # a backbone: hidden states out, our own read-out
        with torch.device("meta"):  # shapes only: ask the parts whether they carry segment memory
            memory = carries_memory(zoo.create_model(preset, **overrides))
        option = attention_class(zoo.preset_config(preset).attention).memory_option  # xl_rel: mem_len
        if memory and option:  # enough of it for the largest delay
            overrides["attention"] = {option: args.mem_len}
        self.backbone = zoo.create_model(preset, **overrides)
        self.carries_state = carries_memory(self.backbone)  # the vanilla LM's KV cache is not memory
        self.read_in = nn.Linear(features, args.d_model)
        self.read_out = nn.Linear(args.d_model, features)

    def forward(self, x: Tensor, targets: Tensor | None = None, *, scored: Tensor | None = None, state=None):
        out = self.backbone(embeds=self.read_in(x), state=state if self.carries_state else None)
        prediction = self.read_out(out.hidden)
        loss = None if targets is None else ((prediction - targets) ** 2).mean(-1)[:, scored].mean()
        return ModelOutput(prediction, loss, state=out.state)


def stream(batch: int, length: int, features: int, k: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """x [b, length, f] ~ N(0, 1) and y[t] = x[t - k] (zero, and not scored, for t < k)."""
    x = torch.randn(batch, length, features, generator=generator)
    y = torch.zeros_like(x)
    y[:, k:] = x[:, :-k]
    return x, y


def run_stream(model: Regressor, x: Tensor, y: Tensor, k: int, segment: int, optimizer=None) -> dict[str, float]:
    """Feed the stream segment by segment, carrying the state; train if given an optimizer.

    Returns summed squared errors and counts for positions whose source is in the current
    segment ("in") and in an earlier one ("earlier")."""
    b = x.shape[0]
    state = model.backbone.init_state(b) if model.carries_state else None
    totals = {"in_sse": 0.0, "in_n": 0, "earlier_sse": 0.0, "earlier_n": 0}
    for start in range(0, x.shape[1], segment):
        xs, ys = x[:, start : start + segment], y[:, start : start + segment]
        t = torch.arange(start, start + xs.shape[1])
        scored = t >= k  # [s]: the target exists
        if optimizer is not None and bool(scored.any()):
            out, _ = train_step(model, {"x": xs, "targets": ys, "scored": scored}, optimizer, clip=0.0, state=state)
        else:
            out = model(xs, state=state)
        state = out.state
        if not bool(scored.any()):
            continue
        with torch.no_grad():
            error = ((out.logits - ys) ** 2).mean(-1)  # [b, s]
            source_inside = (t - k) >= start
            for part, mask in (("in", scored & source_inside), ("earlier", scored & ~source_inside)):
                totals[f"{part}_sse"] += float(error[:, mask].sum())
                totals[f"{part}_n"] += int(mask.sum()) * b
    return totals


def train_and_eval(preset: str, k: int, args) -> dict:
    torch.manual_seed(args.seed)
    model = Regressor(preset, args.features, args)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    g = torch.Generator().manual_seed(args.seed)
    length = args.segment * args.segments
    start = time.time()
    for _ in range(args.streams):
        x, y = stream(args.batch, length, args.features, k, g)
        run_stream(model, x, y, k, args.segment, optimizer)
    train_s = time.time() - start
    model.eval()
    g_eval = torch.Generator().manual_seed(10_000 + args.seed)
    with torch.no_grad():
        x, y = stream(args.eval_batch, length, args.features, k, g_eval)
        totals = run_stream(model, x, y, k, args.segment)
    n = totals["in_n"] + totals["earlier_n"]

    def mse(sse: float, count: int) -> str:
        return f"{sse / count:.3f}" if count else ""

    return {
        "preset": preset,
        "k": k,
        "delay": "within segment" if k < args.segment else "beyond segment",
        "mse": mse(totals["in_sse"] + totals["earlier_sse"], n),
        "mse_source_in_segment": mse(totals["in_sse"], totals["in_n"]),
        "mse_source_earlier_segment": mse(totals["earlier_sse"], totals["earlier_n"]),
        "share_source_earlier": f"{totals['earlier_n'] / n:.2f}",
        "train_s": f"{train_s:.0f}",
    }


def write_outputs(rows: list[dict], out: Path, args) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "results.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    header = list(rows[0])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(r[h]) for h in header) + " |" for r in rows]
    (out / "results.md").write_text("\n".join(lines) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    styles = [("o", "-"), ("s", "--"), ("^", ":"), ("D", "-.")]
    for (marker, line), preset in zip(styles * 4, dict.fromkeys(r["preset"] for r in rows)):
        mine = [r for r in rows if r["preset"] == preset]
        ks, errors = [int(r["k"]) for r in mine], [float(r["mse"]) for r in mine]
        ax.plot(ks, errors, marker=marker, linestyle=line, label=preset)
    ax.axvline(args.segment, color="grey", linestyle="--", linewidth=1)
    ax.text(args.segment, 1.02, f" segment = {args.segment}", color="grey", fontsize=8, va="bottom")
    ax.axhline(1.0, color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel("delay k (steps)")
    ax.set_ylabel("held-out MSE (predict 0 = 1.0)")
    ax.set_ylim(0, 1.15)
    ax.set_title(f"recall x[t-k], segment {args.segment}, mem_len {args.mem_len}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "mse_vs_delay.png", dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", nargs="+", default=list(PRESETS))
    parser.add_argument("--ks", type=int, nargs="+", default=[4, 12, 24, 40], help="delays, one model each")
    parser.add_argument("--segment", type=int, default=16, help="steps per call")
    parser.add_argument("--segments", type=int, default=6, help="segments per stream")
    parser.add_argument("--mem-len", type=int, default=48, help="XL memory per layer; must be >= the largest k")
    parser.add_argument("--features", type=int, default=4)
    parser.add_argument("--d-model", type=int, default=32)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--streams", type=int, default=200, help="training streams (one optimiser step per segment)")
    parser.add_argument("--eval-batch", type=int, default=256)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("results/backbone_memory"))
    parser.add_argument("--replot", action="store_true", help="redraw table and plot from --out/results.csv")
    args = parser.parse_args(argv)
    if args.replot:
        with open(args.out / "results.csv", newline="") as f:
            write_outputs(list(csv.DictReader(f)), args.out, args)
        return 0
    if max(args.ks) > args.mem_len:
        parser.error(f"--mem-len ({args.mem_len}) must be >= the largest delay in --ks ({max(args.ks)})")
    if min(args.ks) < 1:
        parser.error(f"--ks must be >= 1, got {min(args.ks)}")
    torch.set_num_threads(args.threads)
    rows = []
    for preset in args.presets:
        for k in args.ks:
            row = train_and_eval(preset, k, args)
            print(" ".join(f"{key}={value}" for key, value in row.items()), flush=True)
            rows.append(row)
    write_outputs(rows, args.out, args)
    print((args.out / "results.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
