"""Learned attention spans on Tiny Shakespeare.

Paper: Sukhbaatar, Grave, Bojanowski, Joulin 2019, "Adaptive Attention Span in Transformers",
arXiv:1905.07799: with a learned soft mask per head (ramp R, an L1 penalty on the spans), most heads of a
character LM keep short spans, a few in the upper layers long ones, at the bpc of a model whose every span
is the maximum S, for less compute.

Here: ``adaptive_span_lm`` scaled down (4 layers, d 128, 4 heads, FFN 512, S 256, R 32, L1 2e-6, z
initialised to 0, no dropout), trained by the app as a character LM the way the paper reads text: ``batch``
parallel lanes in consecutive segments of ``segment`` characters, each layer's span cache carrying the
previous segments, so a head can learn a span longer than the segment. Modes: ``learned`` (the paper's),
``fixed`` (every span at S: the baseline), ``dynamic`` (spans predicted from each token). Adam (lr 2e-3,
50 warm-up steps, cosine) instead of the paper's Adagrad. Rows: ``summary`` (per mode: val bpc, time per
step, parameters), ``span`` (per mode, layer and head after training) and ``curve`` (train bpc and spans
over training), tagged with the settings.
"""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass, field

import torch

from zoo.app.run import load_run
from zoo.config import require
from zoo.studies.base import STUDY, Study
from zoo.studies.common import Rows, markdown_table, number, run_outcome, saved_figure, train
from zoo.train.eval_protocols import split_stream

MODES = ("learned", "fixed", "dynamic")


@dataclass
class Options:
    modes: list[str] = field(default_factory=lambda: ["learned", "fixed", "dynamic"])
    steps: int = 600
    segment: int = 64
    batch: int = 16
    layers: int = 4
    d_model: int = 128
    heads: int = 4
    max_span: int = 256
    ramp: int = 32
    l1: float = 2e-6
    lr: float = 2e-3
    warmup: int = 50
    clip: float = 0.5
    seed: int = 0
    overrides: list[str] = field(default_factory=list)  # for every run (the toy test points the data elsewhere)

    def __post_init__(self) -> None:
        require(set(self.modes) <= set(MODES), f"study.modes: choose among {', '.join(MODES)}, got {self.modes}")
        require(self.steps > 0 and self.segment > 0, "study.steps and study.segment must be > 0")

    def settings_key(self) -> str:
        return (f"L{self.layers}-d{self.d_model}-h{self.heads}-S{self.max_span}-R{self.ramp}-l1{self.l1:g}"
                f"-t{self.segment}-b{self.batch}-s{self.steps}-lr{self.lr:g}")


@torch.no_grad()
def span_table(model: torch.nn.Module, tokens: torch.Tensor) -> list[list[float]]:
    """Span (tokens) of every head, per layer: the learned or fixed value, or (dynamic) the mean over the
    positions of ``tokens`` [b, t]."""
    stats = model.eval()(tokens).stats
    return [[float(z) for z in stats[f"layer{i}/attn/span"]] for i in range(len(model.stack.blocks))]


def curve_label(key: str) -> str:
    """``"L4-d128-...-l12e-06-t64-b16-s600-lr0.002"`` -> ``"L1 2e-06, 600 steps"``: what the runs vary."""
    l1, steps = re.search(r"-l1(.+?)-t\d", key), re.search(r"-s(\d+)-lr", key)
    return f"L1 {l1.group(1) if l1 else '?'}, {steps.group(1) if steps else '?'} steps"


@STUDY.register("adaptive_span")
class AdaptiveSpan(Study):
    Options = Options
    question = ("Trained as the paper trains them, which spans do the heads of a small character LM learn, and at "
                "what bpc and cost beside every span fixed at the maximum?")
    figures = ("spans.png",)
    toy_options = dict(modes=["learned"], steps=2, segment=8, batch=2, layers=1, d_model=16, heads=2, max_span=16,
                       ramp=4, warmup=1, overrides=["data.path=README.md", "trainer.eval_every=2",
                                                    "trainer.eval_batches=1"])

    def overrides(self, mode: str) -> list[str]:
        o = self.options
        return ["experiment=shakespeare", "model=adaptive_span_lm", f"model.n_layers={o.layers}",
                f"model.d_model={o.d_model}", f"model.n_heads={o.heads}", f"model.d_ff={4 * o.d_model}",
                "model.dropout=0.0", f"+model.attention={{name:adaptive_span,mode:{mode},max_span:{o.max_span},"
                f"ramp:{o.ramp},l1:{o.l1}}}", f"trainer.seq_len={o.segment}", f"trainer.batch_size={o.batch}",
                f"trainer.max_steps={o.steps}", f"trainer.clip={o.clip}", "trainer.log_every=10",
                "trainer.progress=false", f"optim.lr={o.lr}", f"optim.warmup={o.warmup}", f"seed={o.seed}",
                "logger=csv", *o.overrides]

    def run(self) -> None:
        o, key = self.options, self.options.settings_key()
        rows = Rows(self.rows_path, ("settings", "kind", "mode"))
        for mode in o.modes:
            if rows.has(settings=key, kind="summary", mode=mode):
                continue
            run_dir = train(self.overrides(mode), self.paths.runs / key / mode, threads=self.threads)
            result, metrics = run_outcome(run_dir)
            _, task, model, _ = load_run(run_dir / "checkpoints" / "last.pt")
            val = torch.from_numpy(split_stream(task, "val")[: o.batch * o.segment]).long().view(o.batch, o.segment)
            tag = dict(settings=key, mode=mode)
            spans = span_table(model, val)
            curve = []
            for r in metrics:
                if r.get("train/loss"):
                    means = [float(v) for k, v in r.items() if k.endswith("/attn/span_mean") and v]
                    maxes = [float(v) for k, v in r.items() if k.endswith("/attn/span_max") and v]
                    curve.append(dict(kind="curve", **tag, step=int(r["step"]),
                                      train_bpc=float(r["train/loss"]) / math.log(2),
                                      span_mean=statistics.mean(means) if means else "",
                                      span_max=max(maxes) if maxes else ""))
            flat = [z for row in spans for z in row]
            rows.add(curve + [dict(kind="span", **tag, layer=layer, head=head, span=round(z, 2))
                              for layer, row in enumerate(spans) for head, z in enumerate(row)]
                     + [dict(kind="summary", **tag, val_bpc=result["final_metric"],
                             wall_ms_per_step=round(1e3 * result["wall_s"] / result["steps"], 1), cpu_ms_per_step="",
                             params=result["params"], span_mean=statistics.mean(flat), span_max=max(flat))])

    def report(self, rows: list[dict[str, str]]) -> str:
        lines, learned = [], {}
        for key in dict.fromkeys(r["settings"] for r in rows):
            summary = [r for r in rows if r["settings"] == key and r["kind"] == "summary"]
            lines += [f"**Settings `{key}`**", "", *markdown_table(
                ["mode", "val bpc", "ms/step (wall)", "ms/step (CPU)", "mean span", "max span"],
                ([r["mode"], f"{number(r, 'val_bpc'):.3f}", f"{number(r, 'wall_ms_per_step'):.0f}",
                  f"{number(r, 'cpu_ms_per_step'):.0f}" if r["cpu_ms_per_step"] else "-",
                  f"{number(r, 'span_mean'):.1f}", f"{number(r, 'span_max'):.1f}"] for r in summary)), ""]
            for mode in (r["mode"] for r in summary if r["mode"] != "fixed"):
                spans = [r for r in rows if r["settings"] == key and r["kind"] == "span" and r["mode"] == mode]
                layers = list(dict.fromkeys(r["layer"] for r in spans))
                heads = list(dict.fromkeys(r["head"] for r in spans))
                table = {(r["layer"], r["head"]): number(r, "span") for r in spans}
                learned[key, mode] = [[table[layer, head] for head in heads] for layer in layers]
                lines += [f"Spans after training, mode {mode} (tokens; rows = layers from the bottom):", "",
                          *markdown_table(["layer", *(f"head {h}" for h in heads)],
                                          ([layer, *(f"{table[layer, h]:.0f}" for h in heads)]
                                           for layer in layers)), ""]
            lines += [self.verdict(summary, learned.get((key, "learned"))), ""]
        self.figure(rows, learned)
        return "\n".join([*lines, "![spans and training curves](spans.png)"])

    @staticmethod
    def verdict(summary: list[dict[str, str]], spans: list[list[float]] | None) -> str:
        """The paper's finding in two parts: the learned spans' mean well below S at no worse bpc than every span
        at S; and its layer pattern, some head of the top layer reaching at least a quarter of S."""
        by = {r["mode"]: r for r in summary}
        if not {"learned", "fixed"} <= set(by) or not spans:
            return "**Verdict: not enough rows** (the learned and fixed modes at the same settings are needed)."
        learned, fixed = by["learned"], by["fixed"]
        s = number(fixed, "span_mean")
        shorter = number(learned, "span_mean") < s / 2
        as_good = number(learned, "val_bpc") <= number(fixed, "val_bpc")
        pattern = max(spans[-1]) >= s / 4
        return (f"**Verdict: learned spans {'are' if shorter else 'are not'} short** (mean "
                f"{number(learned, 'span_mean'):.1f} of S = {s:.0f}) **at {'no worse' if as_good else 'a worse'} "
                f"bpc** ({number(learned, 'val_bpc'):.3f} against {number(fixed, 'val_bpc'):.3f} fixed); **the "
                f"paper's layer pattern {'shows' if pattern else 'does not show'}** (the top layer's longest span "
                f"{max(spans[-1]):.0f}, a quarter of S is {s / 4:.0f}).")

    def figure(self, rows: list[dict[str, str]], learned: dict[tuple[str, str], list[list[float]]]) -> None:
        panels = len(learned) + 1
        with saved_figure(self.paths.out / "spans.png", 1, panels, figsize=(5 * panels, 3.8), squeeze=False,
                          dpi=90) as (_, axes):
            for ax, ((key, mode), spans) in zip(axes[0], learned.items()):
                n_heads = len(spans[0]) if spans else 0
                for head in range(n_heads):
                    ax.bar([layer + (head - (n_heads - 1) / 2) * 0.8 / n_heads for layer in range(len(spans))],
                           [row[head] for row in spans], width=0.8 / n_heads, label=f"head {head}")
                ax.set(xlabel="layer", ylabel="span (tokens)", xticks=range(len(spans)))
                ax.set_title(f"{mode} spans, {curve_label(key)}", fontsize=9)
                ax.legend(fontsize=7)
            ax = axes[0][-1]
            for settings, mode in dict.fromkeys((r["settings"], r["mode"]) for r in rows if r["kind"] == "curve"):
                points = sorted((int(r["step"]), number(r, "train_bpc")) for r in rows if r["kind"] == "curve"
                                and (r["settings"], r["mode"]) == (settings, mode))
                ax.plot(*zip(*points), label=f"{mode}, {curve_label(settings)}", lw=1)
            ax.set(xlabel="step", ylabel="train bpc (segment)", title="training curves")
            ax.legend(fontsize=6)
