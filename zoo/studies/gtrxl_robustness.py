"""GTrXL robustness over the learning rate: TrXL vs TrXL-I vs GTrXL (b_g = 2, 0), ours beside DI-engine's.

Paper: "Stabilizing Transformers for Reinforcement Learning", Parisotto et al. 2019, arXiv:1910.06764: over
many hyperparameter settings (learning rate, seeds) GTrXL learns the memory tasks in more of them, and less
variably, than TrXL-I, with TrXL (post-norm) failing in most. Their evidence is RL returns; ours is the
supervised stand-in ``zoo.data.delayed_recall``: a cue in segment 0, asked for at the end of every segment,
the stream read one segment per call with the XL memory carried (stop-gradient), so the answer at delay d
lies d segments back and is reachable only through d hops of memory.

Sweep: learning rates x seeds x variants, each run a fixed cap of Adam steps (constant lr, clip 1.0), one
step per stream (each segment's loss / n_segments backpropagated as it is read). A run is *solved* when the
recall accuracy at the longest delay is >= ``threshold`` at two consecutive evaluations; steps-to-solve is
the first of the two, and the run stops there. Variants: ours ``transformer_xl`` (post-norm), ``trxl_i``,
``gtrxl`` with ``gate_bias`` 2 and 0; DI-engine's ``GTrXL`` (``ref_path`` or ``$GTRXL_REF``, a folder holding
``ding/``; skipped with the reason when absent) with ``gru_gating=False`` (its TrXL-I) and ``gru_bias`` 2 and 0.

Why not the app: a step per stream, a stop once solved, the accuracy per delay and the reference model in
the same loop are beyond its trainer; every variant trains in ``zoo/studies/stream_loop.py``. Rows: ``run``
(per variant, lr and seed), ``curve`` (per evaluation) and ``gate`` (our GRU gate against DI-engine's
``GRUGatingUnit`` with the same weights, max |difference|), tagged with the settings.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import zoo
from zoo.config import require
from zoo.data.delayed_recall import delayed_recall_batch, vocab_size
from zoo.residual.gtrxl import GRUGate
from zoo.studies.base import STUDY, Study
from zoo.studies.common import Rows, markdown_table, number, saved_figure
from zoo.studies.stream_loop import Carried, DIEngineGTrXL, evaluate_stream, import_di_engine, train_streams

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
COLOURS = {"TrXL": "tab:red", "TrXL-I": "tab:orange", "GTrXL b_g=2": "tab:blue", "GTrXL b_g=0": "tab:green"}


@dataclass
class Options:
    variants: list[str] = field(default_factory=lambda: list(VARIANTS))
    lrs: list[float] = field(default_factory=lambda: [3e-4, 1e-3, 3e-3, 1e-2, 3e-2])
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    steps: int = 400  # cap on optimiser steps, the same for every run
    batch: int = 32
    layers: int = 2
    d_model: int = 32
    heads: int = 4
    d_ff: int = 32  # DI-engine's GTrXL fixes the FFN width to d_model
    segments: int = 3  # per stream: delays 0..segments - 1
    segment_len: int = 8  # also the memory length
    eval_every: int = 20
    eval_streams: int = 256
    threshold: float = 0.95
    ref_path: str = ""  # a folder holding DI-engine's ding/ ("": $GTRXL_REF); absent: ours only

    def __post_init__(self) -> None:
        unknown = [v for v in self.variants if v not in VARIANTS]
        require(not unknown, f"study.variants: unknown {unknown}; choose among {', '.join(VARIANTS)}")
        require(self.segments >= 1 and self.segment_len >= 2, "study.segments >= 1 and study.segment_len >= 2")

    def task(self) -> dict[str, int]:
        return dict(n_segments=self.segments, segment_len=self.segment_len, n_cues=8, n_noise=16)

    def settings_key(self) -> str:
        return (f"L{self.layers}-d{self.d_model}-h{self.heads}-ff{self.d_ff}-{self.segments}x{self.segment_len}"
                f"-b{self.batch}-cap{self.steps}-eval{self.eval_every}x{self.eval_streams}-thr{self.threshold:g}")


def ours(preset: str, *, vocab: int, d_model: int, layers: int, heads: int, d_ff: int, memory: int,
         gate_bias: float | None = None) -> Carried:
    """A zoo preset read one segment per call, its XL memory ``memory`` tokens per layer (``gate_bias``: the
    GRU gate's b_g, ``residual.gate_bias=`` in Hydra)."""
    residual = {} if gate_bias is None else {"residual": {"name": "gru_gate", "gate_bias": gate_bias}}
    return Carried(zoo.create_model(preset, vocab_size=vocab, d_model=d_model, n_layers=layers, n_heads=heads,
                                    d_ff=d_ff, dropout=0.0, attention={"mem_len": memory}, **residual))


def pieces(batch: dict[str, Tensor], segment_len: int) -> list[dict[str, Tensor]]:
    """A batch of streams cut into the segments read one per call."""
    return [{"tokens": t, "targets": y} for t, y in zip(batch["tokens"].split(segment_len, 1),
                                                        batch["targets"].split(segment_len, 1))]


def recall_by_delay(model: nn.Module, batch: dict[str, Tensor], segment_len: int) -> list[float]:
    """Accuracy of the answer at the end of each segment (delay 0, 1, ...) on held-out streams."""
    outputs = evaluate_stream(model, pieces(batch, segment_len))
    return [round(float((out.logits[:, -1].argmax(-1) == batch["cue"]).float().mean()), 4) for out in outputs]


def check_gate(ref: Any, d_model: int = 16) -> float:
    """max |ours - DI-engine's| of the GRU gate g(x, y) with our weights copied into theirs: our ``join(x, y)``
    is their ``gate(x, ReLU(y))``."""
    torch.manual_seed(0)
    mine, theirs = GRUGate(d_model, gate_bias=2.0), ref.GRUGatingUnit(d_model, 2.0)
    w_r, w_z, w_g = mine.from_y.weight.chunk(3)
    u_r, u_z = mine.from_x.weight.chunk(2)
    pairs = [(theirs.Wr, w_r), (theirs.Wz, w_z), (theirs.Wg, w_g), (theirs.Ur, u_r), (theirs.Uz, u_z),
             (theirs.Ug, mine.from_rx.weight)]
    with torch.no_grad():
        for linear, weight in pairs:
            linear.weight.copy_(weight)
        x, y = torch.randn(2, 5, d_model), torch.randn(2, 5, d_model)
        return float((mine.join(x, y) - theirs(x, F.relu(y))).abs().max())


@STUDY.register("gtrxl_robustness")
class GTrXLRobustness(Study):
    Options = Options
    question = ("Over learning rates and seeds, does GTrXL's gate solve delayed recall in at least as many runs as "
                "TrXL-I, and post-norm TrXL in fewer (Parisotto et al. 2019), ours and DI-engine's alike?")
    figures = ("curves.png",)
    toy_options = dict(variants=["GTrXL b_g=0"], lrs=[1e-2], seeds=[0], steps=2, eval_every=2, batch=4,
                       eval_streams=8, d_model=16, d_ff=16, heads=2, layers=1, segments=2, segment_len=4)

    def build(self, variant: str, ref: Any) -> nn.Module:
        o, (impl, which, gate_bias) = self.options, VARIANTS[variant]
        vocab = vocab_size(8, 16)
        if impl == "ours":
            return ours(which, vocab=vocab, d_model=o.d_model, layers=o.layers, heads=o.heads, d_ff=o.d_ff,
                        memory=o.segment_len, gate_bias=gate_bias)
        return DIEngineGTrXL(ref, gated=which == "gate", gate_bias=2.0 if gate_bias is None else gate_bias,
                             vocab=vocab, d_model=o.d_model, heads=o.heads, layers=o.layers, memory=o.segment_len)

    def train_one(self, variant: str, lr: float, seed: int, ref: Any) -> tuple[dict, list[dict]]:
        """One run to the cap or until solved: its ``run`` row and its ``curve`` rows."""
        o, task = self.options, self.options.task()
        torch.manual_seed(seed)
        model = self.build(variant, ref)
        optimizer = torch.optim.Adam(model.parameters(), lr=lr)
        data = torch.Generator().manual_seed(seed)
        held_out = delayed_recall_batch(o.eval_streams, generator=torch.Generator().manual_seed(10_000), **task)
        tag = dict(settings=o.settings_key(), variant=variant, lr=lr, seed=seed)
        curve, run = [], dict(above=0, solved_at=None, loss=float("nan"))
        begin = time.perf_counter()

        def after(step: int, loss: float) -> bool:
            run["loss"] = loss
            if step % o.eval_every and step != o.steps and loss == loss:
                return False
            accuracy = recall_by_delay(model, held_out, o.segment_len)
            curve.append(dict(kind="curve", **tag, step=step, loss=loss,
                              **{f"acc_delay{d}": a for d, a in enumerate(accuracy)}))
            run["above"] = run["above"] + 1 if accuracy[-1] >= o.threshold else 0
            if run["above"] == 1:
                run["solved_at"] = step
            return run["above"] >= 2 or loss != loss  # solved twice in a row, or the loss went NaN

        steps_run = train_streams(model, optimizer, lambda: pieces(delayed_recall_batch(o.batch, generator=data,
                                                                                        **task), o.segment_len),
                                  steps=o.steps, scale=lambda *_: 1 / o.segments, clip=1.0, after=after)
        solved = run["above"] >= 2
        row = dict(kind="run", **tag, solved=int(solved), steps_to_solve=run["solved_at"] if solved else "",
                   steps_run=steps_run, final_acc=curve[-1][f"acc_delay{o.segments - 1}"],
                   final_loss=round(run["loss"], 4), seconds=round(time.perf_counter() - begin, 1))
        return row, curve

    def run(self) -> None:
        o, rows = self.options, Rows(self.rows_path, ("settings", "kind", "variant", "lr", "seed"))
        ref, why = import_di_engine(o.ref_path or os.environ.get("GTRXL_REF", ""))
        variants = o.variants
        if ref is None and any(VARIANTS[v][0] == "ref" for v in variants):
            print(f"DI-engine's GTrXL skipped ({why}); running ours only", flush=True)
            variants = [v for v in variants if VARIANTS[v][0] == "ours"]
        if ref is not None and not rows.has(settings="", kind="gate", variant="", lr="", seed=""):
            rows.add([dict(kind="gate", settings="", variant="", lr="", seed="", max_abs_diff=check_gate(ref))])
        # seeds outermost, variants innermost: a sweep cut short still holds every (variant, lr) cell alike
        for seed in o.seeds:
            for lr in o.lrs:
                for variant in variants:
                    if not rows.has(settings=o.settings_key(), kind="run", variant=variant, lr=lr, seed=seed):
                        row, curve = self.train_one(variant, lr, seed, ref)
                        rows.add([*curve, row])  # together: a run killed midway leaves nothing behind

    def report(self, rows: list[dict[str, str]]) -> str:
        lines = []
        for key in dict.fromkeys(r["settings"] for r in rows if r["kind"] == "run"):
            runs = [r for r in rows if r["kind"] == "run" and r["settings"] == key]
            threshold = float(key.rsplit("-thr", 1)[1])
            lrs = sorted({float(r["lr"]) for r in runs})
            variants = [v for v in VARIANTS if any(r["variant"] == v for r in runs)]
            cells = {v: [self.cell([r for r in runs if r["variant"] == v and float(r["lr"]) == lr], threshold)
                         for lr in lrs] for v in variants}
            totals = {v: (sum(r["solved"] == "1" for r in runs if r["variant"] == v),
                          sum(r["variant"] == v for r in runs)) for v in variants}
            lines += [f"Settings `{key}`: solved runs / runs (median steps-to-solve); \"+n at cap\": above the "
                      "threshold at the last evaluation only, not confirmed by a second, so not solved.", "",
                      *markdown_table(["variant", *(f"lr {lr:g}" for lr in lrs), "all lrs"],
                                      ([v, *cells[v], f"**{totals[v][0]}/{totals[v][1]}**"] for v in variants)),
                      "", self.verdict(totals), ""]
        gates = [r for r in rows if r["kind"] == "gate"]
        if gates:
            lines += [f"GRU gate, ours against DI-engine's `GRUGatingUnit` with the same weights: max |difference| "
                      f"{number(gates[-1], 'max_abs_diff'):.3g}.", ""]
        self.figure(rows)
        return "\n".join([*lines, "![learning curves](curves.png)"])

    @staticmethod
    def cell(runs: list[dict[str, str]], threshold: float) -> str:
        if not runs:
            return "-"
        steps = [int(r["steps_to_solve"]) for r in runs if r["solved"] == "1"]
        median = f" ({statistics.median(steps):g})" if steps else ""
        at_cap = sum(r["solved"] == "0" and float(r["final_acc"]) >= threshold for r in runs)
        return f"{len(steps)}/{len(runs)}{median}" + (f" +{at_cap} at cap" if at_cap else "")

    @staticmethod
    def verdict(totals: dict[str, tuple[int, int]]) -> str:
        """The paper's ordering, per implementation: the gated model (b_g = 2) solves at least as many runs as
        TrXL-I, and TrXL (ours only) fewer than TrXL-I."""
        checks = []
        for prefix in ("", "ref "):
            gated, reordered = totals.get(f"{prefix}GTrXL b_g=2"), totals.get(f"{prefix}TrXL-I")
            if gated and reordered:
                checks.append((f"{prefix}GTrXL b_g=2 {gated[0]}/{gated[1]} against {prefix}TrXL-I "
                               f"{reordered[0]}/{reordered[1]}", gated[0] >= reordered[0]))
        if "TrXL" in totals and "TrXL-I" in totals:
            checks.append((f"TrXL {totals['TrXL'][0]}/{totals['TrXL'][1]} against TrXL-I "
                           f"{totals['TrXL-I'][0]}/{totals['TrXL-I'][1]}", totals["TrXL"][0] < totals["TrXL-I"][0]))
        if not checks:
            return "**Verdict: not enough rows** (GTrXL b_g=2 or TrXL beside TrXL-I)."
        held = sum(ok for _, ok in checks)
        return (f"**Verdict: {held} of {len(checks)} of the paper's orderings hold**: "
                + "; ".join(f"{'holds' if ok else 'does not'}: {text}" for text, ok in checks) + ".")

    def figure(self, rows: list[dict[str, str]]) -> None:
        """Recall accuracy at the longest delay against step, a line per seed: a row of panels per settings
        and implementation, a panel per lr."""
        curves = [r for r in rows if r["kind"] == "curve"]
        panels = list(dict.fromkeys((r["settings"], VARIANTS[r["variant"]][0]) for r in curves))
        columns = max((len({r["lr"] for r in curves if r["settings"] == key}) for key, _ in panels), default=1)
        with saved_figure(self.paths.out / "curves.png", max(len(panels), 1), columns, sharey=True, squeeze=False,
                          figsize=(3.2 * columns, 2.8 * max(len(panels), 1)), dpi=90) as (_, axes):
            for row, (key, impl) in enumerate(panels):
                mine = [r for r in curves if r["settings"] == key]
                longest = max(int(k.removeprefix("acc_delay")) for k in mine[0] if k.startswith("acc_delay")
                              and mine[0][k] != "")
                for col, lr in enumerate(sorted({float(r["lr"]) for r in mine})):
                    ax = axes[row][col]
                    for v in (v for v in VARIANTS if VARIANTS[v][0] == impl):
                        for i, seed in enumerate(dict.fromkeys(r["seed"] for r in mine)):
                            line = [r for r in mine if (r["variant"], float(r["lr"]), r["seed"]) == (v, lr, seed)]
                            ax.plot([int(r["step"]) for r in line], [number(r, f"acc_delay{longest}") for r in line],
                                    color=COLOURS[v.removeprefix("ref ")], lw=1, alpha=0.8,
                                    label=v if i == 0 and line else None)
                    ax.axhline(float(key.rsplit("-thr", 1)[1]), color="grey", ls=":", lw=1)
                    ax.set_title(f"{impl}, lr {lr:g}, {key.split('-b')[0]}", fontsize=7)
                    ax.grid(alpha=0.3)
                    ax.set_xlabel("step")
                for ax in axes[row][len({r["lr"] for r in mine}):]:
                    ax.axis("off")
                axes[row][0].set_ylabel(f"recall acc., delay {longest}")
                axes[row][0].legend(fontsize=6, loc="lower right")
