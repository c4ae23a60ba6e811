"""``trainer.context_parallel=N`` in the Hydra application: N processes sharing each sequence train as one
process does (same weights, same evaluation), only rank 0 writes; impossible settings are refused naming
the key."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("hydra")

from support.app_overrides import TINY  # noqa: E402

from zoo.app.compose import compose  # noqa: E402
from zoo.app.run import run  # noqa: E402
from zoo.parallel.launch import run_ranks  # noqa: E402
from zoo.train.checkpoints.format import load_checkpoint  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
COMMON = ["data=char_lm", "trainer.max_steps=2", "trainer.eval_every=2", "trainer.threads=1"]


def _train(rank: int, world: int, overrides: list[str], run_dir) -> None:
    run(compose(overrides), run_dir=run_dir)


def _compare(tmp_path, name: str, overrides: list[str]) -> None:
    single = run(compose(overrides), run_dir=tmp_path / "single")
    a = load_checkpoint(tmp_path / name / "checkpoints" / "last.pt")
    b = load_checkpoint(tmp_path / "single" / "checkpoints" / "last.pt")
    assert a["step"] == b["step"] == 2
    for key in a["model"]:  # float32: reductions in another order differ by ~1e-6 in the gradients
        torch.testing.assert_close(a["model"][key], b["model"][key], rtol=1e-3, atol=3e-4)
    result = json.loads((tmp_path / name / "result.json").read_text())
    assert result["final_metric"] == pytest.approx(single, rel=1e-4)  # evaluated over the whole sequences
    lines = [(tmp_path / d / "metrics.jsonl").read_text().splitlines() for d in (name, "single")]
    assert len(lines[0]) == len(lines[1])  # rank 0 alone logs


@pytest.mark.parametrize(
    "model", ["model=vanilla_lm", "model=sparse_transformer"]
)  # ring attention (zigzag), a halo (contiguous)
def test_two_ranks_sharing_each_sequence_train_as_one_process(tmp_path, text_file, model):
    overrides = TINY + COMMON + [model, f"data.path={text_file}"]
    run_ranks(2, _train, overrides + ["trainer.context_parallel=2"], tmp_path / "cp")
    _compare(tmp_path, "cp", overrides)


@pytest.mark.slow
def test_two_replicas_of_two_ranks_train_as_one_process_on_twice_the_rows(tmp_path, text_file):
    """world 4 = 2 data replicas x 2 context ranks: each replica reads half the rows of a batch twice
    the per-rank size, as DDP would."""
    overrides = TINY + COMMON + ["model=transformer_xl", f"data.path={text_file}"]
    run_ranks(4, _train, overrides + ["trainer.context_parallel=2"], tmp_path / "mesh")
    _compare(tmp_path, "mesh", overrides + ["trainer.batch_size=4"])


@pytest.mark.slow
@pytest.mark.parametrize("model", ["model=vanilla_lm", "model=sparse_transformer", "model=transformer_xl"])
def test_bf16_under_context_parallelism_evaluates_as_one_process(tmp_path, text_file, model):
    """bf16 autocast on CPU: the ring's blocks, the halos and the memory run in bf16 beside fp32 sums; the
    validation bpc agrees with one process's to bf16 rounding (1e-3 relative)."""
    overrides = TINY + COMMON + [model, f"data.path={text_file}", "trainer.precision=bf16"]
    run_ranks(2, _train, overrides + ["trainer.context_parallel=2"], tmp_path / "cp")
    single = run(compose(overrides), run_dir=tmp_path / "single")
    result = json.loads((tmp_path / "cp" / "result.json").read_text())
    assert result["final_metric"] == pytest.approx(single, rel=1e-3)


@pytest.mark.slow
def test_the_readme_launch_command_with_torchrun(tmp_path, text_file):
    """The README's command: ``torchrun --nproc_per_node=2 experiments/train.py ... trainer.context_parallel=2``."""
    overrides = TINY + COMMON + ["model=vanilla_lm", f"data.path={text_file}"]
    env = dict(os.environ, PYTHONPATH=str(ROOT), WANDB_SILENT="true", OMP_NUM_THREADS="1")
    env.pop("WORLD_SIZE", None)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    command += [str(ROOT / "experiments" / "train.py"), *overrides, "trainer.context_parallel=2"]
    proc = subprocess.run(
        command + [f"hydra.run.dir={tmp_path / 'cp'}"], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    _compare(tmp_path, "cp", overrides)


def test_context_parallel_without_the_processes_is_refused_naming_the_key(tmp_path, text_file):
    with pytest.raises(ValueError, match="trainer.context_parallel=2 ranks share each sequence, but this run has 1"):
        run(compose(TINY + COMMON + [f"data.path={text_file}", "trainer.context_parallel=2"]), run_dir=tmp_path)


def test_context_parallel_options_are_checked(tmp_path):
    with pytest.raises(ValueError, match="trainer.context_layout must be auto, contiguous or zigzag"):
        run(compose(TINY + ["trainer.context_layout=striped"]), run_dir=tmp_path / "a")
    with pytest.raises(ValueError, match="trainer.compile is not supported with trainer.context_parallel > 1"):
        run(compose(TINY + ["trainer.context_parallel=2", "trainer.compile=true"]), run_dir=tmp_path / "b")
