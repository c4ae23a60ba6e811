"""Universal Transformer algorithmic tasks: copy, reverse, integer addition, trained short and tested long.

Paper: Dehghani et al. 2019, "Universal Transformers", arXiv:1807.03819, Table 4 (trained on strings of
length 40, tested on 400): the Universal Transformer, with and without ACT, generalises to longer strings far
better than the vanilla Transformer (copy 0.91 / 0.35 character / sequence accuracy against 0.53 / 0.03).

Here, scaled down for a CPU: strings of ``train_min``..``train_max`` symbols, tested at ``train_max`` (in
distribution) and ``test_len``; the ACT Universal Transformer, the fixed-depth one and the vanilla
encoder-decoder at (nearly) equal parameter count (4 vanilla layers at d 64 hold as many weights as one
shared block at d 128). Each model is trained by the app (``data=algorithmic``, teacher forcing, Adam with a
cosine schedule), then its last checkpoint decodes ``n_test`` test strings greedily
(``zoo.data.algorithmic.score``: accuracy over the answer symbols plus eos). The ACT model's ponder steps
per position for three test strings are rows too, so their figure re-renders from the rows.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from zoo.app.run import load_run
from zoo.config import require
from zoo.data.algorithmic import PAPER_TABLE4, TASKS, algorithmic_batch, score
from zoo.studies.base import STUDY, Study
from zoo.studies.common import Rows, number, train

# name -> (app overrides, the paper's row)
MODELS = {
    "universal_transformer_act": (["model=universal_seq2seq_act", "model.d_model={d}", "model.d_ff={ff}",
                                   "stack=universal", "stack.max_steps=8"], "ut"),
    "universal_transformer": (["model=universal_seq2seq_act", "model.d_model={d}", "model.d_ff={ff}",
                               "stack=universal", "stack.act=false"], "ut"),
    "vanilla_seq2seq": (["model=vanilla_seq2seq", "model.d_model={half}", "model.d_ff={half_ff}"], "transformer"),
}
PONDER_EXAMPLES = 3


@dataclass
class Options:
    tasks: list[str] = field(default_factory=lambda: list(TASKS))
    models: list[str] = field(default_factory=lambda: list(MODELS))
    steps: int = 600
    batch: int = 32
    lr: float = 1e-3
    train_min: int = 10
    train_max: int = 20
    test_len: int = 40
    n_test: int = 100
    seed: int = 0
    d_model: int = 128  # the Universal Transformer's width; the vanilla model's is half (equal parameters)
    n_layers: int = 4

    def __post_init__(self) -> None:
        require(set(self.tasks) <= set(TASKS), f"study.tasks: each of {', '.join(TASKS)}; got {self.tasks}")
        require(set(self.models) <= set(MODELS), f"study.models: each of {', '.join(MODELS)}; got {self.models}")
        require(0 < self.train_min <= self.train_max <= self.test_len, "need 0 < train_min <= train_max <= test_len")


@STUDY.register("universal_algorithmic")
class UniversalAlgorithmic(Study):
    Options = Options
    question = ("Does the Universal Transformer generalise from short to longer strings on copy, reverse and "
                "addition better than a vanilla encoder-decoder of the same size?")
    figures = ("accuracy.png",)
    toy_options = dict(tasks=["copy"], models=["universal_transformer_act"], steps=2, batch=4, train_min=2,
                       train_max=4, test_len=6, n_test=4, d_model=16, n_layers=1)

    def train_overrides(self, task: str, model: str) -> list[str]:
        o = self.options
        sizes = dict(d=o.d_model, ff=4 * o.d_model, half=o.d_model // 2, half_ff=2 * o.d_model)
        return [
            "data=algorithmic", f"data.problem={task}", f"data.min_len={o.train_min}", f"trainer.seq_len={o.train_max}",
            *(item.format(**sizes) for item in MODELS[model][0]), "model.n_heads=4", f"model.n_layers={o.n_layers}",
            "model.dropout=0.0", "model.label_smoothing=0.0", "optim=adam", f"optim.lr={o.lr}", "optim.schedule=cosine",
            f"optim.warmup={max(o.steps // 10, 1)}", f"trainer.max_steps={o.steps}", f"trainer.batch_size={o.batch}",
            "trainer.eval_every=0", "trainer.eval_batches=2", "trainer.progress=false", f"seed={o.seed}", "logger=csv",
        ]

    @torch.no_grad()
    def accuracy(self, model, task: str, length: int, seed: int) -> tuple[float, float]:
        generator = torch.Generator().manual_seed(seed)
        batch = algorithmic_batch(task, self.options.n_test, length, length, generator=generator)
        predicted = model.generate(batch["src"], max_len=batch["targets"].shape[1], src_pad_mask=batch["src_pad_mask"])
        return score(predicted, batch["targets"])

    def run(self) -> None:
        o, rows = self.options, Rows(self.rows_path, ("kind", "task", "model", "example", "side", "position"))
        for task in o.tasks:
            for name in o.models:
                if rows.has(kind="result", task=task, model=name, example="", side="", position=""):
                    continue
                run_dir = train(self.train_overrides(task, name), self.paths.runs / f"{task}-{name}",
                                threads=self.threads)
                _, _, model, _ = load_run(run_dir / "checkpoints" / "last.pt")
                model.eval()
                result = json.loads((run_dir / "result.json").read_text())
                paper = PAPER_TABLE4[(task, MODELS[name][1])]
                iid = self.accuracy(model, task, o.train_max, o.seed + 2)
                test = self.accuracy(model, task, o.test_len, o.seed + 3)
                rows.add([dict(kind="result", task=task, model=name, params=model.num_parameters, train_steps=o.steps,
                               train_wall_s=round(result.get("wall_s", 0.0), 1), iid_char_acc=iid[0],
                               iid_seq_acc=iid[1],
                               test_char_acc=test[0], test_seq_acc=test[1], paper_char_acc=paper[0],
                               paper_seq_acc=paper[1], train_encoder_steps_mean_last=self.steps_mean(run_dir))]
                         + (self.ponder(model, task) if name == "universal_transformer_act" else []))

    @staticmethod
    def steps_mean(run_dir: Path) -> float | str:
        """The ACT encoder's mean ponder steps over the last 50 logged training steps ("" without ACT)."""
        key = "train/stats/encoder/act/steps_mean"
        logged = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
        values = [m[key] for m in logged if key in m][-50:]
        return round(sum(values) / len(values), 2) if values else ""

    @torch.no_grad()
    def ponder(self, model, task: str) -> list[dict]:
        """Ponder steps per real position of the encoder and the decoder for a few test strings."""
        o = self.options
        batch = algorithmic_batch(task, PONDER_EXAMPLES, o.test_len // 2, o.test_len,
                                  generator=torch.Generator().manual_seed(o.seed + 4))
        out = model(batch["src"], batch["tgt"], src_pad_mask=batch["src_pad_mask"], tgt_pad_mask=batch["tgt_pad_mask"])
        rows = []
        for side, steps, mask in (("encoder", out.stats["encoder/act/steps"], batch["src_pad_mask"]),
                                  ("decoder", out.stats["act/steps"], batch["tgt_pad_mask"])):
            for example in range(PONDER_EXAMPLES):
                rows += [dict(kind="ponder", task=task, model="universal_transformer_act", example=example, side=side,
                              position=p, steps=float(steps[example, p])) for p in range(int(mask[example].sum()))]
        return rows

    def report(self, rows: list[dict[str, str]]) -> str:
        o = self.options
        results = [r for r in rows if r["kind"] == "result"]
        seconds = "train_wall_s" if all(r.get("train_wall_s") for r in results) else "train s (CPU for the old rows)"
        lines = [
            f"Train lengths {o.train_min}-{o.train_max}, test length {o.test_len}; {o.steps} steps x batch {o.batch}, "
            f"Adam lr {o.lr} cosine, seed {o.seed}; greedy decoding, {o.n_test} test strings per length.", "",
            f"| task | model | params | {seconds} | char-acc len {o.train_max} | seq-acc len {o.train_max} | "
            f"char-acc len {o.test_len} | seq-acc len {o.test_len} | paper char / seq (train 40, test 400) |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for r in results:
            cells = [f"{number(r, k):.2f}" for k in ("iid_char_acc", "iid_seq_acc", "test_char_acc", "test_seq_acc")]
            paper = f"{number(r, 'paper_char_acc'):.2f} / {number(r, 'paper_seq_acc'):.2f}"
            lines.append(f"| {r['task']} | {r['model']} | {int(r['params']):,} | "
                         f"{r.get('train_wall_s') or r.get('train_cpu_s')} | {' | '.join(cells)} | {paper} |")
        self.accuracy_figure(results)
        lines += ["", "![character accuracy at the test length](accuracy.png)"]
        for task in sorted({r["task"] for r in rows if r["kind"] == "ponder"}):
            self.ponder_figure([r for r in rows if r["kind"] == "ponder" and r["task"] == task], task)
            lines += ["", f"![ACT ponder steps, {task}](ponder_steps_{task}.png)"]
        return "\n".join([*lines, "", self.verdict(results)])

    @staticmethod
    def verdict(results: list[dict[str, str]]) -> str:
        """The claim shows on a task when a Universal Transformer's character accuracy at the test length beats
        the vanilla model's."""
        shown, not_shown = [], []
        for task in dict.fromkeys(r["task"] for r in results):
            acc = {r["model"]: number(r, "test_char_acc") for r in results if r["task"] == task}
            ut = max((v for k, v in acc.items() if k.startswith("universal")), default=None)
            if ut is not None and "vanilla_seq2seq" in acc:
                (shown if ut > acc["vanilla_seq2seq"] else not_shown).append(
                    f"{task} ({ut:.2f} vs {acc['vanilla_seq2seq']:.2f})")
        if not shown and not not_shown:
            return "**Verdict: not enough rows yet** (a Universal Transformer and the vanilla model on one task)."
        return (f"**Verdict: the Universal Transformer generalises better on {len(shown)} of "
                f"{len(shown) + len(not_shown)} tasks** (best UT vs vanilla character accuracy at the test length): "
                + "; ".join([*(f"better on {s}" for s in shown), *(f"not on {s}" for s in not_shown)]) + ".")

    def accuracy_figure(self, results: list[dict[str, str]]) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        tasks = list(dict.fromkeys(r["task"] for r in results))
        models = list(dict.fromkeys(r["model"] for r in results))
        fig, axis = plt.subplots(figsize=(7, 3.6))
        width = 0.8 / max(len(models), 1)
        for i, name in enumerate(models):
            acc = {r["task"]: number(r, "test_char_acc") for r in results if r["model"] == name}
            axis.bar([t + i * width for t in range(len(tasks))], [acc.get(t, 0.0) for t in tasks], width, label=name)
        axis.set_xticks([t + 0.4 - width / 2 for t in range(len(tasks))], tasks)
        axis.set(ylabel=f"character accuracy, length {self.options.test_len}", ylim=(0, 1))
        axis.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(self.paths.out / "accuracy.png", dpi=100)
        plt.close(fig)

    def ponder_figure(self, rows: list[dict[str, str]], task: str) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(PONDER_EXAMPLES, 2, figsize=(10, 5), sharey=True, squeeze=False)
        for j, side in enumerate(("encoder", "decoder")):
            for i in range(PONDER_EXAMPLES):
                mine = sorted((int(r["position"]), number(r, "steps")) for r in rows
                              if r["side"] == side and int(r["example"]) == i)
                axes[i, j].bar([p for p, _ in mine], [s for _, s in mine], color=("tab:blue", "tab:orange")[j])
                axes[i, j].set_ylabel("steps")
            axes[-1, j].set_xlabel(f"{side} ({'source' if j == 0 else 'target'} position)")
        fig.suptitle(f"ACT ponder steps per position, {task}, {PONDER_EXAMPLES} test examples")
        fig.tight_layout()
        fig.savefig(self.paths.out / f"ponder_steps_{task}.png", dpi=80)
        plt.close(fig)
