"""Zoo variants as sequence backbones on vectors: recall the input from k steps back, across segments.

The task is regression on random vectors: at step t the input is x_t ~ N(0, I) (``features`` wide) and the
target is x_{t-k}. The stream is read one segment of ``segment`` steps per call, as an agent or a streaming
model reads it, so for k longer than a segment the answer lies in an earlier call. Each preset is a backbone
(``head="none"``) between two small linear maps of ours: features -> d_model (``embeds=``) and ``out.hidden``
-> features. The state returned by one call is fed to the next (stop-gradient memory, truncated
back-propagation through one segment, one Adam step per segment).

- ``transformer_xl`` and ``gtrxl`` carry a segment memory (``mem_len`` >= the largest k);
- ``vanilla_lm`` is called with ``state=None`` on every segment: no memory, so it can only solve the
  positions whose source lies inside the current segment.

Why not the app: a regression on vectors through our own read-in and read-out is no token task the app
can load, and the score is split by where the source lies; the models train in the shared stream loop
(``zoo/studies/stream_loop.py``). Rows (one per preset and k): mean squared error on held-out streams over
positions t >= k (predicting zero scores 1.0), split by where the source x_{t-k} lies.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

import zoo
from zoo.config import require
from zoo.models.base import ModelOutput
from zoo.stacks.build import attention_class
from zoo.studies.base import STUDY, Study
from zoo.studies.common import Rows, load_now, load_range, markdown_table, number, saved_figure
from zoo.studies.stream_loop import Carried, evaluate_stream, train_streams
from zoo.train.steps import carries_memory

NO_SOURCE = 1.0  # the MSE of predicting zero: what a model that cannot see the source scores


@dataclass
class Options:
    presets: list[str] = field(default_factory=lambda: ["gtrxl", "transformer_xl", "vanilla_lm"])
    ks: list[int] = field(default_factory=lambda: [4, 12, 24, 40])  # delays, one model each
    segment: int = 16  # steps per call
    segments: int = 6  # segments per stream
    mem_len: int = 48  # XL memory per layer: at least the largest k
    features: int = 4
    d_model: int = 32
    layers: int = 2
    heads: int = 4
    batch: int = 16
    streams: int = 200  # training streams (one optimiser step per segment)
    eval_batch: int = 256
    lr: float = 2e-3
    seed: int = 0

    def __post_init__(self) -> None:
        require(min(self.ks) >= 1, f"study.ks must be >= 1, got {self.ks}")
        require(max(self.ks) <= self.mem_len,
                f"study.mem_len ({self.mem_len}) must be >= the largest delay in study.ks ({max(self.ks)})")

    def settings_key(self) -> str:
        return (f"seg{self.segment}x{self.segments}-mem{self.mem_len}-f{self.features}-d{self.d_model}-L{self.layers}"
                f"-h{self.heads}-b{self.batch}-streams{self.streams}-lr{self.lr:g}-seed{self.seed}")


class Regressor(nn.Module):
    """features -> d_model -> zoo backbone -> features: what a user writes around a zoo model. A stream model
    (``reset``, one call per segment): the prediction as ``logits``, the mean squared error over the ``scored``
    positions [t] as ``loss`` when ``targets`` are given."""

    def __init__(self, preset: str, options: Options):
        super().__init__()
        o = options
        overrides = dict(d_model=o.d_model, n_layers=o.layers, n_heads=o.heads, d_ff=2 * o.d_model, dropout=0.0,
                         head="none")  # a backbone: hidden states out, our own read-out
        with torch.random.fork_rng():  # ask the parts whether they carry segment memory, drawing nothing
            memory = carries_memory(zoo.create_model(preset, **overrides))
        option = attention_class(zoo.preset_config(preset).attention).memory_option  # xl_rel: mem_len
        if memory and option:  # enough of it for the largest delay
            overrides["attention"] = {option: o.mem_len}
        self.backbone = Carried(zoo.create_model(preset, **overrides))
        self.read_in = nn.Linear(o.features, o.d_model)
        self.read_out = nn.Linear(o.d_model, o.features)

    def reset(self, batch: int) -> None:
        self.backbone.reset(batch)

    def forward(self, x: Tensor, targets: Tensor | None = None, *, scored: Tensor | None = None) -> ModelOutput:
        prediction = self.read_out(self.backbone(embeds=self.read_in(x)).hidden)
        loss = None if targets is None else ((prediction - targets) ** 2).mean(-1)[:, scored].mean()
        return ModelOutput(prediction, loss)


def stream(batch: int, options: Options, k: int, generator: torch.Generator) -> list[dict[str, Tensor]]:
    """A batch of streams x [b, segment * segments, f] ~ N(0, 1), y[t] = x[t - k] (zero, not scored, for t < k),
    cut into segments: pieces ``{"x", "targets", "scored" [t]}``."""
    length = options.segment * options.segments
    x = torch.randn(batch, length, options.features, generator=generator)
    y = torch.zeros_like(x)
    y[:, k:] = x[:, :-k]
    t = torch.arange(length)
    return [{"x": xs, "targets": ys, "scored": ts >= k} for xs, ys, ts in
            zip(x.split(options.segment, 1), y.split(options.segment, 1), t.split(options.segment))]


def split_errors(outputs: list[ModelOutput], pieces: list[dict[str, Tensor]], k: int) -> dict[str, float]:
    """Summed squared errors and counts over the scored positions whose source is in the current segment
    (``in``) and in an earlier one (``earlier``)."""
    totals = {"in_sse": 0.0, "in_n": 0, "earlier_sse": 0.0, "earlier_n": 0}
    start = 0
    for out, piece in zip(outputs, pieces):
        scored = piece["scored"]
        error = ((out.logits - piece["targets"]) ** 2).mean(-1)  # [b, s]
        inside = (torch.arange(start, start + len(scored)) - k) >= start
        for part, mask in (("in", scored & inside), ("earlier", scored & ~inside)):
            totals[f"{part}_sse"] += float(error[:, mask].sum())
            totals[f"{part}_n"] += int(mask.sum()) * error.shape[0]
        start += len(scored)
    return totals


@STUDY.register("backbone_memory")
class BackboneMemory(Study):
    Options = Options
    question = ("Used as backbones on vectors read one segment per call, do the memory presets (gtrxl, "
                "transformer_xl) recall the input from k steps back beyond the segment, where vanilla_lm cannot?")
    figures = ("mse_vs_delay.png",)
    toy_options = dict(presets=["gtrxl", "vanilla_lm"], ks=[6], segment=4, segments=3, mem_len=8, d_model=16, layers=1,
                       heads=2, streams=2, eval_batch=4)

    def train_and_score(self, preset: str, k: int) -> dict:
        o = self.options
        torch.manual_seed(o.seed)
        model = Regressor(preset, o)
        optimizer = torch.optim.Adam(model.parameters(), lr=o.lr)
        data = torch.Generator().manual_seed(o.seed)
        begin = time.time()
        train_streams(model, optimizer, lambda: stream(o.batch, o, k, data), steps=o.streams, clip=0.0,
                      scale=lambda _, piece: 1.0 if bool(piece["scored"].any()) else 0.0,
                      after=lambda *_: False, per_segment=True)
        train_s = time.time() - begin
        held_out = stream(o.eval_batch, o, k, torch.Generator().manual_seed(10_000 + o.seed))
        totals = split_errors(evaluate_stream(model, held_out), held_out, k)
        n = totals["in_n"] + totals["earlier_n"]

        def mse(sse: float, count: int) -> str:
            return f"{sse / count:.3f}" if count else ""

        return dict(settings=o.settings_key(), preset=preset, k=k,
                    delay="within segment" if k < o.segment else "beyond segment",
                    mse=mse(totals["in_sse"] + totals["earlier_sse"], n),
                    mse_source_in_segment=mse(totals["in_sse"], totals["in_n"]),
                    mse_source_earlier_segment=mse(totals["earlier_sse"], totals["earlier_n"]),
                    share_source_earlier=f"{totals['earlier_n'] / n:.2f}", train_s=f"{train_s:.0f}",
                    segment=o.segment, mem_len=o.mem_len, load_1min=load_now())

    def run(self) -> None:
        rows = Rows(self.rows_path, ("settings", "preset", "k"))
        for preset in self.options.presets:
            for k in self.options.ks:
                if not rows.has(settings=self.options.settings_key(), preset=preset, k=k):
                    rows.add([self.train_and_score(preset, k)])

    def report(self, rows: list[dict[str, str]]) -> str:
        header = ["preset", "k", "delay", "mse", "mse_source_in_segment", "mse_source_earlier_segment",
                  "share_source_earlier", "train_s"]
        lines = []
        for key in dict.fromkeys(r["settings"] for r in rows):
            mine = [r for r in rows if r["settings"] == key]
            lines += [f"Settings `{key}`; 1-minute load average {load_range(mine)}; `train_s` are wall seconds under "
                      "that load, not a speed comparison.", "",
                      *markdown_table(header, ([r[h] for h in header] for r in mine)), "", self.verdict(mine), ""]
        self.figure(rows)
        return "\n".join([*lines, "![MSE against delay](mse_vs_delay.png)"])

    @staticmethod
    def verdict(rows: list[dict[str, str]]) -> str:
        """Memory recalls beyond the segment when every memory preset's MSE there is below 0.1 (predicting zero:
        1.0) and vanilla_lm's stays near 1.0 (above 0.5), its error in-segment small."""
        beyond = [r for r in rows if r["delay"] == "beyond segment"]
        memory = [r for r in beyond if r["preset"] != "vanilla_lm"]
        vanilla = [r for r in beyond if r["preset"] == "vanilla_lm"]
        if not memory or not vanilla:
            return "**Verdict: not enough rows** (a memory preset and vanilla_lm at a delay beyond the segment)."
        recalls = all(number(r, "mse") < 0.1 for r in memory)
        cannot = all(number(r, "mse") > 0.5 for r in vanilla)
        worst = max(memory, key=lambda r: number(r, "mse"))
        return (f"**Verdict: the memory presets {'recall' if recalls else 'do not all recall'} beyond the segment** "
                f"(worst: {worst['preset']} at k = {worst['k']}, MSE {worst['mse']}) **and vanilla_lm "
                f"{'cannot' if cannot else 'partly can'}** (MSE {', '.join(r['mse'] for r in vanilla)} beyond the "
                f"segment; predicting zero scores {NO_SOURCE:.1f}).")

    def figure(self, rows: list[dict[str, str]]) -> None:
        keys = list(dict.fromkeys(r["settings"] for r in rows))
        styles = [("o", "-"), ("s", "--"), ("^", ":"), ("D", "-.")]
        with saved_figure(self.paths.out / "mse_vs_delay.png", figsize=(5.5, 3.6), dpi=110) as (_, ax):
            lines = list(dict.fromkeys((r["settings"], r["preset"]) for r in rows))
            for (marker, line), (key, preset) in zip(styles * len(lines), lines):
                mine = [r for r in rows if (r["settings"], r["preset"]) == (key, preset)]
                label = preset if len(keys) == 1 else f"{preset}, {key}"
                ax.plot([int(r["k"]) for r in mine], [number(r, "mse") for r in mine], marker=marker, linestyle=line,
                        label=label)
            segment, mem_len = int(rows[0]["segment"]), int(rows[0]["mem_len"])
            ax.axvline(segment, color="grey", linestyle="--", linewidth=1)
            ax.text(segment, 1.02, f" segment = {segment}", color="grey", fontsize=8, va="bottom")
            ax.axhline(NO_SOURCE, color="grey", linestyle=":", linewidth=1)
            ax.set(xlabel="delay k (steps)", ylabel="held-out MSE (predict 0 = 1.0)", ylim=(0, 1.15),
                   title=f"recall x[t-k], segment {segment}, mem_len {mem_len}")
            ax.legend(fontsize=8)
