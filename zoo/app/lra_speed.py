"""LRA Table 2: training speed and memory of each mechanism on byte-level Text, relative to vanilla.

Tay et al. 2020 ("Long Range Arena", arXiv:2011.04006), Table 2: steps per second and peak memory at 1K,
2K, 3K and 4K tokens. Measured here
(``sweep=lra`` after its runs, or the studies ``lra_cpu`` / ``lra_family``, zoo/studies/lra_tables.py): the
model each mechanism trained on Text (its stored config) is rebuilt at each length and timed for a few
optimiser steps on random bytes in zoo.bench's paired rounds (every mechanism once per round, order rotated),
so machine load hits all alike. Memory is the CUDA peak allocation where there is a GPU, else the bytes
of tensors saved for backward. Or the figures come from a ``python -m zoo.bench --paired`` run
(:func:`measured_from_bench`). Table 1 and the files both tables are written to: zoo/app/lra.py.
"""

from __future__ import annotations

import csv
import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from zoo.app.lra_papers import PAPER_LENGTHS, PAPER_TABLE2, paper_row
from zoo.bench.timing import ActivationMeter, clocked, paired_ratios, paired_rounds
from zoo.presets.factory import create_model
from zoo.train.options import pick_device


def _optimiser_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: dict[str, torch.Tensor]) -> None:
    model(**batch).loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _step_memory_mib(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: dict[str, torch.Tensor], device: torch.device
) -> float:
    """Memory of one optimiser step: the CUDA peak allocation, else the bytes of tensors saved for
    backward (counted by the activation meter; parameters saved by their layers included, as the
    table has always counted them)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        _optimiser_step(model, optimizer, batch)
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) / 2**20
    meter = ActivationMeter()
    with meter:
        loss = model(**batch).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return meter.megabytes


def measure_speed(
    configs: dict[str, dict[str, Any]],
    lengths: list[int],
    *,
    batch_size: int,
    steps: int,
    device: str = "auto",
    progress: Callable[[str], None] = lambda line: None,
) -> list[dict[str, Any]]:
    """Median step time and memory of each mechanism's model at each length. Timed by zoo.bench's
    paired rounds: ``steps`` rounds, each one optimiser step of every mechanism in an order rotated
    each round, after a warm-up round; memory from one more step (:func:`_step_memory_mib`)."""

    dev = pick_device(device)
    out = []
    for length in lengths:
        built = {}
        for mech, config in configs.items():
            # timed at lengths it was not trained at: the table grows, and a padded mean divides by the input's
            # own length (a pool_length below it would be refused; the divisor costs nothing either way)
            config = {**config, "max_len": max(int(config.get("max_len", 0)), length), "dropout": 0.0, "pool_length": 0}
            try:
                model = create_model(**config).to(dev).train()
            except ValueError as exc:  # a mechanism that cannot take this length says why
                out.append(
                    {
                        "attention": mech,
                        "length": length,
                        "steps_per_s": None,
                        "memory_mb": None,
                        "error": str(exc)[:200],
                    }
                )
                continue
            generator = torch.Generator().manual_seed(length)
            tokens = torch.randint(1, config["vocab_size"], (batch_size, length), generator=generator)
            batch = {
                "tokens": tokens.to(dev),
                "targets": torch.randint(0, config["n_classes"], (batch_size,), generator=generator).to(dev),
                "pad_mask": torch.ones(batch_size, length, dtype=torch.bool, device=dev),
            }
            built[mech] = (model, torch.optim.Adam(model.parameters(), lr=1e-4), batch)
        if not built:
            continue
        timed = {mech: clocked(functools.partial(_optimiser_step, *parts), dev) for mech, parts in built.items()}
        rounds = paired_rounds(timed, steps, progress=progress)
        seconds = paired_ratios(rounds, next(iter(built)))
        for mech, (model, optimizer, batch) in built.items():
            out.append(
                {
                    "attention": mech,
                    "length": length,
                    "steps_per_s": 1.0 / seconds[mech]["median_s"],
                    "memory_mb": _step_memory_mib(model, optimizer, batch, dev),
                    "error": "",
                }
            )
        del built
    return out


def table2(measured: list[dict[str, Any]], lengths: list[int]) -> tuple[list[str], list[list[Any]]]:
    """LRA Table 2's layout: steps/s (x vanilla) and memory (x vanilla) per length; paper beside."""
    header = [
        "Model",
        *(f"steps/s {n // 1024 if n % 1024 == 0 else n}{'K' if n % 1024 == 0 else ''}" for n in lengths),
        *(f"memory {n // 1024 if n % 1024 == 0 else n}{'K' if n % 1024 == 0 else ''}" for n in lengths),
    ]
    by = {(m["attention"], m["length"]): m for m in measured}
    mechanisms = sorted({m["attention"] for m in measured}, key=lambda m: (m != "vanilla", m))
    rows = []
    for mech in mechanisms:
        speed, memory = [], []
        for n in lengths:
            m, base = by.get((mech, n), {}), by.get(("vanilla", n), {})
            if not m.get("steps_per_s"):
                speed.append("error")
                memory.append("error")
                continue
            ratio = m.get("speedup") or (m["steps_per_s"] / base["steps_per_s"] if base.get("steps_per_s") else None)
            rel = f" ({ratio:.1f}x)" if ratio else ""  # zoo.bench --paired: the median of per-round ratios
            speed.append(f"{m['steps_per_s']:.2f}{rel}")
            mb = f"{m['memory_mb']:.3g} MiB"
            memory.append(f"{mb} ({m['memory_mb'] / base['memory_mb']:.2f}x)" if base.get("memory_mb") else mb)
        rows.append([f"{mech} (ours)", *speed, *memory])
        paper = paper_row(mech)
        if paper in PAPER_TABLE2 and tuple(lengths) == PAPER_LENGTHS:
            steps, gigabytes = PAPER_TABLE2[paper]
            base_steps, base_gb = PAPER_TABLE2["Transformer"]
            rows.append(
                [
                    f"{paper} (LRA paper)",
                    *(f"{s} ({s / b:.1f}x)" for s, b in zip(steps, base_steps)),
                    *(f"{g} GB ({g / b:.2f}x)" for g, b in zip(gigabytes, base_gb)),
                ]
            )
    return header, rows


def plot_table2(measured: list[dict[str, Any]], lengths: list[int], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by = {(m["attention"], m["length"]): m for m in measured}
    mechanisms = sorted({m["attention"] for m in measured}, key=lambda m: (m != "vanilla", m))
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    for ax, key, paper_index, title in (
        (axes[0], "steps_per_s", 0, "training speed relative to vanilla"),
        (axes[1], "memory_mb", 1, "peak memory relative to vanilla"),
    ):
        for mech in mechanisms:
            points = [
                (n, by[(mech, n)][key] / by[("vanilla", n)][key])
                for n in lengths
                if (mech, n) in by and ("vanilla", n) in by and by[(mech, n)][key] and by[("vanilla", n)][key]
            ]
            if points:
                line = ax.plot(*zip(*points), marker="o", label=f"{mech} (ours)")[0]
                paper = paper_row(mech)
                if paper in PAPER_TABLE2:
                    base = PAPER_TABLE2["Transformer"][paper_index]
                    ax.plot(
                        PAPER_LENGTHS,
                        [v / b for v, b in zip(PAPER_TABLE2[paper][paper_index], base)],
                        linestyle="--",
                        color=line.get_color(),
                        label=f"{paper} (LRA)",
                    )
        ax.set_xlabel("sequence length (Text)")
        ax.set_title(title, fontsize=10)
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
        if ax.get_lines():
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def measured_from_bench(paired_csv: str | Path) -> list[dict[str, Any]]:
    """Table 2's measurements from ``python -m zoo.bench --paired --model vanilla_classifier ... --baseline
    vanilla`` (its paired.csv): steps per second from the median step, the speed-up as the median of the
    per-round ratios, memory as its activation MiB (bytes saved for backward, on any device)."""
    with open(paired_csv, newline="") as f:
        return [
            {
                "attention": r["variant"],
                "length": int(r["length"]),
                "steps_per_s": 1000.0 / float(r["median_ms"]),
                "speedup": float(r["speedup"]),
                "memory_mb": float(r["act_mib"]),
                "error": "",
            }
            for r in csv.DictReader(f)
        ]


def speed_configs(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The model config each mechanism trained on Text (else on any task, as a classifier)."""
    configs: dict[str, dict[str, Any]] = {}
    for prefer_text in (True, False):
        for r in rows:
            config = r.get("model_config")
            if (
                config
                and r["attention"] not in configs
                and (r["experiment"] == "lra_text" or not prefer_text)
                and config.get("kind") == "classifier"
            ):
                configs[r["attention"]] = dict(config, vocab_size=257, n_classes=2)
    return configs
