"""The gap between the 2017 block and Llama's, measured: ``transformer_pp`` beside Hugging Face's Llama.

Touvron et al. 2023, "LLaMA", arXiv:2302.13971 (the block: pre-RMSNorm, Zhang & Sennrich 2019,
arXiv:1910.07467; SwiGLU, Shazeer 2020, arXiv:2002.05202; rotary positions, Su et al. 2021,
arXiv:2104.09864; no biases). ``results/streaming/rope`` found HF's ``LlamaForCausalLM`` 0.16-0.18 bpc
better than ``vanilla_lm`` on Tiny Shakespeare at equal size. The question here: does the zoo's
``transformer_pp`` preset close that gap (within ``margin`` bpc of HF's Llama), and which change of the
block buys what?

Setting: characters of Tiny Shakespeare (read in place through the app's ``data=shakespeare``), every model
d 128, 4 layers, 4 heads, trained in one loop (``zoo/studies/reference_loop.py``: our trainer cannot train
HF's model, and a different loop alone moves a model's bpc by 0.02-0.06), the same batches for every model
of a seed, then scored on the whole test split in non-overlapping segments of ``length``.

- ``transformer_pp``: the preset with SwiGLU 341 (2/3 of 512: the parameters of a 512-wide two-matrix
  network) and tied embeddings; ``llama``: ``LlamaForCausalLM`` of that same shape (795,392 parameters
  both); ``vanilla_lm``: the 2017 block with rotary positions (post-norm LayerNorm, ReLU 512 with biases,
  dropout 0.1, tied), 801,408 parameters.
- The ablation: ``vanilla_lm`` (rope) with each of norm {layernorm, rmsnorm} x feed-forward {mlp, swiglu
  at 2/3 width with biases, equal parameters} x init {default, gpt2}, cells named ``norm/feed_forward/init``.
- The step cost: forward + backward of ``vanilla_lm`` with each norm x feed-forward, in paired rounds
  (:func:`zoo.bench.timing.paired_rounds`), against layernorm/mlp.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from importlib.util import find_spec

import torch

import zoo
from zoo.app.aggregate import compare, mean_interval
from zoo.app.compose import compose
from zoo.app.resolve import as_dict
from zoo.app.run import make_task
from zoo.bench.timing import clocked, paired_ratios, paired_rounds
from zoo.config import require
from zoo.studies.base import STUDY, Study
from zoo.studies.common import Rows, number, panels_figure
from zoo.studies.reference_loop import (
    LLAMA,
    OURS,
    LoopSettings,
    build_llama,
    next_token_loss,
    segment_bpc,
    segments_of,
    train_in_loop,
)
from zoo.train.eval_protocols import split_stream

# transformer_pp_llama_init: the preset drawn as HF Llama draws its weights (init=gpt2 without the depth
# scaling: every linear and the token table N(0, 0.02)), which separates the block from the initialisation
MODELS = ("transformer_pp", "llama", "vanilla_lm", "transformer_pp_llama_init")
# (the token table too: gpt2 draws it N(0, 0.02) read unscaled, so the preset's token_init_std steps aside)
LLAMA_DRAWN = dict(init={"name": "gpt2", "scale_depth": False}, token_init_std=0.0)
BASE_CELL = "layernorm/mlp/default"  # the ablation's vanilla_lm as it is: the headline vanilla_lm's seed runs


@dataclass
class Options:
    models: list[str] = field(default_factory=lambda: list(MODELS))  # in this order, one seed of each first
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    ablation: list[str] = field(default_factory=lambda: [
        f"{n}/{f}/{i}" for n in ("layernorm", "rmsnorm") for f in ("mlp", "swiglu") for i in ("default", "gpt2")])
    ablation_seed: int = 0
    steps: int = 2000
    batch_size: int = 16
    length: int = 256
    lr: float = 1e-3
    warmup: int = 100
    timing_rounds: int = 10  # paired rounds of the step cost (0: not timed)
    margin: float = 0.02  # bpc: transformer_pp "equals" HF's Llama within this
    d_model: int = 128  # the width and depth: the tests run a toy size through the same path
    n_layers: int = 4
    test_segments: int = 0  # test segments scored (0: the whole split)

    def __post_init__(self) -> None:
        require(all(m in MODELS for m in self.models), f"study.models must be among {', '.join(MODELS)}")
        for cell in self.ablation:
            parts = cell.split("/")
            require(len(parts) == 3 and parts[0] in ("layernorm", "rmsnorm") and parts[1] in ("mlp", "swiglu")
                    and parts[2] in ("default", "gpt2"),
                    f"study.ablation cells are norm/feed_forward/init (layernorm|rmsnorm/mlp|swiglu/default|gpt2), "
                    f"got {cell!r}")
        require(self.steps > 0 and self.batch_size > 0 and self.length > 1, "study.steps, batch_size, length > 0")


def ablation_overrides(cell: str) -> dict:
    """``rmsnorm/swiglu/gpt2`` -> the create_model keywords that change vanilla_lm's block that way (SwiGLU at
    2/3 of d_ff with biases: the two-matrix network's parameters and biases, only the gate differs)."""
    norm, feed_forward, init = cell.split("/")
    out = dict(norm=norm, init=init)
    if feed_forward == "swiglu":
        out["feed_forward"] = {"name": "swiglu", "two_thirds": True, "bias": True}
    return out


@STUDY.register("llama_gap")
class LlamaGap(Study):
    Options = Options
    question = ("Does `transformer_pp` learn Tiny Shakespeare within 0.02 bpc of Hugging Face's Llama of the same "
                "shape, and which change of the 2017 block (norm, feed-forward, init) buys what?")
    figures = ("gap.png",)
    # HF's Llama only where transformers is installed (the references extra): the rest runs everywhere
    toy_options = dict(models=["transformer_pp", "vanilla_lm", *(["llama"] if find_spec("transformers") else [])],
                       seeds=[0],
                       ablation=["rmsnorm/swiglu/gpt2"], steps=2, batch_size=2, length=16, warmup=1,
                       timing_rounds=1, d_model=16, n_layers=1, test_segments=4)

    def ours(self, preset: str, vocab: int, **overrides) -> torch.nn.Module:
        o = self.options
        sizes = dict(vocab_size=vocab, d_model=o.d_model, n_layers=o.n_layers, n_heads=4, max_len=o.length)
        if preset.startswith("transformer_pp"):
            return zoo.create_model("transformer_pp", **sizes, d_ff=round(8 * o.d_model / 3), tie_embeddings=True,
                                    **(LLAMA_DRAWN if preset == "transformer_pp_llama_init" else {}))
        return zoo.create_model("vanilla_lm", **sizes, d_ff=4 * o.d_model, position="rope", tie_embeddings=True,
                                **overrides)

    def build(self, model: str, vocab: int, seed: int) -> tuple[torch.nn.Module, str]:
        torch.manual_seed(seed)
        o = self.options
        if model == "llama":
            return build_llama(vocab, o.length, d_model=o.d_model, n_layers=o.n_layers,
                               intermediate=round(8 * o.d_model / 3), tie=True), LLAMA
        if model.count("/") == 2:
            return self.ours("vanilla_lm", vocab, **ablation_overrides(model)), OURS
        return self.ours(model, vocab), OURS

    def run(self) -> None:
        o, rows = self.options, Rows(self.rows_path, ("kind", "model", "seed"))
        torch.set_num_threads(self.threads)
        task = make_task(as_dict(compose(["experiment=shakespeare", f"trainer.seq_len={o.length}"])))
        train = torch.from_numpy(split_stream(task, "train"))
        segments = segments_of(torch.from_numpy(split_stream(task, "test")), o.length, o.test_segments)
        jobs = [("model", m, s) for s in o.seeds for m in o.models]  # one seed of every model first
        jobs += [("ablation", cell, o.ablation_seed) for cell in o.ablation if cell != BASE_CELL]
        for kind, model, seed in jobs:
            if rows.has(kind=kind, model=model, seed=seed):
                continue
            network, call = self.build(model, task.vocab_size, seed)
            settings = LoopSettings(o.steps, o.batch_size, o.length, o.lr, o.warmup, seed)
            seconds = train_in_loop(network, call, train, settings)
            rows.add([dict(kind=kind, model=model, seed=seed, bpc=round(segment_bpc(network, call, segments), 5),
                           parameters=sum(p.numel() for p in network.parameters()), steps=o.steps,
                           train_seconds=round(seconds, 1), load_1min=round(os.getloadavg()[0], 1))])
        if o.timing_rounds > 0 and not rows.has(kind="timing", model=BASE_CELL, seed=0):
            rows.add(self.step_cost(task.vocab_size))

    def step_cost(self, vocab: int) -> list[dict]:
        """Seconds of one forward + backward of vanilla_lm per norm x feed-forward (init does not change the
        step), in paired rounds: one row per cell and round."""
        o = self.options
        cells = [f"{n}/{f}/default" for n in ("layernorm", "rmsnorm") for f in ("mlp", "swiglu")]
        generator = torch.Generator().manual_seed(0)
        batch = torch.randint(0, vocab, (o.batch_size, o.length), generator=generator)
        steps = {}
        for cell in cells:
            model = self.ours("vanilla_lm", vocab, **ablation_overrides(cell)).train()
            steps[cell] = clocked(lambda m=model: (next_token_loss(m, batch, OURS).backward(), m.zero_grad()))
        rounds = paired_rounds(steps, o.timing_rounds, progress=lambda _: None)
        return [dict(kind="timing", model=cell, seed=index, seconds=round(r[cell], 5),
                     load_1min=round(os.getloadavg()[0], 1)) for index, r in enumerate(rounds) for cell in cells]

    def report(self, rows: list[dict[str, str]]) -> str:
        o = self.options
        trained = [r for r in rows if r["kind"] in ("model", "ablation")]
        bpc = {(r["model"], int(r["seed"])): number(r, "bpc") for r in trained}
        loads = [number(r, "load_1min") for r in rows] or [0.0]
        lines = [
            f"Test bpc of Tiny Shakespeare (the whole test split in segments of {o.length}, unless "
            f"`test_segments` > 0: {o.test_segments or 'all'}) after {o.steps} steps of {o.batch_size} x {o.length} "
            f"characters, lr {o.lr:g} ({o.warmup} warm-up steps, cosine), every model in the same loop on the same "
            f"batches per seed; 1-minute load average {min(loads):.1f}-{max(loads):.1f} (2 shared cores).", "",
            "| model | parameters | seeds | test bpc: mean (95% interval) | per seed |", "|---|---|---|---|---|",
        ]
        per_model = {m: {s: v for (name, s), v in bpc.items() if name == m} for m in MODELS}
        parameters = {r["model"]: r["parameters"] for r in trained}
        for model in (m for m in MODELS if per_model[m]):
            values = per_model[model]
            interval = mean_interval(list(values.values()))
            ci = f" ({interval.low:.3f}-{interval.high:.3f})" if interval.low is not None else ""
            seeds = ", ".join(f"{s}: {v:.3f}" for s, v in sorted(values.items()))
            count = int(parameters[model])
            lines.append(f"| {model} | {count:,} | {len(values)} | {interval.mean:.3f}{ci} | {seeds} |")
        lines += ["", self.verdict(per_model), ""]
        lines += (self.ablation_lines(bpc, parameters) + [""] if o.ablation else []) + self.timing_lines(rows)
        series = {"test bpc per seed": {m: [(s, v, v, v) for s, v in sorted(per_model[m].items())]
                                        for m in MODELS if per_model[m]}}
        panels_figure(self.paths.out / "gap.png", series, xlabel="seed", ylabel="test bits per character")
        return "\n".join([*lines, "", "![test bpc per seed and model](gap.png)"])

    def verdict(self, per_model: dict[str, dict[int, float]]) -> str:
        o, ours, theirs = self.options, per_model["transformer_pp"], per_model["llama"]
        if not ours or not theirs:
            return "**Verdict: not enough rows yet** (transformer_pp and llama are both needed)."
        difference = compare(ours, theirs, higher_is_better=False)
        interval = difference.interval
        span = (f"95% interval {interval.low:+.3f} to {interval.high:+.3f}, "
                f"{'paired by seed' if difference.paired else 'Welch'}" if interval.low is not None else "one seed")
        within = abs(interval.mean) <= o.margin
        inside = interval.low is not None and -o.margin <= interval.low and interval.high <= o.margin
        lines = [f"**Verdict: transformer_pp - HF Llama = {interval.mean:+.3f} bpc ({span}): "
                 f"{'within' if within else 'not within'} {o.margin} bpc on the mean"
                 + (f"; the interval {'lies inside' if inside else 'reaches past'} +-{o.margin}"
                    if interval.low is not None else "") + ".**"]
        if per_model["transformer_pp_llama_init"]:
            drawn = compare(per_model["transformer_pp_llama_init"], theirs, higher_is_better=False).interval
            ci = f" (95% interval {drawn.low:+.3f} to {drawn.high:+.3f})" if drawn.low is not None else ""
            lines.append(f"transformer_pp initialised as HF Llama - HF Llama = {drawn.mean:+.3f} bpc{ci}.")
        if per_model["vanilla_lm"]:
            gap = compare(per_model["vanilla_lm"], theirs, higher_is_better=False).interval
            ci = f" (95% interval {gap.low:+.3f} to {gap.high:+.3f})" if gap.low is not None else ""
            lines.append(f"vanilla_lm (rope) - HF Llama = {gap.mean:+.3f} bpc{ci}.")
        return " ".join(lines)

    def ablation_lines(self, bpc: dict, parameters: dict) -> list[str]:
        o = self.options
        base = bpc.get(("vanilla_lm", o.ablation_seed))
        cells = [BASE_CELL, *(c for c in o.ablation if c != BASE_CELL)]
        lines = [f"**Ablation** on vanilla_lm (rope), seed {o.ablation_seed} only (one seed: differences below "
                 "the seeds' spread above are not shown to be real); SwiGLU at 2/3 width with biases (equal "
                 "parameters):", "", "| norm | feed-forward | init | parameters | test bpc | change from "
                 f"{BASE_CELL} |", "|---|---|---|---|---|---|"]
        for cell in cells:
            value = base if cell == BASE_CELL else bpc.get((cell, o.ablation_seed))
            count = parameters.get("vanilla_lm" if cell == BASE_CELL else cell)
            if value is None or count is None:
                lines.append(f"| {' | '.join(cell.split('/'))} | - | not run | - |")
                continue
            change = "" if base is None or cell == BASE_CELL else f"{value - base:+.3f}"
            lines.append(f"| {' | '.join(cell.split('/'))} | {int(count):,} | {value:.3f} | {change} |")
        return lines

    def timing_lines(self, rows: list[dict[str, str]]) -> list[str]:
        timed = [r for r in rows if r["kind"] == "timing"]
        if not timed:
            return ["Step cost: not measured (`timing_rounds=0`)."]
        rounds: dict[int, dict[str, float]] = {}
        for r in timed:
            rounds.setdefault(int(r["seed"]), {})[r["model"]] = number(r, "seconds")
        ratios = paired_ratios([rounds[i] for i in sorted(rounds)], BASE_CELL)
        loads = [number(r, "load_1min") for r in timed]
        lines = [f"**Step cost** (forward + backward of vanilla_lm, {self.options.batch_size} x "
                 f"{self.options.length} characters, one thread, {len(rounds)} paired rounds after one warm-up; "
                 f"load average {min(loads):.1f}-{max(loads):.1f} on 2 shared cores): time relative to "
                 f"{BASE_CELL}, median over rounds (min-max)", "",
                 "| norm / feed-forward | median seconds | time / layernorm-mlp's |", "|---|---|---|"]
        for cell, r in ratios.items():
            slower = [1 / r["ratio"], 1 / r["ratio_max"], 1 / r["ratio_min"]]
            lines.append(f"| {cell.removesuffix('/default')} | {r['median_s']:.3f} | {slower[0]:.2f} "
                         f"({slower[1]:.2f}-{slower[2]:.2f}) |")
        return lines
