"""Does adaptive span learn the range the data needs? Ours beside the authors' code, on a task whose range is known.

Claim (Sukhbaatar et al. 2019, arXiv:1905.07799, Figure 3 and the span tables): each head learns its own span,
long only where the data rewards it. Task (``data=copy_at_distance``): Markov text over 16 letters in which
every position copies the letter D = ``distance`` back with probability 0.5, so a head must see D - 1 tokens
back to use the copies; a window shorter than that can only learn the chain (oracle bpc for both is reported).

Runs (the same text, batch streams, seed, steps, sizes, span, ramp, L1, init and optimiser: Adam with our
cosine schedule, not the paper's Adagrad):

- ``ours-adaptive``: ``adaptive_span_lm`` with learned spans (max S, ramp R, L1, z initialised to
  ``span_init`` x S) and the paper's learned relative key embeddings (``positions=relative``;
  ``sinusoidal`` gives the absolute signal the preset used before, which never learned the copy here);
- ``ours-fixed``: every span fixed at S; ``ours-small``: fixed at ``small_span`` (< D);
- ``ref-adaptive`` / ``ref-fixed``: the authors' ``TransformerSeq`` (facebookresearch/adaptive-span, a checkout
  at ``ref_path`` or ``$ADAPTIVE_SPAN_REF``; skipped with the reason when absent), trained by their own
  ``train_iteration`` on the splits their ``data.py`` reads (``zoo.studies.reference_loop``).

Ours train through the app (``zoo.studies.common.train``; each head's span is logged per step by the trainer).
The authors' model is not ours to train: it runs in their loop. Rows: ``summary`` (per run: val bpc, spans),
``span`` (every head's span over training) and ``oracle`` (per settings), tagged with the settings; a learned
run also with its ``span_init``. Attention FLOPs per token are analytic (:func:`attention_flops`).
"""

from __future__ import annotations

import math
import os
import statistics
from dataclasses import dataclass, field

import torch

from zoo.app.run import load_run
from zoo.config import require
from zoo.data import copy_at_distance
from zoo.studies.base import STUDY, Study
from zoo.studies.common import Rows, load_now, markdown_table, number, run_outcome, saved_figure, train
from zoo.studies.reference_loop import train_authors_adaptive_span

RUNS = ("ours-adaptive", "ours-fixed", "ours-small", "ref-adaptive", "ref-fixed")


@dataclass
class Options:
    runs: list[str] = field(default_factory=lambda: list(RUNS))
    distance: int = 200
    copy_prob: float = 0.5
    symbols: int = 16
    train_chars: int = 400_000
    valid_chars: int = 16_384
    steps: int = 1000
    segment: int = 64
    batch: int = 8
    layers: int = 2
    d_model: int = 64
    heads: int = 4
    max_span: int = 256
    small_span: int = 64
    ramp: int = 32
    l1: float = 2e-6
    span_init: float = 0.0  # initial span as a fraction of S (paper: 0)
    lr: float = 2e-3
    warmup: int = 50
    clip: float = 0.5
    log_every: int = 50
    seed: int = 0
    positions: str = "relative"  # ours: the paper's learned relative key embeddings, or absolute "sinusoidal"
    ref_path: str = ""  # a checkout of facebookresearch/adaptive-span ("": $ADAPTIVE_SPAN_REF); absent: ours only
    data_dir: str = ""  # where the splits are written for the authors' reader ("": under the study's runs)

    def __post_init__(self) -> None:
        unknown = [r for r in self.runs if r not in RUNS]
        require(not unknown, f"study.runs: unknown {unknown}; choose among {', '.join(RUNS)}")
        require(self.positions in ("relative", "sinusoidal"), f"study.positions: relative or sinusoidal, "
                f"got {self.positions!r}")

    def task(self) -> dict:
        return dict(distance=self.distance, copy_prob=self.copy_prob, n_symbols=self.symbols, successors=3,
                    chain_seed=0)

    def settings_key(self) -> str:
        """What the runs of one table share (the span's initialisation is a column of it)."""
        return (f"D{self.distance}-p{self.copy_prob:g}-v{self.symbols}-{self.positions}-L{self.layers}-d{self.d_model}"
                f"-h{self.heads}-S{self.max_span}-w{self.small_span}-R{self.ramp}-l1{self.l1:g}-t{self.segment}"
                f"-b{self.batch}-s{self.steps}-lr{self.lr:g}-seed{self.seed}")


def attention_flops(spans: list[list[float]], d_head: int, max_span: int, ramp: int, run: str) -> tuple[float, float]:
    """Per-token attention FLOPs: 6 d_head w per head and layer (q . k, q . p and the weighted sum of v over w keys,
    2 FLOPs per multiply-add). "paper": w per head, the keys with a non-zero mask, min(S, ceil(z + R) - 1) (a
    fixed run: its span). "kernel": what the code computes, one window per layer for every head: ours
    min(S, ceil(max z + R) - 1); the authors' trim the cache to S - 64 floor((S - min(S, ceil(max z) + R)) / 64)."""
    paper = kernel = 0.0
    for row in spans:
        if "adaptive" not in run:
            windows, longest = [round(z) for z in row], round(max(row))
        else:
            windows = [min(max_span, max(0, math.ceil(z + ramp) - 1)) for z in row]
            longest = max(windows)
            if run.startswith("ref"):
                shown = min(max_span, math.ceil(max(row)) + ramp)
                longest = max_span - 64 * ((max_span - shown) // 64)
        paper += sum(6 * d_head * w for w in windows)
        kernel += len(row) * 6 * d_head * longest
    return paper, kernel


@STUDY.register("adaptive_span_range")
class AdaptiveSpanRange(Study):
    Options = Options
    question = ("On text that copies from a known distance D, do learned spans settle where the data needs them "
                "(about D - 1), ours as the authors' code does?")
    figures = ("spans.png",)
    toy_options = dict(runs=["ours-adaptive"], distance=6, train_chars=1000, valid_chars=64, steps=2, segment=8,
                       batch=2, layers=1, d_model=16, heads=2, max_span=16, small_span=4, ramp=4, log_every=1)

    def init_of(self, run: str) -> str:
        return str(self.options.span_init) if "adaptive" in run else ""  # a fixed span has no initialisation

    def overrides(self, run: str) -> list[str]:
        o = self.options
        mode, span = ("learned", o.max_span) if run == "ours-adaptive" else ("fixed", o.max_span)
        span = o.small_span if run == "ours-small" else span
        init = o.span_init * span if mode == "learned" else 0.0
        relative = o.positions == "relative"
        return ["data=copy_at_distance", f"data.distance={o.distance}", f"data.copy_prob={o.copy_prob}",
                f"data.n_symbols={o.symbols}", f"data.train_chars={o.train_chars}", f"data.eval_chars={o.valid_chars}",
                "model=adaptive_span_lm", f"model.n_layers={o.layers}", f"model.d_model={o.d_model}",
                f"model.n_heads={o.heads}", f"model.d_ff={4 * o.d_model}", "model.dropout=0.0",
                f"+model.attention={{name:adaptive_span,mode:{mode},max_span:{span},ramp:{o.ramp},l1:{o.l1},"
                f"span_init:{init},relative_keys:{str(relative).lower()}}}",
                f"position={'none' if relative else 'sinusoidal'}", f"trainer.seq_len={o.segment}",
                f"trainer.batch_size={o.batch}", f"trainer.max_steps={o.steps}", f"trainer.clip={o.clip}",
                f"trainer.log_every={o.log_every}", f"trainer.eval_every={o.steps}", "trainer.eval_batches=0",
                "trainer.progress=false", "optim=adam", f"optim.lr={o.lr}", "optim.betas=[0.9,0.98]", "optim.eps=1e-9",
                "optim.schedule=cosine", f"optim.warmup={o.warmup}", f"seed={o.seed}", "logger=csv"]

    def train_ours(self, run: str) -> tuple[dict, list[tuple[int, float, list[list[float]]]]]:
        """Through the app: the result, and (step, train bpc, spans per layer) from the run's log."""
        o = self.options
        run_dir = self.paths.runs / o.settings_key() / f"{run}-init{o.span_init:g}"
        run_dir = train(self.overrides(run), run_dir, threads=self.threads)
        result, metrics = run_outcome(run_dir)
        _, _, model, _ = load_run(run_dir / "checkpoints" / "last.pt")
        with torch.no_grad():
            spans = [[float(z) for z in block.attention.spans(torch.zeros(1, 1, 1))] for block in model.stack.blocks]
        trajectory = [(int(r["step"]), float(r["train/loss"]) / math.log(2),
                       [[float(r[f"train/stats/layer{i}/attn/span/{h}"]) for h in range(o.heads)]
                        for i in range(o.layers)]) for r in metrics if r.get("train/loss")]
        return dict(bpc=result["final_metric"], spans=spans, minutes=result["wall_s"] / 60), trajectory

    def train_reference(self, run: str, ref: str) -> tuple[dict, list[tuple[int, float, list[list[float]]]]]:
        o = self.options
        data = o.data_dir or str(self.paths.runs / f"data-D{o.distance}-p{o.copy_prob:g}-v{o.symbols}-"
                                                   f"{o.train_chars}-{o.valid_chars}")
        if not os.path.isfile(os.path.join(data, "test.txt")):
            copy_at_distance.write_splits(data, (o.train_chars, o.valid_chars, o.valid_chars), **o.task())
        trajectory = []
        result = train_authors_adaptive_span(ref, data, o, adaptive=run == "ref-adaptive",
                                             log=lambda *point: trajectory.append(point))
        return dict(bpc=result["bpc"], spans=result["spans"], minutes=result["cpu"] / 60), trajectory

    def run(self) -> None:
        o, key = self.options, self.options.settings_key()
        rows = Rows(self.rows_path, ("settings", "kind", "run", "span_init"))
        ref = o.ref_path or os.environ.get("ADAPTIVE_SPAN_REF", "")
        runs = o.runs
        present = bool(ref) and os.path.isfile(os.path.join(ref, "adaptive_span.py"))
        if any(r.startswith("ref") for r in runs) and not present:
            print(f"the authors' runs skipped ({ref!r} is no facebookresearch/adaptive-span checkout; set "
                  "study.ref_path or $ADAPTIVE_SPAN_REF); running ours only", flush=True)
            runs = [r for r in runs if r.startswith("ours")]
        if not rows.has(settings=key, kind="oracle", run="", span_init=""):
            valid = copy_at_distance.generate(o.valid_chars, seed=2, **o.task())  # the valid split of both readers
            rows.add([dict(settings=key, kind="oracle", run="", span_init="", distance=o.distance,
                           **copy_at_distance.oracle_bits(valid, **o.task()))])
        for run in runs:
            tag = dict(settings=key, run=run, span_init=self.init_of(run))
            if rows.has(kind="summary", **tag):
                continue
            result, trajectory = self.train_ours(run) if run.startswith("ours") else self.train_reference(run, ref)
            flat = [z for row in result["spans"] for z in row]
            rows.add([*(dict(kind="span", **tag, step=step, train_bpc=f"{bpc:.4f}", layer=layer, head=head,
                             span=f"{z:.2f}")
                        for step, bpc, spans in trajectory for layer, row in enumerate(spans)
                        for head, z in enumerate(row)),
                      dict(kind="summary", **tag, val_bpc=f"{result['bpc']:.4f}", steps=o.steps,
                           minutes=f"{result['minutes']:.2f}", span_mean=f"{statistics.mean(flat):.1f}",
                           span_max=f"{max(flat):.1f}", spans=" ".join(f"{z:.1f}" for z in flat), heads=o.heads,
                           d_head=o.d_model // o.heads, max_span=o.max_span, ramp=o.ramp, distance=o.distance,
                           seed=o.seed, positions=o.positions, load_1min=load_now())])

    def report(self, rows: list[dict[str, str]]) -> str:
        lines = []
        for key in dict.fromkeys(r["settings"] for r in rows if r["kind"] == "summary"):
            summary = [r for r in rows if r["settings"] == key and r["kind"] == "summary"]
            first = summary[0]
            heads = int(first["heads"])
            body = []
            for r in summary:
                flat = [float(z) for z in r["spans"].split()]
                layers = [flat[i : i + heads] for i in range(0, len(flat), heads)]
                paper, kernel = attention_flops(layers, int(r["d_head"]), int(r["max_span"]), int(r["ramp"]), r["run"])
                body.append([r["run"], f"{float(r['span_init']):g} S" if r["span_init"] else "-",
                             f"{number(r, 'val_bpc'):.3f}", f"{int(paper):,}", f"{int(kernel):,}",
                             " / ".join(f"{sum(h) / len(h):.0f}" for h in layers),
                             " / ".join(" ".join(f"{z:.0f}" for z in h) for h in layers)])
            oracle = [r for r in rows if r["settings"] == key and r["kind"] == "oracle"]
            lines += [f"**D = {first['distance']}, {first['positions']} positions, {first['steps']} steps, seed "
                      f"{first['seed']}** (`{key}`):", "",
                      *markdown_table(["run", "span init", "val bpc", "attention FLOPs/token (paper)", "(kernel)",
                                       "mean span per layer", "spans per layer (heads)"], body), ""]
            if oracle:
                lines += [f"Oracle on the validation text: {number(oracle[0], 'full'):.3f} bpc with the whole past, "
                          f"~{number(oracle[0], 'short'):.3f} bpc without the copies (window < D).", ""]
            lines += [self.verdict(summary), ""]
        self.figure(rows)
        return "\n".join([*lines, "![every head's span over training, the authors' code beside ours](spans.png)"])

    @staticmethod
    def verdict(summary: list[dict[str, str]]) -> str:
        """Ours as the authors' code: at each initialisation both learned, bpc within 0.02 and mean spans within
        10 tokens of each other."""
        pairs = []
        for init in dict.fromkeys(r["span_init"] for r in summary if "adaptive" in r["run"]):
            by = {r["run"]: r for r in summary if r["span_init"] == init}
            if {"ours-adaptive", "ref-adaptive"} <= set(by):
                ours, ref = by["ours-adaptive"], by["ref-adaptive"]
                gap, spans = (number(ours, "val_bpc") - number(ref, "val_bpc"),
                              number(ours, "span_mean") - number(ref, "span_mean"))
                pairs.append((f"from {float(init):g} S: bpc {gap:+.3f}, mean span {spans:+.1f}",
                              abs(gap) <= 0.02 and abs(spans) <= 10))
        if not pairs:
            return "**Verdict: no pair to compare** (ours-adaptive beside ref-adaptive at one initialisation)."
        held = all(ok for _, ok in pairs)
        return (f"**Verdict: ours {'matches' if held else 'does not match'} the authors' code** (ours minus theirs; "
                "within 0.02 bpc and 10 tokens of mean span): " + "; ".join(text for text, _ in pairs) + ".")

    def figure(self, rows: list[dict[str, str]]) -> None:
        """Every head's span over training: a row per settings and initialisation, the authors' code (left)
        beside ours (right); the dashed line is D - 1."""
        spans = [r for r in rows if r["kind"] == "span" and "adaptive" in r["run"]]
        panels = list(dict.fromkeys((r["settings"], r["span_init"]) for r in spans)) or [("", "")]
        summary = {r["settings"]: r for r in rows if r["kind"] == "summary"}
        with saved_figure(self.paths.out / "spans.png", len(panels), 2, squeeze=False,
                          figsize=(11, 3.3 * len(panels)), dpi=70) as (_, axes):
            for (key, init), pair in zip(panels, axes):
                for ax, run in zip(pair, ("ref-adaptive", "ours-adaptive")):
                    mine = [r for r in spans if (r["settings"], r["span_init"], r["run"]) == (key, init, run)]
                    if not mine:
                        ax.axis("off")
                        continue
                    for layer, head in dict.fromkeys((int(r["layer"]), int(r["head"])) for r in mine):
                        points = [(int(r["step"]), float(r["span"])) for r in mine
                                  if (int(r["layer"]), int(r["head"])) == (layer, head)]
                        ax.plot(*zip(*points), color=f"C{layer}", alpha=0.8,
                                label=f"layer {layer}" if head == 0 else None)
                    first = summary[key]
                    ax.axhline(int(first["distance"]) - 1, color="k", ls="--", lw=0.8, label="D - 1")
                    ax.set(ylim=(0, int(first["max_span"])), xlabel="step", ylabel="span z (tokens)")
                    ax.set_title(f"{run} from {float(init):g} S: D = {first['distance']}, {first['steps']} steps, "
                                 f"seed {first['seed']}, {first['positions']}", fontsize=8)
                    ax.legend(fontsize=7)
