"""Gating stabilises? TrXL vs TrXL-I vs GTrXL on delayed recall, over seeds, at one learning rate.

Parisotto et al. 2019 (arXiv:1910.06764) claim that on memory tasks GTrXL (identity-map reordering + GRU
gates, b_g = 2) learns faster and more reliably than TrXL (post-norm) and TrXL-I (reordering only). Their
tasks are reinforcement learning (DMLab memory, Numpad); ours is the supervised stand-in
``zoo.data.delayed_recall``: a cue in the first segment, asked for at the end of every segment, the stream read
one segment per call and the memory carried (stop-gradient), so recalling after d segments needs d hops.

Scale-down: 3 layers, d 64, 4 heads, FFN 256, segment 16, mem_len 16, 4 segments per stream (delays 0..3),
batch 32, Adam at a constant rate, ``steps`` optimiser steps (one per stream, segment i's loss weighted
1 / (i + 1) and backpropagated as it is read). Success: accuracy at the longest delay >= ``threshold`` on
held-out streams at the end of training. Superseded by ``gtrxl_robustness`` (a learning-rate sweep with
DI-engine's GTrXL beside ours); kept for its two single-rate runs.

Why not the app: a step per stream with per-segment weights and the accuracy per delay are beyond its
trainer; the models train in ``zoo/studies/stream_loop.py``. Rows: ``run`` (per model and seed) and
``curve`` (per evaluation), tagged with the settings.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from zoo.config import require
from zoo.data.delayed_recall import delayed_recall_batch, vocab_size
from zoo.studies.base import STUDY, Study
from zoo.studies.common import Rows, markdown_table, number, saved_figure
from zoo.studies.gtrxl_robustness import ours, pieces, recall_by_delay
from zoo.studies.stream_loop import train_streams

MODELS = ("transformer_xl", "trxl_i", "gtrxl")


@dataclass
class Options:
    models: list[str] = field(default_factory=lambda: list(MODELS))
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    steps: int = 800
    batch: int = 32
    lr: float = 1e-3
    layers: int = 3
    d_model: int = 64
    segments: int = 4
    segment_len: int = 16
    eval_every: int = 50
    eval_streams: int = 512
    threshold: float = 0.9

    def __post_init__(self) -> None:
        require(set(self.models) <= set(MODELS), f"study.models: choose among {', '.join(MODELS)}, got {self.models}")
        require(self.segments >= 1 and self.segment_len >= 2, "study.segments >= 1 and study.segment_len >= 2")

    def settings_key(self) -> str:
        return (f"L{self.layers}-d{self.d_model}-{self.segments}x{self.segment_len}-b{self.batch}-lr{self.lr:g}"
                f"-s{self.steps}-eval{self.eval_every}x{self.eval_streams}-thr{self.threshold:g}")


@STUDY.register("gtrxl_recall")
class GTrXLRecall(Study):
    Options = Options
    question = ("At one learning rate, over seeds, does GTrXL recall a cue several segments back more reliably than "
                "TrXL and TrXL-I (Parisotto et al. 2019)?")
    figures = ("curves.png",)
    toy_options = dict(models=["gtrxl"], seeds=[0], steps=2, batch=4, layers=1, d_model=16, segments=2, segment_len=4,
                       eval_every=2, eval_streams=8)

    def train_one(self, model_name: str, seed: int) -> list[dict]:
        """One model trained for ``steps`` streams: its ``curve`` rows then its ``run`` row."""
        o = self.options
        task = dict(n_segments=o.segments, segment_len=o.segment_len, n_cues=8, n_noise=16)
        torch.manual_seed(seed)
        model = ours(model_name, vocab=vocab_size(8, 16), d_model=o.d_model, layers=o.layers, heads=4,
                     d_ff=4 * o.d_model, memory=o.segment_len)
        optimizer = torch.optim.Adam(model.parameters(), lr=o.lr)
        data = torch.Generator().manual_seed(seed)
        held_out = delayed_recall_batch(o.eval_streams, generator=torch.Generator().manual_seed(10_000 + seed), **task)
        tag = dict(settings=o.settings_key(), model=model_name, seed=seed)
        curve, begin = [], time.perf_counter()

        def after(step: int, loss: float) -> bool:
            if step % o.eval_every == 0 or step == o.steps or loss != loss:
                accuracy = recall_by_delay(model, held_out, o.segment_len)
                curve.append(dict(kind="curve", **tag, step=step, loss=round(loss, 4),
                                  **{f"acc_delay{d}": a for d, a in enumerate(accuracy)}))
            return False

        train_streams(model, optimizer, lambda: pieces(delayed_recall_batch(o.batch, generator=data, **task),
                                                       o.segment_len),
                      steps=o.steps, scale=lambda index, _: 1 / (index + 1), clip=1.0, after=after)
        longest, final = f"acc_delay{o.segments - 1}", curve[-1]
        solved = next((c["step"] for c in curve if c[longest] >= o.threshold), "")
        run = dict(kind="run", **tag, final_loss=final["loss"], **{k: v for k, v in final.items() if "acc" in k},
                   success=int(final[longest] >= o.threshold), first_step_solved=solved,
                   seconds=round(time.perf_counter() - begin, 1))
        return [*curve, run]

    def run(self) -> None:
        o, rows = self.options, Rows(self.rows_path, ("settings", "kind", "model", "seed"))
        for model_name in o.models:
            for seed in o.seeds:
                if not rows.has(settings=o.settings_key(), kind="run", model=model_name, seed=seed):
                    rows.add(self.train_one(model_name, seed))  # together: a run killed midway leaves nothing

    def report(self, rows: list[dict[str, str]]) -> str:
        lines = []
        for key in dict.fromkeys(r["settings"] for r in rows if r["kind"] == "run"):
            runs = [r for r in rows if r["kind"] == "run" and r["settings"] == key]
            delays = sorted(int(k.removeprefix("acc_delay")) for k in runs[0] if k.startswith("acc_delay")
                            and runs[0][k] != "")
            models = list(dict.fromkeys(r["model"] for r in runs))
            body = []
            for name in models:
                mine = [r for r in runs if r["model"] == name]
                accuracies = "; ".join(f"s{r['seed']}: " + "/".join(f"{number(r, f'acc_delay{d}'):.2f}" for d in delays)
                                       for r in mine)
                body.append([name, f"{sum(r['success'] == '1' for r in mine)}/{len(mine)}", accuracies,
                             ", ".join(r["first_step_solved"] or "None" for r in mine),
                             ", ".join(f"{number(r, 'final_loss'):.3f}" for r in mine)])
            lines += [f"Settings `{key}` (success: accuracy at delay {delays[-1]} at least the threshold at the end of "
                      "training; chance 1/8):", "",
                      *markdown_table(["model", "success", f"per seed: accuracy at delays 0..{delays[-1]} (final)",
                                       "first step solved", "final loss"], body), "", self.verdict(runs), ""]
        self.figure(rows)
        return "\n".join([*lines, "![accuracy at the longest delay, per seed](curves.png)"])

    @staticmethod
    def verdict(runs: list[dict[str, str]]) -> str:
        """The paper's claim at this rate: GTrXL succeeds in at least as many seeds as each of the others."""
        models = dict.fromkeys(r["model"] for r in runs)
        wins = {m: sum(r["success"] == "1" for r in runs if r["model"] == m) for m in models}
        if "gtrxl" not in wins or len(wins) < 2:
            return "**Verdict: not enough rows** (gtrxl beside another model)."
        others = {m: n for m, n in wins.items() if m != "gtrxl"}
        holds = all(wins["gtrxl"] >= n for n in others.values())
        return (f"**Verdict: GTrXL {'is' if holds else 'is not'} at least as reliable here**: gtrxl "
                f"{wins['gtrxl']} against " + ", ".join(f"{m} {n}" for m, n in others.items()) + " successful seeds.")

    def figure(self, rows: list[dict[str, str]]) -> None:
        """Accuracy at the longest delay against step, a line per seed: a row per settings, a panel per model."""
        curves = [r for r in rows if r["kind"] == "curve"]
        keys = list(dict.fromkeys(r["settings"] for r in curves)) or [""]
        columns = max((len({r["model"] for r in curves if r["settings"] == k}) for k in keys), default=1) or 1
        with saved_figure(self.paths.out / "curves.png", len(keys), columns, sharey=True, squeeze=False,
                          figsize=(4 * columns, 3.2 * len(keys)), dpi=100) as (_, axes):
            for row, key in enumerate(keys):
                mine = [r for r in curves if r["settings"] == key]
                longest = max(int(k.removeprefix("acc_delay")) for k in mine[0] if k.startswith("acc_delay")
                              and mine[0][k] != "")
                for ax, name in zip(axes[row], dict.fromkeys(r["model"] for r in mine)):
                    for seed in dict.fromkeys(r["seed"] for r in mine if r["model"] == name):
                        line = [r for r in mine if (r["model"], r["seed"]) == (name, seed)]
                        ax.plot([int(r["step"]) for r in line], [number(r, f"acc_delay{longest}") for r in line],
                                label=f"seed {seed}")
                    ax.axhline(float(key.rsplit("-thr", 1)[1]), color="grey", ls=":", lw=1)
                    ax.set_title(f"{name}, {key.split('-eval')[0]}", fontsize=8)
                    ax.set_xlabel("step")
                    ax.grid(alpha=0.3)
                axes[row][0].set_ylabel(f"accuracy, delay {longest} segments")
                axes[row][-1].legend(fontsize=8)
