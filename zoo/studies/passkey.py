"""Passkey retrieval past the training length: which position schemes and bounded mechanisms find the key.

Paper: Mohtashami & Jaggi 2023, "Landmark Attention: Random-Access Infinite Context Length for
Transformers", arXiv:2305.16300, Section 4.2: a key hidden in filler, asked for at the end; a model
trained at one length is asked at longer ones. Question: trained at one short length, at 1x-16x of it and
at several depths of the key, which position schemes (with softmax attention) and which bounded mechanisms
still retrieve it, which fail and from which length, and which cannot by construction?

Each run is one training run of the app (``experiment=passkey/len64`` plus the run's overrides, e.g.
``position=alibi`` or ``attention=local_1d attention.block=16 attention.memory=16``), trained once at
``train_len``; its last checkpoint is then scored, without retraining, on ``data=passkey`` held-out
examples at every ``factor x train_len`` and every depth (``data.test_seq_len``, ``data.depth``; -1 = a
uniform place per example). A row per (run, seed, test length, depth): accuracy per digit, the share of
digits whose key a windowed stack can reach at all (from the generator), or the model's refusal.

A learned table of ``model.max_len`` positions cannot be read past its end: the model refuses such a length
(``check_decode_length``) and the row says so. A stack of fixed attention patterns (a window, a strided
set) reaches back only as far as its layers compose (:func:`zoo.app.recall.reachable_keys`); past that the
key is out of sight whatever the training, which is its ceiling.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from zoo.app.recall import attention_label, reachable_keys
from zoo.app.run import load_run
from zoo.config import require
from zoo.data.passkey import passkey_batch
from zoo.studies.base import STUDY, Study
from zoo.studies.common import Rows, load_now, load_range, markdown_table, run_outcome, saved_figure, train
from zoo.train.scoring import evaluate_model

RUNS = [
    "position=learned model.max_len=64",  # the table covers the training length only: past it, a refusal
    "position=sinusoidal",
    "position=rope",
    "position=alibi",
    "position=t5_bias",
    "position=none",  # NoPE: causal masking alone tells positions apart
    "attention=xl_rel position=none",  # Transformer-XL's relative terms inside attention
    "attention=local_1d attention.block=16 attention.memory=16",  # window of 17-32 keys < 64, rope inside
    "attention=sparse_strided attention.stride=8",  # band of 8, then every 8th key: all keys in two layers
    "attention=gated_deltanet position=none",  # recurrent: a fixed-size state, no window
]
CEILING_SLACK = 0.05  # accuracy within this of the reach share is what the window allows (out of reach: chance 0.1)


@dataclass
class Options:
    runs: list[str] = field(default_factory=lambda: list(RUNS))  # each: app overrides of one run
    seeds: list[int] = field(default_factory=lambda: [0])
    steps: int = 3000
    lr: float = 3.0e-3
    warmup: int = 50
    train_len: int = 64
    factors: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16])  # test lengths, x train_len
    depths: list[float] = field(default_factory=lambda: [-1.0, 0.0, 0.5, 1.0])  # -1: uniform per example
    eval_size: int = 256  # held-out examples per (length, depth)
    solved: float = 0.9  # per-digit accuracy that counts as retrieving
    overrides: list[str] = field(default_factory=list)  # for every run (the toy test shrinks the model here)

    def __post_init__(self) -> None:
        require(bool(self.runs) and bool(self.seeds), "study.runs and study.seeds must not be empty")
        require(self.steps > 0 and self.eval_size > 0, "study.steps and study.eval_size must be > 0")
        require(1 in self.factors, f"study.factors must include 1 (the training length), got {self.factors}")
        require(all(d <= 1.0 and (d >= 0.0 or d == -1.0) for d in self.depths),
                f"study.depths must be fractions in [0, 1] or -1 (uniform), got {self.depths}")


def run_name(spec: str) -> str:
    """``"attention=local_1d attention.block=16"`` -> ``"attention_local_1d_attention_block_16"``."""
    return re.sub(r"[^A-Za-z0-9]+", "_", spec).strip("_")


def depth_name(depth: float) -> str:
    return "uniform" if depth < 0 else f"{depth:g}"


def label(model_config: dict[str, Any], spec: str = "") -> str:
    """``local_1d(16+16)+rope``, ``sparse_strided(8)+rope``, ``vanilla+learned(64)``: the mechanism with the
    options the run set on it (the stored config keeps only those), then the positions with the run's own
    ``model.`` overrides (a learned table's length)."""
    name = attention_label(dict(model_config.get("attention") or {"name": None}))
    position = (model_config.get("position") or {}).get("name", "none")
    table = [item.split("=", 1)[1] for item in spec.split() if item.startswith("model.")]
    if table:
        position += "(" + "+".join(table) + ")"
    return name if position == "none" and not name.startswith("vanilla") else f"{name}+{position}"


def reach_share(model_config: dict[str, Any], length: int, depth: float, n_digits: int = 5,
                examples: int = 1024) -> float | None:
    """Share of the key's digits the stack's fixed attention pattern reaches from the question
    (:func:`zoo.app.recall.reachable_keys`; None when a layer reads every earlier key or picks them by
    content): digit i sits at ``where + 1 + i`` and is asked at ``length - n_digits - 1 + i``."""
    reach = reachable_keys(model_config, length)
    if reach is None:
        return None
    out = passkey_batch(examples, length, n_digits=n_digits, depth=depth, generator=torch.Generator().manual_seed(0))
    digit = torch.arange(n_digits)
    asked = (length - n_digits - 1 + digit).expand(examples, -1)
    return float(reach[asked, out["where"][:, None] + 1 + digit].float().mean())


def score(checkpoint: Path, length: int, depth: float, eval_size: int) -> dict[str, Any]:
    """Per-digit accuracy of the checkpoint at ``length`` with the key at ``depth``, or the model's refusal."""
    _, task, model, _ = load_run(checkpoint, data={"test_seq_len": length, "depth": depth, "eval_size": eval_size})
    try:
        model.check_decode_length(length, "data.test_seq_len")
    except ValueError as refusal:
        return dict(accuracy="", refused=str(refusal))
    with torch.no_grad():
        result = evaluate_model(model, task, "test", 0)
    return dict(accuracy=f"{result['test/accuracy']:.4f}", refused="")


@STUDY.register("passkey")
class Passkey(Study):
    Options = Options
    question = ("Trained on passkey retrieval at one short length, which position schemes and bounded mechanisms "
                "still find the key at 2x-16x that length, which fail and from where, and which cannot by "
                "construction?")
    figures = ("passkey.png",)
    # one run that both reaches its table's end at 2x (a refusal row) and has a window (a reach share)
    toy_options = dict(runs=["attention=local_1d attention.block=4 attention.memory=4 position=learned "
                             "model.max_len=16"], steps=2, warmup=1, train_len=16, factors=[1, 2],
                       depths=[-1.0, 1.0], eval_size=8,
                       overrides=["model.d_model=16", "trainer.batch_size=4", "trainer.eval_batches=1"])

    def run(self) -> None:
        o = self.options
        rows = Rows(self.rows_path, ("run", "seed", "test_len", "depth"))
        torch.set_num_threads(self.threads)
        for seed in o.seeds:
            for spec in o.runs:
                wanted = [(f * o.train_len, d) for f in o.factors for d in o.depths]
                if all(rows.has(run=spec, seed=seed, test_len=n, depth=depth_name(d)) for n, d in wanted):
                    continue
                run_dir = train(["experiment=passkey/len64", *spec.split(), f"seed={seed}",
                                 f"trainer.seq_len={o.train_len}", f"trainer.max_steps={o.steps}",
                                 f"optim.lr={o.lr}", f"optim.warmup={o.warmup}", f"trainer.eval_every={o.steps}",
                                 "trainer.progress=false", "trainer.device=cpu", "logger=csv", *o.overrides],
                                self.paths.runs / f"passkey_{run_name(spec)}_s{seed}", threads=self.threads)
                for length, depth in wanted:
                    if not rows.has(run=spec, seed=seed, test_len=length, depth=depth_name(depth)):
                        rows.add([self.measure(spec, seed, run_dir, length, depth)])

    def measure(self, spec: str, seed: int, run_dir: Path, length: int, depth: float) -> dict[str, Any]:
        result, _ = run_outcome(run_dir)
        stored = json.loads((run_dir / "config.json").read_text())
        model_config, data = stored["model_config"], stored["config"]["data"]
        begin = time.perf_counter()
        scored = score(run_dir / "checkpoints" / "last.pt", length, depth, self.options.eval_size)
        reach = reach_share(model_config, length, depth, n_digits=data["n_digits"])
        return dict(run=spec, label=label(model_config, spec), seed=seed, train_len=self.options.train_len,
                    test_len=length, factor=length // self.options.train_len, depth=depth_name(depth), **scored,
                    reach="" if reach is None else f"{reach:.4f}", train_accuracy=f"{result['final_metric']:.4f}",
                    steps=result["steps"], params=result["params"], train_wall_s=f"{result['wall_s']:.0f}",
                    score_s=f"{time.perf_counter() - begin:.1f}", load_1min=load_now())

    def report(self, rows: list[dict[str, str]]) -> str:
        o = self.options
        labels = list(dict.fromkeys(r["label"] for r in rows))
        lengths = sorted({int(r["test_len"]) for r in rows})
        depths = list(dict.fromkeys(r["depth"] for r in rows))
        cells = self.cells(rows)

        def cell(name: str, length: int, depth: str) -> str:
            acc, reach, refused = cells.get((name, length, depth), (None, None, ""))
            if refused:
                return "refused"
            text = "-" if acc is None else f"{acc:.2f}"
            return text + (f" ({reach:.2f})" if reach is not None else "")

        def depth_cells(name: str, length: int) -> str:
            """``1.00 / 0.09 (out)``: a cell per fixed depth, marked where the window cannot reach the key."""
            texts = []
            for depth in fixed:
                reach = cells.get((name, length, depth), (None, None, ""))[1]
                out = reach is not None and reach < o.solved
                texts.append(cell(name, length, depth).split(" (")[0] + (" (out)" if out else ""))
            return "refused" if set(texts) == {"refused"} else " / ".join(texts)

        fixed = [d for d in depths if d != "uniform"]
        head = ["run", *[f"{n:,} ({n // o.train_len}x)" for n in lengths]]
        lines = [
            f"Budget: each run trained once, {o.steps:,} steps of 32 fresh examples at length {o.train_len} "
            f"(experiment=passkey/len64: 5-digit key, 16-word repeated filler, vocabulary 28; vanilla_lm pre-norm, "
            f"2 layers, d_model 64, 2 heads, MLP 128), AdamW lr {o.lr:g}, warm-up {o.warmup} steps, cosine to zero; "
            f"the last checkpoint scored on {o.eval_size} held-out examples per (length, depth), accuracy per digit "
            f"(chance 0.10). Seeds {sorted({int(r['seed']) for r in rows})}, one thread, one run at a time, "
            f"1-minute load average {load_range(rows)} while scoring. Retrieves: accuracy >= {o.solved:g}."
            + (f" Every run also had `{' '.join(o.overrides)}`." if o.overrides else ""),
            "",
            "**Key at a uniform place** (in parentheses: the share of digits a window can reach at all):",
            "",
            *markdown_table(head, [[f"`{n}`", *[cell(n, length, "uniform") for length in lengths]] for n in labels]),
        ]
        if fixed:
            lines += ["", f"**Key at fixed depths** (each cell: depth {' / '.join(fixed)} of the filler; 0 = first, "
                      f"1 = just before the question; (out): under {o.solved:g} of the key's digits within the "
                      "window's reach):",
                      "",
                      *markdown_table(head, [[f"`{n}`", *[depth_cells(n, length) for length in lengths]]
                                             for n in labels])]
        lines += ["", "![accuracy per digit against test length, a panel per depth](passkey.png)", "",
                  "**Verdict per run:**", "", *[f"- {self.verdict(n, lengths, depths, cells)}" for n in labels],
                  "", "Runs: " + "; ".join(f"`{n}` = `{next(r['run'] for r in rows if r['label'] == n)}`"
                                           for n in labels) + "."]
        self.figure(labels, lengths, depths, cells)
        return "\n".join(lines)

    @staticmethod
    def cells(rows: list[dict[str, str]]) -> dict[tuple[str, int, str], tuple[float | None, float | None, str]]:
        """(label, test length, depth) -> (mean accuracy over seeds or None, reach share or None, refusal)."""
        groups: dict[tuple[str, int, str], list[dict[str, str]]] = {}
        for row in rows:
            groups.setdefault((row["label"], int(row["test_len"]), row["depth"]), []).append(row)
        out = {}
        for key, mine in groups.items():
            scored = [float(r["accuracy"]) for r in mine if r["accuracy"]]
            reach = float(mine[0]["reach"]) if mine[0].get("reach") else None
            out[key] = (sum(scored) / len(scored) if scored else None, reach, mine[0].get("refused", ""))
        return out

    def verdict(self, name: str, lengths: list[int], depths: list[str], cells: dict) -> str:
        """Retrieves everywhere / does not learn at 1x / cannot by construction (refusal, window) / fails from X."""
        solved, train_len = self.options.solved, self.options.train_len
        mine = {(n, d): cells[(name, n, d)] for n in lengths for d in depths if (name, n, d) in cells}
        refused = sorted(n for (n, _), (_, _, why) in mine.items() if why)
        failed = {(n, d): c for (n, d), c in mine.items() if not c[2] and c[0] is not None and c[0] < solved}
        if not failed and not refused:
            low = min(c[0] for c in mine.values())
            return f"`{name}` retrieves at every length tested ({lengths[0]:,}-{lengths[-1]:,}), every depth " \
                   f"(lowest {low:.2f})."
        # the window's failure: the key lies out of its reach, and the run answers what it can reach
        blind = {k for k, c in failed.items() if c[1] is not None and c[1] < solved and c[0] >= c[1] - CEILING_SLACK}
        missed = {k: c for k, c in failed.items() if k not in blind}
        if any(n == train_len for n, _ in missed):
            at_one = ", ".join(f"{d} {c[0]:.2f}" for (n, d), c in missed.items() if n == train_len)
            return f"`{name}` does not solve the task at its training length {train_len} at this budget (1x: depth " \
                   f"{at_one})."
        parts = []
        if refused:
            parts.append(f"cannot by construction past {max(n for n in lengths if n not in refused):,}: the model "
                         f"refuses {refused[0]:,} and longer (its position table ends there)")
        if blind:
            text = f"cannot by construction where the key lies beyond its window ({len(blind)} cells, each at the " \
                   "share of digits it can reach)"
            reached = [c[0] for c in mine.values() if c[1] is not None and c[1] >= solved and c[0] is not None]
            if reached and min(reached) >= solved:
                text += f"; where the window reaches every digit it retrieves (lowest {min(reached):.2f})"
            parts.append(text)
        if missed:
            first = min(n for n, _ in missed)
            where = ", ".join(f"{d} {c[0]:.2f}" for (n, d), c in sorted(missed.items()) if n == first)
            parts.append(f"fails from {first:,} ({first // train_len}x; depth {where})")
        return f"`{name}` " + "; ".join(parts) + "."

    def figure(self, labels: list[str], lengths: list[int], depths: list[str], cells: dict) -> None:
        """A panel per depth: accuracy against test length, a line per run (windows dashed), refusals as x at 0."""
        columns = min(len(depths) + 1, 3)  # a spare panel holds the legend
        grid = (-(-(len(depths) + 1) // columns), columns)
        with saved_figure(self.paths.out / "passkey.png", *grid, figsize=(5.5 * columns, 3.8 * grid[0]), squeeze=False,
                          dpi=100) as (_, axes):
            for axis, depth in zip(axes.flat, depths):
                for i, name in enumerate(labels):
                    mine = [(n, cells[(name, n, depth)]) for n in lengths if (name, n, depth) in cells]
                    points = [(n, c[0]) for n, c in mine if c[0] is not None]
                    windowed = any(c[1] is not None for _, c in mine)
                    axis.plot(*zip(*points), marker="o", ms=4, color=f"C{i}", ls="--" if windowed else "-",
                              label=name)
                    refused = [n for n, c in mine if c[2]]
                    if refused:
                        axis.plot(refused, [0.0] * len(refused), "x", color=f"C{i}", ms=7)
                axis.axhline(0.1, color="grey", lw=0.8, ls=":")  # guessing a digit
                axis.axvline(self.options.train_len, color="grey", lw=0.8, ls=":")
                axis.set_xscale("log", base=2)
                axis.set(xlabel="test length (tokens)", ylabel="accuracy per digit", ylim=(-0.03, 1.03),
                         title=f"key at depth {depth}" if depth != "uniform" else "key at a uniform place")
            for axis in list(axes.flat)[len(depths):]:
                axis.axis("off")
            axes.flat[len(depths)].legend(*axes.flat[0].get_legend_handles_labels(), loc="center", fontsize=9,
                                          title="run (dashed: a window; x: refused; dotted: chance)")
