"""Reformer's duplication task (Kitaev et al. 2020, arXiv:2001.04451, Section 2.1, Table 2): ours beside
reformer-pytorch, CPU-sized.

Sequences ``0 w 0 w``; the loss and the accuracy count the second copy of ``w`` only. A 1-layer shared-QK
model is trained with full attention or LSH at 1, 2 or 4 hashes, then each trained model is evaluated with
full attention and LSH at 1, 2, 4 and 8 hashes (the weights carry over: ``lsh`` and ``shared_qk`` share their
parameter names; LSH evaluates with the rotations of the last training step). The paper: LSH-trained models
keep their accuracy with more hashes at evaluation, full-trained ones lose it with fewer hashes, and
LSH-trained ones score chance with full attention.

The paper: length 1024, 127 symbols, d_model = d_ff = 256, 4 heads, 150K steps. Here by default: length 64,
d_model = d_ff = 128, 4 heads of 32, chunk 8, learned positions, a plain (sequential) stack, output layer
untied (as the paper's trax model and the peer), Adam at a constant rate, gradient clip 1.0. Implementations
(``impls``), each trained for every mode and seed:

- ``app``: ours trained by the app (``data=duplication``, ``model=reformer``), its last checkpoint loaded into
  ``zoo.presets.reformer.duplication_model`` of each evaluation mode.
- ``ours-window`` / ``ours-chunk`` / ``ours-across``: ``duplication_model`` with ``look_back="window"``
  (strictly causal: the chunk's most recent same-bucket items), ``"chunk"`` (the paper's own + previous
  chunk, same bucket) or ``attend_across_buckets`` (the peer's default); ``peer`` / ``peer-in-bucket``:
  reformer-pytorch (``zoo/studies/reformer_peer.py``). These train in the studies' shared step loop
  (``zoo.studies.reference_loop.stepped``, the app's ``train_step``): the peer is a model we did not write,
  and the comparison needs every implementation on the very same batches (one generator per seed), which
  the app's data pipeline does not share with a model outside it. Their accuracy with their own attention
  is logged every ``log_every`` steps on ``log_batches`` held-out batches (``stop_at`` > 0 ends a run there).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import partial

import torch

from zoo.app.run import load_run
from zoo.config import IGNORE_INDEX, require
from zoo.data.synthetic import duplication_batch
from zoo.presets.reformer import duplication_model
from zoo.studies.base import STUDY, Study
from zoo.studies.common import Rows, number, saved_figure, spread, train
from zoo.studies.reference_loop import stepped
from zoo.studies.reformer_peer import PEERS, build_peer, peer_module, set_peer_attention

PAPER = {  # Table 2: rows = attention in training, columns = attention in evaluation
    "full": {"full": 100.0, "lsh8": 94.8, "lsh4": 92.5, "lsh2": 76.9, "lsh1": 52.5},
    "lsh4": {"full": 0.8, "lsh8": 100.0, "lsh4": 99.9, "lsh2": 99.4, "lsh1": 91.9},
    "lsh2": {"full": 0.8, "lsh8": 100.0, "lsh4": 99.9, "lsh2": 98.1, "lsh1": 86.8},
    "lsh1": {"full": 0.8, "lsh8": 99.9, "lsh4": 99.6, "lsh2": 94.8, "lsh1": 77.9},
}
EVALS = ["full", "lsh8", "lsh4", "lsh2", "lsh1"]
EVAL_BATCH = 64
OURS = {"ours-window": {"look_back": "window"}, "ours-chunk": {"look_back": "chunk"},
        "ours-across": {"attend_across_buckets": True}}
IMPLS = ["app", *OURS, *PEERS]
LEVEL = 90.0  # the accuracy whose first logged step the report gives (the stopping rule for LSH-4)


@dataclass
class Options:
    impls: list[str] = field(default_factory=lambda: ["ours-window", "ours-chunk", "peer"])
    train: list[str] = field(default_factory=lambda: list(PAPER))  # modes trained: full | lsh<hashes>
    evals: list[str] = field(default_factory=lambda: list(EVALS))  # modes each trained model is evaluated with
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])  # weights and batches (the same for every impl)
    length: int = 64
    n_symbols: int = 127
    d_model: int = 128
    heads: int = 4
    chunk: int = 8
    batch: int = 32
    steps: int = 300
    stop_at: float = 0.0  # > 0: end a run once its logged accuracy reaches this (not for app)
    lr: float = 5e-3
    tie_embeddings: bool = False  # the paper's trax model and the peer do not tie; zoo's default does
    eval_sequences: int = 256
    log_every: int = 25
    log_batches: int = 1  # held-out batches of 64 for the logged curve

    def __post_init__(self) -> None:
        modes = [*self.train, *self.evals]
        require(all(m == "full" or (m.startswith("lsh") and m[3:].isdigit()) for m in modes),
                f"study.train and study.evals take full or lsh<hashes>; got {modes}")
        require(set(self.impls) <= set(IMPLS), f"study.impls: each of {', '.join(IMPLS)}; got {self.impls}")
        require(self.eval_sequences >= EVAL_BATCH, f"study.eval_sequences must be at least {EVAL_BATCH}")
        require(self.log_every > 0, "study.log_every must be > 0")


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
                "trained ones lose it with fewer (Reformer, Table 2), in ours as in reformer-pytorch?")
    figures = ("duplication.png", "curves.png")
    toy_options = dict(impls=["app"], train=["lsh2"], evals=["full", "lsh2"], seeds=[0], length=16,
                       n_symbols=7, d_model=16, heads=2, chunk=4, batch=4, steps=2, eval_sequences=64, log_every=1)

    def sizes(self) -> dict:
        o = self.options
        return dict(n_symbols=o.n_symbols, length=o.length, d_model=o.d_model, n_heads=o.heads, chunk=o.chunk)

    def train_overrides(self, mode: str, seed: int = 0) -> list[str]:
        o = self.options
        return [
            "data=duplication", f"data.n_symbols={o.n_symbols}", f"trainer.seq_len={o.length}", "model=reformer",
            "model.n_layers=1", f"model.d_model={o.d_model}", f"model.d_ff={o.d_model}", f"model.n_heads={o.heads}",
            "model.dropout=0.0", "position=learned", f"model.max_len={o.length}", "stack=sequential",
            "model.ff_chunk_size=0", f"model.tie_embeddings={str(o.tie_embeddings).lower()}",
            *attention_overrides(mode, o.chunk), "optim=adam", f"optim.lr={o.lr}",
            "optim.betas=[0.9,0.999]", "optim.eps=1e-8", "optim.schedule=constant", "optim.warmup=0",
            f"trainer.max_steps={o.steps}", f"trainer.batch_size={o.batch}",
            f"trainer.eval_every={max(o.steps // 8, 1)}", "trainer.eval_batches=2", "trainer.progress=false",
            f"seed={seed}", "logger=csv",
        ]

    def run(self) -> None:
        o, rows = self.options, Rows(self.rows_path, ("kind", "impl", "train", "seed", "eval", "step"))
        generator = torch.Generator().manual_seed(10_000)  # the same held-out sequences for every run
        batches = [duplication_batch(EVAL_BATCH, o.length, n_symbols=o.n_symbols, generator=generator)
                   for _ in range(o.eval_sequences // EVAL_BATCH)]
        impls = [i for i in o.impls if i not in PEERS or peer_module() is not None]
        if impls != o.impls:
            print("reformer-pytorch is not installed (pip install reformer-pytorch): running ours only", flush=True)
        for seed in o.seeds:  # seeds outermost: a cut-short study still has every cell at the first seed
            for mode in o.train:
                for impl in impls:
                    if all(rows.has(kind="result", impl=impl, train=mode, seed=seed, eval=e, step="") for e in o.evals):
                        continue
                    trained = self.by_app if impl == "app" else self.in_loop
                    curve, evaluator, steps = trained(impl, mode, seed, batches)
                    results = [dict(kind="result", impl=impl, train=mode, seed=seed, eval=e, step="", steps=steps,
                                    accuracy_percent=round(accuracy(evaluator(e), batches), 2),
                                    paper_percent=PAPER.get(mode, {}).get(e, "")) for e in o.evals]
                    rows.add(curve + results)  # results last: they mark the run done

    def by_app(self, impl: str, mode: str, seed: int, batches: list[dict]):
        """Trained by the app; (its logged curve, mode -> the trained weights in that mode's model, steps)."""
        run_dir = train(self.train_overrides(mode, seed), self.paths.runs / f"app_{mode}_s{seed}", threads=self.threads)
        _, _, trained, ckpt = load_run(run_dir / "checkpoints" / "last.pt")
        logged = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
        curve = [dict(kind="curve", impl=impl, train=mode, seed=seed, eval="", step=m["step"],
                      accuracy=round(100 * m["val/accuracy"], 2)) for m in logged if "val/accuracy" in m]
        return curve, partial(self.ours_in_mode, trained, {}, ckpt["step"]), ckpt["step"]

    def in_loop(self, impl: str, mode: str, seed: int, batches: list[dict]):
        """Trained in the shared step loop on the seed's batches; the same three things as :meth:`by_app`."""
        o = self.options
        torch.manual_seed(seed)  # initial weights; the peer also draws its rotations from this stream
        if impl in PEERS:
            model = build_peer(impl, mode, **self.sizes())
        else:
            model = duplication_model(mode, **self.sizes(), tie_embeddings=o.tie_embeddings, **OURS[impl])
        generator = torch.Generator().manual_seed(seed)  # the same batches for every impl and mode
        draw = partial(duplication_batch, o.batch, o.length, n_symbols=o.n_symbols, generator=generator)
        optimizer = torch.optim.Adam(model.parameters(), lr=o.lr)
        curve, done = [], 0
        # the post-step hook gives ours fresh rotations for the next step (the peer redraws per call)
        for done, _, loss in stepped(model, lambda _: draw(), optimizer, steps=o.steps, clip=1.0):
            if done % o.log_every == 0 or done == o.steps:
                own = accuracy(model, batches[: o.log_batches])
                curve.append(dict(kind="curve", impl=impl, train=mode, seed=seed, eval="", step=done,
                                  loss=round(loss, 4), accuracy=round(own, 2)))
                if o.stop_at and own >= o.stop_at:
                    break
        if impl in PEERS:
            return curve, partial(set_peer_attention, model), done
        return curve, partial(self.ours_in_mode, model, OURS[impl], done), done

    def ours_in_mode(self, trained, options: dict, steps: int, mode: str):
        """Our trained weights in ``mode``'s model, with the rotations of the last training step."""
        evaluator = duplication_model(mode, **self.sizes(), tie_embeddings=self.options.tie_embeddings, **options)
        mismatched = evaluator.load_state_dict(trained.state_dict(), strict=False)
        require(all(k.endswith("hash_step") for k in mismatched.missing_keys + mismatched.unexpected_keys),
                f"the trained model's weights do not fit the {mode} model: {mismatched}")
        for module in evaluator.modules():
            if hasattr(module, "hash_step"):
                module.hash_step.fill_(steps)
        return evaluator

    def report(self, rows: list[dict[str, str]]) -> str:
        results = [r for r in rows if r["kind"] == "result"]
        cells: dict[tuple[str, str, str], list[float]] = {}
        for r in results:
            cells.setdefault((r.get("impl") or "app", r["train"], r["eval"]), []).append(number(r, "accuracy_percent"))
        table = {key: spread(values) + (len(values),) for key, values in cells.items()}
        impls = [i for i in IMPLS if any(k[0] == i for k in table)]
        trains = list(dict.fromkeys(r["train"] for r in results))
        evals = [e for e in EVALS if any(k[2] == e for k in table)] + sorted({k[2] for k in table} - set(EVALS))
        o = self.options
        tied = "tied" if o.tie_embeddings else "untied"
        lines = [f"Accuracy %, mean (min-max over seeds). Length {o.length} (paper: 1024), {o.n_symbols} symbols, "
                 f"1 layer, d_model = d_ff = {o.d_model} (paper: 256), {o.heads} heads, chunk {o.chunk}, batch "
                 f"{o.batch}, Adam lr {o.lr}, output layer {tied}; {o.eval_sequences} held-out sequences, second "
                 "copy only.", "",
                 "| train | impl | steps | " + " | ".join(e.replace("lsh", "LSH-") for e in evals) + " |",
                 "|---|---|---|" + "---|" * len(evals)]
        for mode in trains:
            for impl in impls:
                if not any((impl, mode, e) in table for e in evals):
                    continue
                steps = sorted({int(r["steps"]) for r in results
                                if (r.get("impl") or "app", r["train"]) == (impl, mode)})
                row = [self.cell(table.get((impl, mode, e))) for e in evals]
                n = max(table[impl, mode, e][3] for e in evals if (impl, mode, e) in table)
                lines.append(f"| {mode.replace('lsh', 'LSH-')} | {impl} (n={n}) | {', '.join(map(str, steps))} | "
                             + " | ".join(row) + " |")
            if mode in PAPER:
                lines.append(f"| {mode.replace('lsh', 'LSH-')} | paper | 150K | "
                             + " | ".join(f"{PAPER[mode].get(e, '')}" for e in evals) + " |")
        curves = [r for r in rows if r["kind"] == "curve"]
        lines += ["", *self.steps_to(curves, impls)]
        self.figure(table, impls, trains, evals)
        self.curves_figure(curves, impls)
        return "\n".join([*lines, "", "![ours and the peer beside the paper's Table 2](duplication.png)", "",
                          "![accuracy while training](curves.png)", "", self.verdict(table)])

    @staticmethod
    def cell(summary: tuple[float, float, float, int] | None) -> str:
        if summary is None:
            return ""
        mean, low, high, n = summary
        return f"{mean:.1f} ({low:.1f}-{high:.1f})" if n > 1 else f"{mean:.1f}"

    @staticmethod
    def steps_to(curves: list[dict[str, str]], impls: list[str]) -> list[str]:
        """First logged step at which each run's accuracy (its own attention) reached :data:`LEVEL`."""
        first: dict[tuple[str, str], list[str]] = {}
        for r in curves:
            key = (r.get("impl") or "app", r["train"], r["seed"] or "0")
            first.setdefault(key, [])
            if number(r, "accuracy") >= LEVEL:
                first[key].append(r["step"])
        modes = list(dict.fromkeys(k[1] for k in first))
        if not modes:
            return ["No training curves in the rows."]
        lines = [f"First logged step at {LEVEL:.0f}% (trained and evaluated with the same attention; one entry per "
                 "seed)", "", "| impl | " + " | ".join(modes) + " |", "|---|" + "---|" * len(modes)]
        for impl in impls:
            entries = [", ".join(min(s, key=int) if s else "never" for (i, m, _), s in first.items()
                                 if (i, m) == (impl, mode)) or "-" for mode in modes]
            lines.append(f"| {impl} | " + " | ".join(entries) + " |")
        return lines

    @staticmethod
    def verdict(table: dict[tuple[str, str, str], tuple[float, float, float, int]]) -> str:
        """The paper's three patterns, each counted over the (impl, trained mode) cells that have it (means over
        seeds): LSH-trained models keep at least 90% with 8 hashes; full-trained ones lose accuracy from 8 hashes
        to 1; LSH-trained ones score about chance (at most 10%) with full attention."""
        lsh8 = [m for (i, t, e), (m, *_) in table.items() if t.startswith("lsh") and e == "lsh8"]
        full = [m for (i, t, e), (m, *_) in table.items() if t.startswith("lsh") and e == "full"]
        drops = [table[i, "full", "lsh8"][0] - table[i, "full", "lsh1"][0] for i in dict.fromkeys(k[0] for k in table)
                 if (i, "full", "lsh8") in table and (i, "full", "lsh1") in table]
        claims = [(f"LSH-trained models keep >= 90% with LSH-8 (lowest {min(lsh8, default=0):.1f}%)",
                   sum(m >= 90.0 for m in lsh8), len(lsh8)),
                  (f"full-trained models lose accuracy from LSH-8 to LSH-1 ({min(drops, default=0):+.1f} to "
                   f"{max(drops, default=0):+.1f} points)", sum(d > 0 for d in drops), len(drops)),
                  (f"LSH-trained models score chance with full attention (paper: 0.8%; lowest here "
                   f"{min(full, default=0):.1f}%)", sum(m <= 10.0 for m in full), len(full))]
        claims = [c for c in claims if c[2]]
        if not claims:
            return "**Verdict: not enough rows yet.**"
        held = sum(n == total for _, n, total in claims)
        return (f"**Verdict: {held} of {len(claims)} of the paper's patterns hold in every cell**: "
                + "; ".join(f"{text}: {n} of {total}" for text, n, total in claims) + ".")

    def figure(self, table: dict, impls: list[str], trains: list[str], evals: list[str]) -> None:
        panels = [*impls, "paper"]
        with saved_figure(self.paths.out / "duplication.png", 1, len(panels), figsize=(3.2 * len(panels), 3.0),
                          squeeze=False, dpi=80) as (_, axes):
            for axis, impl in zip(axes[0], panels):
                names = [t for t in trains if (t in PAPER if impl == "paper" else (impl, t, evals[0]) in table)]
                data = [[PAPER[t].get(e, float("nan")) if impl == "paper"
                         else table.get((impl, t, e), (float("nan"),))[0] for e in evals] for t in names]
                axis.imshow(data or [[float("nan")] * len(evals)], vmin=0, vmax=100, cmap="viridis", aspect="auto")
                axis.set_xticks(range(len(evals)), evals, fontsize=7)
                axis.set_yticks(range(len(names)), names, fontsize=7)
                for i, row in enumerate(data):
                    for j, value in enumerate(row):
                        axis.text(j, i, f"{value:.0f}", ha="center", va="center", color="w" if value < 60 else "k",
                                  fontsize=7)
                axis.set_title(impl, fontsize=9)
            axes[0][0].set_ylabel("trained with")

    def curves_figure(self, curves: list[dict[str, str]], impls: list[str]) -> None:
        modes = list(dict.fromkeys(r["train"] for r in curves)) or ["(none)"]
        colours = dict(zip(IMPLS, ["C5", "C0", "C2", "C4", "C1", "C3"]))
        with saved_figure(self.paths.out / "curves.png", 1, len(modes), figsize=(3.4 * len(modes), 3.0), sharey=True,
                          squeeze=False, dpi=80) as (_, axes):
            for axis, mode in zip(axes[0], modes):
                for impl in impls:
                    runs = [r for r in curves if (r.get("impl") or "app", r["train"]) == (impl, mode)]
                    for n, seed in enumerate(dict.fromkeys(r["seed"] for r in runs)):
                        points = [(int(r["step"]), number(r, "accuracy")) for r in runs if r["seed"] == seed]
                        axis.plot(*zip(*points), color=colours[impl], lw=1, alpha=0.8, label=None if n else impl)
                axis.axhline(LEVEL, color="grey", lw=0.5, ls="--")
                axis.set(title=f"trained and evaluated with {mode}", xlabel="step")
            axes[0][0].set_ylabel("held-out accuracy (%)")
            if curves:
                axes[0][0].legend(fontsize=7)
