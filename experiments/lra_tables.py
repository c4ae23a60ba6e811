"""LRA Tables 1 and 2 from finished sweeps, and the toy data directory for ``sweep=lra`` on a CPU.

    python experiments/lra_tables.py multirun/<date>/<time> --out results/lra     # tables from runs
    python experiments/lra_tables.py --toy-data runs/lra_data [--imdb <aclImdb tarball>]
    python experiments/lra_tables.py --bench runs/bench_text --out results/lra_family  # Table 2, zoo.bench --paired

``sweep=lra`` writes the tables itself at the end (zoo/app/lra.py); this script rebuilds them from
one or more sweep directories (e.g. one per task) with the Table 2 measurement settings given here.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import torch

from zoo.app.lra import markdown, write_lra_tables
from zoo.app.lra_papers import PAPER_LENGTHS
from zoo.app.lra_speed import measured_from_bench, plot_table2, table2
from zoo.data.layouts import write_lra_data_dir


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sweeps", nargs="*", type=Path, help="sweep directories holding */result.json")
    parser.add_argument("--out", type=Path, help="where the tables go (default: the first sweep directory)")
    parser.add_argument(
        "--lengths",
        type=int,
        nargs="+",
        default=list(PAPER_LENGTHS),
        help="Table 2 lengths (paper: 1024 2048 3072 4096)",
    )
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--steps", type=int, default=3, help="timed steps per mechanism and length (after one warm-up)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--scale", default="", help="a sentence on the scale of the runs, printed with the tables")
    parser.add_argument("--table1-only", action="store_true", help="Table 1 only (no Table 2 measurement)")
    parser.add_argument(
        "--bench",
        type=Path,
        help="lay out Table 2 from a zoo.bench --paired output directory (paired.csv, paired.md) into --out",
    )
    parser.add_argument(
        "--toy-data",
        type=Path,
        help="write a data_dir with every LRA layout (synthetic; IMDb linked if --imdb) and exit",
    )
    parser.add_argument(
        "--imdb", type=Path, help="with --toy-data: the real aclImdb tarball to link instead of a tiny one"
    )
    args = parser.parse_args(argv)
    if args.toy_data:
        root = write_lra_data_dir(args.toy_data, imdb=args.imdb)
        print(f"wrote {root}: use data_dir={root}")
        return {"data_dir": root}
    if args.bench:
        return bench_table2(args.bench, args.out or args.bench, args.scale)
    if not args.sweeps:
        parser.error("give sweep directories (or --toy-data, or --bench)")
    torch.set_num_threads(args.threads)
    paths = write_lra_tables(
        args.sweeps,
        args.out or args.sweeps[0],
        lengths=args.lengths,
        batch_size=args.batch_size,
        steps=args.steps,
        device=args.device,
        scale=args.scale,
        measure=not args.table1_only,
    )
    for key in ("table1_md", "table2_md"):
        if key in paths:
            print(paths[key].read_text())
    return paths


def bench_table2(bench_dir: Path, out: Path, scale: str = "") -> dict:
    """Table 2 (markdown, CSV, PNG) from a ``zoo.bench --paired`` run, the paper's figures beside ours."""
    measured = measured_from_bench(bench_dir / "paired.csv")
    lengths = sorted({m["length"] for m in measured})
    header, body = table2(measured, lengths)
    out.mkdir(parents=True, exist_ok=True)
    source = (
        (bench_dir / "paired.md").read_text().split("\n## ")[0].strip() if (bench_dir / "paired.md").is_file() else ""
    )
    note = f"\n\nScale: {scale}" if scale else ""
    paths = {
        "table2_md": out / "lra_table2.md",
        "table2_csv": out / "lra_table2.csv",
        "table2_png": out / "lra_table2.png",
    }
    paths["table2_md"].write_text(
        "# LRA Table 2 layout: steps per second and memory (relative to vanilla)\n\n"
        f"From zoo.bench's paired rounds:\n\n{source}{note}\n\n{markdown(header, body)}\n"
    )
    with open(paths["table2_csv"], "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(body)
    plot_table2(measured, lengths, paths["table2_png"])
    print(paths["table2_md"].read_text())
    return paths


if __name__ == "__main__":
    main()
