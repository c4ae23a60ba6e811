"""What a configuration builds, without data or training, beside its paper's figures.

    python experiments/describe.py experiment=paper/xl_enwik8_24l
    python experiments/describe.py model=reformer trainer.seq_len=8192 --json
    python experiments/describe.py --list            # the paper configurations
    python experiments/describe.py imports=[my_research.attention] attention=my_attention   # your own part

Prints the preset, each axis and its options, the exact parameter count (the model is built on
the meta device: no memory, no data), estimated FLOPs and activation memory per training token at
the configured length, and for experiment=paper/* the published figures beside ours. ``--json``
prints one JSON object (``params`` is an int). Rules of the estimates: zoo/app/paper.py.
"""

from __future__ import annotations

import argparse
import json
import sys

from zoo.app.compose import CONF_DIR
from zoo.app.paper import describe, format_report

PAPER_DIR = CONF_DIR.parent / "conf" / "experiment" / "paper"


def main(argv: list[str] | None = None) -> dict | None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, as for experiments/train.py")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--list", action="store_true", help="list the paper configurations")
    args = parser.parse_args(argv)
    if args.list:
        for path in sorted(PAPER_DIR.glob("*.yaml")):
            print(f"experiment=paper/{path.stem}")
        return None
    info = describe(args.overrides)
    print(json.dumps(info, indent=2, default=str) if args.json else format_report(info))
    return info


def command() -> None:
    """``python experiments/describe.py ARGS``: run with this process's arguments; exit 2 with the message on a
    refused input."""
    try:
        main()
    except (ValueError, ImportError) as exc:  # a bad configuration (the message names the key), imports= gone
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
