"""The documentation builds strictly (a broken link, anchor or API reference fails), and the README stays
short enough to read in one sitting (the rest lives in docs/)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README_MAX_LINES = 300


def test_readme_is_at_most_300_lines():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move detail into docs/"


def test_docs_build_strictly(tmp_path):
    pytest.importorskip("mkdocs", reason="mkdocs is in the dev extra: pip install -e '.[dev]'")
    pytest.importorskip("mkdocstrings_handlers.python", reason="mkdocstrings-python is in the dev extra")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    problems = [line for line in done.stderr.splitlines() if line.startswith(("WARNING", "ERROR"))]
    assert done.returncode == 0, "\n".join(problems) or done.stderr[-3000:]
