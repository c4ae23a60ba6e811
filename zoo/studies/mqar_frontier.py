"""The recall / state-size frontier on MQAR: each mechanism swept along the option that sets its decoding state.

Paper: Based (Arora et al. 2024, "Simple linear attention language models balance the recall-throughput
tradeoff", arXiv:2402.18668, Figure 2: MQAR accuracy against the bytes of recurrent state); the task is
Zoology's (Arora et al. 2023, arXiv:2312.04927). Question: on the cell where the mechanisms separate
(:mod:`zoo.studies.mqar_separation`: length 64, 4 pairs, d_model 64, 2 layers), how does each mechanism's
recall move as the option that sets its state moves, and which settings form the Pareto front (no other
setting recalls as well with fewer bytes)?

Each point is one training run of that cell through the app, the same budget and measurement as
``mqar_separation`` (its ``measure``: accuracy on 512 held-out examples, the decoding state per layer
counted from the state the trained model returns after 64 tokens). The points differ only in the run's
overrides, e.g. a local window's ``block`` and ``memory``, linear attention's head count (its state is
``heads x d_head^2``), GLA's ``expand_k``, the gated delta rule's ``expand_v``, attention's ``n_kv_heads``.
A point's family (a line of the figure) is its ``attention=`` item. The front is :func:`zoo.app.recall.pareto_front`'s,
over every point of the study.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from zoo.app.aggregate import mean_interval
from zoo.app.recall import pareto_front
from zoo.studies.base import STUDY
from zoo.studies.common import Rows, load_range, markdown_table, saved_figure, train
from zoo.studies.mqar_separation import PAIRS, MQARSeparation, run_name
from zoo.studies.mqar_separation import Options as SeparationOptions

# Ordered so that a study stopped early has the sweep of each family's cheap end first.
RUNS = [
    "attention=vanilla",
    "attention=vanilla attention.n_kv_heads=1",
    "attention=gated_deltanet attention.expand_v=0.5",
    "attention=gated_deltanet attention.expand_v=1",
    "attention=gated_deltanet",
    "attention=local_1d attention.block=8 attention.memory=8",
    "attention=local_1d attention.block=16 attention.memory=16",
    "attention=local_1d attention.block=32 attention.memory=32",
    "attention=linear model.n_heads=4",
    "attention=linear",
    "attention=linear model.n_heads=1",
    "attention=gla attention.expand_k=0.25",
    "attention=gla",
    "attention=gla attention.expand_k=1.0",
    "attention=performer attention.n_features=16",
    "attention=performer attention.n_features=64",
    "attention=sparse_strided attention.stride=8",
    "attention=sparse_strided attention.stride=16",
    "attention=adaptive_span",
]


@dataclass
class Options(SeparationOptions):
    runs: list[str] = field(default_factory=lambda: list(RUNS))  # each: app overrides of one point
    seeds: list[int] = field(default_factory=lambda: [0])


def family(spec: str) -> str:
    """``"attention=gla attention.expand_k=0.25"`` -> ``"gla"``: the line a point belongs to."""
    named = [item.split("=", 1)[1] for item in spec.split() if item.startswith(("attention=", "model.attention="))]
    return named[0] if named else "vanilla"


def setting(spec: str) -> str:
    """The point's own options (``block=8 memory=8``), or ``default`` when the family runs as it comes."""
    own = [item.split(".", 1)[-1] for item in spec.split() if not item.startswith(("attention=", "model.attention="))]
    return " ".join(own) or "default"


@STUDY.register("mqar_frontier")
class MQARFrontier(MQARSeparation):
    Options = Options
    question = ("On the MQAR cell where the mechanisms separate (length 64, 4 pairs, d_model 64, 2 layers), how does "
                "each mechanism's recall move with the option that sets its decoding state, and which settings form "
                "the Pareto front of recall against state bytes?")
    figures = ("mqar_frontier.png",)

    def run(self) -> None:
        o = self.options
        rows = Rows(self.rows_path, ("run", "seed", "kind", "step"))
        for seed in o.seeds:
            for spec in o.runs:
                if rows.has(run=spec, seed=seed, kind="final", step=o.steps):
                    continue
                rate = [] if "optim.lr=" in spec else [f"optim.lr={o.lr}"]  # a point may set its own rate
                run_dir = self.paths.runs / f"frontier_{run_name(spec)}_s{seed}"
                train(["experiment=mqar/len64", *spec.split(), f"seed={seed}", f"trainer.max_steps={o.steps}", *rate,
                       f"optim.warmup={o.warmup}", f"trainer.eval_every={o.eval_every}", "trainer.progress=false",
                       "trainer.device=cpu", "logger=csv", *o.overrides], run_dir, threads=self.threads)
                rows.add(self.measure(spec, seed, run_dir))

    def points(self, finals: list[dict[str, str]]) -> list[dict[str, Any]]:
        """One point per run (mean over its seeds), in the shape :func:`pareto_front` reads."""
        out = []
        for spec in dict.fromkeys(r["run"] for r in finals):
            mine = [r for r in finals if r["run"] == spec]
            accuracy = [float(r["accuracy"]) for r in mine]
            state = mine[0]["state_bytes_per_layer"]
            out.append(dict(run=spec, family=family(spec), setting=setting(spec), seq_len=64,
                            state_bytes_per_layer=float(state) if state else None,
                            accuracy=mean_interval(accuracy).mean, seeds=" ".join(f"{a:.3f}" for a in accuracy),
                            ceiling=mine[0].get("window_ceiling", ""), wall_s=mine[0]["wall_s"]))
        return out

    def report(self, rows: list[dict[str, str]]) -> str:
        o = self.options
        finals = [r for r in rows if r["kind"] == "final"]
        points = self.points(finals)
        front = sorted(pareto_front(points), key=lambda p: p["state_bytes_per_layer"])
        on_front = {p["run"] for p in front}
        self.figure(points, front)
        table = [[f"`{p['family']}`", p["setting"],
                  f"{int(p['state_bytes_per_layer']):,}" if p["state_bytes_per_layer"] else "none", p["seeds"],
                  f"{float(p['ceiling']):.3f}" if p["ceiling"] else "-", "yes" if p["run"] in on_front else "",
                  p["wall_s"]] for p in sorted(points, key=lambda p: (p["family"], p["state_bytes_per_layer"] or 0))]
        seeds = sorted({int(r["seed"]) for r in finals})
        return "\n".join([
            f"Budget per point: {o.steps:,} steps of 32 fresh examples (experiment=mqar/len64: vocabulary 256, length "
            f"64, {PAIRS} pairs, d_model 64, 2 layers, 2 heads unless the point sets `n_heads`, learned positions), "
            f"AdamW lr {o.lr:g} unless the point sets its own, {o.warmup} warm-up steps, cosine to zero; final query "
            f"accuracy on 512 held-out examples. Seeds {seeds}; one thread per run, one run at a time, 1-minute load "
            f"average {load_range(finals)} at the runs' ends. The plateau (some value of the context) scores "
            f"{1 / PAIRS:.2f}.",
            "",
            *markdown_table(["family", "setting", "decoding state per layer (bytes, measured)", "final accuracy "
                             "per seed", "window's ceiling", "on the front", "wall s"], table),
            "",
            "![recall against decoding state](mqar_frontier.png)",
            "",
            "**The Pareto front** (no other point recalls as well with fewer bytes), from the least state up: "
            + "; ".join(f"`{p['family']}` {p['setting']} ({int(p['state_bytes_per_layer']):,} B, "
                        f"{p['accuracy']:.3f})" for p in front) + ".",
            "",
            "**Per family** (accuracy as its state grows):",
            "",
            *[f"- {line}" for line in self.trends(points)],
        ])

    def trends(self, points: list[dict[str, Any]]) -> list[str]:
        solved, lines = self.options.solved, []
        for name in dict.fromkeys(p["family"] for p in points):
            line = sorted((p for p in points if p["family"] == name and p["state_bytes_per_layer"]),
                          key=lambda p: p["state_bytes_per_layer"])
            if not line:
                continue
            walk = " -> ".join(f"{p['accuracy']:.3f} at {int(p['state_bytes_per_layer']):,} B" for p in line)
            recalling = [p for p in line if p["accuracy"] >= solved]
            if recalling:
                least = recalling[0]
                verdict = (f"recalls (>= {solved:g}) from {int(least['state_bytes_per_layer']):,} B "
                           f"({least['setting']})")
            elif max(p["accuracy"] for p in line) <= 1 / PAIRS + 0.05:
                verdict = "stays on the plateau at every state size tried: state is not what it lacks at this budget"
            else:
                verdict = f"does not reach {solved:g} at any state size tried"
            lines.append(f"`{name}`: {walk}; {verdict}.")
        return lines

    def figure(self, points: list[dict[str, Any]], front: list[dict[str, Any]]) -> None:
        path = self.paths.out / "mqar_frontier.png"
        with saved_figure(path, figsize=(7.5, 4.5), dpi=110) as (_, axis):
            for i, name in enumerate(dict.fromkeys(p["family"] for p in points)):
                line = sorted((p for p in points if p["family"] == name and p["state_bytes_per_layer"]),
                              key=lambda p: p["state_bytes_per_layer"])
                if line:
                    axis.plot([p["state_bytes_per_layer"] for p in line], [p["accuracy"] for p in line],
                              marker="o", color=f"C{i % 10}", label=name)
            if front:
                axis.step([p["state_bytes_per_layer"] for p in front], [p["accuracy"] for p in front], where="post",
                          color="black", lw=0.8, ls="--", label="Pareto front")
            axis.axhline(1 / PAIRS, color="grey", lw=0.8, ls=":")
            axis.set_xscale("log", base=2)
            axis.set(xlabel="decoding state per layer (bytes, measured after 64 tokens)", ylabel="final query accuracy",
                     ylim=(0, 1.02), title="MQAR recall against state (length 64, 4 pairs, d_model 64)")
            axis.legend(fontsize=7, loc="best")
