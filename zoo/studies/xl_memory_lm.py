"""Does memory help? A character LM on Tiny Shakespeare: Transformer-XL with memory, without, and vanilla.

Paper: Dai et al. 2019, "Transformer-XL: Attentive Language Models Beyond a Fixed-Length Context",
arXiv:1901.02860, Tables 6-7 (ablations): segment-level recurrence lowers bpc at a fixed segment length,
and the relative encoding matters too. Here, at one small scale and the same training budget (steps,
batch, segment length), each model trained by the app:

- ``xl_memory``: ``transformer_xl`` with ``mem_len`` = the segment, its state carried across consecutive
  segments in training and evaluation, and at evaluation also with a longer memory (``eval_mem``);
- ``xl_no_memory``: ``transformer_xl`` with memory off (``mem_len=0``): each segment alone;
- ``vanilla_lm``: absolute sinusoidal positions on the same segments.

Training reads ``batch`` contiguous lanes, one segment of each per step (the reference code's order, so
memory is meaningful), Adam with 5% warm-up and cosine, clipping at 0.25. Evaluation: bits per character on
the first ``eval_chars`` characters of the validation split read as 8 contiguous streams, over all
positions and over the first quarter of each segment (where memory helps most). Rows: ``eval`` (per model
and evaluation memory) and ``train`` (the training loss per logged step), tagged with the settings.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from zoo.app.run import load_run
from zoo.attention.xl_rel import set_eval_memory
from zoo.config import require
from zoo.studies.base import STUDY, Study
from zoo.studies.common import Rows, markdown_table, number, run_outcome, saved_figure, train
from zoo.train.eval_protocols import split_stream

MODELS = ("xl_memory", "xl_no_memory", "vanilla_lm")
EVAL_STREAMS = 8
SMOOTH = 25  # training steps in the figure's moving mean


@dataclass
class Options:
    models: list[str] = field(default_factory=lambda: list(MODELS))
    steps: int = 1000
    segment: int = 32
    batch: int = 16
    layers: int = 2
    d_model: int = 128
    dropout: float = 0.0
    lr: float = 2e-3
    eval_chars: int = 32768
    eval_mem: int = 128  # a longer evaluation memory for xl_memory (0 = skip)
    seed: int = 0
    overrides: list[str] = field(default_factory=list)  # for every run (the toy test points the data elsewhere)

    def __post_init__(self) -> None:
        require(set(self.models) <= set(MODELS), f"study.models: choose among {', '.join(MODELS)}")
        require(self.steps > 0 and self.segment >= 4, "study.steps must be > 0 and study.segment >= 4")

    def settings_key(self) -> str:
        return f"s{self.steps}-t{self.segment}-b{self.batch}-L{self.layers}-d{self.d_model}-lr{self.lr:g}"


@torch.no_grad()
def quarter_bpc(model: torch.nn.Module, stream: torch.Tensor, segment: int, memory: bool) -> tuple[float, float]:
    """(bpc over all positions, bpc over the first quarter of each segment) of ``stream`` [n] read as
    ``EVAL_STREAMS`` contiguous lanes, segment by segment, the state carried where ``memory``."""
    per = len(stream) // EVAL_STREAMS
    lanes = stream[: per * EVAL_STREAMS].view(EVAL_STREAMS, per)
    state = model.init_state(EVAL_STREAMS) if memory else None
    total = early = 0.0
    n_total = n_early = 0
    for pos in range(0, per - 1, segment):
        chunk = lanes[:, pos : pos + segment + 1]
        if chunk.shape[1] < 2:
            break
        out = model(chunk[:, :-1], state=state)
        state = out.state if memory else None
        nll = torch.nn.functional.cross_entropy(out.logits.transpose(1, 2), chunk[:, 1:], reduction="none")  # [8, t]
        total, n_total = total + nll.sum().item(), n_total + nll.numel()
        early, n_early = early + nll[:, : segment // 4].sum().item(), n_early + nll[:, : segment // 4].numel()
    return total / n_total / math.log(2), early / n_early / math.log(2)


@STUDY.register("xl_memory_lm")
class XLMemoryLM(Study):
    Options = Options
    question = ("At the same budget and segment length, does Transformer-XL's memory lower the bpc against the same "
                "model without memory and a vanilla LM, most in the first quarter of each segment?")
    figures = ("train_curves.png",)
    toy_options = dict(models=["xl_memory"], steps=2, segment=8, batch=2, layers=1, d_model=16, eval_chars=256,
                       eval_mem=16, overrides=["data.path=README.md", "trainer.eval_every=2", "trainer.eval_batches=1"])

    def overrides(self, model: str) -> list[str]:
        o = self.options
        arm = {
            "xl_memory": ["model=transformer_xl", f"+model.attention={{name:xl_rel,mem_len:{o.segment}}}"],
            "xl_no_memory": ["model=transformer_xl", "+model.attention={name:xl_rel,mem_len:0}",
                             "trainer.carry_state=false"],
            "vanilla_lm": ["model=vanilla_lm", f"model.max_len={o.segment}", "trainer.carry_state=false"],
        }[model]
        return ["experiment=shakespeare", *arm, f"model.n_layers={o.layers}", f"model.d_model={o.d_model}",
                "model.n_heads=4", f"model.d_ff={4 * o.d_model}", f"model.dropout={o.dropout}",
                f"trainer.seq_len={o.segment}", f"trainer.batch_size={o.batch}", f"trainer.max_steps={o.steps}",
                "trainer.clip=0.25", "trainer.log_every=1", "trainer.progress=false", f"optim.lr={o.lr}",
                f"optim.warmup={max(o.steps // 20, 1)}", f"seed={o.seed}", "logger=csv", *o.overrides]

    def run(self) -> None:
        o, key = self.options, self.options.settings_key()
        rows = Rows(self.rows_path, ("settings", "kind", "model"))
        for name in o.models:
            if rows.has(settings=key, kind="eval", model=name):
                continue
            run_dir = train(self.overrides(name), self.paths.runs / key / name, threads=self.threads)
            _, task, model, _ = load_run(run_dir / "checkpoints" / "last.pt")
            stream = torch.from_numpy(split_stream(task, "val")[: o.eval_chars + EVAL_STREAMS]).long()
            result, metrics = run_outcome(run_dir)
            curve = [dict(settings=key, kind="train", model=name, step=int(r["step"]),
                          train_bpc=float(r["train/loss"]) / math.log(2))
                     for r in metrics if r.get("train/loss")]
            memories = [o.segment, *([o.eval_mem] if o.eval_mem else [])] if name == "xl_memory" else [0]
            evals = []
            for memory in memories:
                if name == "xl_memory":
                    set_eval_memory(model, memory)
                bpc, early = quarter_bpc(model.eval(), stream, o.segment, memory=name == "xl_memory")
                evals.append(dict(settings=key, kind="eval", model=name, eval_memory=memory, eval_bpc=bpc,
                                  eval_bpc_first_quarter=early, train_seconds=round(result["wall_s"], 1)))
            rows.add(curve + evals)  # the curve first: an eval row means the model is complete

    def report(self, rows: list[dict[str, str]]) -> str:
        lines, panels = [], {}
        for key in dict.fromkeys(r["settings"] for r in rows):
            evals = [r for r in rows if r["settings"] == key and r["kind"] == "eval"]
            panels[key] = {m: [r for r in rows if r["settings"] == key and r["kind"] == "train" and r["model"] == m]
                           for m in dict.fromkeys(r["model"] for r in evals)}
            lines += [f"**Settings `{key}`** (bpc on the first held-out characters, 8 streams):", "", *markdown_table(
                ["model", "eval memory", "eval bpc", "bpc, first quarter of each segment", "train seconds"],
                ([r["model"], r["eval_memory"], f"{number(r, 'eval_bpc'):.3f}",
                  f"{number(r, 'eval_bpc_first_quarter'):.3f}", f"{number(r, 'train_seconds'):.0f}"] for r in evals)),
                "", self.verdict(evals), ""]
        self.figure(panels)
        return "\n".join([*lines, "![training curves](train_curves.png)"])

    @staticmethod
    def verdict(evals: list[dict[str, str]]) -> str:
        """The claim shows when xl_memory (training memory) is below both others over all positions and the
        gap to the model without memory is wider in the first quarter of the segments."""
        at = {r["model"]: r for r in evals if r["model"] != "xl_memory" or r["eval_memory"] == evals[0]["eval_memory"]}
        if not set(MODELS) <= set(at):
            return "**Verdict: not enough rows** (all three models are needed)."
        bpc = {m: number(r, "eval_bpc") for m, r in at.items()}
        early = {m: number(r, "eval_bpc_first_quarter") for m, r in at.items()}
        lower = bpc["xl_memory"] < min(bpc["xl_no_memory"], bpc["vanilla_lm"])
        wider = early["xl_no_memory"] - early["xl_memory"] > bpc["xl_no_memory"] - bpc["xl_memory"]
        return (f"**Verdict: the claim {'shows' if lower and wider else 'does not show'}**: with memory "
                f"{bpc['xl_memory']:.3f} bpc against {bpc['xl_no_memory']:.3f} without and {bpc['vanilla_lm']:.3f} "
                f"vanilla; in the first quarter of each segment {early['xl_memory']:.3f} against "
                f"{early['xl_no_memory']:.3f} / {early['vanilla_lm']:.3f}.")

    def figure(self, panels: dict[str, dict[str, list[dict[str, str]]]]) -> None:
        width = max(len(panels), 1)
        path = self.paths.out / "train_curves.png"
        with saved_figure(path, 1, width, figsize=(5.5 * width, 3.5), squeeze=False) as (_, axes):
            for ax, (key, curves) in zip(axes[0], panels.items()):
                for name, curve in curves.items():
                    points = sorted((int(r["step"]), number(r, "train_bpc")) for r in curve)
                    values = [v for _, v in points]
                    smooth = [sum(values[max(0, i - SMOOTH + 1) : i + 1]) / len(values[max(0, i - SMOOTH + 1) : i + 1])
                              for i in range(len(values))]
                    ax.plot([s for s, _ in points], smooth, label=name)
                ax.set(xlabel="step", ylabel=f"train bpc (moving mean of {SMOOTH})", title=key)
                ax.set_ylim(top=min(4.5, ax.get_ylim()[1]))
                ax.grid(alpha=0.3)
                ax.legend()
