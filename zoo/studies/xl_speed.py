"""Transformer-XL speed: evaluation with state reuse (paper Table 9) and a training step against a peer.

Paper: Dai et al. 2019, "Transformer-XL: Attentive Language Models Beyond a Fixed-Length Context",
arXiv:1901.02860, Table 9: evaluation time per token of a vanilla model that re-computes its whole
context for every predicted token (the Al-Rfou et al. protocol) divided by Transformer-XL's, which reuses
the memory of earlier segments: 363x at attention length 800 (1,874x at 3,800), on GPU.

Evaluation (CPU): ``vanilla_lm`` runs one forward over the last L tokens per predicted token;
``transformer_xl`` (same size) reads a stream segment by segment with ``mem_len = L``, so every prediction
sees at least L tokens (never fewer than the vanilla model); its time per token is a segment's time over the
segment length, after the memory is full. Both under ``no_grad`` in eval mode, in ``zoo.bench``'s paired
rounds (order rotated, a warm-up round unrecorded); the speed-up is the median of the per-round ratios.

Training: one step (forward + backward) of ``transformer_xl`` on a segment of N tokens with a full memory
of M tokens from the previous step, against x-transformers' ``TransformerWrapper(max_mem_len=M)`` with
``Decoder(rel_pos_bias=True)`` (the peer BENCHMARKS.md lists at 542 ms / 18,094 ms for 1,024 / 4,096
tokens), same shape: 2 layers, d 256, 4 heads, FFN 1,024, vocab 256, batch 1; in paired rounds too.
"""

from __future__ import annotations

import functools
import importlib.util
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

import zoo
from zoo.bench import clocked, paired_ratios, paired_rounds
from zoo.config import require
from zoo.studies.base import STUDY, Study
from zoo.studies.common import Rows, load_now, load_range, markdown_table, number, saved_figure

PAPER_TABLE9 = {800: 363, 1800: 773, 2800: 1409, 3800: 1874}
PEER_BENCHMARKS_MS = {1024: 542, 4096: 18094}  # x-transformers in BENCHMARKS.md, keyed by segment + memory
EVAL_TARGET = (800, 300)  # at attention length 800, a speed-up of at least 300x (the paper's 363x, on GPU)
TRAIN_TARGET = 0.5  # ours / peer at most this, at every size measured


@dataclass
class Options:
    lengths: list[int] = field(default_factory=lambda: [128, 256, 512, 800])  # attention lengths L
    segment: int = 128  # XL's evaluation segment (capped at L)
    layers: int = 4
    d_model: int = 256
    rounds: int = 5
    train_configs: list[str] = field(default_factory=lambda: ["512+512", "1024+0", "1024+1024", "2048+2048"])
    train_rounds: int = 3
    train_d_model: int = 256

    def __post_init__(self) -> None:
        require(all(c.count("+") == 1 and c.replace("+", "").isdigit() for c in self.train_configs),
                f"study.train_configs are segment+memory pairs such as 512+512, got {self.train_configs}")
        require(self.rounds > 0 and self.train_rounds > 0, "study.rounds and study.train_rounds must be > 0")


def quiet(line: str) -> None:
    """paired_rounds' per-round lines are not printed (each finished row is)."""


class XLStream:
    """Transformer-XL reading random tokens segment by segment, its memory carried between calls."""

    def __init__(self, model: torch.nn.Module, vocab: int, segment: int, length: int):
        self.model, self.vocab, self.segment, self.length = model, vocab, segment, length
        self.state = model.init_state(1)

    def feed(self, piece: torch.Tensor) -> None:
        self.state = self.model(piece, state=self.state).state

    def fill(self) -> None:
        """Read enough segments to fill the memory (and warm up)."""
        for _ in range(-(-self.length // self.segment) + 1):
            self.feed(torch.randint(0, self.vocab, (1, self.segment)))

    def seconds_per_token(self) -> float:
        """One paired-round step: read ``length`` fresh tokens; the clocked model calls per token."""
        pieces = [torch.randint(0, self.vocab, (1, self.segment)) for _ in range(max(1, self.length // self.segment))]
        return sum(clocked(functools.partial(self.feed, p))() for p in pieces) / (self.segment * len(pieces))


def ours_step(model, tokens, state) -> None:
    model(tokens[:, :-1], tokens[:, 1:], state=state).loss.backward()
    model.zero_grad(set_to_none=True)


def peer_step(model, tokens, mems) -> None:
    logits = model(tokens[:, :-1], mems=mems)
    F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()).backward()
    model.zero_grad(set_to_none=True)


@STUDY.register("xl_speed")
class XLSpeed(Study):
    Options = Options
    question = ("Is Transformer-XL's evaluation with state reuse hundreds of times faster per token than a vanilla "
                "model re-computing its context (paper Table 9), and its training step at most half x-transformers'?")
    figures = ("eval_speed.png",)
    # the training comparison needs the peer (the `peers` extra): at toy size it runs where that is installed
    toy_options = dict(lengths=[16], segment=8, layers=1, d_model=16, rounds=1, train_rounds=1, train_d_model=16,
                       train_configs=["16+16"] if importlib.util.find_spec("x_transformers") else [])

    def run(self) -> None:
        o, threads = self.options, self.threads
        require(not o.train_configs or importlib.util.find_spec("x_transformers") is not None,
                "xl_speed: the training comparison times x-transformers' step beside ours; install it "
                "(pip install -e '.[peers]') or leave it out with study.train_configs=[]")
        rows = Rows(self.rows_path, ("kind", "threads", "attention_length", "segment", "memory"))
        shape = dict(vocab_size=256, d_model=o.d_model, n_layers=o.layers, n_heads=4, d_ff=4 * o.d_model, dropout=0.0)
        torch.manual_seed(0)
        vanilla = zoo.create_model("vanilla_lm", **shape, max_len=max(o.lengths)).eval()
        for length in o.lengths:
            seg = min(o.segment, length)
            if rows.has(kind="eval", threads=threads, attention_length=length, segment=seg, memory=length):
                continue
            xl = zoo.create_model("transformer_xl", **shape, attention={"mem_len": length}).eval()
            context = torch.randint(0, shape["vocab_size"], (1, length))
            with torch.no_grad():
                stream = XLStream(xl, shape["vocab_size"], seg, length)
                stream.fill()
                # per predicted token: one vanilla forward over the last L tokens, against XL's share of a segment
                steps = {"vanilla": clocked(functools.partial(vanilla, context)), "xl": stream.seconds_per_token}
                timing = paired_ratios(paired_rounds(steps, o.rounds, progress=quiet), "vanilla")
            rows.add([dict(kind="eval", threads=threads, attention_length=length, segment=seg, memory=length,
                           layers=o.layers, d_model=o.d_model, rounds=o.rounds,
                           vanilla_ms=1e3 * timing["vanilla"]["median_s"], xl_ms=1e3 * timing["xl"]["median_s"],
                           speedup=timing["xl"]["ratio"], speedup_min=timing["xl"]["ratio_min"],
                           speedup_max=timing["xl"]["ratio_max"], load_1min=load_now())])
        for config in o.train_configs:
            n, mem = (int(v) for v in config.split("+"))
            if not rows.has(kind="train", threads=threads, attention_length="", segment=n, memory=mem):
                rows.add([self.train_row(n, mem, threads)])

    def train_row(self, n: int, mem: int, threads: int) -> dict:
        from x_transformers import Decoder, TransformerWrapper

        d, o = self.options.train_d_model, self.options
        torch.manual_seed(0)
        shape = dict(vocab_size=256, d_model=d, n_layers=2, n_heads=4, d_ff=4 * d, dropout=0.0)
        ours = zoo.create_model("transformer_xl", **shape, attention={"mem_len": mem}).train()
        peer = TransformerWrapper(num_tokens=256, max_seq_len=n, max_mem_len=mem,
                                  attn_layers=Decoder(dim=d, depth=2, heads=4, ff_mult=4, rel_pos_bias=True)).train()
        tokens = torch.randint(0, 256, (1, n + 1))
        ours_state = peer_mems = None
        if mem:  # a full memory of `mem` states from the previous segment, as in the steady state
            ours_state = ours(torch.randint(0, 256, (1, mem))).state
            with torch.no_grad():
                _, peer_mems = peer(torch.randint(0, 256, (1, mem)), return_mems=True)
        steps = {"transformer_xl": clocked(functools.partial(ours_step, ours, tokens, ours_state)),
                 "x_transformers": clocked(functools.partial(peer_step, peer, tokens, peer_mems))}
        timing = paired_ratios(paired_rounds(steps, o.train_rounds, progress=quiet), "x_transformers")
        return dict(kind="train", threads=threads, attention_length="", segment=n, memory=mem, layers=2, d_model=d,
                    rounds=o.train_rounds, xl_ms=1e3 * timing["transformer_xl"]["median_s"],
                    peer_ms=1e3 * timing["x_transformers"]["median_s"], load_1min=load_now())

    def report(self, rows: list[dict[str, str]]) -> str:
        lines, verdicts = [], []
        for threads in sorted({int(r["threads"]) for r in rows}):
            group = [r for r in rows if int(r["threads"]) == threads]
            evals = [r for r in group if r["kind"] == "eval"]
            trains = [r for r in group if r["kind"] == "train"]
            plural = "s" if threads > 1 else ""
            lines += [f"### {threads} thread{plural} (1-minute load average {load_range(group)})", ""]
            if evals:
                first = evals[0]
                lines += [f"Evaluation, per-token time: {first['layers']} layers, d {first['d_model']}, 4 heads, vocab "
                          f"256, batch 1; XL segment {first['segment']}, mem_len = attention length; median of "
                          f"{first['rounds']} paired rounds.", "", *markdown_table(
                              ["attention length", "vanilla ms/token", "XL ms/token", "speed-up (median of rounds)",
                               "range", "paper (GPU)"],
                              ([r["attention_length"], f"{number(r, 'vanilla_ms'):.2f}", f"{number(r, 'xl_ms'):.4f}",
                                f"{number(r, 'speedup'):.0f}x",
                                f"{number(r, 'speedup_min'):.0f}-{number(r, 'speedup_max'):.0f}x",
                                f"{PAPER_TABLE9[int(r['attention_length'])]}x"
                                if int(r["attention_length"]) in PAPER_TABLE9 else "-"] for r in evals)), ""]
            if trains:
                lines += [f"Training step (forward + backward), a segment with a full memory from the previous step: "
                          f"2 layers, d {trains[0]['d_model']}; median of {trains[0]['rounds']} paired rounds.", "",
                          *markdown_table(
                              ["segment", "memory", "transformer_xl ms", "x-transformers ms (this run)", "ours / peer",
                               "peer in BENCHMARKS.md"],
                              ([r["segment"], r["memory"], f"{number(r, 'xl_ms'):,.0f}", f"{number(r, 'peer_ms'):,.0f}",
                                f"{number(r, 'xl_ms') / number(r, 'peer_ms'):.2f}",
                                PEER_BENCHMARKS_MS.get(int(r["segment"]) + int(r["memory"]), "-")]
                               for r in trains)), ""]
            verdicts += [self.verdict(threads, evals, trains), ""]
        self.figure(rows)
        return "\n".join([*lines, "![eval speed-up against attention length](eval_speed.png)", "", *verdicts])

    @staticmethod
    def verdict(threads: int, evals: list[dict[str, str]], trains: list[dict[str, str]]) -> str:
        """Table 9's target: a speed-up of at least 300x at L = 800; training: ours / peer <= 0.5 at every size."""
        length, target = EVAL_TARGET
        said = []
        at = [number(r, "speedup") for r in evals if int(r["attention_length"]) == length]
        if at:
            said.append(f"evaluation {'meets' if at[0] >= target else 'misses'} >= {target}x at L = {length} "
                        f"({at[0]:.0f}x; the paper {PAPER_TABLE9[length]}x on GPU)")
        ratios = {f"{r['segment']}+{r['memory']}": number(r, "xl_ms") / number(r, "peer_ms") for r in trains}
        if ratios:
            missed = [f"{k} ({v:.2f})" for k, v in ratios.items() if v > TRAIN_TARGET]
            said.append(f"training is at most {TRAIN_TARGET} of x-transformers' step "
                        + (f"at every size measured ({', '.join(f'{v:.2f}' for v in ratios.values())})" if not missed
                           else f"except at {', '.join(missed)}"))
        return f"**Verdict, {threads} thread(s)**: " + ("; ".join(said) or "not enough rows") + "."

    def figure(self, rows: list[dict[str, str]]) -> None:
        from matplotlib.ticker import NullFormatter

        with saved_figure(self.paths.out / "eval_speed.png", figsize=(5, 3.6), dpi=110) as (_, ax):
            xs: set[int] = set()
            for threads in sorted({int(r["threads"]) for r in rows if r["kind"] == "eval"}):
                evals = sorted((int(r["attention_length"]), r) for r in rows if r["kind"] == "eval"
                               and int(r["threads"]) == threads)
                x = [length for length, _ in evals]
                xs |= set(x)
                ax.plot(x, [number(r, "speedup") for _, r in evals], "o-",
                        label=f"ours (CPU, {threads} thread(s), median)")
                ax.fill_between(x, [number(r, "speedup_min") for _, r in evals],
                                [number(r, "speedup_max") for _, r in evals], alpha=0.2)
            ax.plot(list(PAPER_TABLE9), list(PAPER_TABLE9.values()), "s--", label="paper Table 9 (GPU)")
            ax.set_xscale("log")
            ax.set_yscale("log")
            ticks = sorted(xs | set(PAPER_TABLE9))
            ax.set_xticks(ticks, [str(t) for t in ticks], rotation=45)
            ax.xaxis.set_minor_formatter(NullFormatter())
            ax.set(xlabel="attention length", ylabel="eval speed-up per token (x)",
                   title="Transformer-XL state reuse vs vanilla recompute")
            ax.grid(alpha=0.3, which="both")
            ax.legend(fontsize=7)
