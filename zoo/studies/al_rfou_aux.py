"""Do Al-Rfou et al. 2018's auxiliary losses help a deep, thin character Transformer train?

Paper: Al-Rfou, Choe, Constant, Guo, Jones 2018, "Character-Level Language Modeling with Deeper
Self-Attention", arXiv:1808.04444 ("Auxiliary Losses" and the ablation table): its 64-layer character model
needs intermediate-layer and multiple-target losses to train well (``zoo/models/al_rfou_losses.py``).

Here the same question at CPU scale: the preset ``al_rfou_lm`` cut to a deep, thin model (24 layers, d 64,
context 128) on Tiny Shakespeare, arms at the identical budget (steps, batch, learning-rate schedule, seeds,
residual/norm, data order), each trained by the app:

- ``aux``: the preset's losses (intermediate layers on, dropped at l/(2L) of training; character after next
  weighted 0.5, own classifiers per layer);
- ``plain``: next-character loss at every position only;
- ``aux_shared``: like ``aux`` with the intermediate layers sharing the output head (the earlier code's).

Rows: ``eval`` (validation bpc over training, from the run's metrics.csv) and ``final`` (its result.json),
both tagged with ``settings``, so runs at other sizes or budgets sit in the same file and report apart.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from zoo.config import require
from zoo.studies.base import STUDY, Study
from zoo.studies.common import Rows, markdown_table, number, run_outcome, saved_figure, train

ARMS = {  # what each arm sets; the same dict as the preset's own for "aux"
    "aux": "model.aux_losses={intermediate:true,multi_target:0.5,layer_heads:true}",  # the paper's losses
    "plain": "model.aux_losses={intermediate:false,multi_target:0.0,layer_heads:false}",  # next-char loss only
    "aux_shared": "model.aux_losses={intermediate:true,multi_target:0.5,layer_heads:false}",  # shared classifiers
}
COLOURS = {"aux": "tab:blue", "plain": "tab:red", "aux_shared": "tab:green"}


@dataclass
class Options:
    arms: list[str] = field(default_factory=lambda: ["aux", "plain"])
    seeds: list[int] = field(default_factory=lambda: [0, 1])
    layers: int = 24
    d_model: int = 64
    heads: int = 4
    d_ff: int = 256
    seq: int = 128  # context: trainer.seq_len = model.max_len
    batch: int = 8
    steps: int = 400
    lr: float = 1e-3
    warmup: int = 40
    eval_every: int = 40
    eval_batches: int = 16
    # the first evaluation at or under each (unigram ~4.8, bigram ~3.6 bpc on this split)
    thresholds: list[float] = field(default_factory=lambda: [4.0, 3.7])
    overrides: list[str] = field(default_factory=list)  # for every run (the toy test points the data elsewhere)

    def __post_init__(self) -> None:
        require(set(self.arms) <= set(ARMS), f"study.arms: choose among {', '.join(ARMS)}, got {self.arms}")
        require(self.steps > 0 and self.eval_every > 0, "study.steps and study.eval_every must be > 0")

    def settings_key(self) -> str:
        """What makes two runs comparable; rows of another key report apart."""
        return (f"L{self.layers}-d{self.d_model}-h{self.heads}-ff{self.d_ff}-t{self.seq}-b{self.batch}"
                f"-s{self.steps}-lr{self.lr:g}-w{self.warmup}-e{self.eval_every}x{self.eval_batches}")


def step_to_reach(curve: list[dict[str, str]], threshold: float) -> int | None:
    for point in sorted(curve, key=lambda r: int(r["step"])):
        if number(point, "val_bpc") <= threshold:
            return int(point["step"])
    return None


@STUDY.register("al_rfou_aux")
class AlRfouAux(Study):
    Options = Options
    question = ("Do Al-Rfou et al.'s intermediate-layer and multiple-target losses help a deep, thin character "
                "Transformer train, at the same budget?")
    figures = ("curves.png",)
    toy_options = dict(arms=["aux"], seeds=[0], layers=2, d_model=16, heads=2, d_ff=32, seq=16, batch=2,
                       steps=2, warmup=1, eval_every=2, eval_batches=1, overrides=["data.path=README.md"])

    def overrides(self, arm: str, seed: int) -> list[str]:
        """The app's command line for one run: preset al_rfou_lm, cut to the deep-thin size."""
        o = self.options
        return [
            "experiment=shakespeare", "model=al_rfou_lm", f"model.n_layers={o.layers}", f"model.d_model={o.d_model}",
            f"model.n_heads={o.heads}", f"model.d_ff={o.d_ff}", f"model.max_len={o.seq}",
            "model.dropout=0.0",  # a few hundred steps on 1 MB: no overfitting to regularise against
            ARMS[arm], f"trainer.seq_len={o.seq}", f"trainer.batch_size={o.batch}", f"trainer.max_steps={o.steps}",
            f"trainer.eval_every={o.eval_every}", f"trainer.eval_batches={o.eval_batches}", "trainer.log_every=10",
            "trainer.progress=false", f"optim.lr={o.lr}", f"optim.warmup={o.warmup}", f"seed={seed}", "logger=csv",
            *o.overrides,
        ]

    def run(self) -> None:
        o, key = self.options, self.options.settings_key()
        rows = Rows(self.rows_path, ("settings", "kind", "arm", "seed"))
        for seed in o.seeds:  # alternate arms within a seed: a cut-short session keeps matched pairs
            for arm in o.arms:
                if rows.has(settings=key, kind="final", arm=arm, seed=seed):
                    continue
                run_dir = self.paths.runs / key / f"{arm}_s{seed}"
                train(self.overrides(arm, seed), run_dir, threads=self.threads)
                result, metrics = run_outcome(run_dir)
                train_loss = {r["step"]: r["train/loss"] for r in metrics if r.get("train/loss")}
                tag = dict(settings=key, arm=arm, seed=seed, max_steps=o.steps)
                rows.add([dict(kind="eval", **tag, step=int(r["step"]), val_bpc=float(r["val/bpc"]),
                               train_loss=train_loss.get(r["step"], "")) for r in metrics if r.get("val/bpc")]
                         + [dict(kind="final", **tag, final_val_bpc=result["final_metric"],
                                 best_val_bpc=result["best_metric"], steps=result["steps"], params=result["params"],
                                 wall_s=round(result["wall_s"], 1))])

    def report(self, rows: list[dict[str, str]]) -> str:
        thresholds = self.options.thresholds
        lines, panels = [], {}
        for key in dict.fromkeys(r["settings"] for r in rows):
            finals = sorted((r for r in rows if r["settings"] == key and r["kind"] == "final"),
                            key=lambda r: (r["arm"], int(r["seed"])))
            curves = {(r["arm"], r["seed"]): [c for c in rows if c["settings"] == key and c["kind"] == "eval"
                                              and (c["arm"], c["seed"]) == (r["arm"], r["seed"])] for r in finals}
            panels[key] = (curves, int(finals[0]["max_steps"]) if finals else 0)
            reach = {(r["arm"], r["seed"]): [step_to_reach(curves[r["arm"], r["seed"]], t) for t in thresholds]
                     for r in finals}
            lines += [f"**Settings `{key}`**: val bpc on the first validation batches, every evaluation.", "",
                      *markdown_table(
                          ["arm", "seed", "final val bpc", "best val bpc",
                           *(f"first step <= {t:g}" for t in thresholds), "params"],
                          ([r["arm"], r["seed"], f"{number(r, 'final_val_bpc'):.3f}",
                            f"{number(r, 'best_val_bpc'):.3f}",
                            *(s if s is not None else f"not within {r['steps']}" for s in reach[r["arm"], r["seed"]]),
                            f"{int(r['params']):,}"] for r in finals)), ""]
            arms = list(dict.fromkeys(r["arm"] for r in finals))
            mean = {arm: sum(number(r, "final_val_bpc") for r in finals if r["arm"] == arm)
                    / sum(r["arm"] == arm for r in finals) for arm in arms}
            lines += [*markdown_table(
                ["arm", "mean final val bpc", *(f"steps to <= {t:g} (per seed)" for t in thresholds)],
                ([arm, f"{mean[arm]:.3f}", *(", ".join(str(reach[k][i]) if reach[k][i] is not None else "-"
                                                       for k in reach if k[0] == arm) for i in range(len(thresholds)))]
                 for arm in arms)), "", self.verdict(mean), ""]
        self.figure(panels)
        return "\n".join([*lines, "![val bpc against step](curves.png)"])

    @staticmethod
    def verdict(mean: dict[str, float]) -> str:
        """The claim shows when the paper's losses (``aux``) end lower than the next-character loss alone."""
        if not {"aux", "plain"} <= set(mean):
            return "**Verdict: not enough rows** (both the aux and plain arms are needed)."
        gap = mean["aux"] - mean["plain"]
        return (f"**Verdict: the claim {'shows' if gap < 0 else 'does not show'}** at this budget: with the losses "
                f"{mean['aux']:.3f} against {mean['plain']:.3f} val bpc without them ({gap:+.3f}).")

    def figure(self, panels: dict[str, tuple[dict, int]]) -> None:
        width = max(len(panels), 1)
        path = self.paths.out / "curves.png"
        with saved_figure(path, 1, width, figsize=(6.4 * width, 4.0), squeeze=False) as (_, axes):
            for ax, (key, (curves, steps)) in zip(axes[0], panels.items()):
                for (arm, seed), curve in curves.items():
                    points = sorted((int(c["step"]), number(c, "val_bpc")) for c in curve)
                    if points:
                        ax.plot(*zip(*points), "-" if seed == "0" else "--", color=COLOURS.get(arm, "black"),
                                marker=".", label=f"{arm} (seed {seed})")
                for threshold in self.options.thresholds:
                    ax.axhline(threshold, color="grey", lw=0.8, ls=":")
                ax.axvline(steps / 2, color="grey", lw=0.8, ls="--")  # every intermediate loss is gone from here on
                ax.text(steps / 2, ax.get_ylim()[1], " all intermediate losses dropped", fontsize=7, va="top",
                        color="grey")
                ax.set(xlabel="training step", ylabel="validation bits per character")
                ax.set_title(key, fontsize=8)
                ax.legend(fontsize=8)
                ax.grid(alpha=0.3)
