"""ALiBi's signature claim: train short, test long.

Paper: Press, Smith and Lewis 2022, "Train Short, Test Long: Attention with Linear Biases Enables Input
Length Extrapolation", arXiv:2108.12409, Figure 1 (WikiText-103, trained at L = 512 and 1,024, evaluated at
longer L without overlap): ALiBi's perplexity stays flat or keeps falling past the training length, the
sinusoidal model's rises sharply just past it, rotary and the T5 bias degrade more slowly.

Here: the same small model (``vanilla_lm``, pre-norm, d 128, 4 layers, 4 heads, d_ff 512, dropout 0.1,
max_len 2,048) is trained by the app on Tiny Shakespeare (characters, read in place) at length
``train_len`` with each position scheme and seed, the same data order per seed, the same steps; then each
best checkpoint is scored on the test split at every evaluation length L with two protocols
(``zoo/train/eval_protocols.py``): ``segment``, non-overlapping segments of L each scored on its own (the
paper's Figure 1), and ``sliding``, windows of L moved by L / 2 each scoring only its new tokens.
``learned`` positions have a table of 2,048 rows of which only the first ``train_len`` are trained: past it
a learned model reads untrained rows (that is what "no extrapolation" means for it).

Deviations: characters, not WikiText-103 words; a 0.8M-parameter model trained for minutes on a CPU, not a
247M one for a day; training length 128 (the paper's shortest is 64 in its Table 5 sweep).
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field

import torch

from zoo.app.run import load_run
from zoo.config import require
from zoo.studies.base import STUDY, Study
from zoo.studies.common import Rows, number, panels_figure, spread, train
from zoo.train.eval_protocols import ProtocolSettings, evaluate_protocol

PROTOCOLS = ("segment", "sliding")


@dataclass
class Options:
    positions: list[str] = field(default_factory=lambda: ["sinusoidal", "learned", "rope", "alibi", "t5_bias"])
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    steps: int = 1000
    batch_size: int = 16
    train_len: int = 128
    lengths: list[int] = field(default_factory=lambda: [128, 256, 512, 1024, 2048])
    split: str = "test"
    d_model: int = 128  # the model's width and depth: the tests run a toy size through the same path
    n_layers: int = 4

    def __post_init__(self) -> None:
        require(self.split in ("val", "test"), f"study.split must be val or test, got {self.split!r}")
        require(self.steps > 0 and self.batch_size > 0, "study.steps and study.batch_size must be positive")
        require(self.train_len in self.lengths, f"study.lengths must include study.train_len={self.train_len}")


@STUDY.register("alibi_extrapolation")
class AlibiExtrapolation(Study):
    Options = Options
    question = "Does ALiBi keep its loss past the training length where the other position schemes degrade?"
    figures = ("extrapolation.png",)
    toy_options = dict(positions=["alibi"], seeds=[0], steps=2, batch_size=2, train_len=16, lengths=[16, 32],
                       d_model=16, n_layers=1)

    def train_overrides(self, position: str, seed: int) -> list[str]:
        o = self.options
        return [
            "experiment=shakespeare", "model=vanilla_lm", f"position={position}", "residual=pre_norm",
            f"model.d_model={o.d_model}", f"model.n_layers={o.n_layers}", "model.n_heads=4",
            f"model.d_ff={4 * o.d_model}", "model.dropout=0.1", f"model.max_len={max(o.lengths)}",
            f"trainer.seq_len={o.train_len}", f"trainer.batch_size={o.batch_size}", f"trainer.max_steps={o.steps}",
            f"trainer.eval_every={max(o.steps // 6, 1)}", "trainer.eval_batches=20", f"seed={seed}", "logger=csv",
        ]

    def run(self) -> None:
        o, rows = self.options, Rows(self.rows_path, ("position", "seed", "protocol", "eval_len"))
        torch.set_num_threads(self.threads)
        for seed in o.seeds:  # one seed of every scheme first: a partial study still compares them
            for position in o.positions:
                run_dir = train(self.train_overrides(position, seed), self.paths.runs / f"{position}-seed{seed}",
                                threads=self.threads)
                _, task, model, ckpt = load_run(run_dir / "checkpoints" / "best.pt")
                for protocol in PROTOCOLS:
                    for length in o.lengths:
                        if rows.has(position=position, seed=seed, protocol=protocol, eval_len=length):
                            continue
                        settings = ProtocolSettings(protocol, seq_len=length, batch_size=max(1, 8192 // length))
                        begin = time.perf_counter()
                        result = evaluate_protocol(model, task, o.split, settings)
                        rows.add([dict(
                            position=position, seed=seed, protocol=protocol, eval_len=length,
                            bpc=result[f"{o.split}/loss"] / math.log(2), scored=result[f"{o.split}/scored"],
                            step=ckpt["step"], seconds=round(time.perf_counter() - begin, 1),
                            load_1min=round(os.getloadavg()[0], 1),
                        )])

    @staticmethod
    def aggregate(rows: list[dict[str, str]]) -> dict[tuple[str, str, int], tuple[float, float, float, int]]:
        """(protocol, position, L) -> (mean, min, max, seeds) of the bpc over seeds."""
        groups: dict[tuple[str, str, int], list[float]] = {}
        for row in rows:
            groups.setdefault((row["protocol"], row["position"], int(row["eval_len"])), []).append(number(row, "bpc"))
        return {key: (*spread(values), len(values)) for key, values in groups.items()}

    def report(self, rows: list[dict[str, str]]) -> str:
        o, stats = self.options, self.aggregate(rows)
        positions = [p for p in o.positions if any(r["position"] == p for r in rows)]
        seeds = sorted({int(r["seed"]) for r in rows})
        loads = [number(r, "load_1min") for r in rows] or [0.0]
        lines = [
            f"Bits per character on the Tiny Shakespeare {o.split} split; every model trained at L = {o.train_len} "
            f"for {o.steps} steps of {o.batch_size} x {o.train_len} tokens, seeds {', '.join(map(str, seeds))} "
            f"(mean, min-max over seeds); 1-minute load average {min(loads):.1f}-{max(loads):.1f} while scoring.",
        ]
        for protocol in PROTOCOLS:
            lines += ["", f"**{protocol}**", "", "| position | " + " | ".join(f"L = {n:,}" for n in o.lengths) + " |",
                      "|---|" + "---|" * len(o.lengths)]
            for position in positions:
                cells = []
                for length in o.lengths:
                    value = stats.get((protocol, position, length))
                    cells.append("-" if value is None else f"{value[0]:.3f} ({value[1]:.3f}-{value[2]:.3f})")
                lines.append(f"| {position} | " + " | ".join(cells) + " |")
        longest = max(o.lengths)
        lines += ["", f"Change from L = {o.train_len} to L = {longest:,} (mean over seeds, bpc):", ""]
        for protocol in PROTOCOLS:
            changes = []
            for position in positions:
                short, long = stats.get((protocol, position, o.train_len)), stats.get((protocol, position, longest))
                if short and long:
                    changes.append(f"{position} {long[0] - short[0]:+.3f}")
            lines.append(f"- {protocol}: " + ", ".join(changes))
        lines += ["", self.verdict(stats, positions)]
        series = {
            f"{protocol} (trained at L = {o.train_len})": {
                position: [(n, *stats[key][:3]) for n in o.lengths if (key := (protocol, position, n)) in stats]
                for position in positions
            }
            for protocol in PROTOCOLS
        }
        panels_figure(self.paths.out / "extrapolation.png", series, xlabel="evaluation length L",
                      ylabel=f"bits per character ({o.split})", logx=True, vline=o.train_len)
        lines += ["", "![bpc against evaluation length](extrapolation.png)"]
        return "\n".join(lines)

    def verdict(self, stats: dict, positions: list[str]) -> str:
        """The claim shows when ALiBi's mean bpc at the longest length is no worse than at the training length
        on the paper's protocol while every other scheme's rises."""
        o, longest = self.options, max(self.options.lengths)
        change = {
            p: stats[("segment", p, longest)][0] - stats[("segment", p, o.train_len)][0]
            for p in positions
            if ("segment", p, longest) in stats and ("segment", p, o.train_len) in stats
        }
        if "alibi" not in change or len(change) < 2:
            return "**Verdict: not enough rows yet** (ALiBi and another scheme at both lengths are needed)."
        others = {p: c for p, c in change.items() if p != "alibi"}
        listed = ", ".join(f"{p} {c:+.3f}" for p, c in others.items())
        if change["alibi"] <= 0.0 and all(c > 0.0 for c in others.values()):
            return (f"**Verdict: the claim shows** on `segment`: ALiBi {change['alibi']:+.3f} bpc from L = "
                    f"{o.train_len} to {longest:,}, every other scheme worse ({listed}).")
        return f"**Verdict: the claim does not show** on `segment`: ALiBi {change['alibi']:+.3f} bpc, others {listed}."
