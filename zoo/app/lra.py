"""``sweep=lra``: every LRA task x every mechanism, ending in the layouts of LRA Tables 1 and 2.

Tay et al. 2020 ("Long Range Arena", arXiv:2011.04006):

- Table 1: test accuracy (%) per task (ListOps, Text, Retrieval, Image, Pathfinder, Path-X) and
  their average over the first five (every model fails Path-X, so the paper averages without it).
  Ours come from the sweep's ``result.json`` files; each mechanism that has a counterpart in the
  paper gets the paper's row beside it: the mechanism names it (``Attention.lra_row``: vanilla ->
  Transformer, local_1d -> Local Attention, sparse_* -> Sparse Trans., lsh -> Reformer).
- Table 2: training steps per second and peak memory on byte-level Text at 1K, 2K, 3K and 4K
  tokens, each relative to vanilla, measured after the sweep (zoo/app/lra_speed.py).

Outputs in the sweep directory (or ``out_dir``): ``lra_table1.{md,csv,png}`` and
``lra_table2.{md,csv,png}``. The studies ``lra_cpu`` and ``lra_family`` (zoo/studies/lra_tables.py) report both
tables from their rows.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

import torch

from zoo.app.lra_papers import PAPER_LENGTHS, PAPER_NYSTROMFORMER, PAPER_TABLE1, paper_row
from zoo.app.lra_speed import measure_speed, plot_table2, speed_configs, table2

try:  # the callback base class; the module stays importable without Hydra
    from hydra.experimental.callback import Callback
except ImportError:  # pragma: no cover
    Callback = object  # type: ignore[misc,assignment]

# experiment name -> Table 1 column
TASKS = {
    "lra_listops": "ListOps",
    "lra_text": "Text",
    "lra_retrieval": "Retrieval",
    "lra_image": "Image",
    "lra_pathfinder": "Pathfinder",
    "lra_pathx": "Path-X",
}
AVERAGED = ("ListOps", "Text", "Retrieval", "Image", "Pathfinder")  # the paper's average leaves Path-X out


def gather_runs(sweep_dirs: list[str | Path]) -> list[dict[str, Any]]:
    """One row per finished or failed run: experiment, attention, accuracy (None if failed), config."""
    rows = []
    for sweep_dir in sweep_dirs:
        for result_path in sorted(Path(sweep_dir).rglob("result.json")):
            result = json.loads(result_path.read_text())
            config_path = result_path.with_name("config.json")
            stored = json.loads(config_path.read_text()) if config_path.is_file() else {}
            config = stored.get("config") or _hydra_config(result_path.parent)
            experiment = config.get("experiment") or result.get("experiment")
            attention = (
                (stored.get("model_config") or {}).get("attention", {}).get("name")
                or result.get("attention")
                or (config.get("attention") or {}).get("name")
            )
            value, split = scored_value(result, result_path.parent)
            ok = (
                str(result.get("status", "")).startswith("finished")
                and isinstance(value, (int, float))
                and not math.isnan(value)
            )
            setting = config.get("lra_setting") or {}
            rows.append(
                {
                    "experiment": experiment,
                    "attention": attention,
                    "setting": setting.get("name"),  # lra_setting=<name>, or None for the experiment's own
                    "setting_reported": setting.get("reported"),  # that setting's published softmax figures
                    "accuracy": 100.0 * value if ok else None,
                    "split": split,  # "test" where evaluate.py scored the run's best checkpoint there
                    "status": result.get("status"),
                    "steps": result.get("steps"),
                    "tokens_per_s": result.get("tokens_per_s"),
                    "wall_s": result.get("wall_s"),
                    "seq_len": (config.get("trainer") or {}).get("seq_len"),
                    "model_config": stored.get("model_config"),
                    "dir": str(result_path.parent),
                }
            )
    return rows


def scored_value(result: dict[str, Any], run_dir: Path) -> tuple[Any, str]:
    """(value, split) for Table 1: the test score of the run's best checkpoint where ``evaluate.py
    <run>/checkpoints/best.pt --split test`` wrote it to ``test_best.txt`` (its JSON after any log lines),
    else the run's final score on the split it evaluated during training (``val``: a dev score)."""
    test = run_dir / "test_best.txt"
    metric = result.get("metric", "accuracy")
    if test.is_file() and "{" in test.read_text():
        text = test.read_text()
        scored = json.loads(text[text.index("{") :])
        if f"test/{metric}" in scored:
            return scored[f"test/{metric}"], "test"
    return result.get("final_metric"), str(result.get("metric_name") or "val/").split("/")[0]


def _hydra_config(run_dir: Path) -> dict[str, Any]:
    """The composed config Hydra saved for a run (``.hydra/config.yaml``): a run that failed before
    writing config.json still says which experiment and attention it was."""
    path = run_dir / ".hydra" / "config.yaml"
    if not path.is_file():
        return {}
    import yaml

    return yaml.safe_load(path.read_text()) or {}


def _cell(value: float | None, failed: bool = False) -> str:
    if value is None:
        return "error" if failed else ""
    return f"{value:.2f}"


def table1(rows: list[dict[str, Any]]) -> tuple[list[str], list[list[Any]]]:
    """(header, rows) in LRA Table 1's layout; ours then the paper's counterpart, per mechanism."""
    header = ["Model", *TASKS.values(), "Avg"]
    variants = {(r["attention"], r.get("setting")) for r in rows if r["attention"]}
    out = []
    for mech, setting in sorted(variants, key=lambda v: (v[1] or "", v[0] != "vanilla", v[0])):
        seeds, failed, not_test = {}, set(), set()
        for r in rows:
            if r["attention"] == mech and r.get("setting") == setting and r["experiment"] in TASKS:
                column = TASKS[r["experiment"]]
                if r["accuracy"] is None:
                    failed.add(column)
                else:
                    seeds.setdefault(column, []).append(r["accuracy"])
                    if r.get("split", "test") != "test":
                        not_test.add(column)
        values = {c: sum(v) / len(v) for c, v in seeds.items()}  # several seeds: their mean, range beside it
        scored = [values[c] for c in AVERAGED if c in values]
        average = sum(scored) / len(scored) if len(scored) == len(AVERAGED) else None
        label = f"{mech} (ours, {setting} setting)" if setting else f"{mech} (ours)"
        cells = [_seed_cell(seeds.get(c), c in failed) + (NOT_TEST if c in not_test else "") for c in TASKS.values()]
        out.append([label, *cells, _cell(average)])
        paper = paper_row(mech)
        reported = next((r.get("setting_reported") for r in rows if setting and r.get("setting") == setting), None)
        if setting and reported and paper == "Transformer":  # the setting's figures are for softmax attention
            figures = [reported.get(c) for c in TASKS.values()]
            done = [v for c, v in zip(TASKS.values(), figures) if c in AVERAGED and v is not None]
            mean = sum(done) / len(done) if len(done) == len(AVERAGED) else None
            out.append([f"Transformer ({setting} setting, reported)", *(_cell(v) for v in figures), _cell(mean)])
        if paper in PAPER_TABLE1:
            figures = PAPER_TABLE1[paper]
            out.append([f"{paper} (LRA paper)", *("FAIL" if v is None else f"{v:.2f}" for v in figures)])
        if paper in PAPER_NYSTROMFORMER:
            figures = PAPER_NYSTROMFORMER[paper]
            out.append(
                [f"{paper} (Nyströmformer paper, its setting)", *("" if v is None else f"{v:.2f}" for v in figures)]
            )
    return header, out


NOT_TEST = " †"  # a cell holding a run's final dev score: no test_best.txt beside it


def _seed_cell(values: list[float] | None, failed: bool) -> str:
    """One run: its accuracy; several seeds: mean (min-max, n)."""
    if not values or len(values) == 1:
        return _cell(values[0] if values else None, failed)
    mean = sum(values) / len(values)
    return f"{mean:.2f} ({min(values):.2f}-{max(values):.2f}, n={len(values)})"


def markdown(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows])


# -- figures ------------------------------------------------------------------------------------------------


def plot_table1(rows: list[dict[str, Any]], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(TASKS.values())
    mechanisms = sorted({r["attention"] for r in rows if r["attention"]}, key=lambda m: (m != "vanilla", m))
    papers = sorted({paper_row(m) for m in mechanisms} & set(PAPER_TABLE1), key=list(PAPER_TABLE1).index)
    fig, axes = plt.subplots(1, 2, figsize=(14, 4.2), sharey=True)
    for ax, names, title in ((axes[0], mechanisms, "ours (this sweep)"), (axes[1], papers, "LRA paper, Table 1")):
        width = 0.8 / max(1, len(names))
        for i, name in enumerate(names):
            if ax is axes[0]:
                values = {
                    TASKS[r["experiment"]]: r["accuracy"]
                    for r in rows
                    if r["attention"] == name and r["experiment"] in TASKS
                }
                heights = [values.get(t) or 0.0 for t in tasks]
            else:
                heights = [v or 0.0 for v in PAPER_TABLE1[name][:6]]
            ax.bar([k + i * width for k in range(len(tasks))], heights, width, label=name)
        ax.set_xticks([k + 0.4 - width / 2 for k in range(len(tasks))])
        ax.set_xticklabels(tasks, fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
        if names:
            ax.legend(fontsize=7)
    axes[0].set_ylabel("test accuracy (%); 0 = not run / failed / FAIL")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def _write_csv(path: Path, header: list[str], rows: list[list[Any]]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)


def write_lra_tables(
    sweep_dirs: list[str | Path],
    out_dir: str | Path,
    *,
    lengths: list[int] = PAPER_LENGTHS,
    batch_size: int = 4,
    steps: int = 3,
    device: str = "auto",
    scale: str = "",
    measure: bool = True,
) -> dict[str, Path]:
    """Tables 1 and 2 (markdown, CSV, PNG) for the runs under ``sweep_dirs``, into ``out_dir``; with
    ``measure`` False, Table 1 only (Table 2 then comes from a ``zoo.bench --paired`` run, ``--bench``)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = gather_runs(sweep_dirs)
    note = f"\n\nScale: {scale}" if scale else ""
    header, body = table1(rows)
    paths = {
        "table1_md": out_dir / "lra_table1.md",
        "table1_csv": out_dir / "lra_table1.csv",
        "table1_png": out_dir / "lra_table1.png",
    }
    lengths_run = sorted(
        {(TASKS.get(r["experiment"]), r["seq_len"], r["steps"]) for r in rows if r["experiment"] in TASKS}, key=str
    )
    detail = "; ".join(f"{task}: length {n}, {s} steps" for task, n, s in lengths_run)
    paths["table1_md"].write_text(
        f"# LRA Table 1 layout: test accuracy (%)\n\nRuns: {detail}.{note}\n\n{markdown(header, body)}\n\n"
        "Avg is over the first five tasks, as in the paper (which averages without Path-X, where every model FAILs).\n"
        + (
            f"\n{NOT_TEST.strip()} not a test score: the run's final score on its evaluation (dev) split; "
            "`python experiments/evaluate.py <run>/checkpoints/best.pt --split test > <run>/test_best.txt` "
            "puts the test score of its best checkpoint here.\n"
            if any(NOT_TEST in str(cell) for row in body for cell in row)
            else ""
        )
    )
    _write_csv(paths["table1_csv"], header, body)
    paths["runs_csv"] = out_dir / "lra_runs.csv"
    run_keys = ("experiment", "attention", "accuracy", "split", "status", "steps", "seq_len", "tokens_per_s", "wall_s")
    _write_csv(paths["runs_csv"], list(run_keys), [[r.get(k) for k in run_keys] for r in rows])
    plot_table1(rows, paths["table1_png"])
    configs = speed_configs(rows) if measure else {}
    if configs:
        measured = measure_speed(configs, list(lengths), batch_size=batch_size, steps=steps, device=device)
        header2, body2 = table2(measured, list(lengths))
        paths.update(
            table2_md=out_dir / "lra_table2.md",
            table2_csv=out_dir / "lra_table2.csv",
            table2_png=out_dir / "lra_table2.png",
        )
        where = (
            f"{torch.cuda.get_device_name()} (CUDA peak allocation)"
            if torch.cuda.is_available() and device != "cpu"
            else f"CPU, {torch.get_num_threads()} thread(s) (memory: tensors saved for backward)"
        )
        paths["table2_md"].write_text(
            f"# LRA Table 2 layout: Text, steps per second and peak memory (relative to vanilla)\n\n"
            f"Measured on {where}; batch {batch_size}, median of {steps} paired rounds (one step of every "
            "mechanism per round, order rotated each round) after a warm-up round; "
            f"models as trained on Text in this sweep.{note}\n\n{markdown(header2, body2)}\n"
        )
        _write_csv(
            paths["table2_csv"],
            ["attention", "length", "steps_per_s", "memory_mb", "error"],
            [[m[k] for k in ("attention", "length", "steps_per_s", "memory_mb", "error")] for m in measured],
        )
        plot_table2(measured, list(lengths), paths["table2_png"])
    return paths


class LRATables(Callback):
    """Hydra callback of ``sweep=lra``: writes both tables into the sweep directory at the end."""

    def __init__(self, lengths: list[int] = PAPER_LENGTHS, batch_size: int = 4, steps: int = 3, scale: str = ""):
        self.lengths, self.batch_size, self.steps, self.scale = list(lengths), batch_size, steps, scale

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        sweep_dir = config.hydra.sweep.dir
        paths = write_lra_tables(
            [sweep_dir], sweep_dir, lengths=self.lengths, batch_size=self.batch_size, steps=self.steps, scale=self.scale
        )
        for key in ("table1_md", "table2_md"):
            if key in paths:
                print(f"\n{paths[key].read_text()}", flush=True)
