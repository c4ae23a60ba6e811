"""Context parallelism on one machine: activation bytes per rank, the longest sequence a per-rank budget
holds, and the time of a training step, at N ranks (gloo, one thread each).

Paper: Liu, Zaharia, Abbeel 2023, "Ring Attention with Blockwise Transformers for Near-Infinite Context",
arXiv:2310.01889: with each sequence split over N devices and the key/value blocks passed around a ring,
the activation memory per device falls as 1 / N, so the longest sequence a device's memory holds grows N-fold.

Here: one 2-layer LM skeleton (``vanilla_lm``: d 128, 4 heads, d_ff 512, vocab 256, batch 1, fp32, dropout
0) with three mechanisms, ``vanilla`` (ring attention, zigzag layout), ``local_1d`` (a halo) and
``sparse_fixed`` (a halo and the summaries); every point in fresh forked processes, what is measured and how
in ``zoo/bench/context.py``. Rows are of three kinds: ``bytes`` (per setup, N and rank at ``bytes_length``),
``longest`` (per setup and N, with every probe of the search) and ``step`` (per setup, N, threads, round).
"""

from __future__ import annotations

import json
import os
import statistics
from dataclasses import dataclass, field

from zoo.bench.context import Setup, bytes_per_rank, longest_within, step_rounds
from zoo.config import require
from zoo.studies.base import STUDY, Study
from zoo.studies.common import Rows, load_now, load_range, markdown_table, number, saved_figure

MIB = 2**20
GROWS_WITH_N = 0.9  # the claim shows for a setup whose longest sequence grows at least this share of N-fold


@dataclass
class Options:
    mechanisms: list[str] = field(default_factory=lambda: ["vanilla", "local_1d", "sparse_fixed"])
    ranks: list[int] = field(default_factory=lambda: [1, 2, 4])
    bytes_length: int = 8192
    budget_mib: float = 128.0
    grain: int = 512
    time_length: int = 4096
    rounds: int = 3
    steps: int = 2
    all_cores: bool = True  # also time one process on every core of the machine
    block: int = 128  # local_1d's block and memory, sparse_fixed's stride
    d_model: int = 128  # the skeleton's width and depth (the toy run shrinks them)
    n_layers: int = 2

    def __post_init__(self) -> None:
        require(self.ranks and self.ranks[0] == 1 and self.ranks == sorted(set(self.ranks)),
                f"study.ranks must start at 1 (the baseline) and rise, got {self.ranks}")
        require(set(self.mechanisms) <= set(SETUPS), f"study.mechanisms: choose among {', '.join(SETUPS)}")
        require(self.grain > 0 and self.rounds > 0 and self.steps > 0, "study.grain, rounds, steps must be > 0")


# mechanism -> (its label, its attention options) at block length b
SETUPS = {
    "vanilla": lambda b: ("vanilla (ring)", {"name": "vanilla"}),
    "local_1d": lambda b: (f"local_1d (block {b}, memory {b})", {"name": "local_1d", "block": b, "memory": b}),
    "sparse_fixed": lambda b: (f"sparse_fixed (stride {b}, c 8, union)",
                               {"name": "sparse_fixed", "stride": b, "c": 8, "combine": "union"}),
}


def setups(o: Options) -> list[Setup]:
    shape = {"vocab_size": 256, "d_model": o.d_model, "n_heads": 4, "n_layers": o.n_layers, "d_ff": 4 * o.d_model,
             "dropout": 0.0, "max_len": 1 << 20}
    made = [SETUPS[name](o.block) for name in o.mechanisms]
    return [Setup(label, overrides={"attention": attention}, shape=shape) for label, attention in made]


@STUDY.register("context_parallel")
class ContextParallelCost(Study):
    Options = Options
    question = ("Does splitting each sequence over N ranks cut the activation bytes per rank by N and grow the "
                "longest sequence a per-rank budget holds N-fold, and what does a step cost with gloo on a CPU?")
    figures = ("context_parallel.png",)
    toy_options = dict(mechanisms=["vanilla"], ranks=[1, 2], bytes_length=64, budget_mib=0.07, grain=32,
                       time_length=64, rounds=1, steps=1, all_cores=False, block=16, d_model=16, n_layers=1)

    def run(self) -> None:
        o = self.options
        rows = Rows(self.rows_path, ("kind", "setup", "ranks"))
        for setup in setups(o):
            for world in o.ranks:
                if not rows.has(kind="bytes", setup=setup.label, ranks=world):
                    rows.add(dict(kind="bytes", setup=setup.label, ranks=world, rank=rank, bytes=count,
                                  length=o.bytes_length, load_1min=load_now())
                             for rank, count in enumerate(bytes_per_rank(setup, world, o.bytes_length)))
        for setup in setups(o):
            for world in o.ranks:
                if not rows.has(kind="longest", setup=setup.label, ranks=world):
                    found = longest_within(setup, world, int(o.budget_mib * MIB), o.grain)
                    rows.add([dict(kind="longest", setup=setup.label, ranks=world, longest=found["longest"],
                                   bytes_at_longest=found["bytes_at_longest"], probes=json.dumps(found["probes"]),
                                   budget_mib=o.budget_mib, grain=o.grain, load_1min=load_now())])
        # one thread per rank; one process is timed with one thread and with every core of the machine
        runs = [(1, 1), *[(w, 1) for w in o.ranks if w > 1], *([(1, os.cpu_count() or 1)] if o.all_cores else [])]
        for setup in setups(o):
            if not rows.has(kind="step", setup=setup.label, ranks=1):
                rows.add(dict(kind="step", **r, length=o.time_length, steps=o.steps, load_1min=load_now())
                         for r in step_rounds(setup, runs, o.time_length, o.rounds, o.steps))

    def report(self, rows: list[dict[str, str]]) -> str:
        of = {kind: [r for r in rows if r["kind"] == kind] for kind in ("bytes", "longest", "step")}
        labels = list(dict.fromkeys(r["setup"] for r in rows))
        worlds = sorted({int(r["ranks"]) for r in of["bytes"] + of["longest"]})
        per_rank: dict[tuple[str, int], list[float]] = {}
        for r in of["bytes"]:
            per_rank.setdefault((r["setup"], int(r["ranks"])), []).append(number(r, "bytes") / MIB)
        most = {key: max(values) for key, values in per_rank.items()}
        least = {key: min(values) for key, values in per_rank.items()}
        longest = {(r["setup"], int(r["ranks"])): r for r in of["longest"]}
        lines = [f"1-minute load average while measuring: {load_range(rows)} (bytes are exact and load-independent; "
                 "times are not)."]
        if of["bytes"]:
            lines += ["", f"**Activation bytes per rank at {int(of['bytes'][0]['length']):,} tokens** (saved for "
                      "backward, most / least loaded rank)", "", *markdown_table(
                          ["setup", *(f"N = {w}" for w in worlds), "N=1 / N=max"],
                          ([label, *(f"{most[label, w]:.1f} / {least[label, w]:.1f} MiB" for w in worlds),
                            f"{most[label, worlds[0]] / most[label, worlds[-1]]:.2f}x"] for label in labels))]
        if of["longest"]:
            first = of["longest"][0]
            lines += ["", f"**Longest sequence whose most loaded rank saves at most {number(first, 'budget_mib'):g} "
                      f"MiB** (grid of {first['grain']}; every probe a real forward, doubling then bisection)", "",
                      *markdown_table(["setup", *(f"N = {w}" for w in worlds)], (
                          [label, *(self.longest_cell(longest.get((label, w))) for w in worlds)] for label in labels))]
        if of["step"]:
            lines += ["", *self.step_table(of["step"], labels)]
        self.figure(most, longest, labels, worlds, of)
        lines += ["", "![bytes per rank and longest sequence against N](context_parallel.png)", "",
                  self.verdict(longest, labels, worlds)]
        return "\n".join(lines)

    @staticmethod
    def longest_cell(row: dict[str, str] | None) -> str:
        if row is None or not row["bytes_at_longest"]:  # not measured, or not even one grain fits the budget
            return "-" if row is None else "none"
        return f"{int(row['longest']):,} ({number(row, 'bytes_at_longest') / MIB:.1f} MiB)"

    @staticmethod
    def step_table(steps: list[dict[str, str]], labels: list[str]) -> list[str]:
        runs = list(dict.fromkeys((int(r["ranks"]), int(r["threads"])) for r in steps))
        names = [f"N = {w}, {t} thread{'s' if t > 1 else ''}{' per rank' if w > 1 else ''}" for w, t in runs]
        first = steps[0]
        body = []
        for label in labels:
            times = {run: [number(r, "step_s") for r in steps if (r["setup"], int(r["ranks"]), int(r["threads"]))
                           == (label, *run)] for run in runs}
            body.append([label, *(
                f"{statistics.median(times[run]) * 1e3:,.0f} ms "
                f"({statistics.median(t / b for t, b in zip(times[run], times[runs[0]])):.2f}x)" for run in runs)])
        rounds = len({r["round"] for r in steps})
        return [f"**Time of one training step at {int(first['length']):,} tokens** (forward + backward + gradient "
                f"all-reduce; median of {first['steps']} steps per launch, median over {rounds} rounds in rotated "
                "order; in brackets the median over rounds of the ratio to one process on one thread)", "",
                *markdown_table(["setup", *names], body)]

    @staticmethod
    def verdict(longest: dict, labels: list[str], worlds: list[int]) -> str:
        """Per setup: does the longest sequence within the budget grow at least ``GROWS_WITH_N`` x N-fold?"""
        n = worlds[-1]
        grown = {label: int(longest[label, n]["longest"]) / max(int(longest[label, 1]["longest"]), 1)
                 for label in labels if (label, 1) in longest and (label, n) in longest}
        if n == 1 or not grown:
            return "**Verdict: not enough rows** (the longest sequence at N = 1 and at a larger N are needed)."
        shows = [f"{label} {g:.2f}x" for label, g in grown.items() if g >= GROWS_WITH_N * n]
        not_shown = [f"{label} {g:.2f}x" for label, g in grown.items() if g < GROWS_WITH_N * n]
        said = [f"{what} for {', '.join(which)}" for what, which in (("shows", shows), ("does not show", not_shown))
                if which]
        return (f"**Verdict** (the longest sequence within the per-rank budget at N = {n} against N = 1; the claim "
                f"shows at {GROWS_WITH_N} x {n} = {GROWS_WITH_N * n:.1f}x or more): the claim {'; '.join(said)}.")

    def figure(self, most: dict, longest: dict, labels: list[str], worlds: list[int], of: dict) -> None:
        from matplotlib.ticker import NullLocator

        with saved_figure(self.paths.out / "context_parallel.png", 1, 2, figsize=(10, 4)) as (_, (left, right)):
            for label in labels:
                left.plot(worlds, [most.get((label, w)) for w in worlds], marker="o", label=label)
                found = [int(longest[label, w]["longest"]) if (label, w) in longest else None for w in worlds]
                right.plot(worlds, found, marker="o", label=label)
            left.set(xscale="log", yscale="log", xlabel="ranks N", ylabel="MiB saved, most loaded rank")
            if of["bytes"]:
                left.set_title(f"activation bytes per rank at {int(of['bytes'][0]['length']):,} tokens")
            right.set(xscale="log", yscale="log", xlabel="ranks N", ylabel="tokens")
            if of["longest"]:
                right.set_title(f"longest sequence within {number(of['longest'][0], 'budget_mib'):g} MiB per rank")
            for ax in (left, right):
                ax.xaxis.set_minor_locator(NullLocator())  # ticks at the N measured only
                ax.set_xticks(worlds, [str(w) for w in worlds])
                ax.grid(True, which="both", alpha=0.3)
            right.legend(loc="upper left", fontsize=8)
