"""What recomputing the band in backward costs: one attention call, plain autograd against
``recompute_in_backward`` (``zoo/attention/recompute.py``), in paired alternating rounds.

Adaptive span's blocked attention (Sukhbaatar et al. 2019, arXiv:1905.07799) and the merged-head ("union")
sparse pattern (Child et al. 2019, arXiv:1904.10509) keep only q, k, v (and the spans) for backward and
recompute the band there, which brings their activation memory down to dense SDPA's (``results/perf/``).
Question: what does that cost in time? One more forward pass of the attention inside a forward + backward
should cost about a third more; the claim checked is that it stays under 2x the plain call.

Setting: projected heads [1, heads, length, head_dim] (the attention call alone, no projections or
feed-forward, so a whole training step slows by less); adaptive span with a fixed span S = ``max_span``
and with a learned span z = ``span``; ``sparse_fixed`` union with stride ``stride`` and c = ``c``. Each
round times a forward + backward of both modes in an order rotated each round, after an unrecorded
warm-up round (``zoo.bench.paired_rounds``); the row is the median of the rounds' ratios with min-max.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch

import zoo
from zoo.attention.blocked import key_validity
from zoo.attention.recompute import recompute_in_backward
from zoo.attention.span_band import blocked_span_attention
from zoo.bench import clocked, paired_ratios, paired_rounds
from zoo.config import require
from zoo.studies.base import STUDY, Study
from zoo.studies.common import Rows, bars_figure, number

LIMIT = 2.0  # recomputed / plain time below this: the price is at most one more pass, as designed


@dataclass
class Options:
    length: int = 4096
    rounds: int = 5
    heads: int = 4
    head_dim: int = 64
    max_span: int = 1024  # adaptive span's S (the fixed case's span)
    span: int = 224  # the learned case's span z
    ramp: int = 32  # adaptive span's soft-mask ramp R
    stride: int = 128  # sparse_fixed's l
    c: int = 32  # sparse_fixed's summary columns per block

    def __post_init__(self) -> None:
        require(self.rounds > 0 and self.length > 0, "study.rounds and study.length must be positive")
        require(self.length % self.stride == 0, f"study.length must be a multiple of study.stride={self.stride}")


@STUDY.register("recompute_cost")
class RecomputeCost(Study):
    Options = Options
    question = "What does recomputing the attention band in backward cost in time, against plain autograd?"
    figures = ("recompute_cost.png",)
    toy_options = dict(length=32, rounds=1, heads=2, head_dim=8, max_span=16, span=8, ramp=4, stride=8, c=2)

    def cases(self) -> dict[str, tuple]:
        """label -> (attention function, its inputs): the same q, k, v for every case."""
        o = self.options
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(1, o.heads, o.length, o.head_dim, generator=g, requires_grad=True) for _ in range(3))
        cases = {}
        for label, span in ((f"adaptive_span fixed S={o.max_span}", o.max_span), (f"adaptive_span z={o.span}", o.span)):
            spans = torch.full((o.heads,), float(span), requires_grad=True)
            attend = functools.partial(blocked_span_attention, ramp=o.ramp, reach=min(o.max_span, span + o.ramp - 1))
            cases[label] = (lambda q, k, v, spans, attend=attend: attend(q, k, v, spans=spans), (q, k, v, spans))
        union = zoo.create_attention("sparse_fixed", d_model=o.heads * o.head_dim, n_heads=o.heads, causal=True,
                                     stride=o.stride, c=o.c, combine="union").train()
        valid = key_validity(None, o.length, o.length, q.device)
        cases[f"sparse_fixed union l={o.stride}"] = (functools.partial(union.merged, stride=o.stride), (q, k, v, valid))
        return cases

    def run(self) -> None:
        o, rows = self.options, Rows(self.rows_path, ("attention", "length"))

        def step(fn, inputs, recompute: bool) -> None:
            out = recompute_in_backward(fn, *inputs) if recompute else fn(*inputs)
            out.sum().backward()

        for label, (fn, inputs) in self.cases().items():
            if rows.has(attention=label, length=o.length):
                continue
            steps = {mode: clocked(functools.partial(step, fn, inputs, mode == "recomputed"))
                     for mode in ("plain", "recomputed")}
            cost = paired_ratios(paired_rounds(steps, o.rounds), "recomputed")["plain"]  # recomputed / plain time
            rows.add([dict(attention=label, length=o.length, heads=o.heads, head_dim=o.head_dim, ratio=cost["ratio"],
                           ratio_min=cost["ratio_min"], ratio_max=cost["ratio_max"], rounds=o.rounds,
                           threads=self.threads, load_1min=round(os.getloadavg()[0], 1))])

    def report(self, rows: list[dict[str, str]]) -> str:
        first = rows[0]
        lines = [
            f"One attention call (forward + backward) on projected heads [1, {first['heads']}, length, "
            f"{first['head_dim']}], {first['rounds']} alternating rounds, {first['threads']} thread(s), 1-minute load "
            f"average {', '.join(sorted({r['load_1min'] for r in rows}))}.",
            "",
            "| attention | length | recomputed / plain time, median (min-max) |",
            "|---|---|---|",
        ]
        bars = {}
        for row in rows:
            ratio = (number(row, "ratio"), number(row, "ratio_min"), number(row, "ratio_max"))
            bars[f"{row['attention']} @{int(row['length']):,}"] = ratio
            cell = f"{ratio[0]:.2f}x ({ratio[1]:.2f}-{ratio[2]:.2f})"
            lines.append(f"| {row['attention']} | {int(row['length']):,} | {cell} |")
        bars_figure(self.paths.out / "recompute_cost.png", bars, ylabel="recomputed / plain time", reference=1.0,
                    title="Recomputing in backward, one call")
        worst = max(bars.values())[0]
        verdict = (f"**Verdict: the cost stays under {LIMIT:.0f}x**" if worst < LIMIT else
                   f"**Verdict: the cost exceeds {LIMIT:.0f}x**")
        lines += ["", "![recomputed / plain time](recompute_cost.png)", "",
                  f"{verdict}: the median ratio is at most {worst:.2f}x (the attention call alone; a whole training "
                  "step also runs the projections and the feed-forward, so it slows by less)."]
        return "\n".join(lines)
