"""Do Al-Rfou et al. 2018's auxiliary losses help a deep, thin character Transformer train?
(zoo/models/al_rfou_losses.py)

The paper (arXiv:1808.04444, "Auxiliary Losses" and the ablation table) needs intermediate-layer and
multiple-target losses to train its 64-layer character model. Here the same question at CPU scale:
the preset ``al_rfou_lm`` cut to a deep, thin model (``--layers`` 24, d ``--d-model`` 64, context
``--seq`` 128) on tiny Shakespeare, two arms at the identical budget (steps, batch, learning-rate
schedule, seeds, residual/norm, data order):

- ``aux``: the preset's losses (intermediate layers on, dropped at l/(2L) of training; character
  after next weighted 0.5, own classifier);
- ``plain``: ``model.aux_losses={intermediate:false,multi_target:0.0,layer_heads:false}`` (next-character loss at every
  position only).

Every run goes through the project's Hydra app (experiments/train.py), so what runs is what a user
runs; validation bits per character over training come from the run's metrics.csv. No reference
implementation is run: the authors' code (tensor2tensor, TF1) is not runnable here (see the README).

    python experiments/al_rfou_aux.py                   # runs missing (arm, seed) pairs, then merges
    python experiments/al_rfou_aux.py --merge           # table + plot from the CSVs only
    python experiments/al_rfou_aux.py --smoke --out runs/al_rfou_aux_smoke   # seconds: 2 layers, 4 steps

Resumable: one row per finished run is appended to ``runs.csv`` (and its curve to ``curves.csv``);
a run whose row exists with the same settings is skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from zoo.app.csv_rows import append_rows, read_rows

ROOT = Path(__file__).resolve().parents[1]
ARMS = {  # what each arm sets; the same dict as the preset's own for "aux"
    "aux": "model.aux_losses={intermediate:true,multi_target:0.5,layer_heads:true}",  # the paper's losses
    "plain": "model.aux_losses={intermediate:false,multi_target:0.0,layer_heads:false}",  # next-char loss only
    "aux_shared": "model.aux_losses={intermediate:true,multi_target:0.5,layer_heads:false}",  # shared classifiers
}
RUN_FIELDS = ["arm", "seed", "settings", "final_val_bpc", "best_val_bpc", "steps", "params", "wall_s"]
CURVE_FIELDS = ["arm", "seed", "step", "val_bpc", "train_loss"]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="results/al_rfou_aux", help="CSV, markdown and PNG go here")
    p.add_argument("--runs-dir", default="runs/al_rfou_aux", help="Hydra run directories (git-ignored)")
    p.add_argument(
        "--data-dir",
        default=os.environ.get("ZOO_DATA_DIR", "../shared/data"),
        help="the shared data directory holding tinyshakespeare/input.txt (relative: to the project root)",
    )
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--d-ff", type=int, default=256)
    p.add_argument("--seq", type=int, default=128, help="context (trainer.seq_len = model.max_len)")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, default=40)
    p.add_argument("--eval-every", type=int, default=40)
    p.add_argument("--eval-batches", type=int, default=16)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--arms", nargs="+", default=["aux", "plain"], choices=list(ARMS))
    p.add_argument(
        "--thresholds",
        type=float,
        nargs="+",
        default=[4.0, 3.7],
        help="report the first eval step with val bpc <= each (unigram ~4.8, bigram ~3.6 bpc on this split)",
    )
    p.add_argument("--merge", action="store_true", help="only rebuild the table and plot from the CSVs")
    p.add_argument("--smoke", action="store_true", help="2 layers, d 16, 4 steps: checks the pipeline in seconds")
    args = p.parse_args(argv)
    if args.smoke:
        args.layers, args.d_model, args.heads, args.d_ff, args.seq, args.batch = 2, 16, 2, 32, 16, 2
        args.steps, args.warmup, args.eval_every, args.eval_batches, args.seeds = 4, 1, 2, 1, [0]
    return args


def settings_key(args: argparse.Namespace) -> str:
    """What makes two runs comparable; a row with another key is not reused."""
    return (
        f"L{args.layers}-d{args.d_model}-h{args.heads}-ff{args.d_ff}-t{args.seq}-b{args.batch}"
        f"-s{args.steps}-lr{args.lr:g}-w{args.warmup}-e{args.eval_every}x{args.eval_batches}"
    )


def overrides(arm: str, seed: int, args: argparse.Namespace, run_dir: Path) -> list[str]:
    """The app's command line for one run: preset al_rfou_lm, cut to the deep-thin size."""
    return [
        "experiment=shakespeare",
        "model=al_rfou_lm",
        f"model.n_layers={args.layers}",
        f"model.d_model={args.d_model}",
        f"model.n_heads={args.heads}",
        f"model.d_ff={args.d_ff}",
        f"model.max_len={args.seq}",
        "model.dropout=0.0",  # a few hundred steps on 1 MB: no overfitting to regularise against
        ARMS[arm],
        f"data_dir={args.data_dir}",
        f"trainer.seq_len={args.seq}",
        f"trainer.batch_size={args.batch}",
        f"trainer.max_steps={args.steps}",
        f"trainer.eval_every={args.eval_every}",
        f"trainer.eval_batches={args.eval_batches}",
        "trainer.log_every=10",
        "trainer.threads=1",
        "trainer.progress=false",
        f"optim.lr={args.lr}",
        f"optim.warmup={args.warmup}",
        f"seed={seed}",
        "logger=csv",
        f"hydra.run.dir={run_dir}",
    ]


def run_one(arm: str, seed: int, args: argparse.Namespace, out: Path) -> None:
    run_dir = Path(args.runs_dir) / f"{settings_key(args)}/{arm}_s{seed}"
    command = [sys.executable, str(ROOT / "experiments" / "train.py"), *overrides(arm, seed, args, run_dir)]
    print("running:", " ".join(command[1:]), flush=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run(command, cwd=ROOT, env=env, check=True)
    result = json.loads((ROOT / run_dir / "result.json").read_text())
    metrics = read_rows(ROOT / run_dir / "metrics.csv")
    train_loss = {r["step"]: r["train/loss"] for r in metrics if r.get("train/loss")}
    curve = [
        dict(
            arm=arm,
            seed=seed,
            step=int(r["step"]),
            val_bpc=float(r["val/bpc"]),
            train_loss=train_loss.get(r["step"], ""),
        )
        for r in metrics
        if r.get("val/bpc")
    ]
    append_rows(out / "curves.csv", curve, CURVE_FIELDS)  # the curve first: a row in runs.csv means it is complete
    row = dict(
        arm=arm,
        seed=seed,
        settings=settings_key(args),
        final_val_bpc=result["final_metric"],
        best_val_bpc=result["best_metric"],
        steps=result["steps"],
        params=result["params"],
        wall_s=round(result["wall_s"], 1),
    )
    append_rows(out / "runs.csv", [row], RUN_FIELDS)


def step_to_reach(curve: list[dict], threshold: float) -> int | None:
    for point in sorted(curve, key=lambda r: int(r["step"])):
        if float(point["val_bpc"]) <= threshold:
            return int(point["step"])
    return None


def merge(args: argparse.Namespace, out: Path) -> str:
    """table.md (final val bpc and the step to reach each threshold per run, means per arm) and curves.png."""
    key = settings_key(args)
    runs = [r for r in read_rows(out / "runs.csv") if r["settings"] == key]
    done = {(r["arm"], r["seed"]) for r in runs}
    curves = [c for c in read_rows(out / "curves.csv") if (c["arm"], c["seed"]) in done]
    if not runs:
        return f"no finished runs with settings {key} in {out / 'runs.csv'}"
    reach_heads = " | ".join(f"first step <= {t:g}" for t in args.thresholds)
    lines = [
        f"Settings `{key}`; val bpc on the first {args.eval_batches} validation batches "
        f"({args.eval_batches * args.batch * args.seq} characters), every {args.eval_every} steps.",
        "",
        f"| arm | seed | final val bpc | best val bpc | {reach_heads} | params |",
        "|---|---|---|---|" + "---|" * len(args.thresholds) + "---|",
    ]
    by_arm: dict[str, list[tuple[float, list[int | None]]]] = {}
    for r in sorted(runs, key=lambda r: (r["arm"], int(r["seed"]))):
        curve = [c for c in curves if c["arm"] == r["arm"] and c["seed"] == r["seed"]]
        reach = [step_to_reach(curve, t) for t in args.thresholds]
        by_arm.setdefault(r["arm"], []).append((float(r["final_val_bpc"]), reach))
        reach_text = " | ".join(str(s) if s is not None else f"not within {r['steps']}" for s in reach)
        lines.append(
            f"| {r['arm']} | {r['seed']} | {float(r['final_val_bpc']):.3f} | {float(r['best_val_bpc']):.3f} "
            f"| {reach_text} | {int(r['params']):,} |"
        )
    per_seed = " | ".join(f"steps to <= {t:g} (per seed)" for t in args.thresholds)
    lines += ["", f"| arm | mean final val bpc | {per_seed} |", "|---|---|" + "---|" * len(args.thresholds)]
    for arm, values in sorted(by_arm.items()):
        mean = sum(v for v, _ in values) / len(values)
        cells = [
            ", ".join(str(r[i]) if r[i] is not None else "-" for _, r in values) for i in range(len(args.thresholds))
        ]
        lines.append(f"| {arm} | {mean:.3f} | " + " | ".join(cells) + " |")
    table = "\n".join(lines) + "\n"
    (out / "table.md").write_text(table)
    plot(curves, args, out / "curves.png")
    return table


def plot(curves: list[dict], args: argparse.Namespace, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=100)
    colours = {"aux": "tab:blue", "plain": "tab:red", "aux_shared": "tab:green"}
    for arm, seed in sorted({(c["arm"], c["seed"]) for c in curves}):
        points = sorted((int(c["step"]), float(c["val_bpc"])) for c in curves if c["arm"] == arm and c["seed"] == seed)
        style = "-" if seed == "0" else "--"
        label = f"{arm} (seed {seed})"
        ax.plot(*zip(*points), style, color=colours.get(arm, "black"), marker=".", label=label)
    for threshold in args.thresholds:
        ax.axhline(threshold, color="grey", lw=0.8, ls=":")
    ax.axvline(args.steps / 2, color="grey", lw=0.8, ls="--")  # every intermediate loss is gone from here on
    ax.text(args.steps / 2, ax.get_ylim()[1], " all intermediate losses dropped", fontsize=7, va="top", color="grey")
    ax.set_xlabel("training step")
    ax.set_ylabel("validation bits per character")
    ax.set_title(f"{args.layers}-layer d{args.d_model} char LM, tiny Shakespeare: Al-Rfou aux losses", fontsize=9)
    if curves:
        ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    if not out.is_absolute():
        out = ROOT / out
    out.mkdir(parents=True, exist_ok=True)
    if not args.merge:
        key = settings_key(args)
        finished = {(r["arm"], r["seed"]) for r in read_rows(out / "runs.csv") if r["settings"] == key}
        for seed in args.seeds:  # alternate arms within a seed: a cut-short session keeps matched pairs
            for arm in args.arms:
                if (arm, str(seed)) in finished:
                    print(f"skip {arm} seed {seed}: already in {out / 'runs.csv'}")
                    continue
                run_one(arm, seed, args, out)
    print(merge(args, out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
