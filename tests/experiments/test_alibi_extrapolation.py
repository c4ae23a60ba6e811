"""experiments/alibi_extrapolation.py without training: the command it launches carries every setting,
and the report (mean and range over seeds, change past the training length) is computed from the rows."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from script_modules import load_script

SCRIPT = Path(__file__).parents[2] / "experiments" / "alibi_extrapolation.py"


def load():
    return load_script(SCRIPT)


def test_train_command_sets_the_scheme_seed_and_training_length(tmp_path):
    experiment = load()
    command = experiment.train_command("alibi", 2, 50, 8, tmp_path / "run", 1)
    assert "position=alibi" in command and "seed=2" in command
    assert f"trainer.seq_len={experiment.TRAIN_LEN}" in command and "trainer.max_steps=50" in command
    assert f"hydra.run.dir={tmp_path / 'run'}" in command and "trainer.resume=auto" in command


def test_report_from_rows(tmp_path):
    experiment = load()
    table = tmp_path / "extrapolation.csv"
    rows = []
    for seed, offset in ((0, 0.0), (1, 0.2)):
        for length, bpc in ((128, 3.0), (512, 3.5)):
            for protocol in experiment.PROTOCOLS:
                rows.append(
                    dict(
                        position="rope",
                        seed=seed,
                        protocol=protocol,
                        eval_len=length,
                        bpc=bpc + offset,
                        scored=10,
                        step=5,
                        seconds=0.1,
                        load_1min=0.0,
                    )
                )
    experiment.append_rows(table, rows[:3])
    experiment.append_rows(table, rows[3:])  # appending keeps one header
    read = experiment.read_rows(table)
    assert len(read) == len(rows) and read[0]["bpc"] == pytest.approx(3.0)
    stats = experiment.aggregate(read)
    mean, low, high, seeds = stats[("segment", "rope", 512)]
    assert (mean, low, high, seeds) == (pytest.approx(3.6), pytest.approx(3.5), pytest.approx(3.7), 2)
    experiment.main(
        [
            "--summary-only",
            "--positions",
            "rope,alibi",
            "--seeds",
            "0,1",
            "--lengths",
            "128,512",
            "--out",
            str(tmp_path),
        ]
    )
    summary = (tmp_path / "summary.md").read_text()
    assert "| rope | 3.100 (3.000-3.200) | 3.600 (3.500-3.700) |" in summary
    assert "segment: rope +0.500" in summary and "alibi" not in summary.split("## segment")[1].split("##")[0]
    assert (tmp_path / "extrapolation.png").stat().st_size > 0
    with open(table) as handle:
        assert sum(1 for _ in csv.reader(handle)) == len(rows) + 1
