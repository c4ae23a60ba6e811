"""Multi-query associative recall separates the mechanisms: one Figure 2 cell of Zoology, every family.

Paper: Arora et al. 2023, "Zoology: Measuring and Improving Recall in Efficient Language Models",
arXiv:2312.04927 (MQAR, Figure 2); the recall / state axis is Based's (Arora et al. 2024, arXiv:2402.18668,
Figure 2). Question: on the smallest cell of Figure 2 (length 64, 4 key-value pairs, d_model 64, 2
layers), at a CPU budget where softmax attention leaves the plateau, which of the zoo's mechanisms recall,
and how many bytes of decoding state does each keep?

Each run is one training run of the app (``experiment=mqar/len64`` plus the run's overrides, app syntax
separated by spaces, e.g. ``attention=local_1d attention.block=4 attention.memory=4`` or a per-layer
hybrid ``model.attention=[{name:local_1d,block:4,memory:4},vanilla]``), so the budget is the experiment's
with ``steps``, ``lr`` and ``warmup`` set here. A row per evaluation (the curve) and one per finished run:
best and final query accuracy on the 512 held-out examples, the decoding state per layer measured from the
state the trained model returns after 64 tokens (:func:`zoo.app.recall.decoding_state`), parameters, wall
time and the load it ran under.

A windowed mechanism is scored against its ceiling: the share of held-out queries whose key lies within
what its layers can reach (each layer's fixed pattern, composed over the layers), from the task's own
generator. At or below that ceiling the window, not the training,
is what stops it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zoo.app.aggregate import mean_interval
from zoo.app.recall import attention_label, decoding_state, reachable_keys
from zoo.config import IGNORE_INDEX, require
from zoo.data.mqar import mqar_batch
from zoo.studies.base import STUDY, Study
from zoo.studies.common import Rows, load_now, load_range, markdown_table, run_outcome, saved_figure, train

WINDOW = "{name:local_1d,block:4,memory:4}"  # 5-8 keys per layer: most pairs lie further back (see the ceiling)
PAIRS = 4  # experiment=mqar/len64's key-value pairs (Zoology's Figure 2 at length 64)
CEILING_SLACK = 0.05  # a window's accuracy this far above its ceiling is guessing among values, not recall
RUNS = [
    "attention=vanilla",
    "attention=local_1d attention.block=4 attention.memory=4",
    "attention=linear",
    "attention=gated_deltanet",
    f"model.attention=[{WINDOW},vanilla]",
    "attention=gla",
]


@dataclass
class Options:
    runs: list[str] = field(default_factory=lambda: list(RUNS))  # each: app overrides of one mechanism
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    steps: int = 3000
    lr: float = 3.0e-3
    warmup: int = 100
    eval_every: int = 250
    solved: float = 0.9  # query accuracy that counts as recalling (the bar for attention)
    overrides: list[str] = field(default_factory=list)  # for every run (the toy test shortens the task here)

    def __post_init__(self) -> None:
        require(bool(self.runs) and bool(self.seeds), "study.runs and study.seeds must not be empty")
        require(self.steps > 0 and self.eval_every > 0, "study.steps and study.eval_every must be > 0")


def run_name(spec: str) -> str:
    """``"attention=local_1d attention.block=4"`` -> ``"local_1d_block_4"``: a run directory's name."""
    kept = [item.split("=", 1)[1] if item.startswith(("attention=", "model.attention=")) else item.removeprefix(
        "attention.") for item in spec.split()]
    return re.sub(r"[^A-Za-z0-9]+", "_", "_".join(kept)).strip("_")


def layer_attentions(model_config: dict[str, Any]) -> list[dict[str, Any]]:
    """The attention options of each layer (a per-layer list is cycled over ``n_layers``)."""
    attention = model_config.get("attention") or {}
    per_layer = attention if isinstance(attention, list) else [attention]
    per_layer = [a if isinstance(a, dict) else {"name": a} for a in per_layer]
    return [per_layer[i % len(per_layer)] for i in range(model_config["n_layers"])]


def label(model_config: dict[str, Any]) -> str:
    """``local_1d(4+4)+vanilla``: each distinct layer's mechanism (:func:`attention_label`)."""
    return "+".join(dict.fromkeys(attention_label(a) for a in layer_attentions(model_config)))


def window_ceiling(config: dict[str, Any], model_config: dict[str, Any], examples: int = 1024) -> float | None:
    """Share of held-out queries whose key the stack's fixed attention pattern reaches
    (:func:`zoo.app.recall.reachable_keys`; None when a layer reads every earlier key or picks them by
    content): from the task's own generator, so the share is of the queries this task asks."""
    reach = reachable_keys(model_config, config["trainer"]["seq_len"])
    if reach is None:
        return None
    data, pairs = config["data"], config["data"]["num_kv_pairs"]
    batch = mqar_batch(examples, config["trainer"]["seq_len"], seed=12345, vocab_size=data["vocab_size"],
                       num_kv_pairs=pairs, power_a=data["power_a"], random_non_queries=data["random_non_queries"])
    tokens, targets = batch["tokens"], batch["targets"]
    example, query = (targets != IGNORE_INDEX).nonzero(as_tuple=True)
    key_slot = (tokens[example, : 2 * pairs : 2] == tokens[example, query].unsqueeze(-1)).float().argmax(-1)
    return float(reach[query, 2 * key_slot].float().mean())


@STUDY.register("mqar_separation")
class MQARSeparation(Study):
    Options = Options
    question = ("On Zoology's smallest MQAR cell (length 64, 4 pairs, d_model 64, 2 layers), at a CPU budget where "
                "softmax attention leaves the plateau, which mechanisms recall, and with how many bytes of decoding "
                "state?")
    figures = ("mqar_separation.png",)
    toy_options = dict(runs=["attention=local_1d attention.block=4 attention.memory=4"],
                       seeds=[0], steps=2, warmup=1, eval_every=2,
                       overrides=["data.eval_size=32", "trainer.batch_size=4", "trainer.eval_batches=2"])

    def run(self) -> None:
        o = self.options
        rows = Rows(self.rows_path, ("run", "seed", "kind", "step"))
        for seed in o.seeds:  # seeds outer: a study stopped early has every mechanism at the first seeds
            for spec in o.runs:
                if rows.has(run=spec, seed=seed, kind="final", step=o.steps):
                    continue
                run_dir = self.paths.runs / f"mqar_{run_name(spec)}_s{seed}"
                train(["experiment=mqar/len64", *spec.split(), f"seed={seed}", f"trainer.max_steps={o.steps}",
                       f"optim.lr={o.lr}", f"optim.warmup={o.warmup}", f"trainer.eval_every={o.eval_every}",
                       "trainer.progress=false", "trainer.device=cpu", "logger=csv", *o.overrides],
                      run_dir, threads=self.threads)
                rows.add(self.measure(spec, seed, run_dir))

    def measure(self, spec: str, seed: int, run_dir: Path) -> list[dict[str, Any]]:
        """The run's evaluations, then its final row: accuracy, measured decoding state, ceiling, cost."""
        result, metrics = run_outcome(run_dir)
        stored = json.loads((run_dir / "config.json").read_text())
        config, model_config = stored["config"], stored["model_config"]
        state, why = decoding_state(model_config, config["trainer"]["seq_len"])
        ceiling = window_ceiling(config, model_config)
        common = dict(run=spec, mechanism=label(model_config), seed=seed)
        rows = [dict(common, kind="eval", step=int(m["step"]), accuracy=f"{float(m['val/accuracy']):.4f}")
                for m in metrics if m.get("val/accuracy")]
        return rows + [dict(common, kind="final", step=result["steps"], accuracy=f"{result['final_metric']:.4f}",
                            best_accuracy=f"{result['best_metric']:.4f}",
                            state_bytes_per_layer="" if state is None else int(state), no_state=why,
                            window_ceiling="" if ceiling is None else f"{ceiling:.4f}", params=result["params"],
                            wall_s=f"{result['wall_s']:.0f}", load_1min=load_now())]

    def report(self, rows: list[dict[str, str]]) -> str:
        o = self.options
        finals = [r for r in rows if r["kind"] == "final"]
        mechanisms = list(dict.fromkeys(r["mechanism"] for r in finals))
        table, verdicts, points = [], [], {}
        for name in mechanisms:
            mine = [r for r in finals if r["mechanism"] == name]
            final = [float(r["accuracy"]) for r in mine]
            interval = mean_interval(final)
            # an accuracy's interval is clipped to [0, 1]: two seeds' t interval is wider than the scale
            spread = f"{interval.mean:.3f}" + (
                f" [{max(interval.low, 0.0):.3f}, {min(interval.high, 1.0):.3f}]" if interval.n > 1 else "")
            state = mine[0]["state_bytes_per_layer"]
            ceiling = mine[0].get("window_ceiling", "")
            seconds = sum(float(r["wall_s"]) for r in mine) / len(mine)
            table.append([f"`{name}`", " ".join(f"{a:.3f}" for a in final), spread,
                          f"{int(state):,}" if state else f"none ({mine[0]['no_state'][:40]})",
                          f"{float(ceiling):.3f}" if ceiling else "-", f"{int(mine[0]['params']):,}", f"{seconds:.0f}"])
            points[name] = (float(state) if state else None, interval.mean, min(final), max(final))
            verdicts.append(self.verdict(name, final, ceiling))
        self.figure(rows, points)
        first = finals[0] if finals else {}
        lines = [
            f"Budget: {o.steps:,} steps of 32 fresh examples (experiment=mqar/len64: vocabulary 256, length 64, "
            "4 pairs, "
            f"d_model 64, 2 layers, 2 heads, learned positions), AdamW lr {o.lr:g}, {o.warmup} warm-up steps, cosine "
            "to zero; accuracy over the queries of 512 held-out examples at the last step. "
            f"Seeds {sorted({int(r['seed']) for r in finals})}, "
            f"one thread per run, one run at a time, 1-minute load average {load_range(finals)} at the runs' ends.",
            "",
            f"The plateau every run starts on, answering some value of the context, scores one in {PAIRS} "
            f"({1 / PAIRS:.2f}). Intervals: 95% Student's t over the seeds, clipped to [0, 1].",
            "",
            *markdown_table(["mechanism", "final accuracy per seed", "mean [95% interval]",
                             "decoding state per layer (bytes, after 64 tokens)", "window's ceiling", "parameters",
                             "wall s per run"], table),
            "",
            "![accuracy over training, and against decoding state](mqar_separation.png)",
            "",
            f"**Verdict per mechanism** (recalls: every seed at or above {o.solved:g}):",
            "",
            *[f"- {v}" for v in verdicts],
        ]
        if first:
            lines += ["", "Runs: " + "; ".join(f"`{m}` = `{next(r['run'] for r in finals if r['mechanism'] == m)}`"
                                                 for m in mechanisms) + "."]
        return "\n".join(lines)

    def verdict(self, name: str, final: list[float], ceiling: str) -> str:
        solved = self.options.solved
        if all(a >= solved for a in final):
            return f"`{name}` recalls (lowest seed {min(final):.3f})."
        if ceiling:
            reach = float(ceiling)
            if max(final) > reach + CEILING_SLACK:
                return (f"`{name}` answers more queries ({max(final):.3f}) than its window reaches ({reach:.3f}): "
                        "the ceiling is wrong or it guesses well.")
            where = "at that bound" if max(final) >= reach - CEILING_SLACK else "below it at this budget"
            return (f"`{name}` cannot recall: its window reaches the key of only {reach:.3f} of the queries, a bound "
                    f"no training passes; it answers {max(final):.3f} (best seed), {where}.")
        if any(a >= solved for a in final):
            seeds = " ".join(f"{a:.3f}" for a in final)
            return f"`{name}` recalls on some seeds only ({seeds}): not shown at this budget."
        return f"`{name}` does not recall at this budget (best seed {max(final):.3f})."

    def figure(self, rows: list[dict[str, str]], points: dict[str, tuple]) -> None:
        path = self.paths.out / "mqar_separation.png"
        with saved_figure(path, 1, 2, figsize=(11, 4), dpi=110) as (_, (curve, state)):
            for i, name in enumerate(points):
                colour = f"C{i}"
                for seed in sorted({r["seed"] for r in rows if r["mechanism"] == name}):
                    evals = sorted((int(r["step"]), float(r["accuracy"])) for r in rows
                                   if r["mechanism"] == name and r["seed"] == seed and r["kind"] == "eval")
                    if evals:
                        curve.plot(*zip(*evals), color=colour, lw=1, label=name if seed == min(
                            r["seed"] for r in rows if r["mechanism"] == name) else None)
                size, mean, low, high = points[name]
                if size:
                    state.errorbar([size], [mean], yerr=[[mean - low], [high - mean]], fmt="o", color=colour,
                                   capsize=3, label=name)
            curve.axhline(self.options.solved, color="grey", lw=0.8, ls=":")
            curve.axhline(1 / PAIRS, color="grey", lw=0.8, ls="--")
            curve.set(xlabel="training step (batches of 32)", ylabel="query accuracy (held out)", ylim=(0, 1.02),
                      title="MQAR, length 64, 4 pairs, d_model 64")
            for axis in (curve, state):
                if axis.get_legend_handles_labels()[0]:
                    axis.legend(fontsize=7)
            state.set_xscale("log", base=2)
            state.set(xlabel="decoding state per layer (bytes, measured)", ylabel="final query accuracy",
                      ylim=(0, 1.02), title="recall against state (mean, seeds' range)")
