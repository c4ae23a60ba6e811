"""StreamingLLM's claim beside the paper: a window cache loses the model once the first tokens are evicted,
keeping 4 of them (attention sinks) restores it at a window's cost, because trained models park attention
on the first tokens.

Paper: Xiao, Tian, Chen, Han, Lewis 2023, "Efficient Streaming Language Models with Attention Sinks",
arXiv:2309.17453, Section 3 and Figure 3 (perplexity over 20K tokens: dense attention fails past the
pre-training length, window attention once the initial tokens are evicted, sliding window with
re-computation and StreamingLLM stay low; StreamingLLM up to 22.2x faster than re-computation), and
Section 3.1, Figure 2 (most heads beyond the first two layers give the initial token a large share).

Here: a ``vanilla_lm`` (dense causal attention, the ``experiment=shakespeare`` settings) trained by the app
on Tiny Shakespeare for each position scheme (``none``: no absolute signal, a 20K stream runs past any
trained table; ``rope``: the paper's setting, the rolled caches numbered by place), then streamed over
``tokens`` tokens of a split token by token, four ways with the same weights (``streaming_modes.py``);
the stream is cut into chunks, each run by every mode in an order rotated each chunk, so their tokens/s
are compared under the same load. Then the attention weight the queries at ``sink_from`` ... L - 1 of
``sink_segments`` segments of the training length L give the first ``sinks`` keys, per layer and head.

Rows: ``chunk`` (per chunk and mode: bpc, tokens/s, cache MiB), ``summary`` (per mode: bpc over the whole
stream, over positions W + 1 ... L - 1, over the last half; tokens/s; cache at the end) and ``sink`` (per
layer and head: mass, uniform share, ratio). Deviation from the paper: a 0.8M-parameter character model
in place of Llama-2 on PG19.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from zoo.app.run import load_run
from zoo.bench.timing import rotation
from zoo.config import require
from zoo.studies.base import STUDY, Study
from zoo.studies.common import Rows, load_now, load_range, markdown_table, number, saved_figure, train
from zoo.studies.streaming_modes import MODES, Stream, mode_models, sink_mass
from zoo.train.eval_protocols import split_stream

MARGIN = 0.05  # bpc: two modes closer than this stream alike; a mode this much worse has lost the model
LN2 = math.log(2)


@dataclass
class Options:
    positions: list[str] = field(default_factory=lambda: ["none", "rope"])
    steps: int = 2000
    tokens: int = 20_000  # of the split, streamed
    window: int = 128  # W: keys in the window cache (and recompute's past)
    sinks: int = 4  # k: initial tokens kept by the sinks mode, and the keys the sink mass sums
    chunk: int = 1000  # tokens per chunk (the modes alternate per chunk)
    split: str = "test"
    sink_from: int = 128  # the first query position the sink mass counts
    sink_segments: int = 32
    overrides: list[str] = field(default_factory=list)  # for every training run (the toy test shrinks it here)

    def __post_init__(self) -> None:
        require(self.split in ("val", "test"), f"study.split must be val or test, got {self.split!r}")
        require(0 < self.window and 0 <= self.sinks and 0 < self.chunk, "study.window, chunk must be > 0, sinks >= 0")


@STUDY.register("streaming")
class Streaming(Study):
    Options = Options
    question = ("Does a window cache keep the model past the training length once 4 attention sinks are kept, "
                "and does the trained model park attention on its first tokens?")
    figures = ("streaming.png",)
    toy_options = dict(positions=["rope"], steps=2, tokens=40, window=8, sinks=2, chunk=20, sink_from=16,
                       sink_segments=2, overrides=[
                           "data.path=README.md", "model.d_model=16", "model.n_layers=1", "model.n_heads=2",
                           "model.d_ff=32", "trainer.seq_len=32", "trainer.batch_size=2", "trainer.eval_every=2",
                           "trainer.eval_batches=1"])

    def run(self) -> None:
        o = self.options
        rows = Rows(self.rows_path, ("kind", "position", "tokens"))
        for position in o.positions:
            run_dir = train(["experiment=shakespeare", "model=vanilla_lm", f"position={position}",
                             f"trainer.max_steps={o.steps}", "trainer.progress=false", "logger=csv", *o.overrides],
                            self.paths.runs / f"train_{position}", threads=self.threads)
            _, task, model, ckpt = load_run(run_dir / "checkpoints" / "best.pt")
            stream = torch.from_numpy(split_stream(task, o.split))
            tag = dict(position=position, checkpoint_step=ckpt["step"], train_len=task.seq_len)
            if not rows.has(kind="summary", position=position, tokens=o.tokens):
                rows.add(self.stream(model.eval(), stream, tag))
            if not rows.has(kind="sink", position=position, tokens=""):
                rows.add(self.sink_rows(model.eval(), stream, tag))

    def stream(self, model: torch.nn.Module, stream: torch.Tensor, tag: dict) -> list[dict]:
        o = self.options
        require(len(stream) > o.tokens, f"the {o.split} split holds {len(stream) - 1} predictable tokens, fewer than "
                                        f"study.tokens={o.tokens}")
        runs = {mode: Stream(mode, m, o.window) for mode, m in mode_models(model, o.window, o.sinks).items()}
        common = dict(kind="chunk", **tag, tokens=o.tokens, window=o.window, sinks=o.sinks)
        out = []
        for index, start in enumerate(range(0, o.tokens, o.chunk)):
            end = min(start + o.chunk, o.tokens)
            for mode in rotation(list(MODES), index):
                before = runs[mode].seconds
                runs[mode].run(stream, start, end)
                out.append(dict(common, mode=mode, start=start, end=end,
                                bpc=float(np.mean(runs[mode].nll[start:end])) / LN2,
                                tokens_per_s=(end - start) / (runs[mode].seconds - before),
                                cache_mib=runs[mode].cache_mib(), load_1min=load_now()))
        inside, tail = slice(o.window + 1, tag["train_len"]), o.tokens // 2  # past the window, inside training
        for mode, run in runs.items():
            nll = np.asarray(run.nll)
            out.append(dict(common, kind="summary", mode=mode, bpc_all=nll.mean() / LN2,
                            bpc_inside=nll[inside].mean() / LN2 if len(nll[inside]) else "",
                            bpc_tail=nll[-tail:].mean() / LN2, tokens_per_s=len(nll) / run.seconds,
                            cache_mib=run.cache_mib(), load_1min=load_now()))
        return out

    def sink_rows(self, model: torch.nn.Module, stream: torch.Tensor, tag: dict) -> list[dict]:
        o, length = self.options, tag["train_len"]
        require(0 <= o.sink_from < length, f"study.sink_from must lie in [0, {length}) (the training length)")
        n = min(o.sink_segments, len(stream) // length)
        require(n > 0, f"the {o.split} split is shorter than one segment of {length}")
        rows = sink_mass(model, stream[: n * length].view(n, length), o.sink_from, o.sinks)
        return [dict(kind="sink", **tag, tokens="", segments=n, sink_from=o.sink_from, sinks=o.sinks, **r)
                for r in rows]

    def report(self, rows: list[dict[str, str]]) -> str:
        lines = [f"1-minute load average while streaming: {load_range([r for r in rows if r['kind'] == 'chunk'])}; "
                 "tokens/s compare the modes (their chunks alternate), not the machine.", ""]
        groups = list(dict.fromkeys((r["position"], r["tokens"]) for r in rows if r["kind"] == "summary"))
        for position, tokens in groups:
            summary = [r for r in rows if r["kind"] == "summary" and (r["position"], r["tokens"]) == (position, tokens)]
            lines += [*self.stream_table(position, tokens, summary), "",
                      self.verdict(position, {r["mode"]: number(r, "bpc_tail") for r in summary}), ""]
        for position in dict.fromkeys(r["position"] for r in rows if r["kind"] == "sink"):
            sink = [r for r in rows if r["kind"] == "sink" and r["position"] == position]
            lines += [*self.sink_table(position, sink), ""]
        self.figure(rows, groups)
        return "\n".join([*lines, "![bpc and state bytes against position](streaming.png)"])

    @staticmethod
    def stream_table(position: str, tokens: str, summary: list[dict[str, str]]) -> list[str]:
        first = summary[0]
        w, length, tail = int(first["window"]), int(first["train_len"]), int(tokens) // 2

        def bpc(row: dict[str, str], key: str) -> str:
            return f"{number(row, key):.3f}" if row[key] else "-"

        return [f"**position={position}, {int(tokens):,} tokens** (checkpoint step {first['checkpoint_step']}, "
                f"trained at {length}; window W = {w}, sinks k = {first['sinks']})", "", *markdown_table(
                    ["mode", "bpc, all", f"bpc, positions {w + 1}-{length - 1} (past the window, inside the training "
                     "length)", f"bpc, last {tail:,} tokens", "tokens/s", "cache MiB at the end"],
                    ([r["mode"], bpc(r, "bpc_all"), bpc(r, "bpc_inside"), bpc(r, "bpc_tail"),
                      f"{number(r, 'tokens_per_s'):,.0f}", f"{number(r, 'cache_mib'):.2f}"] for r in summary))]

    @staticmethod
    def sink_table(position: str, sink: list[dict[str, str]]) -> list[str]:
        first, body = sink[0], []
        for layer in dict.fromkeys(r["layer"] for r in sink):
            heads = [r for r in sink if r["layer"] == layer]
            ratios = [number(r, "ratio") for r in heads]
            body.append([layer, " ".join(f"{number(r, 'mass'):.3f}" for r in heads),
                         f"{min(ratios):.1f}-{max(ratios):.1f}x"])
        return [f"**position={position}: mean attention weight on the first {first['sinks']} keys**, queries at "
                f"{first['sink_from']}-{int(first['train_len']) - 1} of {first['segments']} segments (uniform share "
                f"{number(first, 'uniform'):.4f}), per head:", "",
                *markdown_table(["layer", "mass per head", "ratio to uniform"], body)]

    @staticmethod
    def verdict(position: str, tail: dict[str, float]) -> str:
        """Over the last half of the stream: sinks within ``MARGIN`` of re-computation (the claim), the window
        without sinks and dense attention worse by more than ``MARGIN`` (the failures it fixes)."""
        if not set(MODES) <= set(tail):
            return f"**Verdict, position={position}: not enough rows** (every mode is needed)."
        keeps = abs(tail["sinks"] - tail["recompute"]) <= MARGIN
        window_fails = tail["window"] - tail["sinks"] > MARGIN
        dense_fails = tail["dense"] - tail["recompute"] > MARGIN
        said = [f"sinks {'keep' if keeps else 'do not keep'} the re-computation's bpc ({tail['sinks']:.3f} against "
                f"{tail['recompute']:.3f})",
                f"the window without sinks {'fails' if window_fails else 'does not fail'} ({tail['window']:.3f})",
                f"dense attention {'fails' if dense_fails else 'does not fail'} past the training length "
                f"({tail['dense']:.3f})"]
        claim = "shows" if keeps and window_fails else "shows in part" if keeps else "does not show"
        return f"**Verdict, position={position}: the claim {claim}** over the last half: " + "; ".join(said) + "."

    def figure(self, rows: list[dict[str, str]], groups: list[tuple[str, str]]) -> None:
        height = max(len(groups), 1)
        with saved_figure(self.paths.out / "streaming.png", height, 2, figsize=(11, 4 * height), squeeze=False,
                          dpi=90) as (_, axes):
            for (left, right), group in zip(axes, groups):
                position, tokens = group
                chunks = [r for r in rows if r["kind"] == "chunk" and (r["position"], r["tokens"]) == group]
                for mode in MODES:
                    points = sorted((int(r["end"]), r) for r in chunks if r["mode"] == mode)
                    x = [end for end, _ in points]
                    left.plot(x, [number(r, "bpc") for _, r in points], marker=".", label=mode)
                    right.plot(x, [number(r, "cache_mib") for _, r in points], marker=".", label=mode)
                if chunks:
                    left.axvline(int(chunks[0]["train_len"]), color="grey", lw=0.8, ls=":")
                left.set(xlabel="position in the stream", ylabel="bits per character (per chunk)",
                         title=f"position={position}, {int(tokens):,} tokens: bpc vs position")
                right.set(xlabel="position in the stream", ylabel="MiB", title="state bytes (recompute keeps none)")
                right.set_yscale("symlog")
                for axis in (left, right):
                    axis.grid(alpha=0.3)
                    axis.legend(fontsize=8)
