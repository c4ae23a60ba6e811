"""GTrXL robustness over the learning rate: TrXL vs TrXL-I vs GTrXL (b_g = 2, 0), ours beside DI-engine's.

Paper: "Stabilizing Transformers for Reinforcement Learning", Parisotto et al. 2019, arXiv:1910.06764.
Their robustness claim (the hyperparameter-sensitivity analysis of their RL experiments) is that over
many hyperparameter settings (learning rate, head/width choices, seeds) GTrXL learns the memory tasks in
more of them, and less variably, than TrXL-I, with TrXL (post-norm) failing in most. Their evidence is RL
returns; ours is the supervised stand-in ``zoo.data.delayed_recall``: a cue in segment 0, asked for at the
end of every segment, the stream read one segment per call with the XL memory carried (stop-gradient),
so the answer at delay d lies d segments back and is reachable only through d hops of memory.

Sweep: learning rates x seeds x variants, each run a fixed cap of Adam steps (constant lr, clip 1.0).
A run is *solved* when the recall accuracy at the longest delay is >= ``--threshold`` at two consecutive
evaluations; steps-to-solve is the first of the two, and the run stops there (that saves the CPU for the
runs that do not solve). Variants:

- ours: ``transformer_xl`` (post-norm), ``trxl_i``, ``gtrxl`` with ``gate_bias`` 2 and 0
  (``residual={"name": "gru_gate", "gate_bias": ...}``, the same key as ``residual.gate_bias=`` in Hydra);
- reference: DI-engine's ``GTrXL`` (``ding/torch_utils/network/gtrxl.py``), run from a directory outside
  the project given by ``--ref-path`` (or ``$GTRXL_REF``): ``gru_gating=False`` (its TrXL-I) and
  ``gru_bias`` 2 and 0. It has no post-norm variant. We give it the same token embedding, a final
  LayerNorm and the same LM head as ours (it maps embeddings to hidden states; the task head is ours).

``--check-gate`` compares our GRU gate with DI-engine's ``GRUGatingUnit`` on random inputs with the same
weights (max |difference|, 0 when the formulas agree).

Outputs (appended as each run ends, so a killed sweep resumes where it stopped): ``runs.csv`` (one row per
run), ``curves.csv`` (one row per evaluation). ``--merge`` writes ``table.md`` and ``curves.png``.

    python experiments/gtrxl_robustness.py --out results/gtrxl_robustness --ref-path <dir with ding/>
    python experiments/gtrxl_robustness.py --out results/gtrxl_robustness --merge
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

import zoo
from zoo.app.csv_rows import append_rows, read_rows
from zoo.bench import import_checkout
from zoo.data.delayed_recall import delayed_recall_batch, vocab_size
from zoo.models.base import ModelOutput
from zoo.models.losses import token_loss
from zoo.residual.gtrxl import GRUGate
from zoo.train.steps import TrainingDiverged, forward_backward, optimizer_step

# variant -> (implementation, preset or reference switch, gate bias)
VARIANTS = {
    "TrXL": ("ours", "transformer_xl", None),
    "TrXL-I": ("ours", "trxl_i", None),
    "GTrXL b_g=2": ("ours", "gtrxl", 2.0),
    "GTrXL b_g=0": ("ours", "gtrxl", 0.0),
    "ref TrXL-I": ("ref", "no_gate", None),
    "ref GTrXL b_g=2": ("ref", "gate", 2.0),
    "ref GTrXL b_g=0": ("ref", "gate", 0.0),
}
RUN_FIELDS = ["variant", "lr", "seed", "solved", "steps_to_solve", "steps_run", "final_acc", "final_loss", "seconds"]
REF_MODULE = "ding.torch_utils.network.gtrxl"


def import_reference(path: str):
    """DI-engine's gtrxl module from ``path`` (a directory holding ``ding/``), or None with a reason."""
    if not path:
        return None, "no --ref-path / $GTRXL_REF given"
    if not (Path(path) / "ding" / "torch_utils" / "network" / "gtrxl.py").is_file():
        return None, f"--ref-path {path!r} has no ding/torch_utils/network/gtrxl.py"
    try:
        return import_checkout(path, REF_MODULE)[0], ""
    except ImportError as error:
        return None, f"importing {REF_MODULE} from {path!r} failed: {error}"


class Ours(nn.Module):
    """A zoo preset behind the stream interface: reset(batch), then one call per segment,
    ``(tokens, targets) -> ModelOutput`` (logits [b, t, vocab], the model's own loss), the memory carried."""

    def __init__(self, preset: str, gate_bias: float | None, args, vocab: int):
        super().__init__()
        overrides = {} if gate_bias is None else {"residual": {"name": "gru_gate", "gate_bias": gate_bias}}
        self.model = zoo.create_model(
            preset,
            vocab_size=vocab,
            d_model=args.d_model,
            n_layers=args.layers,
            n_heads=args.heads,
            d_ff=args.d_ff,
            dropout=0.0,
            attention={"mem_len": args.segment_len},
            **overrides,
        )
        self.state = None

    def reset(self, batch: int) -> None:
        self.state = self.model.init_state(batch)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor | None = None) -> ModelOutput:
        out = self.model(tokens, targets, state=self.state)
        self.state = out.state
        return out


class Reference(nn.Module):
    """DI-engine's GTrXL between our token embedding and a LayerNorm + LM head (the task's input/output)."""

    def __init__(self, ref, gated: bool, gate_bias: float | None, args, vocab: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, args.d_model)
        self.core = ref.GTrXL(
            input_dim=args.d_model,
            head_dim=args.d_model // args.heads,
            embedding_dim=args.d_model,
            head_num=args.heads,
            layer_num=args.layers,
            memory_len=args.segment_len,
            gru_gating=gated,
            gru_bias=2.0 if gate_bias is None else gate_bias,
            use_embedding_layer=False,
        )
        self.norm = nn.LayerNorm(args.d_model)
        self.head = nn.Linear(args.d_model, vocab)

    def reset(self, batch: int) -> None:
        self.core.reset_memory(batch)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor | None = None) -> ModelOutput:
        """The same interface as :class:`Ours`, scored by the loss our models use (zoo.models.losses)."""
        hidden = self.core(self.embed(tokens), batch_first=True, return_mem=False)["logit"]
        logits = self.head(self.norm(hidden))
        return ModelOutput(logits, None if targets is None else token_loss(logits, targets, None, 0.0)[0])


def build(variant: str, args, vocab: int, ref) -> nn.Module:
    impl, which, gate_bias = VARIANTS[variant]
    if impl == "ours":
        return Ours(which, gate_bias, args, vocab)
    return Reference(ref, which == "gate", gate_bias, args, vocab)


def check_gate(ref, d_model: int = 16) -> float:
    """max |ours - DI-engine's| of the GRU gate g(x, y) with our weights copied into theirs."""
    torch.manual_seed(0)
    ours, theirs = GRUGate(d_model, gate_bias=2.0), ref.GRUGatingUnit(d_model, 2.0)
    w_r, w_z, w_g = ours.from_y.weight.chunk(3)
    u_r, u_z = ours.from_x.weight.chunk(2)
    pairs = [(theirs.Wr, w_r), (theirs.Wz, w_z), (theirs.Wg, w_g), (theirs.Ur, u_r), (theirs.Uz, u_z)]
    with torch.no_grad():
        for linear, weight in [*pairs, (theirs.Ug, ours.from_rx.weight)]:
            linear.weight.copy_(weight)
        x, y = torch.randn(2, 5, d_model), torch.randn(2, 5, d_model)
        return float((ours.join(x, y) - theirs(x, F.relu(y))).abs().max())


def stream(model: nn.Module, batch: dict, seg_len: int, train: bool) -> tuple[float, torch.Tensor]:
    """Feed a stream segment by segment, memory carried. Returns (mean loss, accuracy per delay [n_seg]).

    Training backpropagates each segment's loss / n_seg at once (zoo.train.steps.forward_backward): the
    memory is detached (truncated BPTT); the caller takes the optimiser step. A NaN loss raises
    TrainingDiverged before any gradient is touched."""
    model.reset(batch["tokens"].shape[0])
    losses, correct = [], []
    n_segments = batch["tokens"].shape[1] // seg_len
    for tokens, targets in zip(batch["tokens"].split(seg_len, 1), batch["targets"].split(seg_len, 1)):
        piece = {"tokens": tokens, "targets": targets}
        out = forward_backward(model, piece, scale=1 / n_segments)[0] if train else model(**piece)
        losses.append(float(out.loss.detach()))
        correct.append((out.logits[:, -1].argmax(-1) == batch["cue"]).float().mean())
    return sum(losses) / len(losses), torch.stack(correct)


def run(variant: str, lr: float, seed: int, args, task: dict, ref) -> tuple[dict, list[dict]]:
    torch.manual_seed(seed)
    model = build(variant, args, vocab_size(task["n_cues"], task["n_noise"]), ref)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    data = torch.Generator().manual_seed(seed)
    held_out = delayed_recall_batch(args.eval_streams, generator=torch.Generator().manual_seed(10_000), **task)
    curve, start, above, solved_at, loss = [], time.perf_counter(), 0, None, float("nan")
    for step in range(1, args.steps + 1):
        opt.zero_grad(set_to_none=True)
        try:
            loss, _ = stream(model, delayed_recall_batch(args.batch, generator=data, **task), args.segment_len, True)
            optimizer_step(model, opt, clip=1.0)
        except TrainingDiverged:  # the loss went NaN: no step taken; evaluated now, and the run ends below
            loss = float("nan")
        if step % args.eval_every and step != args.steps and loss == loss:
            continue
        model.eval()
        with torch.no_grad():
            _, acc = stream(model, held_out, args.segment_len, False)
        model.train()
        curve.append(dict(variant=variant, lr=lr, seed=seed, step=step, loss=loss, **acc_fields(acc)))
        above = above + 1 if acc[-1] >= args.threshold else 0
        if above == 1:
            solved_at = step
        if above >= 2 or loss != loss:  # solved twice in a row, or the loss went NaN
            break
    solved = above >= 2
    row = dict(
        variant=variant,
        lr=lr,
        seed=seed,
        solved=int(solved),
        steps_to_solve=solved_at if solved else "",
        steps_run=step,
        final_acc=round(float(curve[-1][f"acc_delay{task['n_segments'] - 1}"]), 4),
        final_loss=round(loss, 4),
        seconds=round(time.perf_counter() - start, 1),
    )
    return row, curve


def acc_fields(acc: torch.Tensor) -> dict:
    return {f"acc_delay{d}": round(float(a), 4) for d, a in enumerate(acc)}


def key(row: dict) -> tuple[str, float, int]:
    return row["variant"], float(row["lr"]), int(row["seed"])


def sweep(args, task: dict) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ref, why = import_reference(args.ref_path)
    variants = args.variants.split(",")
    for v in variants:
        if v not in VARIANTS:
            raise SystemExit(f"--variants: unknown {v!r}; allowed: {', '.join(VARIANTS)}")
    if ref is None and any(VARIANTS[v][0] == "ref" for v in variants):
        print(f"reference skipped ({why}); running ours only", flush=True)
        variants = [v for v in variants if VARIANTS[v][0] == "ours"]
    done = {key(r) for r in read_rows(out / "runs.csv")}
    # curve rows of a run killed before its runs.csv row: drop them, the run starts again
    kept = [c for c in read_rows(out / "curves.csv") if key(c) in done]
    if len(kept) != len(read_rows(out / "curves.csv")):
        (out / "curves.csv").unlink()
        if kept:
            append_rows(out / "curves.csv", kept)
    # seeds outermost, variants innermost: a sweep cut short still holds every (variant, lr) cell alike
    for seed in (int(s) for s in args.seeds.split(",")):
        for lr in (float(x) for x in args.lrs.split(",")):
            for variant in variants:
                if (variant, lr, seed) in done:
                    continue
                row, curve = run(variant, lr, seed, args, task, ref)
                append_rows(out / "curves.csv", curve)
                append_rows(out / "runs.csv", [row])
                print(" ".join(f"{k}={v}" for k, v in row.items()), flush=True)


def merge(args, task: dict) -> None:
    out = Path(args.out)
    runs = read_rows(out / "runs.csv")
    if not runs:
        raise SystemExit(f"--merge: no runs in {out / 'runs.csv'}; run the sweep first")
    lrs = sorted({float(r["lr"]) for r in runs})
    variants = [v for v in VARIANTS if any(r["variant"] == v for r in runs)]
    lines = [
        "| variant | " + " | ".join(f"lr {lr:g}" for lr in lrs) + " | all lrs |",
        "|---|" + "---|" * (len(lrs) + 1),
    ]
    for v in variants:
        cells, total, n_total = [], 0, 0
        for lr in lrs:
            mine = [r for r in runs if r["variant"] == v and float(r["lr"]) == lr]
            steps = [int(r["steps_to_solve"]) for r in mine if r["solved"] == "1"]
            total, n_total = total + len(steps), n_total + len(mine)
            median = f" ({statistics.median(steps):g})" if steps else ""
            # above the threshold at the last evaluation only: not confirmed by a second one, so not solved
            at_cap = sum(r["solved"] == "0" and float(r["final_acc"]) >= args.threshold for r in mine)
            late = f" +{at_cap} at cap" if at_cap else ""
            cells.append(f"{len(steps)}/{len(mine)}{median}{late}" if mine else "-")
        lines.append(f"| {v} | " + " | ".join(cells) + f" | {total}/{n_total} |")
    (out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    plot(read_rows(out / "curves.csv"), variants, lrs, out / "curves.png", task, args.threshold)


def plot(curves: list[dict], variants: list[str], lrs: list[float], path: Path, task: dict, threshold: float):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    longest = f"acc_delay{task['n_segments'] - 1}"
    impls = [i for i in ("ours", "ref") if any(VARIANTS[v][0] == i for v in variants)]
    fig, axes = plt.subplots(
        len(impls), len(lrs), figsize=(3.2 * len(lrs), 2.8 * len(impls)), sharex=True, sharey=True, squeeze=False
    )
    colours = {"TrXL": "tab:red", "TrXL-I": "tab:orange", "GTrXL b_g=2": "tab:blue", "GTrXL b_g=0": "tab:green"}
    for row, impl in enumerate(impls):
        for col, lr in enumerate(lrs):
            ax = axes[row][col]
            for v in (v for v in variants if VARIANTS[v][0] == impl):
                colour = colours[v.removeprefix("ref ")]
                for i, seed in enumerate(sorted({c["seed"] for c in curves})):
                    mine = [c for c in curves if c["variant"] == v and float(c["lr"]) == lr and c["seed"] == seed]
                    ax.plot(
                        [int(c["step"]) for c in mine],
                        [float(c[longest]) for c in mine],
                        color=colour,
                        lw=1,
                        alpha=0.8,
                        label=v if i == 0 else None,
                    )
            ax.axhline(threshold, color="grey", ls=":", lw=1)
            ax.set_title(f"{impl}, lr {lr:g}", fontsize=9)
            ax.grid(alpha=0.3)
            if row == len(impls) - 1:
                ax.set_xlabel("step")
        axes[row][0].set_ylabel(f"recall acc., delay {task['n_segments'] - 1}")
        axes[row][-1].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--lrs", default="3e-4,1e-3,3e-3,1e-2,3e-2")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--steps", type=int, default=400, help="cap on optimiser steps, the same for every run")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--d-model", type=int, default=32)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--d-ff", type=int, default=32, help="FFN width (DI-engine's GTrXL uses d_model)")
    parser.add_argument("--segments", type=int, default=3, help="segments per stream: delays 0..segments-1")
    parser.add_argument("--segment-len", type=int, default=8, help="also the memory length")
    parser.add_argument("--eval-every", type=int, default=20)
    parser.add_argument("--eval-streams", type=int, default=256)
    parser.add_argument("--threshold", type=float, default=0.95)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--ref-path", default=os.environ.get("GTRXL_REF", ""), help="directory holding ding/")
    parser.add_argument("--merge", action="store_true", help="summarise runs.csv / curves.csv: table.md, curves.png")
    parser.add_argument("--check-gate", action="store_true", help="compare our GRU gate with DI-engine's and exit")
    parser.add_argument("--out", default="results/gtrxl_robustness")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    task = dict(n_segments=args.segments, segment_len=args.segment_len, n_cues=8, n_noise=16)
    if args.check_gate:
        ref, why = import_reference(args.ref_path)
        if ref is None:
            raise SystemExit(f"--check-gate needs the reference: {why}")
        print(f"GRU gate, ours vs DI-engine, max |difference|: {check_gate(ref):.3g}")
    elif args.merge:
        merge(args, task)
    else:
        sweep(args, task)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
