"""ListOps at the PyTorch LRA re-implementations' full budget (``lra_setting=nystromformer``).

Setting: mlpen/Nystromformer's LRA code (Xiong et al. 2021, arXiv:2102.03902, Table 2; the setting most
PyTorch LRA papers reuse): 2 layers, d 64, 5,000 steps of 32 expressions of up to 2,000 tokens padded to
2,048. Question: which of the zoo's mechanisms leave the label-frequency plateau at that budget, and where
their test accuracy lands beside the setting's 37.1% for softmax attention.

Each run is a mechanism with optional ``:``-separated overrides (``local_1d:attention.block=64``); plain
``lsh`` runs as that setting's ``reformer-2`` (Hugging Face's ``LSHSelfAttention`` with 2 hashes and the
``ReformerConfig`` defaults): 2 rounds, chunks of 64, 64 buckets at 2,048 tokens, own + previous chunk
across buckets, no dropout on the attention weights. What stays ours there: the rounds are sorted apart,
rotations are drawn per optimiser step, the projections have biases and scores carry 1/sqrt(d_k) (the last
two are options: ``lsh:attention.bias=false:attention.scale_scores=false``).

Deviation from their loop, for CPU time only: the dev split (1,984 examples) is scored every ``eval_every``
= 500 steps, not every 50, so the best checkpoint is chosen among 10 evaluations instead of 100. Runs made
elsewhere (their own loop by the ``lra_parity`` study's ``theirs``, ablations trained by hand) join the
rows through ``read_runs`` (directories of ``listops_*_s*`` runs; read, never trained).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from zoo.config import require
from zoo.studies.base import STUDY, Study
from zoo.studies.common import PROJECT_ROOT, Rows, score_checkpoint, train

REPORTED_SOFTMAX = 37.1  # softmax attention in this setting (mlpen/Nystromformer), dev/test accuracy %
MAJORITY = 17.74  # the most frequent answer's share of the 1,984 dev / test sequences, %
REFORMER_2 = ["attention.n_hashes=2", "attention.n_buckets=64", "attention.chunk_size=64",
              "attention.attend_across_buckets=true", "model.attention_dropout=0"]
PLATEAU_MARGIN = 5.0  # points above the most frequent answer's share that count as having left the plateau


@dataclass
class Options:
    runs: list[str] = field(default_factory=lambda: ["sparse_fixed", "local_1d", "lsh", "vanilla"])
    seeds: list[int] = field(default_factory=lambda: [0])
    eval_every: int = 500
    checkpoint_every: int = 100
    overrides: list[str] = field(default_factory=list)  # for every run (the toy test shortens the task here)
    read_runs: list[str] = field(default_factory=list)  # directories of runs made elsewhere, read into the rows

    def __post_init__(self) -> None:
        require(self.eval_every > 0 and self.checkpoint_every > 0, "study.eval_every, checkpoint_every must be > 0")


def run_overrides(run: str) -> tuple[str, list[str]]:
    """``"lsh"`` -> ("lsh", their reformer-2 options); ``"local_1d:a=1:b=2"`` -> ("local_1d", ["a=1", "b=2"])."""
    mechanism, *extra = run.split(":")
    if mechanism == "lsh" and not extra:
        extra = list(REFORMER_2)
    return mechanism, [f"attention={mechanism}", *extra]


def curve_rows(run: Path) -> list[dict]:
    """A run's evaluations (dev accuracy, mean training loss since the previous one) and, once finished, the
    test accuracy of its best checkpoint; else how far it got. Reads our metrics.jsonl / test_best.txt and the
    reference's (lra_parity's ``theirs`` writes the same metric keys and a result.json)."""
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    rows, losses, last = [], [], 0
    for m in metrics:
        if "train/loss" in m:
            losses.append(m["train/loss"])
            last = max(last, m["step"])
        if "val/accuracy" in m:
            mean = sum(losses) / len(losses) if losses else float("nan")
            rows.append(dict(run=run.name, kind="eval", step=m["step"], dev_accuracy=f"{100 * m['val/accuracy']:.2f}",
                             train_loss_since_last_eval=f"{mean:.4f}", test_of_best=""))
            losses = []
    ours, theirs = run / "test_best.txt", run / "result.json"
    final = None
    if ours.is_file():
        text = ours.read_text()
        scored = json.loads(text[text.index("{"):])
        final = f"{100 * scored['test/accuracy']:.2f}% (best checkpoint: step {scored['step']})"
    elif theirs.is_file() and "test_accuracy" in (result := json.loads(theirs.read_text())):
        final = f"{100 * result['test_accuracy']:.2f}% (best checkpoint: step {result['best_step']})"
    rows.append(dict(run=run.name, kind="final" if final else "progress", step=last, dev_accuracy="",
                     train_loss_since_last_eval="", test_of_best=final or "not finished"))
    return rows


@STUDY.register("lra_listops_budget")
class ListOpsBudget(Study):
    Options = Options
    question = ("At the PyTorch LRA setting's full ListOps budget, which mechanisms leave the label-frequency "
                "plateau, and where does their test accuracy land beside softmax attention's 37.1%?")
    figures = ("listops_curve.png",)
    toy_options = dict(runs=["local_1d"], seeds=[0], eval_every=2, checkpoint_every=2, overrides=[
        "trainer.max_steps=2", "optim.warmup=1", "trainer.seq_len=128", "data.max_length=128", "data.min_length=64",
        "data.eval_size=64", "trainer.batch_size=4", "trainer.eval_batches=2"])

    def run(self) -> None:
        o = self.options
        rows = Rows(self.rows_path, ("run", "kind", "step"))
        dirs = []
        for seed in o.seeds:
            for run in o.runs:
                mechanism, extra = run_overrides(run)
                run_dir = self.paths.runs / f"listops_{mechanism}_s{seed}"
                train(["experiment=lra_listops", "lra_setting=nystromformer", *extra, f"seed={seed}",
                       f"trainer.eval_every={o.eval_every}", f"trainer.checkpoint_every={o.checkpoint_every}",
                       "trainer.progress=false", "trainer.device=cpu", "logger=csv", *o.overrides],
                      run_dir, threads=self.threads)
                if not (run_dir / "test_best.txt").is_file():
                    scored = score_checkpoint(run_dir / "checkpoints" / "best.pt", "test")
                    (run_dir / "test_best.txt").write_text(json.dumps(scored, indent=2))
                dirs.append(run_dir)
        for root in o.read_runs:
            dirs += sorted(p for p in (PROJECT_ROOT / root).glob("listops_*_s*") if p.is_dir())
        done = rows.done()
        rows.add(r for d in dirs for r in curve_rows(d) if (r["run"], r["kind"], str(r["step"])) not in done)

    def report(self, rows: list[dict[str, str]]) -> str:
        runs = list(dict.fromkeys(r["run"] for r in rows))
        curves = {run: sorted((int(r["step"]), float(r["dev_accuracy"])) for r in rows
                              if r["run"] == run and r["kind"] == "eval") for run in runs}
        finals = {r["run"]: r["test_of_best"] for r in rows if r["kind"] == "final"}
        reached = {run: max([int(r["step"]) for r in rows if r["run"] == run] or [0]) for run in runs}
        lines = ["| run | step | dev accuracy (%) | train loss (mean since the last evaluation) "
                 "| test (best checkpoint) |", "|---|---|---|---|---|"]
        for run in runs:
            for r in rows:
                if r["run"] == run and r["kind"] == "eval":
                    lines.append(f"| {run} | {r['step']} | {r['dev_accuracy']} | {r['train_loss_since_last_eval']} | |")
            lines.append(f"| {run} | {reached[run]} | | | {finals.get(run, 'not finished')} |")
        self.figure(curves)
        verdicts = []
        for run in runs:
            best = max((acc for _, acc in curves[run]), default=None)
            if best is None:
                continue
            left = best >= MAJORITY + PLATEAU_MARGIN
            verdicts.append(f"`{run.removeprefix('listops_')}` {'left' if left else 'stayed on'} the plateau "
                            f"(best dev {best:.2f}% by step {reached[run]:,})")
        lines += ["", "![ListOps dev accuracy](listops_curve.png)", "",
                  f"**Verdict per run** (plateau: the most frequent answer, {MAJORITY}% of dev; left it = best dev "
                  f"at least {PLATEAU_MARGIN:.0f} points above): " + "; ".join(verdicts) + ". "
                  f"Softmax attention in this setting is reported at {REPORTED_SOFTMAX}%; one seed per mechanism "
                  "does not rank mechanisms whose exit from the plateau depends on the seed."]
        return "\n".join(lines)

    def figure(self, curves: dict[str, list[tuple[int, float]]]) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(figsize=(6.4, 3.6))
        for name, points in curves.items():
            if points:
                steps, accuracy = zip(*points)
                axes.plot(steps, accuracy, marker="o", markersize=3, linewidth=1, label=name.removeprefix("listops_"))
        axes.axhline(REPORTED_SOFTMAX, color="grey", ls="--", lw=0.8, label=f"reported, softmax ({REPORTED_SOFTMAX}%)")
        axes.axhline(MAJORITY, color="grey", ls=":", lw=0.8, label=f"most frequent answer ({MAJORITY}%)")
        axes.set(xlabel="training step (batches of 32)", ylabel="dev accuracy (%)",
                 title="ListOps, lra_setting=nystromformer")
        axes.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(self.paths.out / "listops_curve.png", dpi=100)
        plt.close(fig)
