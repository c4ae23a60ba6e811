"""StreamingLLM's claim beside the paper: a window cache loses the model once the first tokens are
evicted, and keeping 4 of them (attention sinks) restores it at a window's cost.

Paper: Xiao, Tian, Chen, Han, Lewis 2023, "Efficient Streaming Language Models with Attention Sinks",
arXiv:2309.17453, Section 3 and Figure 3 (perplexity over 20K tokens: dense attention fails past the
pre-training length, window attention once the initial tokens are evicted, sliding window with
re-computation and StreamingLLM stay low; StreamingLLM up to 22.2x faster than re-computation).

A model trained by the app with dense causal attention on real text is streamed over ``--tokens``
tokens of a split, token by token through its state, four ways with the same weights (each an
``attention=`` override of the trained model, so no weight changes):

- ``dense``: the unbounded KV cache (every earlier token; memory and time per token grow);
- ``window``: ``max_cache=W`` (the most recent W keys; StreamingLLM's "window attention");
- ``sinks``: ``max_cache=W, sinks=k`` (the first k keys kept, the window rolled; StreamingLLM);
- ``recompute``: the model re-run from scratch on the last W + 1 tokens for every token (the
  "sliding window with re-computation" baseline; O(W^2) per token).

Every mode sees W + 1 tokens when predicting (the cache's W plus the token itself), except ``dense``.
The stream is cut into chunks; each chunk is run by every mode, in an order rotated each chunk, so
their tokens/s are compared under the same load. Positions: either none (no absolute signal: a
stream of 20K tokens runs past any trained table; the first pair of commands below) or a position acting
inside attention: with ``position=rope`` the window and sinks modes number the cached keys by their place
in the cache (``position.cache_positions``, StreamingLLM's rule, Section 3.2), the paper's setting (the
second pair). Deviation from the paper: a small character-level model (d 128, 4 layers, trained at 256
tokens on Tiny Shakespeare) in place of Llama-2 on PG19.

    python experiments/train.py experiment=shakespeare model=vanilla_lm position=none \\
        trainer.max_steps=2000 trainer.threads=1 logger=csv hydra.run.dir=runs/streaming/train
    python experiments/streaming.py runs/streaming/train/checkpoints/best.pt --tokens 20000 \\
        --window 128 --sinks 4 --threads 1 --out results/streaming/nope
    python experiments/train.py experiment=shakespeare model=vanilla_lm position=rope \\
        trainer.max_steps=2000 trainer.threads=1 logger=csv hydra.run.dir=runs/streaming_rope/train
    python experiments/streaming.py runs/streaming_rope/train/checkpoints/best.pt --tokens 20000 \\
        --window 128 --sinks 4 --threads 1 --out results/streaming/rope

Writes ``streaming.csv`` (per chunk and mode: bpc, tokens/s, cache MiB), ``summary.md`` and
``streaming.png`` into ``--out``.
"""

from __future__ import annotations

import argparse
import math
import os
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

import zoo
from zoo.app.run import load_run
from zoo.bench.generate import state_bytes
from zoo.bench.machine import describe_machine
from zoo.bench.report import write_csv
from zoo.bench.timing import rotation
from zoo.config import NoOptions
from zoo.position.base import POSITION
from zoo.train.eval_protocols import split_stream

MODES = ("dense", "window", "sinks", "recompute")


def mode_models(model: torch.nn.Module, window: int, sinks: int) -> dict[str, torch.nn.Module]:
    """The trained model under each mode's attention options (the same weights, loaded into each)."""
    config = model.config.to_dict()
    attention = {
        "dense": {"max_cache": 0},
        "window": {"max_cache": window},
        "sinks": {"max_cache": window, "sinks": sinks},
    }
    attention["recompute"] = attention["dense"]
    position = dict(config["position"] if isinstance(config["position"], dict) else {"name": config["position"]})
    # a rolled cache numbers its keys by their place in it (StreamingLLM, Section 3.2) where the position part
    # can (rope): a key's rotation then never exceeds the window, the distances the model was trained on
    renumber = "cache_positions" in getattr(POSITION.get(position["name"]), "Options", NoOptions).__dataclass_fields__
    out = {}
    for mode in MODES:
        part = dict(config["attention"] if isinstance(config["attention"], dict) else {"name": config["attention"]})
        require_vanilla(part["name"])
        rolled = {"cache_positions": True} if renumber and mode in ("window", "sinks") else {}
        built = zoo.create_model(
            **{**config, "attention": {**part, **attention[mode]}, "position": {**position, **rolled}}
        )
        built.load_state_dict(model.state_dict())
        out[mode] = built.eval()
    return out


def require_vanilla(name: str) -> None:
    if name != "vanilla":
        raise SystemExit(f"the four modes are options of the vanilla KV cache; the checkpoint's attention is {name!r}")


class Stream:
    """One mode's pass over the stream: NLL per predicted token, seconds, the state's bytes."""

    def __init__(self, mode: str, model: torch.nn.Module, window: int):
        self.mode, self.model, self.window = mode, model, window
        self.state = None if mode == "recompute" else model.init_state(1)
        self.nll: list[float] = []
        self.seconds = 0.0

    @torch.no_grad()
    def run(self, tokens: torch.Tensor, start: int, end: int) -> None:
        """Predict tokens[start + 1 ... end] from everything before them (as the mode allows)."""
        begin = time.perf_counter()
        if self.mode == "recompute":
            self.nll.extend(self.recompute(tokens, start, end))
        else:
            for i in range(start, end):
                out = self.model(tokens[None, i : i + 1], state=self.state)
                self.state = out.state
                self.nll.append(float(F.cross_entropy(out.logits[0, -1], tokens[i + 1])))
        self.seconds += time.perf_counter() - begin

    def recompute(self, tokens: torch.Tensor, start: int, end: int, batch: int = 64) -> list[float]:
        """Every position i re-run from scratch on tokens[i - W ... i] (W + 1 tokens; the whole prefix
        while it is shorter), in batches of windows."""
        nll, w = [], self.window
        for first in range(start, end, batch):
            rows = range(first, min(first + batch, end))
            for i in (i for i in rows if i < w):  # the stream's first W positions: each its whole prefix
                logits = self.model(tokens[None, : i + 1]).logits[0, -1]
                nll.append(float(F.cross_entropy(logits, tokens[i + 1])))
            full = [i for i in rows if i >= w]
            if full:
                logits = self.model(torch.stack([tokens[i - w : i + 1] for i in full])).logits[:, -1]
                nll.extend(F.cross_entropy(logits, tokens[[i + 1 for i in full]], reduction="none").tolist())
        return nll

    def cache_mib(self) -> float:
        return 0.0 if self.state is None else state_bytes(self.state) / 2**20


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint")
    parser.add_argument("--split", default="test", choices=["train", "val", "test"])
    parser.add_argument("--tokens", type=int, default=20_000, help="tokens of the split to stream over")
    parser.add_argument("--window", type=int, default=128, help="W: keys in the window cache (and recompute's past)")
    parser.add_argument("--sinks", type=int, default=4, help="k: initial tokens kept (the sinks mode)")
    parser.add_argument("--chunk", type=int, default=1000, help="tokens per chunk (modes alternate per chunk)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--data-path", default="", help="the data file, if it moved since training")
    parser.add_argument("--out", default="results/streaming")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    _, task, model, ckpt = load_run(args.checkpoint, data={"path": args.data_path} if args.data_path else None)
    stream = torch.from_numpy(split_stream(task, args.split)[: args.tokens + 1])
    if len(stream) < args.tokens + 1:
        raise SystemExit(f"the {args.split} split holds {len(stream) - 1} predictable tokens, fewer than --tokens")
    runs = {mode: Stream(mode, m, args.window) for mode, m in mode_models(model, args.window, args.sinks).items()}
    rows = []
    for index, start in enumerate(range(0, args.tokens, args.chunk)):
        end = min(start + args.chunk, args.tokens)
        for mode in rotation(list(MODES), index):
            before = runs[mode].seconds
            runs[mode].run(stream, start, end)
            nll = runs[mode].nll[start:end]
            rows.append(
                dict(
                    mode=mode,
                    start=start,
                    end=end,
                    bpc=float(np.mean(nll)) / math.log(2),
                    tokens_per_s=(end - start) / (runs[mode].seconds - before),
                    cache_mib=runs[mode].cache_mib(),
                    load_1min=os.getloadavg()[0],
                )
            )
        done = rows[-len(MODES) :]
        print(f"{end:>7,}  " + "  ".join(f"{r['mode']} {r['bpc']:.3f} bpc {r['tokens_per_s']:.0f} tok/s" for r in done))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_csv(out / "streaming.csv", rows)
    meta = dict(
        checkpoint_step=ckpt["step"],
        machine=describe_machine(),
        threads=args.threads,
        window=args.window,
        sinks=args.sinks,
        tokens=args.tokens,
        train_len=task.seq_len,
        split=args.split,
        load=" ".join(f"{x:.1f}" for x in os.getloadavg()),
    )
    (out / "summary.md").write_text(summary_markdown(runs, rows, meta))
    plot(rows, out / "streaming.png", meta)
    print((out / "summary.md").read_text())


def summary_markdown(runs: dict[str, Stream], rows: list[dict], meta: dict) -> str:
    tail = meta["tokens"] // 2  # the second half: far past the training length and the window
    lines = [
        "# Streaming past the training length (StreamingLLM's claim)",
        "",
        f"Checkpoint step {meta['checkpoint_step']}, trained at {meta['train_len']} tokens; {meta['tokens']:,} tokens "
        f"of the {meta['split']} split, window W = {meta['window']}, sinks k = {meta['sinks']}; {meta['machine']}, "
        f"{meta['threads']} thread(s), load average at the end {meta['load']}. tokens/s: the mode's whole stream, "
        "its chunks interleaved with the other modes' (order rotated per chunk).",
        "",
        f"| mode | bpc, all | bpc, positions {meta['window'] + 1}-{meta['train_len'] - 1} (past the window, inside "
        f"the training length) | bpc, last {tail:,} tokens | tokens/s | cache MiB at the end |",
        "|---|---|---|---|---|---|",
    ]
    inside = slice(meta["window"] + 1, meta["train_len"])
    for mode, run in runs.items():
        nll = np.asarray(run.nll)
        lines.append(
            f"| {mode} | {nll.mean() / math.log(2):.3f} | {nll[inside].mean() / math.log(2):.3f} | "
            f"{nll[-tail:].mean() / math.log(2):.3f} | {len(nll) / run.seconds:,.0f} | {run.cache_mib():.2f} |"
        )
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: Path, meta: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for mode in MODES:
        points = [r for r in rows if r["mode"] == mode]
        x = [r["end"] for r in points]
        left.plot(x, [r["bpc"] for r in points], marker=".", label=mode)
        right.plot(x, [r["cache_mib"] for r in points], marker=".", label=mode)
    left.axvline(meta["train_len"], color="grey", lw=0.8, ls=":")
    left.set(xlabel="position in the stream", ylabel="bits per character (per chunk)", title="perplexity vs position")
    right.set(xlabel="position in the stream", ylabel="MiB", title="state bytes (recompute keeps none)")
    right.set_yscale("symlog")
    for axis in (left, right):
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    fig.suptitle(f"W = {meta['window']}, sinks = {meta['sinks']}, trained at {meta['train_len']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


if __name__ == "__main__":
    main()
