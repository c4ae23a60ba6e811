"""Transformer-XL speed: evaluation with state reuse (paper Table 9) and training against a peer.

Reproduces Dai et al. 2019 (arXiv:1901.02860), Table 9: evaluation time per token of the vanilla
model that re-computes its whole context for every predicted token (the Al-Rfou et al. protocol)
divided by Transformer-XL's, which reuses the memory of earlier segments. The paper measured
363x at attention length 800 (1,874x at 3,800) on GPU.

Protocol (ours, CPU):
- vanilla (``vanilla_lm``, same size): one forward over the last L tokens per predicted token;
- XL (``transformer_xl``, same size): a stream fed segment by segment (``--segment`` tokens) with
  ``mem_len = L``, so every prediction sees at least L tokens of context (never fewer than the
  vanilla model); time per token = time per segment / segment length, measured after the memory
  is full. Both under ``torch.no_grad()`` in eval mode, timed in zoo.bench's paired rounds (both
  once per round, order rotated, a warm-up round unrecorded) so machine load hits both alike; the
  ratio is the median of per-round ratios.

Training speed (``--train-lengths``): one step (forward + backward) of ``transformer_xl`` on a
segment of N tokens with a full memory of N tokens from the previous step, against
x-transformers' ``TransformerWrapper`` with ``max_mem_len = N`` and ``rel_pos_bias=True``
(the peer BENCHMARKS.md lists at 542 ms / 18,094 ms for 1,024 / 4,096), same shape: 2 layers,
d 256, 4 heads, FFN 1,024, vocab 256, batch 1. In paired rounds too.

    python experiments/xl_speed.py --out results/xl_speed
"""

from __future__ import annotations

import argparse
import csv
import functools
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

import zoo
from zoo.bench import clocked, describe_machine, paired_ratios, paired_rounds, write_csv

PAPER_TABLE9 = {800: 363, 1800: 773, 2800: 1409, 3800: 1874}
PEER_BENCHMARKS_MS = {1024: 542, 4096: 18094}  # keyed by segment + memory


def ours_step(model, tokens, state) -> None:
    out = model(tokens[:, :-1], tokens[:, 1:], state=state)
    out.loss.backward()
    model.zero_grad(set_to_none=True)


def peer_step(model, tokens, mems) -> None:
    logits = model(tokens[:, :-1], mems=mems)
    F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()).backward()
    model.zero_grad(set_to_none=True)


def quiet(line: str) -> None:
    """paired_rounds' per-round lines are not logged (the per-length summary is)."""


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


def eval_speed(lengths: list[int], segment: int, rounds: int, shape: dict, log) -> list[dict]:
    torch.manual_seed(0)
    vanilla = zoo.create_model("vanilla_lm", **shape, max_len=max(lengths)).eval()
    rows = []
    for length in lengths:
        seg = min(segment, length)
        xl = zoo.create_model("transformer_xl", **shape, attention={"mem_len": length}).eval()
        context = torch.randint(0, shape["vocab_size"], (1, length))
        with torch.no_grad():
            stream = XLStream(xl, shape["vocab_size"], seg, length)
            stream.fill()
            # per predicted token: one vanilla forward over the last L tokens, against XL's share of a segment
            steps = {"vanilla": clocked(functools.partial(vanilla, context)), "xl": stream.seconds_per_token}
            recorded = paired_rounds(steps, rounds, progress=quiet)
        timing = paired_ratios(recorded, "vanilla")
        row = dict(
            attention_length=length,
            segment=seg,
            vanilla_ms_per_token=1e3 * timing["vanilla"]["median_s"],
            xl_ms_per_token=1e3 * timing["xl"]["median_s"],
            speedup=timing["xl"]["ratio"],
            speedup_min=timing["xl"]["ratio_min"],
            speedup_max=timing["xl"]["ratio_max"],
            paper_speedup=PAPER_TABLE9.get(length, ""),
        )
        log(
            f"eval L={length} seg={seg}: vanilla {row['vanilla_ms_per_token']:.2f} ms/token, XL "
            f"{row['xl_ms_per_token']:.4f} ms/token, speed-up {row['speedup']:.0f}x (range "
            f"{row['speedup_min']:.0f}-{row['speedup_max']:.0f})"
        )
        rows.append(row)
    return rows


def train_speed(configs: list[tuple[int, int]], rounds: int, log) -> list[dict]:
    from x_transformers import Decoder, TransformerWrapper

    shape = dict(vocab_size=256, d_model=256, n_layers=2, n_heads=4, d_ff=1024, dropout=0.0)
    rows = []
    for n, mem in configs:
        torch.manual_seed(0)
        ours = zoo.create_model("transformer_xl", **shape, attention={"mem_len": mem}).train()
        peer = TransformerWrapper(
            num_tokens=256,
            max_seq_len=n,
            max_mem_len=mem,
            attn_layers=Decoder(dim=256, depth=2, heads=4, ff_mult=4, rel_pos_bias=True),
        ).train()
        tokens = torch.randint(0, 256, (1, n + 1))
        ours_state = peer_mems = None
        if mem:  # a full memory of `mem` states from the previous segment, as in the steady state
            ours_state = ours(torch.randint(0, 256, (1, mem))).state
            with torch.no_grad():
                _, peer_mems = peer(torch.randint(0, 256, (1, mem)), return_mems=True)
        steps = {
            "transformer_xl": clocked(functools.partial(ours_step, ours, tokens, ours_state)),
            "x_transformers": clocked(functools.partial(peer_step, peer, tokens, peer_mems)),
        }
        timing = paired_ratios(paired_rounds(steps, rounds, progress=quiet), "x_transformers")
        row = dict(
            segment=n,
            memory=mem,
            transformer_xl_ms=1e3 * timing["transformer_xl"]["median_s"],
            x_transformers_ms=1e3 * timing["x_transformers"]["median_s"],
            peer_in_benchmarks_md_ms=PEER_BENCHMARKS_MS.get(n + mem, ""),
        )
        row["ratio_ours_over_peer"] = row["transformer_xl_ms"] / row["x_transformers_ms"]
        log(
            f"train segment {n} + memory {mem}: transformer_xl {row['transformer_xl_ms']:.0f} ms, x-transformers "
            f"{row['x_transformers_ms']:.0f} ms, ratio {row['ratio_ours_over_peer']:.2f}"
        )
        rows.append(row)
    return rows


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.6))
    xs = [r["attention_length"] for r in rows]
    ax.plot(xs, [r["speedup"] for r in rows], "o-", label="ours (CPU, median)")
    ax.fill_between(xs, [r["speedup_min"] for r in rows], [r["speedup_max"] for r in rows], alpha=0.2)
    ax.plot(list(PAPER_TABLE9), list(PAPER_TABLE9.values()), "s--", label="paper Table 9 (GPU)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ticks = sorted(set(xs) | set(PAPER_TABLE9))
    ax.set_xticks(ticks, [str(int(t)) for t in ticks], rotation=45)
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlabel("attention length")
    ax.set_ylabel("eval speed-up per token (x)")
    ax.set_title("Transformer-XL state reuse vs vanilla recompute")
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", default="128,256,512,800")
    parser.add_argument(
        "--segment", type=int, default=128, help="XL evaluation segment length (capped at the attention length)"
    )
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--train-configs",
        default="512+512,1024+0,1024+1024,2048+2048",
        help="segment+memory pairs; '' to skip the training comparison",
    )
    parser.add_argument("--train-rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default="results/xl_speed")
    parser.add_argument(
        "--replot", action="store_true", help="only redraw eval_speed.png from the eval_speed.csv in --out"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.replot:
        with open(out / "eval_speed.csv") as f:
            rows = [{k: (float(v) if v else "") for k, v in row.items()} for row in csv.DictReader(f)]
        plot(rows, out / "eval_speed.png")
        return 0
    lines: list[str] = []

    def log(text: str) -> None:
        print(text, flush=True)
        lines.append(text)

    shape = dict(
        vocab_size=256, d_model=args.d_model, n_layers=args.layers, n_heads=4, d_ff=4 * args.d_model, dropout=0.0
    )
    command = "python " + " ".join(["experiments/xl_speed.py", *(argv if argv is not None else sys.argv[1:])])
    eval_rows = eval_speed([int(x) for x in args.lengths.split(",")], args.segment, args.rounds, shape, log)
    write_csv(out / "eval_speed.csv", eval_rows)
    plot(eval_rows, out / "eval_speed.png")
    configs = (
        [tuple(int(v) for v in pair.split("+")) for pair in args.train_configs.split(",")] if args.train_configs else []
    )
    train_rows = train_speed(configs, args.train_rounds, log) if configs else []
    if train_rows:
        write_csv(out / "train_speed.csv", train_rows)
    md = [
        f"# Transformer-XL speed\n\nCommand: `{command}`  \nMachine: {describe_machine()}, torch {torch.__version__}, "
        f"{args.threads} threads (shared machine: absolute times are noisy, ratios are measured in the same run, "
        "in zoo.bench's paired rounds: order rotated each round, a warm-up round unrecorded).\n"
    ]
    md.append(
        "## Evaluation: per-token time, vanilla re-computing its context vs XL state reuse\n\nModel: "
        f"{args.layers} layers, d {args.d_model}, 4 heads, FFN {4 * args.d_model}, vocab 256, batch 1; XL segment "
        f"{args.segment}, mem_len = attention length.\n"
    )
    md.append(
        "| attention length | vanilla ms/token | XL ms/token | speed-up (median of rounds) | range | paper (GPU) "
        "|\n|---|---|---|---|---|---|"
    )
    for r in eval_rows:
        md.append(
            f"| {r['attention_length']} | {r['vanilla_ms_per_token']:.2f} | {r['xl_ms_per_token']:.4f} | "
            f"{r['speedup']:.0f}x | {r['speedup_min']:.0f}-{r['speedup_max']:.0f}x | "
            f"{str(r['paper_speedup']) + 'x' if r['paper_speedup'] else '-'} |"
        )
    if train_rows:
        md.append(
            "\n## Training step (forward + backward): a segment with a full memory from the previous step\n\n2 "
            "layers, d 256, 4 heads, FFN 1,024, vocab 256, batch 1. Peer: x-transformers "
            "TransformerWrapper(max_mem_len=memory), Decoder(rel_pos_bias=True). BENCHMARKS.md's peer figure is "
            "quoted at segment + memory = its token count.\n"
        )
        md.append(
            "| segment | memory | transformer_xl ms | x-transformers ms (this run) | ours / peer | peer in "
            "BENCHMARKS.md |\n|---|---|---|---|---|---|"
        )
        for r in train_rows:
            md.append(
                f"| {r['segment']} | {r['memory']} | {r['transformer_xl_ms']:.0f} | {r['x_transformers_ms']:.0f} "
                f"| {r['ratio_ours_over_peer']:.2f} | {r['peer_in_benchmarks_md_ms'] or '-'} |"
            )
    md.append("\nLog:\n\n```\n" + "\n".join(lines) + "\n```\n")
    (out / "README.md").write_text("\n".join(md))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
