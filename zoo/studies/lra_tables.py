"""Long Range Arena at a CPU budget, laid out as the paper's Tables 1 and 2.

Paper: Tay et al. 2021, "Long Range Arena: A Benchmark for Efficient Transformers", arXiv:2011.04006:
Table 1, test accuracy per task for each efficient Transformer; Table 2, training steps per second and
memory on byte-level Text at 1K-4K tokens, relative to the vanilla Transformer. Question: at a budget a CPU
affords, where do the zoo's mechanisms land beside the paper's rows, and how do their speed and memory
scale beside the paper's ratios?

Each run trains one (task, mechanism, seed) through the app (``zoo.studies.common.train``); its row is what
``zoo.app.lra.gather_runs`` reads from the run. Table 2 is measured after the runs, either on the model each
mechanism trained on Text, rebuilt at each length (``speed=trained``, ``zoo.app.lra_speed.measure_speed``)
or with ``zoo.bench``'s paired rounds on the Text task's shape (``speed=bench``). The report (both tables
and their figures, ``zoo.app.lra``/``lra_speed``) is computed from the rows alone.

Two registered settings: ``lra_cpu`` (ListOps, Text and Image for four mechanisms, a 2-layer d 64 model)
and ``lra_family`` (ListOps for every mechanism with a row in Table 1, two seeds, the Nystromformer
setting's model; Table 2 by ``zoo.bench``). Tasks and mechanisms are written ``name:key=value:...`` (the
overrides that go with that task or mechanism).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zoo.app.lra import gather_runs, markdown, plot_table1, table1
from zoo.app.lra_speed import measure_speed, measured_from_bench, plot_table2, speed_configs, table2
from zoo.bench import Variant, parse_set, run_paired, write_csv
from zoo.config import require
from zoo.data.images import synthetic_cifar10
from zoo.studies.base import STUDY, Study
from zoo.studies.common import Rows, train, typed

RUN_KEYS = ("experiment", "attention", "accuracy", "split", "status", "steps", "seq_len", "tokens_per_s", "wall_s")
SPEED_KEYS = ("attention", "length", "steps_per_s", "speedup", "memory_mb", "error")
SPEEDS = ("trained", "bench", "none")
SYNTHETIC_CIFAR = "synthetic"  # image_data: write a synthetic CIFAR-10-shaped set into the study's runs


@dataclass
class Options:
    tasks: list[str] = field(default_factory=list)  # experiment[:override...]
    mechanisms: list[str] = field(default_factory=list)  # attention[:override...]
    seeds: list[int] = field(default_factory=lambda: [0])
    overrides: list[str] = field(default_factory=list)  # for every run
    text_data: str = "../shared/data/imdb/aclImdb_v1_labeled.tar.gz"  # lra_text's data.path
    image_data: str = SYNTHETIC_CIFAR  # lra_image's data.path, or "synthetic" (2,000 images per batch file)
    speed: str = "trained"  # Table 2: trained | bench | none
    speed_lengths: list[int] = field(default_factory=lambda: [1024, 2048, 3072, 4096])
    speed_batch: int = 1
    speed_rounds: int = 2
    bench_set: list[str] = field(default_factory=list)  # speed=bench: the Text shape's model (zoo.bench --set)
    scale: str = ""  # a sentence on the scale of the runs, printed with the tables

    def __post_init__(self) -> None:
        require(self.speed in SPEEDS, f"study.speed must be one of {', '.join(SPEEDS)}; got {self.speed!r}")
        require(bool(self.tasks) and bool(self.mechanisms), "study.tasks and study.mechanisms must name something")


def split_item(item: str) -> tuple[str, list[str]]:
    """``"local_1d:attention.block=32"`` -> ("local_1d", ["attention.block=32"])."""
    name, *overrides = item.split(":")
    return name, overrides


def run_row(gathered: dict[str, Any], seed: int) -> dict[str, Any]:
    """The row of one finished (or failed) run, from ``gather_runs``."""
    return {"kind": "run", "name": f"{gathered['experiment']}/{gathered['attention']}/s{seed}", "seed": seed,
            **{k: gathered.get(k) for k in RUN_KEYS}}


def speed_row(measured: dict[str, Any]) -> dict[str, Any]:
    return {"kind": "speed", "name": f"speed/{measured['attention']}/{measured['length']}",
            **{k: measured.get(k) for k in SPEED_KEYS}}


class LraTables(Study):
    """Runs, then Tables 1 and 2; subclasses set the defaults of one setting."""

    question = ("At a CPU budget, where do the mechanisms land beside LRA's Table 1, and how do their speed and "
                "memory on Text scale beside its Table 2?")
    figures = ("lra_table1.png", "lra_table2.png")

    def data_overrides(self, experiment: str) -> list[str]:
        o = self.options
        if experiment == "lra_text" and o.text_data:
            return [f"data.path={o.text_data}"]
        if experiment == "lra_image" and o.image_data:
            path = self.paths.runs / "cifar_synth" if o.image_data == SYNTHETIC_CIFAR else Path(o.image_data)
            if o.image_data == SYNTHETIC_CIFAR and not (path / "test_batch").exists():
                synthetic_cifar10(path, per_batch=2000)
            return [f"data.path={path}"]
        return []

    def run(self) -> None:
        o, rows = self.options, Rows(self.rows_path, ("kind", "name"))
        trained = []
        for seed in o.seeds:
            for task in o.tasks:
                experiment, task_overrides = split_item(task)
                for mechanism in o.mechanisms:
                    name, mechanism_overrides = split_item(mechanism)
                    run_dir = train([f"experiment={experiment}", *task_overrides, *self.data_overrides(experiment),
                                     f"attention={name}", *mechanism_overrides, *o.overrides, f"seed={seed}",
                                     "trainer.progress=false", "logger=csv"],
                                    self.paths.runs / experiment / f"{name}_s{seed}", threads=self.threads)
                    for gathered in gather_runs([run_dir]):
                        trained.append(gathered)
                        if not rows.has(kind="run", name=run_row(gathered, seed)["name"]):
                            rows.add([run_row(gathered, seed)])
        if o.speed == "none" or any(r["kind"] == "speed" for r in rows.read()):
            return
        if o.speed == "trained":
            measured = measure_speed(speed_configs(trained), o.speed_lengths, batch_size=o.speed_batch,
                                     steps=o.speed_rounds)
        else:
            measured = self.bench_speed([split_item(m)[0] for m in o.mechanisms])
        rows.add(speed_row(m) for m in measured)

    def bench_speed(self, mechanisms: list[str]) -> list[dict[str, Any]]:
        """``zoo.bench``'s paired rounds on the Text shape, each mechanism at its default options in the
        ``vanilla_classifier`` skeleton, vanilla the baseline; read as Table 2 by ``measured_from_bench``."""
        o, shape = self.options, parse_set(self.options.bench_set)
        sizes = {k: shape.pop(k) for k in ("d_model", "heads", "d_ff", "layers", "vocab") if k in shape}
        labels = dict.fromkeys(["vanilla", *mechanisms])
        variants = [Variant(m, "zoo", "vanilla_classifier", {"attention": m}) for m in labels]
        self.paths.runs.mkdir(parents=True, exist_ok=True)
        _, summary = run_paired(variants, o.speed_lengths, "vanilla", rounds=o.speed_rounds, batch=o.speed_batch,
                                overrides=shape, threads=self.threads, device="cpu", **sizes)
        return measured_from_bench(write_csv(self.paths.runs / "bench_text_paired.csv", summary))

    def report(self, rows: list[dict[str, str]]) -> str:
        o = self.options
        runs = [dict(r, accuracy=float(r["accuracy"]) if "accuracy" in r else None, setting=None)
                for r in typed(rows) if r["kind"] == "run"]
        for r in runs:
            r.setdefault("attention", None), r.setdefault("split", "test")
        measured = [dict(m, error=m.get("error", "")) for m in typed(rows) if m["kind"] == "speed"]
        detail = "; ".join(sorted({f"{r['experiment']}: length {r['seq_len']}, {r['steps']} steps" for r in runs}))
        lines = [f"Runs: {detail}." + (f" Scale: {o.scale}" if o.scale else ""), "",
                 "**Table 1 layout: test accuracy (%)**; several seeds: mean (min-max, n)", "",
                 markdown(*table1(runs)), "",
                 "Avg is over the first five tasks, as in the paper (which averages without Path-X, where every model "
                 "FAILs).", "", "![Table 1](lra_table1.png)"]
        plot_table1(runs, self.paths.out / "lra_table1.png")
        lengths = sorted({m["length"] for m in measured})
        if measured:
            lines += ["", "**Table 2 layout: Text, steps per second and memory (relative to vanilla)**; memory: bytes "
                      "saved for backward on a CPU, not the paper's peak device memory", "",
                      markdown(*table2(measured, lengths)), "", "![Table 2](lra_table2.png)"]
        plot_table2(measured, lengths, self.paths.out / "lra_table2.png")
        lines += ["", self.verdict(runs, measured)]
        return "\n".join(lines)

    @staticmethod
    def verdict(runs: list[dict[str, Any]], measured: list[dict[str, Any]]) -> str:
        """Measured against the paper's rows, not a claim the budget can settle: which runs finished, and which
        mechanisms step faster than vanilla at the longest length measured."""
        done = [r for r in runs if r["accuracy"] is not None and not math.isnan(r["accuracy"])]
        text = f"**Verdict: {len(done)} of {len(runs)} runs finished with a test score**"
        if measured:
            longest = max(m["length"] for m in measured)
            at = {m["attention"]: m for m in measured if m["length"] == longest and m.get("steps_per_s")}
            if "vanilla" in at:
                faster = sorted(a for a, m in at.items() if a != "vanilla" and
                                (m.get("speedup") or m["steps_per_s"] / at["vanilla"]["steps_per_s"]) > 1.0)
                text += (f"; faster than vanilla at {longest:,} tokens: {', '.join(faster) or 'none'} "
                         f"(of {len(at) - 1})")
        return text + ". The accuracies are a CPU budget's, not comparable with the paper's full-size runs."


CPU_COMMON = ["model.d_model=64", "model.n_layers=2", "model.n_heads=4", "model.d_ff=128", "model.dropout=0.0",
              "model.attention_dropout=0.0", "optim=adam", "optim.lr=1e-3", "optim.schedule=cosine", "optim.warmup=40",
              "optim.weight_decay=0.0", "trainer.eval_every=0", "trainer.eval_split=test", "trainer.eval_batches=40",
              "trainer.checkpoints=false", "trainer.device=cpu"]


@dataclass
class CpuOptions(Options):
    tasks: list[str] = field(default_factory=lambda: [
        "lra_listops:trainer.seq_len=256:data.min_length=64:data.max_length=256:trainer.batch_size=8:"
        "trainer.max_steps=250",
        "lra_text:trainer.seq_len=512:trainer.batch_size=8:trainer.max_steps=150",
        "lra_image:trainer.seq_len=1024:trainer.batch_size=4:trainer.max_steps=150"])
    mechanisms: list[str] = field(default_factory=lambda: ["vanilla", "local_1d", "sparse_fixed", "lsh"])
    overrides: list[str] = field(default_factory=lambda: list(CPU_COMMON))
    scale: str = ("CPU scale: 2 layers, d = 64, 4 heads; ListOps 256 tokens x 250 steps of 8, Text 512 bytes x 150 "
                  "steps of 8, Image 1,024 pixels x 150 steps of 4 (synthetic CIFAR-10 layout); one thread on a "
                  "loaded 2-core machine")


@STUDY.register("lra_cpu")
class LraCpu(LraTables):
    """ListOps, Text and Image for four mechanisms at a CPU scale; Table 2 on the models trained on Text."""

    Options = CpuOptions
    toy_options = dict(tasks=["lra_listops:trainer.seq_len=32:data.min_length=8:data.max_length=32:data.eval_size=8:"
                              "trainer.batch_size=2:trainer.max_steps=2"], mechanisms=["vanilla"],
                       overrides=[*CPU_COMMON, "model.d_model=16", "model.d_ff=32", "model.n_heads=2",
                                  "trainer.eval_batches=2", "optim.warmup=1"], speed="none")


FAMILY = [
    "vanilla",
    "local_1d:attention.block=32:attention.memory=32",
    "sparse_fixed:attention.stride=32:attention.c=8",
    "longformer:attention.window=32:attention.global_tokens=1",
    "linformer:attention.k=64:attention.max_len=256",
    "lsh",
    "sinkhorn:attention.block=32:attention.max_len=256",
    "synthesizer:attention.max_len=256",
    "bigbird:attention.block=16:attention.random_blocks=3",
    "linear",
    "performer:attention.n_features=256",
    "nystromformer:attention.landmarks=32:attention.conv_kernel=35",
]
FAMILY_COMMON = ["model.n_layers=2", "model.d_model=64", "model.n_heads=2", "model.d_ff=128", "model.activation=gelu",
                 "model.max_len=256", "model.dropout=0.1", "model.attention_dropout=0.1", "position=learned",
                 "residual=pre_norm", "optim=adam", "optim.lr=1e-3", "optim.schedule=cosine", "optim.warmup=40",
                 "optim.weight_decay=0.0", "trainer.batch_size=16", "trainer.max_steps=400", "trainer.eval_every=0",
                 "trainer.eval_split=test", "trainer.eval_batches=40", "trainer.checkpoints=false",
                 "trainer.device=cpu"]


@dataclass
class FamilyOptions(Options):
    tasks: list[str] = field(default_factory=lambda: [
        "lra_listops:trainer.seq_len=256:data.min_length=64:data.max_length=256"])
    mechanisms: list[str] = field(default_factory=lambda: list(FAMILY))
    seeds: list[int] = field(default_factory=lambda: [0, 1])
    overrides: list[str] = field(default_factory=lambda: list(FAMILY_COMMON))
    speed: str = "bench"
    speed_rounds: int = 3
    bench_set: list[str] = field(default_factory=lambda: [
        "d_model=64", "heads=2", "d_ff=128", "layers=2", "vocab=257", "n_classes=2", "residual=pre_norm"])
    scale: str = ("the Nystromformer setting's model (2 layers, d 64, 2 heads, FF 128 GELU, pre-norm, learned "
                  "positions, mean pooling, dropout 0.1) on ListOps trees of 64-256 tokens, 400 steps of batch 16, "
                  "Adam 1e-3, 40 warm-up steps, cosine; 640 test examples per run; one thread. Table 2: zoo.bench's "
                  "paired rounds on the Text shape (vocabulary 257, 2 classes), each mechanism at its default "
                  "options, batch 1")


@STUDY.register("lra_family")
class LraFamily(LraTables):
    """ListOps for every mechanism with a row in LRA Table 1, two seeds; Table 2 by ``zoo.bench --paired``."""

    Options = FamilyOptions
    toy_options = dict(tasks=["lra_listops:trainer.seq_len=32:data.min_length=8:data.max_length=32:data.eval_size=8"],
                       mechanisms=["local_1d:attention.block=8:attention.memory=8"], seeds=[0],
                       overrides=[*FAMILY_COMMON, "model.max_len=32", "trainer.batch_size=2", "trainer.max_steps=2",
                                  "trainer.eval_batches=2", "optim.warmup=1"],
                       speed_lengths=[32], speed_rounds=1,
                       bench_set=["d_model=16", "heads=2", "d_ff=32", "layers=1", "vocab=257", "n_classes=2"])
