"""(Re)write conf/<axis>/<name>.yaml for every registered attention, residual, stack and position,
conf/data/<task>.yaml for every registered task (and its named setups), and conf/model/<preset>.yaml
for every registered preset lacking one, from the registries (see zoo/app/sync.py); and the README's
mechanism x position-scheme table from the parts' answers (zoo/app/position_table.py).

    python experiments/sync_configs.py            # write
    python experiments/sync_configs.py --check    # exit 1 listing mismatches, write nothing
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from zoo.app.compose import CONF_DIR
from zoo.app.position_table import rewrite, table, written
from zoo.app.sync import check, sync

CONF = CONF_DIR.parent / "conf"
README = CONF.parent / "README.md"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="list mismatches and exit 1 if any; write nothing")
    parser.add_argument("--conf", type=Path, default=CONF, help="the conf/ directory (default: the project's)")
    args = parser.parse_args(argv)
    if args.check:
        problems = check(args.conf)
        if args.conf == CONF and written(README.read_text()) != table():
            problems.append(f"stale: the mechanism x position table in {README}")
        for line in problems:
            print(line)
        print(
            "conf/ is in sync with the registries"
            if not problems
            else f"{len(problems)} mismatch(es); run experiments/sync_configs.py"
        )
        return 1 if problems else 0
    changes, problems = sync(args.conf)
    if args.conf == CONF and rewrite(README):
        changes.append(f"updated the mechanism x position table in {README}")
    for line in changes + problems:
        print(line)
    if not changes:
        print("conf/ already in sync")
    return 1 if problems else 0


def command() -> None:
    """``python experiments/sync_configs.py ARGS``: run with this process's arguments; exit 2 with the message on a
    refused input."""
    sys.exit(main())
