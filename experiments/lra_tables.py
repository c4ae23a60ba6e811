"""LRA Tables 1 and 2 from finished sweeps, and the toy data directory for ``sweep=lra`` on a CPU.

    python experiments/lra_tables.py multirun/<date>/<time> --out results/lra     # tables from runs
    python experiments/lra_tables.py --toy-data runs/lra_data [--imdb <aclImdb tarball>]

``sweep=lra`` writes the tables itself at the end (zoo/app/lra.py); this script rebuilds them from
one or more sweep directories (e.g. one per task) with the Table 2 measurement settings given here.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from zoo.app.lra import PAPER_LENGTHS, write_lra_tables
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
    if not args.sweeps:
        parser.error("give sweep directories (or --toy-data)")
    torch.set_num_threads(args.threads)
    paths = write_lra_tables(
        args.sweeps,
        args.out or args.sweeps[0],
        lengths=args.lengths,
        batch_size=args.batch_size,
        steps=args.steps,
        device=args.device,
        scale=args.scale,
    )
    for key in ("table1_md", "table2_md"):
        if key in paths:
            print(paths[key].read_text())
    return paths


if __name__ == "__main__":
    main()
