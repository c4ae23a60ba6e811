"""Universal Transformer length generalisation with randomised position offsets (Dehghani et al. 2019,
arXiv:1807.03819, Section 3.3 and Table 4), beside PyTorch's own encoder-decoder.

Copy / reverse / addition, trained on lengths ``train_min``..``train_max`` (the paper: 40) and tested at
``test_lengths`` (the paper: 400). Training positions start at a random offset u in 0..R per sequence
(R = ``offset_max``, >= test length - train length so that the positions a long test string reaches were seen
in training); evaluation starts at 0. Models at (nearly) equal parameter count:

- ``ut``: the Universal Transformer, fixed T steps; the stack adds position + timestep before every step, the
  position shifted by the offset (``stack.random_offset_max``, zoo/stacks/universal.py).
- ``ut_act``: the same with ACT halting (at most ``2 T`` steps).
- ``vanilla``: our encoder-decoder, T layers at width d / 2 (params ~ layers * d^2), the offset on its
  sinusoidal position axis (``position.random_offset_max``, zoo/position/absolute.py).
- ``torch``: ``torch.nn.Transformer`` at the vanilla's size (``zoo.studies.reference_loop.TorchSeq2Seq``), with
  the same tied embeddings and sinusoid (offset drawn there): the reference for our vanilla.

Every model trains in the studies' shared step loop (``zoo.studies.reference_loop.stepped``, the app's
``train_step``, Adam with betas (0.9, 0.98), warm-up ``train_steps // 10`` then cosine, clip 1.0) on the very same
training strings (one generator per seed): ``torch.nn.Transformer`` is a model the app cannot build, and the
comparison needs it on our models' batches. Scoring: char-acc is the share of answer symbols (+ eos) whose argmax
is right given the true prefix (teacher forcing, as tensor2tensor's ``accuracy``); seq-acc is the share of strings
whose every argmax is right, which is exactly greedy decoding's sequence accuracy. ``greedy_lengths`` also decodes
``n_greedy`` strings greedily (batched). ``curve_every`` > 0 scores the training length every so many steps.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

import zoo
from zoo.config import require
from zoo.data.algorithmic import BOS, EOS, PAD, PAPER_TABLE4, TASKS, algorithmic_batch, score, vocab_size
from zoo.studies.base import STUDY, Study
from zoo.studies.common import Rows, markdown_table, saved_figure
from zoo.studies.reference_loop import TorchSeq2Seq, stepped
from zoo.train.steps import adam, schedule

PAPER_ROW = {"ut": "ut", "ut_act": "ut", "vanilla": "transformer", "torch": "transformer"}
MODELS = tuple(PAPER_ROW)
MARGIN = 0.05  # char-acc a lead must exceed to count (test strings of one length, 32 of them, differ by more)
COLOURS = {"ut": "tab:blue", "ut_act": "tab:green", "vanilla": "tab:orange", "torch": "tab:red"}


@dataclass
class Options:
    tasks: list[str] = field(default_factory=lambda: ["copy", "reverse"])
    models: list[str] = field(default_factory=lambda: list(MODELS))
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    offset_max: int = 360  # R: training offsets 0..R (0 = none)
    d_model: int = 64  # the UT's width; vanilla and torch use d / 2
    heads: int = 4
    steps_t: int = 4  # UT steps T (ACT: at most 2 T) = vanilla layers
    train_steps: int = 400
    batch: int = 32
    lr: float = 3e-3
    train_min: int = 1
    train_max: int = 40
    test_lengths: list[int] = field(default_factory=lambda: [40, 100, 200, 400])
    n_test: int = 32
    greedy_lengths: list[int] = field(default_factory=lambda: [40, 100])
    n_greedy: int = 16
    curve_every: int = 0

    def __post_init__(self) -> None:
        require(set(self.tasks) <= set(TASKS), f"study.tasks: each of {', '.join(TASKS)}; got {self.tasks}")
        require(set(self.models) <= set(MODELS), f"study.models: each of {', '.join(MODELS)}; got {self.models}")
        require(0 < self.train_min <= self.train_max, "need 0 < study.train_min <= study.train_max")


def build(name: str, task: str, o: Options) -> nn.Module:
    """Model ``name`` for ``task`` at the study's sizes (the UT at d, the others at d / 2 with T layers)."""
    vocab = vocab_size(task)
    common = dict(vocab_size=vocab, n_heads=o.heads, n_layers=o.steps_t, dropout=0.0, label_smoothing=0.0)
    if name == "torch":
        return TorchSeq2Seq(vocab, o.d_model // 2, o.heads, 2 * o.d_model, o.steps_t, o.offset_max)
    if name == "vanilla":
        position = {"name": "sinusoidal", "random_offset_max": o.offset_max}
        return zoo.create_model("vanilla_seq2seq", d_model=o.d_model // 2, d_ff=2 * o.d_model, position=position,
                                **common)
    stack = {"act": name == "ut_act", "random_offset_max": o.offset_max}
    if name == "ut_act":
        stack["max_steps"] = 2 * o.steps_t
    return zoo.create_model("universal_seq2seq_act", d_model=o.d_model, d_ff=4 * o.d_model, stack=stack, **common)


def logits_of(model: nn.Module, batch: dict[str, Tensor]) -> Tensor:
    out = model(batch["src"], batch["tgt"], src_pad_mask=batch["src_pad_mask"], tgt_pad_mask=batch["tgt_pad_mask"])
    return out.logits


@torch.no_grad()
def score_teacher_forced(model: nn.Module, batch: dict[str, Tensor]) -> tuple[float, float]:
    """(char-acc, seq-acc) of the argmax given the true prefix; seq-acc equals greedy decoding's."""
    model.eval()
    return score(logits_of(model, batch).argmax(-1), batch["targets"])


@torch.no_grad()
def score_greedy(model: nn.Module, batch: dict[str, Tensor]) -> tuple[float, float]:
    model.eval()
    width = batch["targets"].shape[1]
    if isinstance(model, TorchSeq2Seq):
        predicted = model.generate(batch["src"], width, batch["src_pad_mask"], BOS, EOS, PAD)
    else:
        predicted = model.generate(batch["src"], max_len=width, src_pad_mask=batch["src_pad_mask"])
    return score(predicted, batch["targets"])


def test_batch(task: str, length: int, n: int, seed: int) -> dict[str, Tensor]:
    """The same n test strings of one length for every model of a seed (seeded by length)."""
    return algorithmic_batch(task, n, length, length, generator=torch.Generator().manual_seed(10_000 + seed * 1_000
                                                                                            + length))


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


@STUDY.register("ut_length")
class UTLength(Study):
    Options = Options
    question = ("With randomised position offsets in training, does the Universal Transformer generalise from "
                "strings of 40 to 400 better than a vanilla encoder-decoder (ours, and torch.nn.Transformer)?")
    figures = ("char_acc_vs_length.png",)
    toy_options = dict(tasks=["reverse"], models=["ut_act", "torch"], seeds=[0], train_steps=2, d_model=16, steps_t=2,
                       train_max=6, offset_max=10, test_lengths=[12], n_test=4, greedy_lengths=[12], n_greedy=2,
                       curve_every=2, batch=4)

    def run(self) -> None:
        o, rows = self.options, Rows(self.rows_path, ("kind", "task", "model", "offset_max", "seed", "step"))
        for task in o.tasks:
            for seed in o.seeds:
                for name in o.models:
                    if not rows.has(kind="result", task=task, model=name, offset_max=o.offset_max, seed=seed, step=""):
                        rows.add(self.train_and_score(task, name, seed))  # curve rows, then the result last

    def train_and_score(self, task: str, name: str, seed: int) -> list[dict]:
        o = self.options
        torch.manual_seed(seed)  # init and the offset draws
        model = build(name, task, o)
        optimizer = adam(model, lr=o.lr)
        scheduler = schedule(optimizer, "cosine", warmup=o.train_steps // 10, total=o.train_steps)
        generator = torch.Generator().manual_seed(seed + 1)  # the training strings: identical for every model
        head = dict(task=task, model=name, offset_max=o.offset_max, seed=seed)
        found, losses, act_steps, start = [], [], [], time.process_time()
        for done, out, loss in stepped(model, lambda _: algorithmic_batch(task, o.batch, o.train_min, o.train_max,
                                                                            generator=generator),
                                       optimizer, steps=o.train_steps, scheduler=scheduler):
            if "encoder/act/steps_mean" in out.stats:
                act_steps.append(float(out.stats["encoder/act/steps_mean"]))
            losses.append(loss)
            if o.curve_every and done % o.curve_every == 0:
                char, seq = score_teacher_forced(model, test_batch(task, o.train_max, o.n_test, seed))
                found.append(dict(kind="curve", **head, step=done, loss=round(loss, 4), char=char, seq=seq))
        row = dict(kind="result", **head, step="", params=sum(p.numel() for p in model.parameters()),
                   train_steps=o.train_steps, train_cpu_s=round(time.process_time() - start, 1),
                   final_loss=round(mean(losses[-20:]), 4))
        if act_steps:
            row["encoder_act_steps_last"] = round(mean(act_steps[-20:]), 2)
        start = time.process_time()
        for length in sorted({o.train_max, *o.test_lengths}):
            batch = test_batch(task, length, o.n_test, seed)
            row[f"char_{length}"], row[f"seq_{length}"] = (round(v, 4) for v in score_teacher_forced(model, batch))
            if length in o.greedy_lengths:
                small = {k: v[: o.n_greedy] for k, v in batch.items()}
                row[f"greedy_char_{length}"], row[f"greedy_seq_{length}"] = (round(v, 4)
                                                                             for v in score_greedy(model, small))
        row["eval_cpu_s"] = round(time.process_time() - start, 1)
        return [*found, row]

    def report(self, rows: list[dict[str, str]]) -> str:
        results = [r for r in rows if r["kind"] == "result"]
        lengths = sorted({int(k.split("_")[1]) for r in results for k, v in r.items() if k.startswith("char_") and v})
        groups: dict[tuple[str, str, int], list[dict]] = {}
        for r in results:
            groups.setdefault((r["task"], r["model"], int(r["offset_max"])), []).append(r)
        order = sorted(groups, key=lambda k: (TASKS.index(k[0]), -k[2], MODELS.index(k[1])))
        body = []
        for key in order:
            rs = groups[key]
            cells = []
            for n in lengths:
                chars = [float(r[f"char_{n}"]) for r in rs if r.get(f"char_{n}")]
                seqs = [float(r[f"seq_{n}"]) for r in rs if r.get(f"seq_{n}")]
                cells.append(f"{mean(chars):.2f} / {mean(seqs):.2f}" if chars else "-")
            paper = PAPER_TABLE4[(key[0], PAPER_ROW[key[1]])]
            loss = mean([float(r["final_loss"]) for r in rs])
            body.append([*key, len(rs), f"{int(rs[0]['params']):,}", f"{loss:.3f}", *cells,
                         f"{paper[0]:.2f} / {paper[1]:.2f}"])
        lines = ["Char-acc / seq-acc, teacher-forced argmax, mean over seeds; offsets 0..R (R = 0: none). Paper "
                 "column: its Table 4 row at 400 (UT for `ut` and `ut_act`, Transformer for `vanilla` and "
                 "`torch`).", "",
                 *markdown_table(["task", "model", "offsets 0..R", "seeds", "params", "final train loss",
                                  *(f"len {n} char / seq" for n in lengths), "paper char / seq (400)"], body)]
        greedy = sorted({k for r in results for k, v in r.items() if k.startswith("greedy_char_") and v},
                        key=lambda k: int(k.split("_")[-1]))
        if greedy:
            table = []
            for key in order:
                cells = []
                for k in greedy:
                    c = [float(r[k]) for r in groups[key] if r.get(k)]
                    s = [float(r[k.replace("char", "seq")]) for r in groups[key] if r.get(k)]
                    cells.append(f"{mean(c):.2f} / {mean(s):.2f}" if c else "-")
                table.append([*key, *cells])
            lines += ["", "Greedy decoding (batched), char-acc / seq-acc, mean over seeds:", "",
                      *markdown_table(["task", "model", "offsets 0..R", *(f"len {k.split('_')[-1]}" for k in greedy)],
                                      table)]
        self.figure(groups, lengths)
        lines += ["", "![char-acc against test length](char_acc_vs_length.png)"]
        curve = [r for r in rows if r["kind"] == "curve"]
        if curve:
            self.curve_figure(curve)
            lines += ["", "![char-acc at the training length over training](train_length_curve.png)"]
        return "\n".join([*lines, "", self.verdict(groups, lengths)])

    @staticmethod
    def verdict(groups: dict[tuple[str, str, int], list[dict]], lengths: list[int]) -> str:
        """At the longest test length, per task and offset setting: the best UT (ut or ut_act) beside the paper's
        UT row, and whether it leads both vanillas by more than :data:`MARGIN` (char-acc, mean over seeds)."""
        longest, parts, shown = max(lengths, default=0), [], 0
        for task, offset in dict.fromkeys((k[0], k[2]) for k in groups):
            best = {m: mean([float(r[f"char_{longest}"]) for r in groups[task, m, offset]]) for m in MODELS
                    if (task, m, offset) in groups and groups[task, m, offset][0].get(f"char_{longest}")}
            ut = max((best[m] for m in ("ut", "ut_act") if m in best), default=None)
            others = max((best[m] for m in ("vanilla", "torch") if m in best), default=None)
            if ut is None or others is None:
                continue
            shown += ut > others + MARGIN
            parts.append(f"{task}, offsets 0..{offset}: UT {ut:.2f} (paper {PAPER_TABLE4[task, 'ut'][0]:.2f}) against "
                         f"{others:.2f}")
        if not parts:
            return "**Verdict: not enough rows yet** (a UT and a vanilla model of one task are needed)."
        return (f"**Verdict: the UT leads both vanillas by more than {MARGIN} char-acc at length {longest} in {shown} "
                f"of {len(parts)} settings** (best of each kind, mean over seeds): " + "; ".join(parts) + ".")

    def figure(self, groups: dict, lengths: list[int]) -> None:
        tasks = sorted({k[0] for k in groups}, key=TASKS.index) or ["(none)"]
        with saved_figure(self.paths.out / "char_acc_vs_length.png", 1, len(tasks), figsize=(4.5 * len(tasks), 3.6),
                          squeeze=False, dpi=80) as (_, axes):
            for axis, task in zip(axes[0], tasks):
                for (t, model, offset), rs in groups.items():
                    if t == task:
                        ys = [mean([float(r[f"char_{n}"]) for r in rs]) for n in lengths]
                        axis.plot(lengths, ys, "-o" if offset else "--x", color=COLOURS[model],
                                  label=f"{model}{'' if offset else ' (no offsets)'}")
                for row, colour in (("ut", "tab:blue"), ("transformer", "tab:orange")):
                    if (task, row) in PAPER_TABLE4:
                        axis.plot([400], [PAPER_TABLE4[(task, row)][0]], "*", ms=11, color=colour,
                                  label=f"paper {row} (test 1..400)")
                axis.set_xscale("log")
                axis.set_xticks(lengths, [str(n) for n in lengths])
                axis.xaxis.set_minor_formatter("")
                axis.set(ylim=(0, 1.02), xlabel="test length", title=task)
                axis.grid(alpha=0.3)
            axes[0][0].set_ylabel("char-acc (teacher forced, mean of seeds)")
            handles = {}
            for axis in axes[0]:
                handles.update(zip(*reversed(axis.get_legend_handles_labels())))  # label -> handle, all panels
            axes[0][-1].legend(list(handles.values()), list(handles), fontsize=6, loc="upper right")

    def curve_figure(self, points: list[dict[str, str]]) -> None:
        """Char-acc at the training length over training steps, one line per run."""
        runs: dict[tuple, list[dict]] = {}
        for p in points:
            runs.setdefault((p["task"], p["model"], p["offset_max"], p["seed"]), []).append(p)
        with saved_figure(self.paths.out / "train_length_curve.png", figsize=(5, 3.4), dpi=80) as (_, axis):
            for (task, model, offset, seed), ps in runs.items():
                axis.plot([int(p["step"]) for p in ps], [float(p["char"]) for p in ps], "-o", ms=3,
                          label=f"{task} {model} offsets 0..{offset} seed {seed}")
            axis.set(xlabel="training step", ylabel="char-acc at the training length", ylim=(0, 1.02))
            axis.grid(alpha=0.3)
            axis.legend(fontsize=7)
