"""`make demo`: every registered LM preset that fits the task, tiny, on a built-in synthetic
long-range task (multi-query associative recall), one Hydra multirun, ending with the comparison
table and the path of its plot.

A fixed wall-time budget (default 240 s of training, about 5 minutes in all with start-up and
evaluation on 2 CPU cores) is divided among the LM presets, so the demo stays about as long as the
zoo grows; each run also stops at ``--max-steps``. Runs are therefore compared at equal wall time
(the table's ``steps`` column says how far each got). A preset that cannot run on the task shows
up as a failed row with its error.

    python experiments/demo.py                       # the default
    python experiments/demo.py --budget 60           # quicker
    python experiments/demo.py --set data=duplication --set trainer.seq_len=128
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import zoo
from zoo.app.compose import CONF_DIR

ROOT = CONF_DIR.parent


def lm_presets() -> tuple[list[str], dict[str, str]]:
    """Registered presets whose head is a language model (the demo task's); the rest with the reason.

    Nothing is built here: a preset that cannot run on the task (a shape it does not support, ...)
    fails inside the sweep, where train.py records it as a failed row with its error instead of
    stopping the other runs."""

    fit, skipped = [], {}
    for preset in zoo.list_models():
        kind = zoo.preset_config(preset).kind
        if kind == "lm":
            fit.append(preset)
        else:
            skipped[preset] = f"a {kind} model; the demo task is language modelling"
    return fit, skipped


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--budget",
        type=float,
        default=float(os.environ.get("ZOO_DEMO_BUDGET", 240)),
        help="seconds of training shared by all presets (default 240)",
    )
    parser.add_argument("--max-steps", type=int, default=300, help="step cap per preset (default 300)")
    parser.add_argument("--logger", default="csv", help="csv (default), wandb (offline) or none")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="extra Hydra overrides for every run"
    )
    parser.add_argument("--out", default="", help="sweep directory (default multirun/demo-<time>)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    overrides = ["experiment=demo", f"logger={args.logger}", *args.set]
    presets, skipped = lm_presets()
    for preset, reason in skipped.items():
        print(f"skipping {preset}: {reason}")
    if not presets:
        print("no registered LM preset fits the demo task", file=sys.stderr)
        return 1
    per_run = max(5.0, args.budget / len(presets))
    out = Path(args.out or ROOT / "multirun" / f"demo-{datetime.now():%Y-%m-%d_%H-%M-%S}")
    print(
        f"demo: {len(presets)} presets ({', '.join(presets)}), up to {args.max_steps} steps or {per_run:.0f} s of "
        "training each",
        flush=True,
    )
    cmd = [
        sys.executable,
        str(ROOT / "experiments" / "train.py"),
        "-m",
        *overrides,
        f"model={','.join(presets)}",
        f"trainer.max_steps={args.max_steps}",
        f"trainer.max_time_s={per_run:.1f}",
        f"hydra.sweep.dir={out}",
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", WANDB_SILENT="true")
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
    summary = out / "summary.md"
    # exit status 1 with a summary: the sweep ran, and some presets failed on the task (their rows
    # say why; the multirun's last lines name them); anything else is the demo's own failure
    if proc.returncode not in (0, 1) or not summary.is_file():
        print(proc.stdout[-4000:], proc.stderr[-4000:], f"no summary written in {out}", sep="\n", file=sys.stderr)
        return proc.returncode or 1
    print()
    print(summary.read_text())
    if proc.returncode == 1:  # the multirun's own list of the jobs that did not finish
        print(proc.stderr[proc.stderr.rfind("error: ") :].strip() if "error: " in proc.stderr else proc.stderr[-2000:])
    print(f"table: {summary}\ncsv: {out / 'summary.csv'}\nplot: {out / 'summary.png'}")
    print(f"demo wall time: {time.perf_counter() - start:.0f} s")
    return 0


def command() -> None:
    """``python experiments/demo.py ARGS``: run with this process's arguments; exit 2 with the message on a
    refused input."""
    sys.exit(main())
