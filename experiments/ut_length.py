"""Universal Transformer length generalisation with randomised position offsets (Dehghani et al.
2019, arXiv:1807.03819, Section 3.3 and Table 4), beside PyTorch's own encoder-decoder.

Copy / reverse / addition, trained on lengths ``--train-min .. --train-max`` (the paper: 40) and
tested at ``--test-lengths`` (the paper: 400). Training positions start at a random offset u in
0..R per sequence (R = ``--offset-max``, >= test length - train length so that the positions a
long test string reaches were seen in training); evaluation starts at 0. Models at (nearly) equal
parameter count:

- ``ut``: the Universal Transformer, fixed T steps; the stack adds position + timestep before every
  step, the position shifted by the offset (``stack.random_offset_max``, zoo/stacks/universal.py).
- ``ut_act``: the same with ACT halting (at most ``2 T`` steps).
- ``vanilla``: our encoder-decoder, ``layers`` layers at width d / 2 (params ~ layers * d^2), the
  offset on its sinusoidal position axis (``position.random_offset_max``, zoo/position/absolute.py).
- ``torch``: ``torch.nn.Transformer`` (PyTorch's encoder-decoder, code we did not write) at the
  vanilla's size, with the same tied embeddings and the same sinusoid (offset drawn here) added
  outside it: the reference for our vanilla.

Scoring (see ``score_teacher_forced``): char-acc is the share of answer symbols (+ eos) whose
argmax is right given the true prefix (teacher forcing, as tensor2tensor's ``accuracy`` metric);
seq-acc is the share of strings whose every argmax is right, which is exactly greedy decoding's
sequence accuracy (greedy reproduces the target iff each step's argmax given the true prefix is
right). ``--greedy-lengths`` also decodes greedily (batched) and reports greedy char-acc there.

    python experiments/ut_length.py --out results/ut_length            # resumable: skips done runs
    python experiments/ut_length.py --merge --out results/ut_length    # table + plot from results.csv
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import torch
from torch import Tensor, nn

import zoo
from zoo.app.csv_rows import append_rows, read_rows
from zoo.config import IGNORE_INDEX
from zoo.data.algorithmic import BOS, EOS, PAD, PAPER_TABLE4, TASKS, algorithmic_batch, score, vocab_size
from zoo.models.base import ModelOutput
from zoo.position.base import sinusoid_table
from zoo.train.steps import adam, schedule, train_step

PAPER = PAPER_TABLE4  # Table 4 (train 40, test 400): (task, row) -> (char, seq)
PAPER_ROW = {"ut": "ut", "ut_act": "ut", "vanilla": "transformer", "torch": "transformer"}
MODELS = tuple(PAPER_ROW)


class TorchSeq2Seq(nn.Module):
    """torch.nn.Transformer with three-way tied embeddings (scaled by sqrt(d)) and the sinusoid
    added outside it; in training each sequence (source and target drawn apart, as our models
    do) starts at a random position 0..offset_max."""

    def __init__(self, vocab: int, d_model: int, n_heads: int, d_ff: int, layers: int, offset_max: int):
        super().__init__()
        self.d_model, self.offset_max = d_model, offset_max
        self.embed = nn.Parameter(torch.randn(vocab, d_model) * d_model**-0.5)
        self.transformer = nn.Transformer(d_model, n_heads, layers, layers, d_ff, dropout=0.0, batch_first=True)

    def vectors(self, tokens: Tensor) -> Tensor:
        b, t = tokens.shape
        positions = torch.arange(t)[None]
        if self.training and self.offset_max:
            positions = positions + torch.randint(0, self.offset_max + 1, (b, 1))
        signal = sinusoid_table(positions.flatten(), self.d_model).view(-1, t, self.d_model)
        return nn.functional.embedding(tokens, self.embed) * math.sqrt(self.d_model) + signal

    def forward(
        self, src: Tensor, tgt: Tensor, targets: Tensor | None = None, *, src_pad_mask: Tensor, tgt_pad_mask: Tensor
    ) -> ModelOutput:
        """Called like our encoder-decoder, so zoo.train.steps trains both; the loss is cross-entropy
        over the targets that are not -100 (as our models' loss)."""
        logits = self.logits(src, tgt, src_pad_mask, tgt_pad_mask)
        if targets is None:
            return ModelOutput(logits)
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX)
        return ModelOutput(logits, loss)

    def logits(self, src: Tensor, tgt: Tensor, src_pad_mask: Tensor, tgt_pad_mask: Tensor) -> Tensor:
        causal = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1], dtype=torch.bool)
        h = self.transformer(
            self.vectors(src),
            self.vectors(tgt),
            tgt_mask=causal,
            src_key_padding_mask=~src_pad_mask,
            tgt_key_padding_mask=~tgt_pad_mask,
            memory_key_padding_mask=~src_pad_mask,
            tgt_is_causal=True,
        )
        return h @ self.embed.t()

    @torch.no_grad()
    def generate(self, src: Tensor, max_len: int, src_pad_mask: Tensor) -> Tensor:
        """Greedy decoding, recomputing the prefix (nn.Transformer keeps no cache)."""
        prefix = torch.full((src.shape[0], 1), BOS, dtype=torch.long)
        done = torch.zeros(src.shape[0], dtype=torch.bool)
        for _ in range(max_len):
            logits = self.logits(src, prefix, src_pad_mask, torch.ones_like(prefix, dtype=torch.bool))
            token = logits[:, -1].argmax(-1).masked_fill(done, PAD)
            prefix = torch.cat([prefix, token[:, None]], 1)
            done |= token == EOS
            if bool(done.all()):
                break
        return prefix[:, 1:]


def build(name: str, task: str, args) -> nn.Module:
    d, heads, steps, offsets = args.d_model, args.heads, args.steps_t, args.offset_max
    vocab = vocab_size(task)
    common = dict(vocab_size=vocab, n_heads=heads, n_layers=steps, dropout=0.0, label_smoothing=0.0)
    if name == "torch":
        return TorchSeq2Seq(vocab, d // 2, heads, 2 * d, steps, offsets)
    if name == "vanilla":
        position = {"name": "sinusoidal", "random_offset_max": offsets}
        return zoo.create_model("vanilla_seq2seq", d_model=d // 2, d_ff=2 * d, position=position, **common)
    stack = {"act": name == "ut_act", "random_offset_max": offsets}
    if name == "ut_act":
        stack["max_steps"] = 2 * steps
    return zoo.create_model("universal_seq2seq_act", d_model=d, d_ff=4 * d, stack=stack, **common)


def logits_of(model: nn.Module, batch: dict[str, Tensor]) -> Tensor:
    out = model(batch["src"], batch["tgt"], src_pad_mask=batch["src_pad_mask"], tgt_pad_mask=batch["tgt_pad_mask"])
    return out.logits


@torch.no_grad()
def score_teacher_forced(model: nn.Module, batch: dict[str, Tensor]) -> tuple[float, float]:
    """(char-acc, seq-acc) of the argmax given the true prefix; seq-acc equals greedy decoding's."""
    model.eval()
    predicted = logits_of(model, batch).argmax(-1)
    return score(predicted, batch["targets"])


@torch.no_grad()
def score_greedy(model: nn.Module, batch: dict[str, Tensor]) -> tuple[float, float]:
    model.eval()
    width = batch["targets"].shape[1]
    if isinstance(model, TorchSeq2Seq):
        predicted = model.generate(batch["src"], width, batch["src_pad_mask"])
    else:
        predicted = model.generate(batch["src"], max_len=width, src_pad_mask=batch["src_pad_mask"])
    return score(predicted, batch["targets"])


def test_batch(task: str, length: int, n: int, seed: int) -> dict[str, Tensor]:
    """The same n test strings of one length for every model and seed (seeded by length)."""
    g = torch.Generator().manual_seed(10_000 + seed * 1_000 + length)
    return algorithmic_batch(task, n, length, length, generator=g)


def run(task: str, name: str, seed: int, args) -> dict:
    torch.manual_seed(seed)  # init and the offset draws
    model = build(name, task, args)
    optimizer = adam(model, lr=args.lr)
    scheduler = schedule(optimizer, "cosine", warmup=args.train_steps // 10, total=args.train_steps)
    g = torch.Generator().manual_seed(seed + 1)  # the training strings: identical for every model
    start = time.process_time()
    losses, act_steps = [], []
    for step in range(args.train_steps):
        batch = algorithmic_batch(task, args.batch, args.train_min, args.train_max, generator=g)
        out, loss = train_step(model, batch, optimizer, scheduler=scheduler)
        if "encoder/act/steps_mean" in out.stats:
            act_steps.append(float(out.stats["encoder/act/steps_mean"]))
        losses.append(float(loss.detach()))
        if args.curve_every and (step + 1) % args.curve_every == 0:
            char, seq = score_teacher_forced(model, test_batch(task, args.train_max, args.n_test, seed))
            point = {"task": task, "model": name, "offset_max": args.offset_max, "seed": seed, "step": step + 1}
            append_rows(
                Path(args.out) / "curve.csv", [{**point, "loss": round(float(loss), 4), "char": char, "seq": seq}]
            )
        if step % max(1, args.train_steps // 5) == 0:
            print(f"  {task} {name} seed {seed} step {step} loss {float(loss):.3f}", flush=True)
    row = {
        "task": task,
        "model": name,
        "offset_max": args.offset_max,
        "seed": seed,
        "params": sum(p.numel() for p in model.parameters()),
        "train_steps": args.train_steps,
        "train_cpu_s": round(time.process_time() - start, 1),
        "final_loss": round(sum(losses[-20:]) / len(losses[-20:]), 4),
    }
    if act_steps:
        row["encoder_act_steps_last"] = round(sum(act_steps[-20:]) / len(act_steps[-20:]), 2)
    start = time.process_time()
    for length in sorted({args.train_max, *args.test_lengths}):
        batch = test_batch(task, length, args.n_test, seed)
        row[f"char_{length}"], row[f"seq_{length}"] = (round(v, 4) for v in score_teacher_forced(model, batch))
        if length in args.greedy_lengths:
            small = {k: v[: args.n_greedy] for k, v in batch.items()}
            row[f"greedy_char_{length}"], row[f"greedy_seq_{length}"] = (
                round(v, 4) for v in score_greedy(model, small)
            )
    row["eval_cpu_s"] = round(time.process_time() - start, 1)
    return row


def run_key(row: dict) -> tuple:
    return (row["task"], row["model"], int(row["offset_max"]), int(row["seed"]))


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def write_report(out: Path, args) -> None:
    rows = read_rows(out / "results.csv")
    if not rows:
        print("no rows yet")
        return
    lengths = sorted({int(k.split("_")[1]) for k in rows[0] if k.startswith("char_")})
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["task"], r["model"], int(r["offset_max"])), []).append(r)
    head = " | ".join(f"len {n} char / seq" for n in lengths)
    lines = [
        f"| task | model | offsets 0..R | seeds | params | final train loss | {head} | paper char / seq (400) |",
        "|---|---|---|---|---|---|" + "---|" * len(lengths) + "---|",
    ]
    order = {m: i for i, m in enumerate(MODELS)}
    for (task, model, offset), rs in sorted(groups.items(), key=lambda kv: (kv[0][0], -kv[0][2], order[kv[0][1]])):
        cells = []
        for n in lengths:
            chars = [float(r[f"char_{n}"]) for r in rs if r.get(f"char_{n}")]
            seqs = [float(r[f"seq_{n}"]) for r in rs if r.get(f"seq_{n}")]
            cells.append(f"{mean(chars):.2f} / {mean(seqs):.2f}" if chars else "-")
        paper = PAPER[(task, PAPER_ROW[model])]
        loss = mean([float(r["final_loss"]) for r in rs])
        lines.append(
            f"| {task} | {model} | {offset} | {len(rs)} | {int(rs[0]['params']):,} | {loss:.3f} | "
            + " | ".join(cells)
            + f" | {paper[0]:.2f} / {paper[1]:.2f} |"
        )
    greedy = [k for k in rows[0] if k.startswith("greedy_char_")]
    if greedy:
        lines += ["", "Greedy decoding (batched), char-acc / seq-acc, mean over seeds:", ""]
        lines += ["| task | model | offsets 0..R | " + " | ".join(f"len {k.split('_')[-1]}" for k in greedy) + " |"]
        lines += ["|---|---|---|" + "---|" * len(greedy)]
        for (task, model, offset), rs in sorted(groups.items(), key=lambda kv: (kv[0][0], -kv[0][2], order[kv[0][1]])):
            cells = []
            for k in greedy:
                c = [float(r[k]) for r in rs if r.get(k)]
                s = [float(r[k.replace("char", "seq")]) for r in rs if r.get(k)]
                cells.append(f"{mean(c):.2f} / {mean(s):.2f}" if c else "-")
            lines.append(f"| {task} | {model} | {offset} | " + " | ".join(cells) + " |")
    (out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    plot(groups, lengths, out / "char_acc_vs_length.png")
    if (out / "curve.csv").exists():
        plot_curve(read_rows(out / "curve.csv"), out / "train_length_curve.png")


def plot(groups: dict, lengths: list[int], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = sorted({k[0] for k in groups}, key=TASKS.index)
    colours = {"ut": "tab:blue", "ut_act": "tab:green", "vanilla": "tab:orange", "torch": "tab:red"}
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.5 * len(tasks), 3.6), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        for (t, model, offset), rs in groups.items():
            if t != task:
                continue
            ys = [mean([float(r[f"char_{n}"]) for r in rs]) for n in lengths]
            style = "-o" if offset else "--x"
            ax.plot(lengths, ys, style, color=colours[model], label=f"{model}{'' if offset else ' (no offsets)'}")
        for row, colour in (("ut", "tab:blue"), ("transformer", "tab:orange")):
            ax.plot([400], [PAPER[(task, row)][0]], "*", ms=11, color=colour, label=f"paper {row} (test 1..400)")
        ax.set_xscale("log")
        ax.set_xticks(lengths, [str(n) for n in lengths])
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_ylim(0, 1.02)
        ax.set_xlabel("test length")
        ax.set_title(task)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("char-acc (teacher forced, mean of seeds)")
    handles = {}
    for ax in axes[0]:
        handles.update(zip(*reversed(ax.get_legend_handles_labels())))  # label -> handle, all panels
    fig.legend(list(handles.values()), list(handles), fontsize=7, loc="center right")
    fig.tight_layout(rect=(0, 0, 0.8, 1))
    fig.savefig(path, dpi=80)


def plot_curve(points: list[dict], path: Path) -> None:
    """Char-acc at the training length over training steps, one line per run (curve.csv)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs: dict[tuple, list[dict]] = {}
    for p in points:
        runs.setdefault((p["task"], p["model"], p["offset_max"], p["seed"]), []).append(p)
    fig, ax = plt.subplots(figsize=(5, 3.4))
    for (task, model, offset, seed), ps in runs.items():
        label = f"{task} {model} offsets 0..{offset} seed {seed}"
        ax.plot([int(p["step"]) for p in ps], [float(p["char"]) for p in ps], "-o", ms=3, label=label)
    ax.set_xlabel("training step")
    ax.set_ylabel("char-acc at the training length")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=80)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", default="copy,reverse")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--offset-max", type=int, default=360, help="R: training offsets 0..R (0 = none)")
    parser.add_argument("--d-model", type=int, default=64, help="the UT's width; vanilla/torch use d/2")
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--steps-t", type=int, default=4, help="UT steps T (ACT: at most 2T) = vanilla layers")
    parser.add_argument("--train-steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--train-min", type=int, default=1)
    parser.add_argument("--train-max", type=int, default=40)
    parser.add_argument("--test-lengths", default="40,100,200,400")
    parser.add_argument("--n-test", type=int, default=32)
    parser.add_argument("--greedy-lengths", default="40", help="lengths also decoded greedily ('' = none)")
    parser.add_argument("--n-greedy", type=int, default=16)
    parser.add_argument("--curve-every", type=int, default=0, help="score at --train-max every N steps (curve.csv)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default="results/ut_length")
    parser.add_argument("--merge", action="store_true", help="only write results.md and the plot")
    args = parser.parse_args()
    args.test_lengths = [int(n) for n in args.test_lengths.split(",")]
    args.greedy_lengths = [int(n) for n in args.greedy_lengths.split(",") if n]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.merge:
        write_report(out, args)
        return
    torch.set_num_threads(args.threads)
    done = {run_key(r) for r in read_rows(out / "results.csv")}
    for task in args.tasks.split(","):
        for seed in (int(s) for s in args.seeds.split(",")):
            for name in args.models.split(","):
                if name not in MODELS:
                    raise ValueError(f"--models: unknown {name!r}; valid: {', '.join(MODELS)}")
                key = (task, name, args.offset_max, seed)
                if key in done:
                    print(f"skip {key}: in results.csv")
                    continue
                row = run(task, name, seed, args)
                print(row, flush=True)
                append_rows(out / "results.csv", [row])
    write_report(out, args)


if __name__ == "__main__":
    main()
