"""What a kill, a copy or a race can no longer break (issue 28, item 2): a checkpoint and its
checksum never out of step, a checkpoint copied without its checksum still readable, a run
directory claimed by one run at a time, a resume past max_steps said out loud.

Each test failed on the code before this change (see the docstrings for what it caught)."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

pytest.importorskip("hydra")

from support.app_overrides import TINY  # noqa: E402
from support.script_modules import load_script

from zoo.app.compose import compose  # noqa: E402
from zoo.app.run import run  # noqa: E402
from zoo.train.checkpoints.format import (  # noqa: E402
    CheckpointError,
    UncheckedCheckpointWarning,
    load_checkpoint,
    sha256_of,
)
from zoo.train.rundir import RunDirError  # noqa: E402

ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]
SIX_STEPS = ["trainer.max_steps=6", "trainer.eval_every=2", "trainer.log_every=1"]


def train(run_dir, *overrides):
    return run(compose(TINY + list(overrides)), run_dir=run_dir)


def test_a_kill_between_the_checkpoint_and_its_checksum_leaves_a_run_that_resumes_exactly(tmp_path):
    """SIGKILL right after the step-4 ``last.pt`` is renamed into place, before its sidecar is:
    the new checkpoint sits beside the step-2 sidecar. Before: it failed its own checksum and the
    run could not resume ("no sound one"). Now the resumed run continues from step 4 to the very
    weights of an uninterrupted run, and the sidecar is repaired (``sha256sum -c`` agrees)."""
    killed = tmp_path / "killed"
    code = textwrap.dedent(f"""
        import os, signal, torch
        torch.set_num_threads(1)
        from zoo.app.compose import compose
        from zoo.app.run import run
        renames, real_replace = [], os.replace
        def replace(source, target):
            real_replace(source, target)
            renames.append(str(target))
            if str(target).endswith("last.pt") and renames.count(str(target)) == 2:  # the step-4 save
                os.kill(os.getpid(), signal.SIGKILL)
        os.replace = replace
        run(compose({TINY + SIX_STEPS!r}), run_dir={str(killed)!r})
    """)
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == -9, proc.stderr[-2000:]
    last = killed / "checkpoints" / "last.pt"
    assert torch.load(last, weights_only=True)["step"] == 4  # the new checkpoint, beside the old sidecar
    assert (killed / "checkpoints" / "last.pt.sha256").read_text().split()[0] != sha256_of(last)
    assert load_checkpoint(last)["step"] == 4  # sound: its checksum was written before the rename
    train(killed, *SIX_STEPS, "trainer.resume=auto")
    train(tmp_path / "straight", *SIX_STEPS)
    a = load_checkpoint(last)["model"]
    b = load_checkpoint(tmp_path / "straight" / "checkpoints" / "last.pt")["model"]
    assert all(torch.equal(a[k], b[k]) for k in b)
    check = subprocess.run(["sha256sum", "-c", "last.pt.sha256"], cwd=last.parent, capture_output=True, text=True)
    assert check.returncode == 0 and not list(last.parent.glob(".*tmp*"))


def test_a_checkpoint_copied_without_its_checksum_loads_with_a_warning(tmp_path):
    """Before: a sound best.pt copied without its .sha256 was refused by every loader. Now it loads
    as data with a warning saying nothing checked it; a checksum that does not match is still refused."""
    train(tmp_path / "run")
    copied = tmp_path / "elsewhere" / "best.pt"
    copied.parent.mkdir()
    copied.write_bytes((tmp_path / "run" / "checkpoints" / "best.pt").read_bytes())
    with pytest.warns(UncheckedCheckpointWarning, match=r"best.pt has no checksum file best.pt.sha256.*sha256sum"):
        assert load_checkpoint(copied)["step"] == 2

    evaluate = load_script(ROOT / "experiments" / "evaluate.py")
    with pytest.warns(UncheckedCheckpointWarning):
        assert evaluate.main([str(copied), "--batches", "1"])["step"] == 2
    (copied.parent / "best.pt.sha256").write_text(f"{'0' * 64}  best.pt\n")
    with pytest.raises(CheckpointError, match="its SHA-256 is"), warnings.catch_warnings():
        warnings.simplefilter("error")  # a mismatch is refused outright, with no warning on the way
        load_checkpoint(copied)


def test_resuming_a_checkpoint_past_max_steps_says_so(tmp_path, capsys):
    """Before: a checkpoint at step 4 resumed with trainer.max_steps=2 evaluated silently."""
    train(tmp_path)
    capsys.readouterr()
    train(tmp_path, "trainer.max_steps=2", "trainer.resume=auto")
    out = capsys.readouterr().out
    last = tmp_path / "checkpoints" / "last.pt"
    assert f"checkpoint {last} is at step 4, past trainer.max_steps=2: nothing left to train" in out
    result = json.loads((tmp_path / "result.json").read_text())
    assert (result["steps"], result["resumed_at_step"]) == (4, 4)


def _race(run_dir, barrier, outcomes):
    torch.set_num_threads(1)
    barrier.wait()  # both processes claim the directory at the same instant
    try:
        run(compose(TINY + ["trainer.max_steps=8", "trainer.log_every=1"]), run_dir=run_dir)
        outcomes.put("ran")
    except RunDirError as exc:
        outcomes.put(f"refused: {exc}")


def test_two_runs_started_at_once_into_one_directory_one_is_refused(tmp_path):
    """Two processes started together with the same run directory. Before: both passed the check
    (it read, then wrote, with no lock) and interleaved their metrics. Now one claims it and the
    other is refused, naming the holder; the metrics hold each step once."""
    ctx = multiprocessing.get_context("fork")
    barrier, outcomes = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_race, args=(tmp_path, barrier, outcomes)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
    results = sorted(outcomes.get(timeout=5) for _ in procs)
    assert results[0] == "ran" and results[1].startswith("refused: "), results
    assert "in use by another run (process" in results[1] or "already holds a run" in results[1]
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines if "train/loss" in line] == list(range(1, 9))


def flip_a_tensor_byte(path) -> str:
    """Flip one bit inside the first tensor's bytes of the zip container at ``path``; its entry name."""
    import zipfile

    with zipfile.ZipFile(path) as archive:
        entry = next(i for i in archive.infolist() if "/data/" in i.filename and i.file_size > 8)
    data = bytearray(path.read_bytes())
    name_len, extra_len = (
        int.from_bytes(data[entry.header_offset + 26 : entry.header_offset + 28], "little"),
        int.from_bytes(data[entry.header_offset + 28 : entry.header_offset + 30], "little"),
    )
    data[entry.header_offset + 30 + name_len + extra_len + 3] ^= 0x40
    path.write_bytes(bytes(data))
    return entry.filename


def test_a_damaged_checkpoint_without_its_checksum_is_refused_by_its_zip_crcs(tmp_path):
    """Before: with no .sha256 beside it, a bit flip in a copied checkpoint's tensors loaded (with a
    warning) and was evaluated and resumed from. Now the zip container's per-entry CRC-32s are checked:
    the damaged copy is refused naming the file and the entry, by the loader, evaluate.py and resume."""
    train(tmp_path / "run")
    copied = tmp_path / "elsewhere" / "best.pt"
    copied.parent.mkdir()
    copied.write_bytes((tmp_path / "run" / "checkpoints" / "best.pt").read_bytes())
    entry = flip_a_tensor_byte(copied)
    refused = rf"refusing checkpoint {copied}: entry '{entry}' of its zip container does not match the CRC-32"
    with pytest.raises(CheckpointError, match=refused):
        load_checkpoint(copied)
    evaluate = load_script(ROOT / "experiments" / "evaluate.py")
    with pytest.raises(CheckpointError, match=refused):
        evaluate.main([str(copied), "--batches", "1"])
    with pytest.raises(CheckpointError, match=refused):
        train(tmp_path / "resumed", f"trainer.resume={copied}")


def test_a_checkpoint_resumed_without_its_checksum_is_never_called_sound(tmp_path, monkeypatch, capsys):
    """Before: a run resumed from a copy without its .sha256 reported it as the "newest sound checkpoint"."""
    from zoo.train import trainer
    from zoo.train.steps import TrainingDiverged

    train(tmp_path / "run")
    copied = tmp_path / "elsewhere" / "last.pt"
    copied.parent.mkdir()
    copied.write_bytes((tmp_path / "run" / "checkpoints" / "last.pt").read_bytes())

    def diverge(*args, **kwargs):
        raise TrainingDiverged("the loss is nan")

    monkeypatch.setattr(trainer, "forward_backward", diverge)
    with pytest.warns(UncheckedCheckpointWarning), pytest.raises(TrainingDiverged) as stopped:
        train(tmp_path / "resumed", "trainer.max_steps=6", f"trainer.resume={copied}")
    assert "sound" not in str(stopped.value) and f"newest checkpoint: {copied}" in str(stopped.value)
    assert "SHA-256 was never checked" in str(stopped.value)
