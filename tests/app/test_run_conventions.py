"""The conventions Hydra users expect (issue 28, item 4): a debug= group, early stopping, free-form
tags, a local/ config directory ignored by git. None of them existed before this change (the keys
were refused at compose time)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

pytest.importorskip("hydra")

from support.app_cli import ROOT, TOY, read_csv, train_main  # noqa: E402

from zoo.app.compose import CONF_DIR, compose  # noqa: E402
from zoo.app.run import run  # noqa: E402


def result_of(run_dir: Path) -> dict:
    return json.loads((run_dir / "result.json").read_text())


# the toy job without its own step count: the debug file's counts apply (the command line would win)
TOY_STEPS_UNSET = [o for o in TOY if not o.startswith("trainer.max_steps=")]


def test_debug_fast_is_three_steps_one_evaluation_batch_and_no_checkpoint(tmp_path):
    run(compose([*TOY_STEPS_UNSET, "debug=fast"]), run_dir=tmp_path)
    result = result_of(tmp_path)
    assert result["steps"] == 3 and not (tmp_path / "checkpoints").exists()
    assert result["val/scored"] <= 2 * 16  # one batch of 2 x 16 tokens
    assert (tmp_path / "metrics.jsonl").is_file() and not (tmp_path / "wandb").exists()  # logger=csv


def test_debug_overfit_trains_and_scores_one_batch(tmp_path, monkeypatch):
    """Every step reads training batch 0, the evaluation scores that batch, and a tiny model learns
    it (the run's metric is train/accuracy: what was measured is named)."""
    from zoo.data import TASK

    task_class, seen = TASK.get("duplication"), []
    original = task_class.batch

    def recording(self, split, index, **kwargs):
        seen.append((split, index))
        return original(self, split, index, **kwargs)

    monkeypatch.setattr(task_class, "batch", recording)
    run(compose([*TOY, "debug=overfit", "trainer.max_steps=60", "trainer.eval_every=30"]), run_dir=tmp_path)
    result = result_of(tmp_path)
    assert result["metric_name"] == "train/accuracy" and result["final_metric"] == 1.0
    assert set(seen) == {("train", 0)}


def test_debug_profile_writes_a_trace_into_the_run_directory(tmp_path):
    run(compose([*TOY_STEPS_UNSET, "debug=profile"]), run_dir=tmp_path)
    trace = json.loads((tmp_path / "profile" / "trace.json").read_text())
    names = {event.get("name", "") for event in trace["traceEvents"]}
    assert any(name.startswith("aten::") for name in names) and "ProfilerStep#1" in names
    assert "aten::" in (tmp_path / "profile" / "ops.txt").read_text()


def test_debug_anomaly_runs_under_anomaly_detection(tmp_path):
    seen = []
    record = (lambda trainer, step: seen.append(torch.is_anomaly_enabled()),)
    run(compose([*TOY, "debug=anomaly"]), run_dir=tmp_path, callbacks=record)
    assert seen and all(seen) and not torch.is_anomaly_enabled()


EARLY = ["optim.lr=1e-9", "optim.schedule=constant", "optim.warmup=0", "trainer.eval_every=1", "trainer.max_steps=20"]


def test_early_stopping_stops_on_the_validation_metric_resumes_its_count_and_is_recorded(tmp_path):
    """A model that cannot improve (lr 1e-9) stops after `patience` evaluations without a better
    metric; interrupted in between, the resumed run keeps its count and stops at the same step."""
    run(compose([*TOY, *EARLY, "trainer.early_stop_patience=2"]), run_dir=tmp_path / "straight")
    result = result_of(tmp_path / "straight")
    assert (result["steps"], result["stop_reason"], result["stopped_early"]) == (3, "early_stop", True)
    assert result["early_stop"] == {"patience": 2, "best_step": 1, "evaluations_without_improvement": 2}

    def interrupt(trainer, step):
        if step == 3:  # after the evaluation at step 2 (one without improvement), before step 3's
            raise KeyboardInterrupt

    split = tmp_path / "split"
    with pytest.raises(KeyboardInterrupt):
        run(compose([*TOY, *EARLY, "trainer.early_stop_patience=2"]), run_dir=split, callbacks=(interrupt,))
    run(compose([*TOY, *EARLY, "trainer.early_stop_patience=2", "trainer.resume=auto"]), run_dir=split)
    assert result_of(split)["steps"] == 3 and result_of(split)["early_stop"] == result["early_stop"]
    run(compose([*TOY, *EARLY]), run_dir=tmp_path / "off")
    assert result_of(tmp_path / "off")["steps"] == 20 and result_of(tmp_path / "off")["stop_reason"] == "max_steps"


def test_tags_reach_the_summary_and_wandb(tmp_path, monkeypatch):
    sweep = tmp_path / "sweep"
    assert train_main(["-m", *TOY, "seed=0,1", "tags=[ablation,v2]", f"hydra.sweep.dir={sweep}"], monkeypatch) == 0
    assert [r["tags"] for r in read_csv(sweep / "summary.csv")] == ["ablation v2", "ablation v2"]
    from zoo.app.resolve import as_dict
    from zoo.app.run import make_loggers

    resolved = as_dict(compose([*TOY, "logger=wandb", "logger.tags=[team]", "tags=[ablation]"]))
    (wandb,) = [logger for logger in make_loggers(resolved, tmp_path, "run", "") if hasattr(logger, "init_args")]
    assert wandb.init_args["tags"] == ["team", "ablation"]


def test_a_local_config_holds_machine_paths_and_git_ignores_it(tmp_path):
    conf = tmp_path / "conf"
    shutil.copytree(CONF_DIR, conf)
    (conf / "local" / "default.yaml").write_text("# @package _global_\ndata_dir: /mnt/datasets\n")
    assert compose(["data=shakespeare"], conf_dir=conf).data_dir == "/mnt/datasets"
    assert compose(["data=shakespeare"], conf_dir=conf).data.path.startswith("/mnt/datasets/")
    assert compose(["data_dir=/elsewhere"], conf_dir=conf).data_dir == "/elsewhere"  # the command line wins
    assert compose([]).data_dir != "/mnt/datasets"  # without the file: the project's default

    def ignored(path: str) -> bool:
        return subprocess.run(["git", "check-ignore", "-q", path], cwd=ROOT).returncode == 0

    assert ignored("conf/local/default.yaml") and ignored("conf/local/cluster.yaml")
    assert not ignored("conf/local/README.md")
