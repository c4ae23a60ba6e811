"""Reformer's duplication task (Kitaev et al. 2020, arXiv:2001.04451, Section 2.1, Table 2), CPU-sized.

Sequences ``0 w 0 w``; the loss and the accuracy count the second copy of ``w`` only. A 1-layer shared-QK
model is trained with full attention and with LSH attention at 1, 2 and 4 hashes, then each trained model is
evaluated with full attention and with LSH at 1, 2, 4 and 8 hashes (the weights carry over: ``lsh`` and
``shared_qk`` share their parameter names). The paper: LSH-trained models keep their accuracy with more
hashes at evaluation, full-trained ones lose it with fewer hashes, and LSH-trained ones score chance with
full attention.

The paper: length 1024, 127 symbols, d_model = d_ff = 256, 4 heads, 150K steps. Here by default: length 64,
127 symbols, d_model = d_ff = 128, 4 heads, chunk 8 (the paper's ratio of length to chunk), learned
positions, a plain (sequential) stack (one layer gains nothing from reversibility). Each model is trained by
the app (``data=duplication``, Adam, constant rate, clip 1.0), then its last checkpoint is loaded into
``zoo.presets.reformer.duplication_model`` of each evaluation mode, with the rotations of its last step.
Superseded by ``reformer_table2`` (ours beside reformer-pytorch) for the LSH rows.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import torch

from zoo.app.run import load_run
from zoo.config import IGNORE_INDEX, require
from zoo.data.synthetic import duplication_batch
from zoo.presets.reformer import duplication_model
from zoo.studies.base import STUDY, Study
from zoo.studies.common import Rows, number, train

PAPER = {  # Table 2: rows = attention in training, columns = attention in evaluation
    "full": {"full": 100.0, "lsh8": 94.8, "lsh4": 92.5, "lsh2": 76.9, "lsh1": 52.5},
    "lsh4": {"full": 0.8, "lsh8": 100.0, "lsh4": 99.9, "lsh2": 99.4, "lsh1": 91.9},
    "lsh2": {"full": 0.8, "lsh8": 100.0, "lsh4": 99.9, "lsh2": 98.1, "lsh1": 86.8},
    "lsh1": {"full": 0.8, "lsh8": 99.9, "lsh4": 99.6, "lsh2": 94.8, "lsh1": 77.9},
}
EVALS = ["full", "lsh8", "lsh4", "lsh2", "lsh1"]
EVAL_BATCH = 64


@dataclass
class Options:
    train: list[str] = field(default_factory=lambda: list(PAPER))  # modes trained: full | lsh<hashes>
    evals: list[str] = field(default_factory=lambda: list(EVALS))  # modes each trained model is evaluated with
    length: int = 64
    n_symbols: int = 127
    d_model: int = 128
    heads: int = 4
    chunk: int = 8
    batch: int = 32
    steps: int = 800
    lr: float = 5e-3
    eval_sequences: int = 512
    seed: int = 0

    def __post_init__(self) -> None:
        modes = [*self.train, *self.evals]
        require(all(m == "full" or (m.startswith("lsh") and m[3:].isdigit()) for m in modes),
                f"study.train and study.evals take full or lsh<hashes>; got {modes}")
        require(self.eval_sequences >= EVAL_BATCH, f"study.eval_sequences must be at least {EVAL_BATCH}")


def attention_overrides(mode: str, chunk: int) -> list[str]:
    if mode == "full":
        return ["attention=shared_qk"]
    return ["attention=lsh", f"attention.n_hashes={mode[3:]}", f"attention.chunk_size={chunk}"]


@torch.no_grad()
def accuracy(model, batches: list[dict]) -> float:
    """Per cent of the second copy's symbols predicted right."""
    model.eval()
    right = total = 0
    for batch in batches:
        keep = batch["targets"] != IGNORE_INDEX
        predicted = model(batch["tokens"]).logits.argmax(-1)
        right += int((predicted[keep] == batch["targets"][keep]).sum())
        total += int(keep.sum())
    return 100.0 * right / total


@STUDY.register("reformer_duplication")
class ReformerDuplication(Study):
    Options = Options
    question = ("Do LSH-trained models keep the duplication task with more hashes at evaluation, and do full-"
                "trained ones lose it with fewer (Reformer, Table 2)?")
    figures = ("duplication.png",)
    toy_options = dict(train=["lsh2"], evals=["full", "lsh2"], length=16, n_symbols=7, d_model=16, heads=2, chunk=4,
                       batch=4, steps=2, eval_sequences=64)

    def train_overrides(self, mode: str) -> list[str]:
        o = self.options
        return [
            "data=duplication", f"data.n_symbols={o.n_symbols}", f"trainer.seq_len={o.length}", "model=reformer",
            "model.n_layers=1", f"model.d_model={o.d_model}", f"model.d_ff={o.d_model}", f"model.n_heads={o.heads}",
            "model.dropout=0.0", "position=learned", f"model.max_len={o.length}", "stack=sequential",
            "model.ff_chunk_size=0", *attention_overrides(mode, o.chunk), "optim=adam", f"optim.lr={o.lr}",
            "optim.betas=[0.9,0.999]", "optim.eps=1e-8", "optim.schedule=constant", "optim.warmup=0",
            f"trainer.max_steps={o.steps}", f"trainer.batch_size={o.batch}",
            f"trainer.eval_every={max(o.steps // 8, 1)}", "trainer.eval_batches=2", "trainer.progress=false",
            f"seed={o.seed}", "logger=csv",
        ]

    def run(self) -> None:
        o, rows = self.options, Rows(self.rows_path, ("kind", "train", "eval", "step"))
        generator = torch.Generator().manual_seed(10_000 + o.seed)
        batches = [duplication_batch(EVAL_BATCH, o.length, n_symbols=o.n_symbols, generator=generator)
                   for _ in range(o.eval_sequences // EVAL_BATCH)]
        for mode in o.train:
            if all(rows.has(kind="result", train=mode, eval=e, step="") for e in o.evals):
                continue
            run_dir = train(self.train_overrides(mode), self.paths.runs / mode, threads=self.threads)
            _, _, trained, ckpt = load_run(run_dir / "checkpoints" / "last.pt")
            logged = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
            found = [dict(kind="curve", train=mode, eval="", step=m["step"], accuracy=round(100 * m["val/accuracy"], 2))
                     for m in logged if "val/accuracy" in m]
            for evaluation in o.evals:
                evaluator = duplication_model(evaluation, n_symbols=o.n_symbols, length=o.length, d_model=o.d_model,
                                              n_heads=o.heads, chunk=o.chunk)
                # only LSH's rotation step may differ between the trained model and the evaluator
                mismatched = evaluator.load_state_dict(trained.state_dict(), strict=False)
                require(all(k.endswith("hash_step") for k in mismatched.missing_keys + mismatched.unexpected_keys),
                        f"the trained model's weights do not fit the {evaluation} model: {mismatched}")
                for module in evaluator.modules():  # evaluate with the rotations of the last training step
                    if hasattr(module, "hash_step"):
                        module.hash_step.fill_(ckpt["step"])
                found.append(dict(kind="result", train=mode, eval=evaluation, step="", steps=ckpt["step"],
                                  accuracy_percent=round(accuracy(evaluator, batches), 2),
                                  paper_percent=PAPER.get(mode, {}).get(evaluation, "")))
            rows.add(found)

    def report(self, rows: list[dict[str, str]]) -> str:
        results = {(r["train"], r["eval"]): r for r in rows if r["kind"] == "result"}
        trains = list(dict.fromkeys(t for t, _ in results))
        evals = [e for e in EVALS if any(e == v for _, v in results)] + sorted(
            {v for _, v in results} - set(EVALS))
        steps = {t: results[t, e]["steps"] for t, e in results}
        o = self.options
        lines = [f"Ours in bold, the paper's in brackets. Length {o.length} (paper: 1024), {o.n_symbols} symbols, "
                 f"1 layer, d_model = d_ff = {o.d_model} (paper: 256), {o.heads} heads, chunk {o.chunk}, steps of "
                 f"batch {o.batch} as listed per row (paper: 150K), Adam lr {o.lr}. Accuracy over {o.eval_sequences} "
                 "held-out sequences, second copy only.", "",
                 "| train \\ eval | " + " | ".join(e.replace("lsh", "LSH-") for e in evals) + " |",
                 "|---|" + "---|" * len(evals)]
        for t in trains:
            cells = []
            for e in evals:
                r = results.get((t, e))
                paper = f" ({number(r, 'paper_percent'):.1f}%)" if r and r["paper_percent"] else ""
                cells.append(f"**{number(r, 'accuracy_percent'):.1f}%**{paper}" if r else "")
            lines.append(f"| {t.replace('lsh', 'LSH-')} ({steps[t]} steps) | " + " | ".join(cells) + " |")
        self.figure(results, trains, evals)
        curves = [r for r in rows if r["kind"] == "curve"]
        if curves:
            lines += ["", "Training curve (accuracy on a few held-out batches, by step): " + "; ".join(
                f"{t.replace('lsh', 'LSH-')} " + ", ".join(
                    f"{r['step']}: {number(r, 'accuracy'):.1f}%" for r in curves if r["train"] == t)
                for t in dict.fromkeys(r["train"] for r in curves))]
        return "\n".join([*lines, "", "![ours beside the paper's Table 2](duplication.png)", "",
                          self.verdict(results)])

    @staticmethod
    def verdict(results: dict[tuple[str, str], dict[str, str]]) -> str:
        """The claim shows for an LSH-trained model that scores at least 90% with 8 hashes, and for the full
        model when its accuracy falls from 8 hashes to 1."""
        shown, missed = [], []
        for (t, e), r in results.items():
            if t.startswith("lsh") and e == "lsh8":
                line = f"{t} trained: {r['accuracy_percent']}% with LSH-8"
                (shown if number(r, "accuracy_percent") >= 90.0 else missed).append(line)
        if ("full", "lsh8") in results and ("full", "lsh1") in results:
            drop = (number(results["full", "lsh8"], "accuracy_percent")
                    - number(results["full", "lsh1"], "accuracy_percent"))
            (shown if drop > 0 else missed).append(f"full trained: {drop:+.1f} points from LSH-8 to LSH-1")
        if not shown and not missed:
            return "**Verdict: not enough rows yet.**"
        return (f"**Verdict: {len(shown)} of {len(shown) + len(missed)} checks show the paper's pattern**: "
                + "; ".join([*(f"shows: {s}" for s in shown), *(f"does not: {m}" for m in missed)]) + ".")

    def figure(self, results: dict, trains: list[str], evals: list[str]) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, 2, figsize=(9, 3.2))
        paper_rows = [t for t in trains if t in PAPER]
        for ax, title, names, value in (
            (axes[0], "ours (CPU-sized)", trains, lambda t, e: number(results[t, e], "accuracy_percent")
             if (t, e) in results else float("nan")),
            (axes[1], "paper, Table 2", paper_rows, lambda t, e: PAPER[t].get(e, float("nan"))),
        ):
            data = [[value(t, e) for e in evals] for t in names]
            ax.imshow(data or [[float("nan")] * len(evals)], vmin=0, vmax=100, cmap="viridis")
            ax.set_xticks(range(len(evals)), evals)
            ax.set_yticks(range(len(names)), names)
            for i, row in enumerate(data):
                for j, v in enumerate(row):
                    ax.text(j, i, f"{v:.0f}", ha="center", va="center", color="w" if v < 60 else "k", fontsize=8)
            ax.set(title=title, xlabel="evaluated with")
        axes[0].set_ylabel("trained with")
        fig.tight_layout()
        fig.savefig(self.paths.out / "duplication.png", dpi=80)
        plt.close(fig)
