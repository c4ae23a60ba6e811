"""House style that a reviewer should not have to police by eye: code lines fit a laptop screen."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_LINE = 120  # pyproject.toml [tool.ruff] line-length; ruff's E501 checks the same


def test_no_code_line_runs_past_the_line_length():
    long = [
        f"{path.relative_to(ROOT)}:{number}: {len(line)} characters"
        for folder in ("zoo", "experiments", "tests")
        for path in sorted((ROOT / folder).rglob("*.py"))
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if len(line) > MAX_LINE
    ]
    assert not long, "lines over 120 characters:\n" + "\n".join(long)
