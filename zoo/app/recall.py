"""Recall against decoding state: Zoology's Figure 2 and Based's recall / state-size frontier from MQAR sweeps.

Zoology (Arora et al. 2023, arXiv:2312.04927) Figure 2 plots MQAR accuracy against d_model, a panel
per sequence length, a line per mechanism, each point the best of four learning rates. Based (Arora
et al. 2024, arXiv:2402.18668) Figure 2 plots MQAR accuracy against the bytes of state a mechanism
keeps to decode. Both are read here from the jobs of ``data=mqar`` sweeps (``conf/sweep/mqar_figure2.yaml``,
run once per length), so the training is the app's and the seeds are the sweep machinery's.

The state is measured, not estimated: each job's stored model config is rebuilt, a sequence of the
job's length is fed through ``init_state`` in eval mode, and the tensors of the returned state are
counted (:func:`zoo.bench.generate.state_bytes`), divided by the number of layers (bytes per layer
for one sequence). A model that cannot continue a sequence has no decoding state to count: its row
keeps the reason and stays off the frontier.

Outputs (:func:`write_report`): ``recall_rows.csv`` (one row per job), ``figure2.csv`` (per
mechanism, length and d_model: best learning rate per seed, then mean and 95% interval over seeds),
``frontier.csv`` (the same cells with their state, the Pareto front marked), ``figure2.png`` and
``frontier.png`` (attention's curve from the paper's figure drawn beside ours), and ``recall.md`` naming
the front and giving a verdict per length and mechanism. ``python -m zoo.app.recall`` renders one report from
a grid split over several sweep directories.
"""

from __future__ import annotations

import csv
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

from zoo.app.aggregate import mean_interval
from zoo.app.summary import gather
from zoo.attention.blocked import PatternAttention
from zoo.bench.generate import state_bytes
from zoo.presets.factory import create_model

# Zoology's Figure 2 gives curves, not a table: attention's, read off the published figure by eye (within
# about 0.02; the repository's assets/figure2.png), drawn beside ours. Its other mixers (Hyena, RWKV, H3,
# BaseConv) are not parts of the zoo, so their curves have nothing of ours to sit beside.
PAPER_CURVES = {
    "vanilla": {
        64: {64: 0.97, 128: 0.97, 256: 0.97, 512: 0.97},
        128: {64: 0.97, 128: 0.97, 256: 0.97, 512: 0.97},
        256: {64: 0.97, 128: 0.97, 256: 0.97, 512: 0.97},
    }
}
SOLVED = 0.9  # mean query accuracy over seeds that counts as recalling


def decoding_state(model_config: dict[str, Any], seq_len: int) -> tuple[float | None, str]:
    """(bytes of decoding state per layer after ``seq_len`` tokens of one sequence, "") or (None, why not)."""
    model = create_model(**model_config).eval()
    try:
        state = model.init_state(1)
    except ValueError as refusal:
        return None, str(refusal)
    tokens = torch.randint(0, model.config.vocab_size, (1, seq_len), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = model(tokens, state=state)
    return state_bytes(out.state) / model.config.n_layers, ""


def reachable_keys(model_config: dict[str, Any], length: int) -> torch.Tensor | None:
    """bool [length, length]: can position i read position j through the causal stack, each layer's fixed
    pattern (``PatternAttention.allowed``, any head) composed over the layers, a position always keeping its
    own (the residual)? None when a layer's keys are not a fixed pattern (every earlier key, hash buckets, a
    recurrent state): then the task, not the pattern, bounds what it reads. A test-size analysis (the
    studies ask it at 64-1,024 positions), never a mechanism's implementation."""
    model = create_model(**model_config)
    layers = [block.attention for block in model.stack.blocks]
    if not all(isinstance(layer, PatternAttention) for layer in layers):
        return None
    position = torch.arange(length)
    i, j = position[:, None], position[None, :]
    reach = torch.eye(length)
    for layer in layers:
        allowed = layer.allowed(i, j)
        allowed = allowed.any(0) if allowed.dim() == 3 else allowed  # per-head patterns: any head reads it
        step = (allowed & (j <= i)) | (i == j)
        reach = (step.float() @ reach).clamp(max=1.0)  # i reads m in this layer, m already reached j
    return reach.bool()


def attention_label(attention: dict[str, Any]) -> str:
    """``local_1d(4+4)``: a layer's mechanism with the option values the run set on it (a stored config
    keeps only those, in the order given)."""
    options = [str(value) for key, value in attention.items() if key != "name"]
    return str(attention.get("name")) + (f"({'+'.join(options)})" if options else "")


def mechanism_label(model_config: dict[str, Any], varied: dict[str, str]) -> str:
    """The mechanism and the state options the sweep set (``local_1d window=16``): a point of the frontier;
    a per-layer hybrid names each layer with its options (``local_1d(4+4)+vanilla``)."""
    attention = model_config.get("attention") or {}
    if isinstance(attention, list):
        label = "+".join(dict.fromkeys(attention_label(a) for a in attention))
    else:
        label = str(attention.get("name", "?"))
    options = [f"{k.removeprefix('attention.')}={v}" for k, v in sorted(varied.items()) if k.startswith("attention.")]
    return " ".join([label, *options])


def recall_rows(sweep_dirs: list[str | Path]) -> list[dict[str, Any]]:
    """One row per finished job of the sweeps: mechanism, length, pairs, d_model, lr, seed, accuracy, state."""
    rows = []
    for sweep in sweep_dirs:
        for job in gather(sweep):
            if not str(job.get("status", "")).startswith("finished") or job.get("best_metric") is None:
                continue
            stored = json.loads((Path(job["dir"]) / "config.json").read_text())
            config, model_config = stored["config"], stored["model_config"]
            if config["data"]["name"] != "mqar":
                raise ValueError(f"{job['dir']}: data={config['data']['name']}, not mqar")
            seq_len = config["trainer"]["seq_len"]
            state, why = decoding_state(model_config, seq_len)
            rows.append(
                dict(
                    mechanism=mechanism_label(model_config, job.get("overrides", {})),
                    seq_len=seq_len,
                    num_kv_pairs=config["data"]["num_kv_pairs"],
                    d_model=model_config["d_model"],
                    lr=config["optim"]["lr"],
                    seed=config["seed"],
                    accuracy=float(job["best_metric"]),
                    state_bytes_per_layer=state,
                    no_state=why,
                    job=f"{Path(sweep).name}/{Path(job['dir']).name}",  # sweep and job, no machine path
                )
            )
    return rows


def figure2_cells(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (mechanism, length, d_model): each seed's best learning rate, then the mean and 95% interval
    over seeds (Zoology reports the best of four rates per point)."""
    best: dict[tuple, dict[Any, dict[str, Any]]] = defaultdict(dict)
    for row in rows:
        cell = (row["mechanism"], row["seq_len"], row["num_kv_pairs"], row["d_model"])
        kept = best[cell].get(row["seed"])
        if kept is None or row["accuracy"] > kept["accuracy"]:
            best[cell][row["seed"]] = row
    cells = []
    for (mechanism, seq_len, pairs, d_model), by_seed in sorted(best.items()):
        interval = mean_interval([r["accuracy"] for r in by_seed.values()])
        states = {r["state_bytes_per_layer"] for r in by_seed.values()}
        cells.append(
            dict(
                mechanism=mechanism,
                seq_len=seq_len,
                num_kv_pairs=pairs,
                d_model=d_model,
                seeds=interval.n,
                accuracy=interval.mean,
                low=interval.low,
                high=interval.high,
                best_lrs=" ".join(str(by_seed[s]["lr"]) for s in sorted(by_seed)),
                per_seed=" / ".join(f"{by_seed[s]['accuracy']:.3f}" for s in sorted(by_seed)),
                state_bytes_per_layer=states.pop() if len(states) == 1 else None,
            )
        )
    return cells


def pareto_front(cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The cells no other cell of the same length beats with no more state and at least the accuracy."""
    front = []
    for cell in cells:
        if cell["state_bytes_per_layer"] is None:
            continue
        dominated = any(
            other is not cell
            and other["seq_len"] == cell["seq_len"]
            and other["state_bytes_per_layer"] is not None
            and other["state_bytes_per_layer"] <= cell["state_bytes_per_layer"]
            and other["accuracy"] >= cell["accuracy"]
            and (other["state_bytes_per_layer"], -other["accuracy"])
            != (cell["state_bytes_per_layer"], -cell["accuracy"])
            for other in cells
        )
        if not dominated:
            front.append(cell)
    return front


def _interval(cell: dict[str, Any]) -> str:
    """``0.980 [0.950, 1.000] (seeds: 1.000 / 0.940 / 1.000)``, or ``0.250 (1 seed)`` where one seed leaves
    no interval; each seed's accuracy is shown, since a mean of 0.6 can be one seed recalling and one not."""
    if cell["low"] is None:
        return f"{cell['accuracy']:.3f} ({cell['seeds']} seed)"
    seeds = f"seeds: {cell['per_seed']}" if cell.get("per_seed") else f"{cell['seeds']} seeds"
    return f"{cell['accuracy']:.3f} [{cell['low']:.3f}, {cell['high']:.3f}] ({seeds})"


def verdicts(cells: list[dict[str, Any]], solved: float = SOLVED) -> list[str]:
    """One line per (length, mechanism): the widths at which it recalls (mean over seeds >= ``solved``),
    with the interval, or its best width and accuracy when it recalls at none."""
    lines = []
    for length, mechanism in sorted({(c["seq_len"], c["mechanism"]) for c in cells}):
        line = sorted(
            (c for c in cells if (c["seq_len"], c["mechanism"]) == (length, mechanism)), key=lambda c: c["d_model"]
        )
        shown = ", ".join(f"d_model {c['d_model']}: {_interval(c)}" for c in line)
        widths = [c["d_model"] for c in line]
        recalls = [c["d_model"] for c in line if c["accuracy"] >= solved]
        if recalls == widths:
            verdict = "recalls at every width tried"
        elif recalls and recalls == widths[-len(recalls) :]:
            verdict = f"recalls from d_model {recalls[0]} on"
        elif recalls:
            verdict = f"recalls at d_model {', '.join(map(str, recalls))} only"
        else:
            verdict = "does not recall at any width tried"
        lines.append(f"- length {length}, **{mechanism}**: {verdict} ({shown})")
    return lines


def _write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["empty"])
        writer.writeheader()
        writer.writerows(rows)


def _plots(cells: list[dict[str, Any]], front: list[dict[str, Any]], out: Path) -> None:
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lengths = sorted({c["seq_len"] for c in cells})
    fig, axes = plt.subplots(1, len(lengths), figsize=(4 * len(lengths), 3.5), squeeze=False)
    for ax, length in zip(axes[0], lengths):
        mine = [c for c in cells if c["seq_len"] == length]
        for mechanism in sorted({c["mechanism"] for c in mine}):
            line = sorted((c for c in mine if c["mechanism"] == mechanism), key=lambda c: c["d_model"])
            widths = [c["d_model"] for c in line]
            drawn = ax.plot(widths, [c["accuracy"] for c in line], marker="o", label=mechanism)
            if all(c["low"] is not None for c in line):  # 95% interval over seeds (none from one seed)
                below = [c["accuracy"] - max(c["low"], 0.0) for c in line]  # drawn within [0, 1]
                above = [min(c["high"], 1.0) - c["accuracy"] for c in line]
                ax.errorbar(
                    widths,
                    [c["accuracy"] for c in line],
                    yerr=[below, above],
                    fmt="none",
                    capsize=3,
                    alpha=0.5,
                    color=drawn[0].get_color(),
                )
            paper = PAPER_CURVES.get(mechanism, {}).get(length)
            if paper:
                ax.plot(
                    list(paper),
                    list(paper.values()),
                    linestyle="--",
                    color=drawn[0].get_color(),
                    label=f"{mechanism}, Zoology Fig. 2",
                )
        pairs = mine[0]["num_kv_pairs"]
        ax.set(
            title=f"length {length}, {pairs} pairs",
            xlabel="d_model",
            ylabel="MQAR accuracy",
            xscale="log",
            ylim=(0, 1.02),
        )
        ticks = sorted({c["d_model"] for c in mine} | {w for m in PAPER_CURVES.values() for w in m.get(length, {})})
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.minorticks_off()
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "figure2.png", dpi=120)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(6, 4))
    for length in lengths:
        points = [c for c in cells if c["seq_len"] == length and c["state_bytes_per_layer"] is not None]
        ax.scatter(
            [c["state_bytes_per_layer"] for c in points], [c["accuracy"] for c in points], label=f"length {length}"
        )
        for c in points:  # each point named: the mechanism and its width
            name = f"{c['mechanism']} d{c['d_model']}"
            ax.annotate(
                name, (c["state_bytes_per_layer"], c["accuracy"]), fontsize=6, xytext=(3, 3), textcoords="offset points"
            )
        edge = sorted((c for c in front if c["seq_len"] == length), key=lambda c: c["state_bytes_per_layer"])
        ax.plot([c["state_bytes_per_layer"] for c in edge], [c["accuracy"] for c in edge], linestyle="--")
    ax.set(xscale="log", xlabel="decoding state per layer (bytes, measured)", ylabel="MQAR accuracy", ylim=(0, 1.05))
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda x, _: f"{x:,.0f}"))
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "frontier.png", dpi=120)
    plt.close(fig)


def write_report(sweep_dirs: list[str | Path], out: str | Path, *, plots: bool = True) -> dict[str, Path]:
    """Read the sweeps, write the rows, cells, front (CSV + Markdown) and plots into ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rows = recall_rows(sweep_dirs)
    if not rows:
        raise ValueError(f"no finished data=mqar job in {', '.join(map(str, sweep_dirs))}")
    cells = figure2_cells(rows)
    front = pareto_front(cells)
    on_front = {id(c) for c in front}
    frontier = [{**c, "pareto": id(c) in on_front} for c in cells]
    _write_csv(out / "recall_rows.csv", rows)
    _write_csv(out / "figure2.csv", cells)
    _write_csv(out / "frontier.csv", frontier)
    lines = ["| length | mechanism | d_model | accuracy | state bytes / layer |", "|---|---|---|---|---|"]
    for c in sorted(front, key=lambda c: (c["seq_len"], c["state_bytes_per_layer"])):
        lines.append(
            f"| {c['seq_len']} | {c['mechanism']} | {c['d_model']} | {c['accuracy']:.3f} "
            f"| {c['state_bytes_per_layer']:.0f} |"
        )
    refused = sorted({(r["mechanism"], r["no_state"]) for r in rows if r["no_state"]})
    lines += ["", *(f"- {m}: off the frontier ({why})" for m, why in refused)]
    lines += [
        "",
        f"## Verdicts (recalls: mean query accuracy over seeds >= {SOLVED}, best rate per seed)",
        "",
        *verdicts(cells),
    ]
    (out / "recall.md").write_text(
        "# MQAR: the Pareto front of recall against decoding state\n\n" + "\n".join(lines) + "\n"
    )
    paths = {name: out / name for name in ("recall_rows.csv", "figure2.csv", "frontier.csv", "recall.md")}
    if plots:
        _plots(cells, front, out)
        paths.update(figure2=out / "figure2.png", frontier_png=out / "frontier.png")
    return paths


try:  # the callback base class; the module stays importable without Hydra for write_report
    from hydra.experimental.callback import Callback
except ImportError:  # pragma: no cover
    Callback = object  # type: ignore[misc,assignment]


class RecallReport(Callback):
    """Hydra callback of ``sweep=mqar_figure2``: writes the Figure 2 cells and the frontier into the sweep directory."""

    def __init__(self, plots: bool = True):
        self.plots = plots

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        paths = write_report([config.hydra.sweep.dir], config.hydra.sweep.dir, plots=self.plots)
        print(f"\n{paths['recall.md'].read_text()}", flush=True)


def main(argv: list[str] | None = None) -> None:
    """Re-render the report from finished sweeps (a grid split over several sweep directories, e.g. one per
    process): ``python -m zoo.app.recall SWEEP_DIR [SWEEP_DIR ...] --out DIR``."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("sweeps", nargs="+", help="hydra.sweep.dir of each finished data=mqar sweep")
    parser.add_argument("--out", required=True, help="where recall.md, the CSVs and the plots go")
    args = parser.parse_args(argv)
    paths = write_report(args.sweeps, args.out)
    print(paths["recall.md"].read_text())


if __name__ == "__main__":
    main()
