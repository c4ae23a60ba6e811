"""Transformer-XL trained beside its official code, step for step (Dai et al. 2019, arXiv:1901.02860).

Our side of the parity run beside kimiyoung/transformer-xl (``results/xl_parity/README.md`` says how the
reference was run and patched, and how its initial weights were copied from ours): ``transformer_xl`` scaled
down (2 layers, d 128, 2 heads of 64, d_ff 256, tgt_len = mem_len = ``seq_len``, dropout 0, one (u, v) pair
as the reference) on Tiny Shakespeare without its newline bytes (the reference never sees enwik8's), cut into
train / valid / test files of the lengths given (written into the study's runs directory, read by the app's
``char_lm`` task). Each run is trained with the app's own parts: the task's contiguous lanes,
``make_optimizer`` / ``make_schedule`` (Adam, cosine to 0 as the reference's ``eta_min=0``) and
``train_step`` with clipping at 0.25, the memory carried across steps (:func:`zoo.studies.reference_loop.stepped`:
the app's run cannot start from the weights the reference was given, ``torch.manual_seed(seed)`` then the
preset's initialisation, nor compare step by step). Then the test split is scored with ``evaluate_protocol``
(memory protocol: the evaluation memory and clamp lengths, ``same_length`` on and off).

The reference's per-step losses are read from its ``train.py --log-interval 1`` log (its ``bpc`` lines, 5
decimals), ``<reference>/train_<steps>.log``; ``reference`` defaults to ``$ZOO_REFERENCES/xl-parity`` (default
``../ref``). Without it our losses are recorded alone and the report says so.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import torch

import zoo
from zoo.app.compose import compose
from zoo.config import require
from zoo.data import TASK
from zoo.studies.base import STUDY, Study
from zoo.studies.common import PROJECT_ROOT, Rows, load_now, markdown_table, number, step_difference_figure
from zoo.studies.reference_loop import stepped
from zoo.train.eval_protocols import ProtocolSettings, evaluate_protocol
from zoo.train.options import OptimOptions, make_optimizer, make_schedule

SIZE = dict(n_layers=2, d_model=128, n_heads=2, d_ff=256, dropout=0.0, attention_dropout=0.0)
THRESHOLDS = (1e-5, 1e-4, 1e-2)  # relative loss differences whose first crossing the report gives


@dataclass
class Options:
    steps: list[int] = field(default_factory=lambda: [200, 2000])  # one run per entry, at the lr of the same place
    lrs: list[float] = field(default_factory=lambda: [2.5e-4, 1e-3])
    seq_len: int = 64  # tgt_len = mem_len in training
    batch: int = 4
    eval_batch: int = 10
    eval_mem_len: int = 128
    clamp_len: int = 100
    chars: list[int] = field(default_factory=lambda: [965_291, 55_051, 55_051])  # train, valid, test
    seed: int = 0
    reference: str = ""  # directory of the reference's train_<steps>.log; "" = $ZOO_REFERENCES/xl-parity

    def __post_init__(self) -> None:
        require(len(self.steps) == len(self.lrs), f"study.steps and study.lrs pair up; got {self.steps}, {self.lrs}")
        require(len(self.chars) == 3 and min(self.chars) > 0, f"study.chars: train, valid, test > 0; got {self.chars}")


def reference_losses(path: Path) -> list[float]:
    """Per-step training loss (nats) from the reference's log: its training lines' bpc times ln 2 (its
    evaluation lines, ``| Eval N at step S | ... | bpc``, are not training steps)."""
    lines = re.finditer(r"\| epoch +\d+ step +\d+ \|.*?\| bpc +([\d.]+)", path.read_text())
    return [float(m.group(1)) * math.log(2) for m in lines]


def write_corpus(source: Path, folder: Path, chars: list[int]) -> Path:
    """Tiny Shakespeare without its newline bytes, cut into train / valid / test files of ``chars`` characters."""
    text = source.read_text().replace("\n", "")
    require(sum(chars) <= len(text), f"study.chars ask {sum(chars)} characters; the corpus has {len(text)}")
    folder.mkdir(parents=True, exist_ok=True)
    start = 0
    for split, count in zip(("train", "valid", "test"), chars):
        (folder / f"{split}.txt").write_text(text[start : start + count])
        start += count
    return folder


@STUDY.register("xl_parity")
class XLParity(Study):
    Options = Options
    question = ("Does our Transformer-XL training loop follow kimiyoung/transformer-xl's step for step from the same "
                "weights, and does our evaluation protocol give its test bpc?")
    figures = ("relative_difference.png",)
    toy_options = dict(steps=[2], lrs=[2.5e-4], seq_len=8, batch=2, eval_batch=2, eval_mem_len=8, clamp_len=8,
                       chars=[8000, 60, 60])

    def reference_dir(self) -> Path:
        given = self.options.reference or str(Path(os.environ.get("ZOO_REFERENCES", "../ref")) / "xl-parity")
        return PROJECT_ROOT / given

    def run(self) -> None:
        o, rows = self.options, Rows(self.rows_path, ("kind", "run", "step", "same_length"))
        source = Path(compose(["data=shakespeare"]).data.path)
        corpus = write_corpus(PROJECT_ROOT / source, self.paths.runs / "corpus", o.chars)

        def task(batch: int):
            return TASK.get("char_lm")(path=str(corpus), vocab="chars", seq_len=o.seq_len, batch_size=batch, seed=0)

        for steps, lr in zip(o.steps, o.lrs):
            if rows.has(kind="test", run=steps, step="", same_length=False):
                continue
            train = task(o.batch)
            torch.manual_seed(o.seed)
            model = zoo.create_model("transformer_xl", vocab_size=train.vocab_size, **SIZE,
                                     attention={"mem_len": o.seq_len, "share_biases": True})
            options = OptimOptions(name="adam", lr=lr, betas=[0.9, 0.999], eps=1e-8, schedule="cosine", warmup=0,
                                   min_lr_ratio=0.0)
            optimizer = make_optimizer(model, options)
            scheduler = make_schedule(optimizer, options, d_model=SIZE["d_model"], total=steps)
            losses = [loss for _, _, loss in stepped(model, partial(train.batch, "train"), optimizer, steps=steps,
                                                     scheduler=scheduler, clip=0.25, state=model.init_state(o.batch))]
            log = self.reference_dir() / f"train_{steps}.log"
            theirs = reference_losses(log)[:steps] if log.is_file() else []
            found = []
            for step, ours in enumerate(losses, start=1):
                ref = theirs[step - 1] if step <= len(theirs) else None
                found.append(dict(kind="step", run=steps, step=step, same_length="", lr=lr, ours_loss=f"{ours:.7f}",
                                  reference_loss="" if ref is None else f"{ref:.7f}",
                                  relative_difference="" if ref is None else f"{abs(ours - ref) / ref:.3e}"))
            for same_length in (True, False):
                settings = ProtocolSettings(protocol="memory", seq_len=o.seq_len, batch_size=o.eval_batch,
                                            mem_len=o.eval_mem_len, clamp_len=o.clamp_len, same_length=same_length)
                with torch.no_grad():
                    scored = evaluate_protocol(model, task(o.eval_batch), "test", settings, show_progress=False)
                found.append(dict(kind="test", run=steps, step="", same_length=same_length, lr=lr,
                                  bpc=f"{scored['test/bpc']:.7f}", scored=scored["test/scored"], load_1min=load_now()))
            rows.add(found)

    def report(self, rows: list[dict[str, str]]) -> str:
        runs = list(dict.fromkeys(r["run"] for r in rows))
        body, compared = [], {}
        for run in runs:
            steps = [r for r in rows if r["kind"] == "step" and r["run"] == run]
            tests = {r["same_length"]: r for r in rows if r["kind"] == "test" and r["run"] == run}
            pairs = [(int(r["step"]), number(r, "relative_difference")) for r in steps if r["relative_difference"]]
            compared[run] = pairs
            if pairs:
                worst = max(pairs, key=lambda p: p[1])
                crossings = [next((s for s, d in pairs if d > t), None) for t in THRESHOLDS]
                largest = f"{worst[1]:.2e} (step {worst[0]})"
                first = ", ".join(f"{t:.0e}: {'never' if s is None else s}" for t, s in zip(THRESHOLDS, crossings))
            else:
                largest, first = "no reference log", "-"
            test = " / ".join(f"{number(tests[k], 'bpc'):.7f}" if k in tests else "-" for k in ("True", "False"))
            body.append([run, steps[0]["lr"] if steps else "", len(pairs), largest, first, test])
        lines = ["Per-step training loss, ours against the reference's log (its bpc printed to 5 decimals, about "
                 "2e-6 relative), and the test bpc of our final weights by the memory protocol.", "",
                 *markdown_table(["steps", "lr", "steps compared", "largest relative difference",
                                  "first step above", "test bpc, same_length on / off"], body)]
        step_difference_figure(self.paths.out / "relative_difference.png",
                               {f"{run} steps": pairs for run, pairs in compared.items()},
                               ylabel="|ours - reference| / reference",
                               title="Transformer-XL training loss, ours beside kimiyoung/transformer-xl")
        return "\n".join([*lines, "", "![relative difference per step](relative_difference.png)", "",
                          self.verdict(compared)])

    @staticmethod
    def verdict(compared: dict[str, list[tuple[int, float]]]) -> str:
        if not any(compared.values()):
            return "**Verdict: no reference log was found; our losses are recorded alone.**"
        parts = []
        for run, pairs in compared.items():
            if not pairs:
                continue
            above = next((s for s, d in pairs if d > 1e-5), None)
            parts.append(f"{run} steps: " + ("within 1e-5 at every step" if above is None
                                             else f"within 1e-5 up to step {above - 1}, apart from step {above}"))
        return ("**Verdict: the loops agree step for step while the run is stable**: " + "; ".join(parts) + ". "
                "Where they part, compare with ours against ours from weights nudged by 1e-7 (the README).")
