"""Slopes of a ``zoo.bench`` run over a chosen length range, from the fastest repeat.

On a shared, overloaded CPU every step carries a roughly constant contention overhead, which
flattens slopes fitted from the smallest lengths up; fitting over the long end (and on the
fastest repeat, the least disturbed one) says more about how cost grows. Reads ``bench.csv``
written by ``python -m zoo.bench``, writes ``slopes.md`` beside it.

    python experiments/sparse_local_slopes.py results/sparse_local --from 4096
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

from zoo.bench import fit_slope


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="folder holding bench.csv")
    parser.add_argument("--from", dest="start", type=int, default=4096, help="smallest length in the fit")
    parser.add_argument("--baseline", default="vanilla")
    args = parser.parse_args()
    rows = [r for r in csv.DictReader((args.folder / "bench.csv").open()) if r["status"] == "ok"]
    labels = list(dict.fromkeys(r["variant"] for r in rows))
    base = {int(r["length"]): float(r["time_min_ms"]) for r in rows if r["variant"] == args.baseline}
    lines = [
        f"# Slopes from length {args.start} up (fastest repeat), from `{args.folder / 'bench.csv'}`",
        "",
        f"Command: `python experiments/sparse_local_slopes.py {args.folder} --from {args.start}`",
        "",
        "| variant | lengths fitted | time slope (min) | time slope (all lengths, min) | memory slope | speed-up "
        f"over {args.baseline} at the largest shared length (min times) |",
        "|---|---|---|---|---|---|",
    ]
    for label in labels:
        mine = sorted(
            (int(r["length"]), float(r["time_min_ms"]), float(r["act_mib"])) for r in rows if r["variant"] == label
        )
        tail = [m for m in mine if m[0] >= args.start]
        shared = [m for m in mine if m[0] in base]
        speedup = f"{base[shared[-1][0]] / shared[-1][1]:.2f}x at {shared[-1][0]}" if shared else "n/a"
        lines.append(
            f"| {label} | {', '.join(str(m[0]) for m in tail)} | "
            f"{fit_slope([m[0] for m in tail], [m[1] for m in tail]):.2f} | "
            f"{fit_slope([m[0] for m in mine], [m[1] for m in mine]):.2f} | "
            f"{fit_slope([m[0] for m in tail], [m[2] for m in tail]):.2f} | {speedup} |"
        )
    out = args.folder / "slopes.md"
    out.write_text("\n".join(lines) + "\n")
    print(out.read_text())


if __name__ == "__main__":
    main()
