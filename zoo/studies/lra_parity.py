"""ListOps in our app beside mlpen/Nystromformer's LRA code, step for step (Xiong et al. 2021, arXiv:2102.03902).

Our side is the app's own path: ``experiment=lra_listops lra_setting=nystromformer attention=vanilla`` plus
``overrides`` and the variant's own, built by ``zoo.app.run.build``, with ``make_optimizer`` / ``make_schedule``
(AdamW, one-cycle). Their side is their ``ModelForSC`` with their ListOps config, optimiser, ``OneCycleLR`` and
step (``zoo/studies/lra_reference.py``), started from our initial weights (copied). Both see the same batches of
our ListOps task with dropout 0, one step each in turn through the studies' shared loop
(``zoo.studies.reference_loop.stepped``: the app's run cannot train their model, nor two models in lockstep),
so the two losses compare per step. Variants: ``setting`` (the setting as it is: plain N(0, 0.02) tables,
padded mean) and ``our_tables`` (our default token and position tables, values copied into theirs).

``theirs`` also trains their model alone with each named attention (``nystrom-64``, ...) at the setting's
full budget on our batches, dropout on (``train_theirs_alone``), into ``<runs>/listops_their_<attention>_s<seed>``,
whose log ``lra_listops_budget`` reads with our runs (``read_runs``).

``reference`` is their ``LRA/code`` directory, by default ``$ZOO_REFERENCES/Nystromformer/LRA/code`` (default
``../ref``); without it our losses are recorded alone and the report says so.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from zoo.app.compose import compose
from zoo.app.run import build, optim_options
from zoo.config import require
from zoo.studies.base import STUDY, Study
from zoo.studies.common import PROJECT_ROOT, Rows, markdown_table, number, step_difference_figure
from zoo.studies.lra_reference import (
    TheirClassifier,
    copy_into_theirs,
    their_model,
    their_optimiser,
    train_theirs_alone,
)
from zoo.studies.reference_loop import stepped
from zoo.train.options import make_optimizer, make_schedule

SETTING = ["experiment=lra_listops", "lra_setting=nystromformer", "attention=vanilla", "trainer.device=cpu"]
NO_DROPOUT = ["model.dropout=0", "model.attention_dropout=0"]
VARIANTS = {  # name -> (our overrides, what it is)
    "setting": ([], "the setting as it is now: plain N(0, 0.02) token and position tables, `pooling=padded_mean`"),
    "our_tables": (["model.token_init_std=0", "position=learned", "position.init_std=1"],
                   "our default tables (token rows N(0, 1/d) read times sqrt(d), positions N(0, 1)), values "
                   "copied into theirs"),
}
PARITY = 1e-5  # relative loss difference within float32 rounding of a loss near 2 over a few hundred steps


@dataclass
class Options:
    variants: list[str] = field(default_factory=lambda: list(VARIANTS))
    steps: int = 200
    # for every variant: ListOps cut at 512 tokens keeps 200 steps of 32 within minutes on a CPU
    overrides: list[str] = field(default_factory=lambda: ["data.max_length=512", "data.min_length=256",
                                                          "trainer.seq_len=512"])
    theirs: list[str] = field(default_factory=list)  # their attentions trained alone at the setting's budget
    theirs_overrides: list[str] = field(default_factory=lambda: ["trainer.eval_every=500"])
    theirs_stop_after: int = 0  # > 0: stop their run alone there (the same schedule, looked at shorter)
    reference: str = ""  # their LRA/code directory; "" = $ZOO_REFERENCES/Nystromformer/LRA/code

    def __post_init__(self) -> None:
        require(set(self.variants) <= set(VARIANTS), f"study.variants: each of {', '.join(VARIANTS)}; "
                f"got {self.variants}")
        require(self.steps > 0, "study.steps must be > 0")


@STUDY.register("lra_parity")
class LRAParity(Study):
    Options = Options
    question = ("Does our ListOps training loop, in the setting copied from mlpen/Nystromformer, follow theirs step "
                "for step from the same weights on the same batches?")
    figures = ("relative_difference.png",)
    toy_options = dict(variants=["setting"], steps=1, overrides=["data.max_length=32", "data.min_length=16",
                                                                  "trainer.seq_len=32", "trainer.batch_size=2"])

    def reference_dir(self) -> Path:
        root = Path(os.environ.get("ZOO_REFERENCES", "../ref"))
        return PROJECT_ROOT / (self.options.reference or root / "Nystromformer" / "LRA" / "code")

    def run(self) -> None:
        o, rows = self.options, Rows(self.rows_path, ("kind", "variant", "step"))
        reference = self.reference_dir()
        found = (reference / "model_wrapper.py").is_file()
        for variant in o.variants:
            if not rows.has(kind="step", variant=variant, step=o.steps - 1):
                rows.add(self.lockstep(variant, reference if found else None))
        for attention in o.theirs if found else []:
            if rows.has(kind="theirs", variant=attention, step=""):
                continue
            resolved, task, _ = build(compose(SETTING + o.theirs_overrides))
            run_dir = self.paths.runs / f"listops_their_{attention}_s{resolved['seed']}"
            result = train_theirs_alone(reference, attention, resolved, task, run_dir, o.theirs_stop_after)
            rows.add([dict(kind="theirs", variant=attention, step="", best_step=result["best_step"],
                           dev_accuracy=round(100 * result["dev_accuracy"], 2),
                           test_accuracy=round(100 * result["test_accuracy"], 2))])

    def lockstep(self, variant: str, reference: Path | None) -> list[dict]:
        """Ours and theirs (when ``reference``) from the same weights, a step of each in turn on one batch."""
        o = self.options
        resolved, task, ours = build(compose(SETTING + NO_DROPOUT + o.overrides + VARIANTS[variant][0]))
        config = ours.config
        require(config.head == "mlp" and config.attention["name"] == "vanilla",
                "their ModelForSC has the mlp head and (mapped here) softmax attention only")
        options, total = optim_options(resolved), resolved["trainer"]["max_steps"]
        optimizer = make_optimizer(ours, options)
        batch_at = lru_cache(maxsize=1)(lambda step: task.batch("train", step))  # one batch for both models
        our_steps = stepped(ours, batch_at, optimizer, steps=o.steps, clip=resolved["trainer"]["clip"],
                            scheduler=make_schedule(optimizer, options, d_model=config.d_model, total=total))
        their_steps = their_optimizer = None
        if reference is not None:
            theirs, training = their_model(reference, config.max_len)
            copy_into_theirs(ours, theirs, config.n_layers)
            require(total == training["num_train_steps"],
                    f"our schedule spans {total} steps, theirs {training['num_train_steps']}")
            their_optimizer, their_scheduler = their_optimiser(theirs, training)
            their_steps = stepped(TheirClassifier(theirs), batch_at, their_optimizer, steps=o.steps,
                                  scheduler=their_scheduler, clip=0.0)
        found = []
        for step in range(o.steps):
            rates = [optimizer.param_groups[0]["lr"], their_optimizer.param_groups[0]["lr"] if their_optimizer else ""]
            ours_loss = next(our_steps)[2]
            theirs_loss = next(their_steps)[2] if their_steps else None
            found.append(dict(kind="step", variant=variant, step=step, our_loss=f"{ours_loss:.8f}",
                              their_loss="" if theirs_loss is None else f"{theirs_loss:.8f}",
                              relative_difference="" if theirs_loss is None
                              else f"{abs(ours_loss - theirs_loss) / abs(theirs_loss):.3e}",
                              our_lr=rates[0], their_lr=rates[1]))
        return found

    def report(self, rows: list[dict[str, str]]) -> str:
        steps = [r for r in rows if r["kind"] == "step"]
        compared = {v: [(int(r["step"]), number(r, "relative_difference")) for r in steps
                        if r["variant"] == v and r["relative_difference"]]
                    for v in dict.fromkeys(r["variant"] for r in steps)}
        body = []
        for variant, pairs in compared.items():
            mine = [r for r in steps if r["variant"] == variant]
            last = mine[-1]
            if pairs:
                worst = max(d for _, d in pairs)
                equal = sum(d == 0 for _, d in pairs)
                body.append([VARIANTS[variant][1] if variant in VARIANTS else variant, len(mine), f"{worst:.1e}",
                             f"{equal} of {len(pairs)}", f"{last['our_loss']} / {last['their_loss']}"])
            else:
                body.append([VARIANTS.get(variant, ("", variant))[1], len(mine), "no reference", "-",
                             f"{last['our_loss']} / -"])
        lines = markdown_table(["our model", "steps", "largest relative loss difference", "steps with equal losses",
                                "loss at the last step, ours / theirs"], body)
        alone = [r for r in rows if r["kind"] == "theirs"]
        if alone:
            lines += ["", "Their model alone at the setting's budget on our batches (dropout on):", "",
                      *markdown_table(["their attention", "best dev step", "dev accuracy %", "test accuracy % (best)"],
                                      [[r["variant"], r["best_step"], r["dev_accuracy"], r["test_accuracy"]]
                                       for r in alone])]
        step_difference_figure(self.paths.out / "relative_difference.png", compared,
                               ylabel="|ours - theirs| / theirs",
                               title="ListOps loss, ours beside mlpen/Nystromformer's run_tasks.py")
        return "\n".join([*lines, "", "![relative difference per step](relative_difference.png)", "",
                          self.verdict(compared)])

    @staticmethod
    def verdict(compared: dict[str, list[tuple[int, float]]]) -> str:
        if not any(compared.values()):
            return "**Verdict: their code was not found (`study.reference`); our losses are recorded alone.**"
        parts = []
        for variant, pairs in compared.items():
            if pairs:
                worst = max(d for _, d in pairs)
                parts.append(f"{variant}: {'within' if worst < PARITY else 'not within'} {PARITY:.0e} over "
                             f"{len(pairs)} steps (largest {worst:.1e})")
        same = compared.get("setting") and max(d for _, d in compared["setting"]) < PARITY
        head = "our loop is theirs" if same else "our loop does not follow theirs in the setting"
        return f"**Verdict: {head}**: " + "; ".join(parts) + "."
