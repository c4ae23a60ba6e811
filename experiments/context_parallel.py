"""Context parallelism on this machine: activation bytes per rank, the longest sequence a per-rank budget
holds, and the time of a step, at N = 1, 2, 4 ranks (gloo, one thread each) for vanilla (ring attention),
local_1d (a halo) and sparse_fixed (a halo and the summaries), on one 2-layer LM skeleton (vanilla_lm:
d 128, 4 heads, d_ff 512, vocab 256, batch 1, fp32). What is measured and how: ``zoo/bench/context.py``.

    python experiments/context_parallel.py --bytes-length 8192 --budget-mib 128 --grain 512 \\
        --time-length 4096 --rounds 3 --steps 2 --out results/context_parallel

Writes ``bytes.csv`` (per setup, N and rank at ``--bytes-length``), ``longest.csv`` (with every probe),
``steps.csv`` (per round), ``summary.md`` and ``context_parallel.png`` into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import NullLocator  # noqa: E402

from zoo.bench.context import Setup, bytes_per_rank, longest_within, step_rounds  # noqa: E402
from zoo.bench.machine import describe_machine, load_average  # noqa: E402
from zoo.bench.report import write_csv  # noqa: E402

SETUPS = [
    Setup("vanilla (ring)", overrides={"attention": {"name": "vanilla"}}),
    Setup("local_1d (block 128, memory 128)", overrides={"attention": {"name": "local_1d"}}),
    Setup(
        "sparse_fixed (stride 128, c 8, union)",
        overrides={"attention": {"name": "sparse_fixed", "stride": 128, "c": 8, "combine": "union"}},
    ),
]
MIB = 2**20


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", default="1,2,4")
    parser.add_argument("--bytes-length", type=int, default=8192)
    parser.add_argument("--budget-mib", type=float, default=128.0)
    parser.add_argument("--grain", type=int, default=512)
    parser.add_argument("--time-length", type=int, default=4096)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--out", default="results/context_parallel")
    args = parser.parse_args(argv)
    worlds = [int(w) for w in args.ranks.split(",")]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"command": "python experiments/context_parallel.py " + " ".join(sys.argv[1:] if argv is None else argv)}
    meta.update(machine=describe_machine(), load_before=load_average())

    byte_rows = []
    for setup in SETUPS:
        for world in worlds:
            for rank, count in enumerate(bytes_per_rank(setup, world, args.bytes_length)):
                byte_rows.append({"setup": setup.label, "ranks": world, "rank": rank, "bytes": count})
            print(
                f"bytes  {setup.label:>40}  N={world}  max {max(r['bytes'] for r in byte_rows[-world:]) / MIB:.1f} MiB"
            )
    write_csv(out / "bytes.csv", byte_rows)

    budget = int(args.budget_mib * MIB)
    longest_rows = []
    for setup in SETUPS:
        for world in worlds:
            found = longest_within(setup, world, budget, args.grain)
            longest_rows.append(
                {
                    "setup": setup.label,
                    "ranks": world,
                    "longest": found["longest"],
                    "bytes_at_longest": found["bytes_at_longest"],
                    "probes": json.dumps(found["probes"]),
                }
            )
            print(f"longest {setup.label:>40}  N={world}  {found['longest']}")
    write_csv(out / "longest.csv", longest_rows)

    # one thread per rank; one process is timed with one thread and with every core of the machine
    runs = [(1, 1), *[(w, 1) for w in worlds if w > 1], (1, os.cpu_count() or 1)]
    step_rows = [r for setup in SETUPS for r in step_rounds(setup, runs, args.time_length, args.rounds, args.steps)]
    write_csv(out / "steps.csv", step_rows)
    meta["load_after"] = load_average()
    (out / "summary.md").write_text(summary(byte_rows, longest_rows, step_rows, runs, worlds, args, meta))
    plot(byte_rows, longest_rows, worlds, args, out / "context_parallel.png")
    print((out / "summary.md").read_text())
    return 0


def summary(byte_rows, longest_rows, step_rows, runs, worlds, args, meta) -> str:
    lines = [
        "# Context parallelism: bytes per rank, longest sequence within a budget, step time",
        "",
        f"Command: `{meta['command']}`  ",
        f"Machine: {meta['machine']}; load average before {meta['load_before']}, after {meta['load_after']}.",
        "",
        f"## Activation bytes per rank at {args.bytes_length:,} tokens (saved for backward, most / least loaded rank)",
        "",
        "| setup | " + " | ".join(f"N = {w}" for w in worlds) + " | N=1 / N=max |",
        "|---|" + "---|" * (len(worlds) + 1),
    ]
    for label in dict.fromkeys(r["setup"] for r in byte_rows):
        cells, most = [], {}
        for w in worlds:
            counts = [r["bytes"] for r in byte_rows if r["setup"] == label and r["ranks"] == w]
            most[w] = max(counts)
            cells.append(f"{max(counts) / MIB:.1f} / {min(counts) / MIB:.1f} MiB")
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {most[worlds[0]] / most[worlds[-1]]:.2f}x |")
    lines += [
        "",
        f"## Longest sequence whose most loaded rank saves at most {args.budget_mib:g} MiB (grid of {args.grain})",
        "",
        "| setup | " + " | ".join(f"N = {w}" for w in worlds) + " |",
        "|---|" + "---|" * len(worlds),
    ]
    for label in dict.fromkeys(r["setup"] for r in longest_rows):
        cells = [
            f"{r['longest']:,} ({r['bytes_at_longest'] / MIB:.1f} MiB)"
            for w in worlds
            for r in longest_rows
            if r["setup"] == label and r["ranks"] == w
        ]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    names = [f"N = {w}, {t} thread{'s' if t > 1 else ''}{' per rank' if w > 1 else ''}" for w, t in runs]
    lines += [
        "",
        f"## Time of one training step at {args.time_length:,} tokens (forward + backward + gradient all-reduce; "
        f"median of {args.steps} steps per launch, median over {args.rounds} rounds in rotated order)",
        "",
        "Time (and, in brackets, the median over rounds of its ratio to one process on one thread):",
        "",
        "| setup | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(runs),
    ]
    for label in dict.fromkeys(r["setup"] for r in step_rows):
        times = {
            run: [r["step_s"] for r in step_rows if (r["setup"], r["ranks"], r["threads"]) == (label, *run)]
            for run in runs
        }
        cells = []
        for run in runs:
            ratio = statistics.median(t / b for t, b in zip(times[run], times[runs[0]]))
            cells.append(f"{statistics.median(times[run]) * 1e3:,.0f} ms ({ratio:.2f}x)")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(byte_rows, longest_rows, worlds, args, path: Path) -> None:
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for label in dict.fromkeys(r["setup"] for r in byte_rows):
        most = [max(r["bytes"] for r in byte_rows if r["setup"] == label and r["ranks"] == w) / MIB for w in worlds]
        left.plot(worlds, most, marker="o", label=label)
        longest = [r["longest"] for w in worlds for r in longest_rows if r["setup"] == label and r["ranks"] == w]
        right.plot(worlds, longest, marker="o", label=label)
    left.set(xscale="log", yscale="log", xlabel="ranks N", ylabel="MiB saved, most loaded rank")
    left.set_title(f"activation bytes per rank at {args.bytes_length:,} tokens")
    right.set(xscale="log", yscale="log", xlabel="ranks N", ylabel="tokens")
    right.set_title(f"longest sequence within {args.budget_mib:g} MiB per rank")
    for ax in (left, right):
        ax.xaxis.set_minor_locator(NullLocator())  # ticks at the N measured only
        ax.set_xticks(worlds, [str(w) for w in worlds])
        ax.grid(True, which="both", alpha=0.3)
    right.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
