"""Every registered study, at toy size, through the same entry point as the full size: it trains through
the app, writes rows.csv, its figures and the README block, and its report re-renders from the rows alone
(``report_only=true``) to the same text, running nothing."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from support.app_cli import script_main
from support.fast_cases import default_run_keeps

from zoo.app.compose import compose
from zoo.app.study import run_study
from zoo.studies import STUDY
from zoo.studies.common import REPORT_BEGIN, REPORT_END

ROOT = Path(__file__).resolve().parents[2]
COMMAND = re.compile(r"^Command: `python experiments/study\.py (?P<args>[^`]*)`$", re.M)


def study_process(*args: str) -> subprocess.CompletedProcess:
    """``python experiments/study.py ARGS`` in a process of its own, as a user runs it."""
    env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, str(ROOT / "experiments" / "study.py"), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.fixture
def study_main(monkeypatch):
    """``python experiments/study.py ARGS`` in this process (a study sets torch's threads: put them back)."""
    threads = torch.get_num_threads()
    monkeypatch.setenv("WANDB_MODE", "disabled")
    yield lambda *args: script_main("study.py", list(args), monkeypatch)
    torch.set_num_threads(threads)


def overrides(options: dict) -> list[str]:
    def value(v):  # Hydra's override grammar: strings in a list quoted (they may hold '=' or ':')
        if not isinstance(v, list):
            return str(v)
        return "[" + ",".join(f"'{x}'" if isinstance(x, str) else str(x) for x in v) + "]"

    return [f"study.{key}={value(v)}" for key, v in options.items()]


def block(readme: Path) -> str:
    text = readme.read_text()
    return text[text.index(REPORT_BEGIN) : text.index(REPORT_END)]


def committed_reports() -> list[Path]:
    """Every committed results README holding a study's generated block."""
    return sorted(p for p in (ROOT / "results").glob("*/README.md") if REPORT_BEGIN in p.read_text())


@pytest.mark.parametrize("name", STUDY.list())
def test_study_runs_at_toy_size_and_reports_from_its_rows(name, tmp_path, study_main):
    cls = STUDY.get(name)
    assert cls.toy_options, f"study {name!r} declares no toy_options for this test"
    out, runs = tmp_path / "out", tmp_path / "runs"
    args = [f"study={name}", *overrides(cls.toy_options), f"out={out}", f"runs={runs}"]
    assert study_main(*args) == 0
    assert (out / "rows.csv").stat().st_size > 0
    for figure in cls.figures:
        assert (out / figure).stat().st_size > 0, figure
    first = block(out / "README.md")
    assert f"Command: `python experiments/study.py study={name}" in first
    (out / "rows.csv").with_suffix(".bak").write_bytes((out / "rows.csv").read_bytes())
    for figure in cls.figures:
        (out / figure).unlink()
    assert study_main(*args, "report_only=true") == 0
    assert block(out / "README.md") == first  # the report is a function of the rows
    assert (out / "rows.csv").read_bytes() == (out / "rows.csv").with_suffix(".bak").read_bytes()  # nothing ran
    for figure in cls.figures:
        assert (out / figure).stat().st_size > 0, figure


# one committed report re-renders in the default run (each study's own toy run checks its report is a function
# of its rows); every committed one with -m slow
@pytest.mark.parametrize(
    "readme",
    default_run_keeps(committed_reports(), ["alibi_extrapolation"], key=lambda p: p.parent.name),
    ids=lambda p: p.parent.name,
)
def test_committed_results_re_render_from_their_rows(readme, tmp_path, study_main):
    """The committed table, figures and verdict are what the study's report makes of the committed rows:
    re-rendered by the command the README names (into a copy), the block is the same but for where it wrote."""
    args = COMMAND.search(block(readme)).group("args").split()
    out = tmp_path / "out"
    out.mkdir()
    shutil.copy(readme.parent / "rows.csv", out / "rows.csv")
    assert study_main(*args, f"out={out}", "report_only=true") == 0
    assert COMMAND.sub("", block(out / "README.md")) == COMMAND.sub("", block(readme))


def test_the_entry_point_runs_as_its_own_process(tmp_path):
    """One study through ``python experiments/study.py`` in a process of its own (the in-process runs above
    share this one's imports): its committed rows re-rendered."""
    readme = committed_reports()[0]
    args = COMMAND.search(block(readme)).group("args").split()
    shutil.copy(readme.parent / "rows.csv", tmp_path / "rows.csv")
    done = study_process(*args, f"out={tmp_path}", "report_only=true")
    assert done.returncode == 0, done.stderr[-4000:]
    assert COMMAND.sub("", block(tmp_path / "README.md")) == COMMAND.sub("", block(readme))


def test_unknown_study_option_is_refused_before_anything_runs(tmp_path):
    with pytest.raises(Exception, match="stepz"):
        compose(["study=alibi_extrapolation", "study.stepz=3", f"out={tmp_path}"], config_name="study_app")
    cfg = compose(
        ["study=alibi_extrapolation", "study.train_len=100", f"out={tmp_path}", f"runs={tmp_path}"],
        config_name="study_app",
    )
    with pytest.raises(ValueError, match="train_len"):  # a value its Options refuse, before anything runs
        run_study(cfg, [])
    assert not (tmp_path / "rows.csv").exists()


def test_report_only_without_rows_says_so(tmp_path):
    cfg = compose(
        ["study=alibi_extrapolation", "report_only=true", f"out={tmp_path}", f"runs={tmp_path}"],
        config_name="study_app",
    )
    with pytest.raises(SystemExit, match="no rows"):
        run_study(cfg, [])
