"""The README's mechanism x position-scheme table is the parts' own answers (zoo/app/position_table.py):
it cannot drift from the registry, a mechanism registered later appears in it, and every refusal in it
gives the mechanism's reason."""

from __future__ import annotations

import re
from pathlib import Path

from zoo.app.position_table import table, written
from zoo.attention.base import ATTENTION
from zoo.attention.vanilla import VanillaAttention

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_readme_table_is_the_parts_answers():
    assert written(README.read_text()) == table(), (
        "the README's mechanism x position table disagrees with the registered parts: run "
        "python experiments/sync_configs.py"
    )


def test_every_mechanism_has_a_row_and_every_refusal_a_reason():
    rows = [line for line in table().splitlines()[2:]]
    named = [m for row in rows for m in re.findall(r"`(\w+)`", row.split(" | ")[0])]
    assert sorted(named) == sorted(ATTENTION.list())
    for row in rows:
        for cell in row.strip("| ").split(" | ")[1:]:
            assert cell == "yes" or (cell.startswith("no: ") and len(cell) > 60), cell


def test_a_mechanism_registered_later_gets_its_row():
    class LaterBiasOnly(VanillaAttention):
        position_kinds = ("pair_bias",)
        no_position_reason = "a test part: its scores are rotated by nothing at all, for the sake of this check"

    ATTENTION.register("zz_later")(LaterBiasOnly)
    try:
        row = next(line for line in table().splitlines() if "`zz_later`" in line)
        assert row.endswith("| yes |") and "no: a test part" in row
    finally:
        ATTENTION.unregister("zz_later")
