"""Seconds per training step of every paper configuration (``conf/experiment/paper/*.yaml``), at a stated
small scale, on this machine: what a headline row costs before anyone launches it at full size.

Each row is the paper's configuration (width, heads, d_ff, attention options, vocabulary, adaptive head,
memory length) with only depth, batch and segment length cut down, trained for a few Adam steps on random
tokens by the trainer's own step (``zoo.train.steps.train_step``) with the state carried (memory models see
their memory). The parameter count of the full-size model is counted on the meta device (``zoo.app.paper``).
Timed in ``zoo.bench``'s paired rounds: each round runs ``steps`` steps of every configuration in turn (the
order rotated each round, a warm-up round unrecorded), so load affects all alike; s/step is the median over
rounds of each round's mean.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch

from zoo.app.paper import count_parameters, meta_model, model_config_for, resolved_config
from zoo.bench import clocked, paired_ratios, paired_rounds
from zoo.config import require
from zoo.models.base import HEAD
from zoo.studies.base import STUDY, Study
from zoo.studies.common import PROJECT_ROOT, Rows, bars_figure, number
from zoo.train.steps import adam, train_step

PAPER_DIR = PROJECT_ROOT / "conf" / "experiment" / "paper"


@dataclass
class Options:
    names: list[str] = field(default_factory=list)  # paper configurations; empty: every one in conf/experiment/paper
    layers: int = 2
    seq_len: int = 512
    batch_size: int = 1
    steps: int = 3  # timed steps per round (after a warm-up round)
    rounds: int = 2

    def __post_init__(self) -> None:
        require(min(self.layers, self.seq_len, self.batch_size, self.steps, self.rounds) > 0,
                "study.layers, seq_len, batch_size, steps and rounds must be positive")
        known = sorted(p.stem for p in PAPER_DIR.glob("*.yaml"))
        unknown = [n for n in self.names if n not in known]
        require(not unknown, f"study.names: no paper configuration {unknown}; known: {', '.join(known)}")


class Configuration:
    """One paper row at the small scale: its model, optimiser, carried state and a random batch maker."""

    def __init__(self, name: str, o: Options):
        self.resolved = resolved_config([f"experiment=paper/{name}"])
        self.full_params = count_parameters(meta_model(model_config_for(self.resolved)[1]))["params"]
        small = resolved_config(
            [f"experiment=paper/{name}", f"model.n_layers={o.layers}", f"trainer.seq_len={o.seq_len}"]
        )
        config = model_config_for(small)[1]
        torch.manual_seed(0)
        self.model = HEAD.get(config.kind)(config).train()
        self.optimizer, self.state, self.options = adam(self.model, 1e-4), None, o

    def step(self) -> None:
        o = self.options
        tokens = torch.randint(0, self.model.config.vocab_size, (o.batch_size, o.seq_len + 1))
        out, _ = train_step(self.model, {"tokens": tokens[:, :-1], "targets": tokens[:, 1:]}, self.optimizer,
                            state=self.state)
        self.state = out.state  # detached by train_step: truncated BPTT across steps

    def round(self) -> float:
        """``steps`` training steps on fresh random batches; mean seconds per step."""
        return sum(clocked(self.step)() for _ in range(self.options.steps)) / self.options.steps


@STUDY.register("paper_step_time")
class PaperStepTime(Study):
    Options = Options
    question = "What does a training step of each paper configuration cost at a small scale on this machine?"
    figures = ("step_time.png",)
    toy_options = dict(names=["adaptive_span_enwik8_small"], layers=1, seq_len=8, steps=1, rounds=1)

    def run(self) -> None:
        o, rows = self.options, Rows(self.rows_path, ("config",))
        names = [n for n in (o.names or sorted(p.stem for p in PAPER_DIR.glob("*.yaml"))) if not rows.has(config=n)]
        if not names:
            return
        configurations = {name: Configuration(name, o) for name in names}
        rounds = paired_rounds({name: c.round for name, c in configurations.items()}, o.rounds)
        seconds = paired_ratios(rounds, names[0])
        scale = f"{o.layers} layers, batch {o.batch_size} x {o.seq_len} tokens, CPU fp32, {self.threads} thread(s)"
        for name, c in configurations.items():
            paper = c.resolved["paper"]
            source = f"{paper['citation'].split(',')[0]}, {paper['table']}: {paper['row']}"
            rows.add([dict(config=name, paper_row=source,
                           published_params=paper.get("params"), our_params=c.full_params,
                           s_per_step=round(seconds[name]["median_s"], 3), scale=scale,
                           small_model_params=sum(p.numel() for p in c.model.parameters()),
                           load_avg_1m=round(os.getloadavg()[0], 1))])

    def report(self, rows: list[dict[str, str]]) -> str:
        lines = [f"Scale: {', '.join(sorted({r['scale'] for r in rows}))}; 1-minute load average "
                 f"{', '.join(sorted({r['load_avg_1m'] for r in rows}))} when the rows were written. Parameters of the "
                 "full-size model as counted when the row was measured.", "",
                 "| config | paper row | parameters, ours / published | s per step | small model's parameters |",
                 "|---|---|---|---|---|"]
        for r in rows:
            published = f"{int(r['published_params']) / 1e6:.0f}M" if r["published_params"] else "not published"
            lines.append(f"| `{r['config']}` | {r['paper_row']} | {int(r['our_params']) / 1e6:.1f}M / {published} | "
                         f"{number(r, 's_per_step'):.2f} | {int(r['small_model_params']):,} |")
        times = {r["config"]: number(r, "s_per_step") for r in rows}
        bars_figure(self.paths.out / "step_time.png", {k: (v, v, v) for k, v in times.items()}, ylabel="s per step",
                    title="Paper configurations at a small scale")
        slowest, fastest = max(times, key=times.get), min(times, key=times.get)
        lines += ["", "![seconds per training step](step_time.png)", "",
                  f"**Verdict: measured, no claim to check**: from {times[fastest]:.2f} s (`{fastest}`) to "
                  f"{times[slowest]:.2f} s (`{slowest}`) per step at this scale, "
                  f"{times[slowest] / times[fastest]:.1f}x apart; full-size cost is not this times the depth ratio "
                  "(the embeddings and heads do not grow with depth)."]
        return "\n".join(lines)
