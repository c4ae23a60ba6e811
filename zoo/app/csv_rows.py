"""Rows of a results CSV, appended as each run ends, so that a killed sweep keeps what it finished.

The experiment scripts (``experiments/*.py``) write one row per finished run (or per evaluation point)
and skip the runs already present when restarted; these two functions are the whole of that protocol.
"""

from __future__ import annotations

import csv
from pathlib import Path


def read_rows(path: Path | str) -> list[dict[str, str]]:
    """Every row of the CSV at ``path`` as a dict of strings; [] when the file does not exist yet."""
    path = Path(path)
    if not path.exists():
        return []
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def append_rows(path: Path | str, rows: list[dict], fields: list[str] | None = None) -> None:
    """Append ``rows`` to the CSV at ``path`` (created with its folder, header first, if missing).

    The header is ``fields`` when given, else the keys of the rows in first-seen order. When a row
    brings a key the file's header lacks, the file is rewritten once with the union of the keys (older
    rows get empty cells there), so a script that starts recording a new column keeps its earlier rows.
    """
    if not rows:
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    keys = list(fields) if fields is not None else list(dict.fromkeys(k for row in rows for k in row))
    old = read_rows(path) if path.exists() else None
    if old is not None:
        with path.open(newline="") as f:
            header = next(csv.reader(f), [])
        union = list(dict.fromkeys([*header, *keys]))
        if union == header:
            with path.open("a", newline="") as f:
                csv.DictWriter(f, fieldnames=header, restval="").writerows(rows)
            return
        rows, keys = old + rows, union
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=keys, restval="")
        writer.writeheader()
        writer.writerows(rows)
