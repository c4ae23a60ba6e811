"""Multiruns that resume (issue 28, item 2): a multirun killed part way, launched again with
sweep.resume=true, keeps its finished jobs, resumes the interrupted one exactly and runs the rest;
a launch that would mix two sweeps is refused and writes nothing; a job is never run over another
job's run; the launch exits non-zero naming every job that did not finish.

Each test here fails on the code before this change: there, a re-launch exited 0 having run
nothing, deleted the earlier summary and overwrote the jobs' .hydra/ records."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("hydra")

from support.app_cli import TOY, read_csv, snapshot, train_main, train_process  # noqa: E402

from zoo.app.compose import compose  # noqa: E402
from zoo.app.run import run  # noqa: E402
from zoo.train.checkpoints.format import load_checkpoint  # noqa: E402


def logged_steps(run_dir: Path) -> list[int]:
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [line["step"] for line in lines if "train/loss" in line]


def test_a_killed_multirun_resumes_keeps_reruns_nothing_twice_and_covers_every_job(tmp_path):
    """kill -9 of the whole multirun as job 1's step-2 checkpoint is renamed into place, before its
    checksum (job 0 finished, job 2 never started); the same command with sweep.resume=true: job 0
    kept untouched, job 1 resumed from that last.pt to the very weights of an uninterrupted run,
    job 2 run; one summary row each. Before: the checkpoint failed its own checksum, and the
    re-launch ran nothing."""
    sweep, once = tmp_path / "sweep", tmp_path / "kill-once"
    once.touch()
    jobs = ["trainer.max_steps=4", "trainer.checkpoint_every=1", "trainer.log_every=1", "seed=0,1,2"]
    argv = ["-m", *TOY, *jobs, "imports=[sweep_killer]", f"hydra.sweep.dir={sweep}"]
    env = {"ZOO_TEST_KILL_ONCE": str(once), "ZOO_TEST_KILL_JOB": "1", "ZOO_TEST_KILL_STEP": "2"}
    killed = train_process(argv, env)
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert json.loads((sweep / "0" / "result.json").read_text())["steps"] == 4
    assert load_checkpoint(sweep / "1" / "checkpoints" / "last.pt")["step"] == 2
    assert not (sweep / "1" / "result.json").exists() and not (sweep / "2").exists()
    assert not (sweep / "summary.csv").exists()
    job0 = snapshot(sweep / "0")

    resumed = train_process([*argv, "sweep.resume=true"], env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    rows = {Path(r["dir"]).name: r for r in read_csv(sweep / "summary.csv")}
    assert sorted(rows) == ["0", "1", "2"] and len(read_csv(sweep / "summary.csv")) == 3
    assert rows["0"]["status"] == "finished (kept from an earlier launch)"
    assert rows["1"]["status"] == "finished (resumed at step 2)"
    assert rows["2"]["status"] == "finished"
    assert snapshot(sweep / "0") == job0  # not a byte written into the kept job
    assert logged_steps(sweep / "1") == [1, 2, 3, 4]
    straight = tmp_path / "straight"
    run(compose([*TOY, *jobs[:3], "seed=1"]), run_dir=straight)
    a = load_checkpoint(sweep / "1" / "checkpoints" / "last.pt")["model"]
    b = load_checkpoint(straight / "checkpoints" / "last.pt")["model"]
    assert all(torch.equal(a[k], b[k]) for k in b)
    assert float(rows["1"]["final_metric"]) == json.loads((straight / "result.json").read_text())["final_metric"]


def test_a_launch_that_would_mix_two_sweeps_is_refused_and_writes_nothing(tmp_path, monkeypatch, capsys):
    """Into a directory holding a sweep: without sweep.resume, or resuming with the model list
    reordered or an override added, the launch exits 2 naming the fix (and the difference), and
    every file there is as it was (summary, job records, Hydra's .hydra/ of every job)."""
    sweep = tmp_path / "sweep"
    argv = ["-m", *TOY, "attention=vanilla,additive", f"hydra.sweep.dir={sweep}"]
    assert train_main(argv, monkeypatch) == 0
    before = snapshot(sweep)
    assert {"summary.csv", "summary.md", "0/.hydra/overrides.yaml", "1/.hydra/overrides.yaml"} <= set(before)
    capsys.readouterr()
    assert train_main(argv, monkeypatch) == 2
    error = capsys.readouterr().err
    assert f"sweep directory {sweep} already holds a sweep" in error and "continue it with sweep.resume=true" in error
    reordered = ["-m", *TOY, "attention=additive,vanilla", "sweep.resume=true", f"hydra.sweep.dir={sweep}"]
    assert train_main(reordered, monkeypatch) == 2
    error = capsys.readouterr().err
    assert "- attention=vanilla,additive  (first launch only)" in error
    assert "+ attention=additive,vanilla  (this launch only)" in error
    more = [*argv, "trainer.max_steps=3", "sweep.resume=true"]
    assert train_main(more, monkeypatch) == 2
    assert "+ trainer.max_steps=3  (this launch only)" in capsys.readouterr().err
    assert snapshot(sweep) == before


def test_a_job_directory_holding_another_run_is_refused_untouched_and_named(tmp_path, monkeypatch, capsys):
    """Job 0's directory holds another model's finished run (left by an older sweep, no sweep record):
    job 0 is refused and not a byte of that run changes (before: its .hydra/overrides.yaml was
    overwritten), job 1 runs, and the launch exits 1 naming job 0; the summary lists both."""
    sweep = tmp_path / "sweep"
    assert train_main(["-m", *TOY, "model=transformer_xl", f"hydra.sweep.dir={tmp_path / 'other'}"], monkeypatch) == 0
    sweep.mkdir()
    (tmp_path / "other" / "0").rename(sweep / "0")
    before = snapshot(sweep / "0")
    capsys.readouterr()
    assert train_main(["-m", *TOY, "seed=0,1", f"hydra.sweep.dir={sweep}"], monkeypatch) == 1
    error = capsys.readouterr().err
    assert "1 job(s) of the sweep" in error and "job 0 (" in error and "refused:" in error
    assert snapshot(sweep / "0") == before
    assert json.loads((sweep / "0" / "result.json").read_text())["model"] == "transformer_xl"
    rows = {Path(r["dir"]).name: r for r in read_csv(sweep / "summary.csv")}
    assert rows["0"]["status"].startswith("refused: ") and rows["0"]["final_metric"] == ""
    assert rows["1"]["status"] == "finished" and rows["1"]["model"] == "vanilla_lm"


def test_a_baseline_naming_a_key_the_sweep_does_not_set_is_refused_before_anything_runs(tmp_path, monkeypatch, capsys):
    sweep = tmp_path / "sweep"
    argv = ["-m", *TOY, "attention=vanilla,additive", "sweep.baseline=residual:pre_norm", f"hydra.sweep.dir={sweep}"]
    assert train_main(argv, monkeypatch) == 2
    error = capsys.readouterr().err
    assert "sweep.baseline='residual:pre_norm': this sweep does not set residual" in error and "attention" in error
    assert not sweep.exists()
