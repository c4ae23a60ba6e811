"""An output location that cannot be written is refused before any work, naming the path and the cause
(issue 35, item 8). Before: a read-only file system and a run directory whose parent is a file failed
with a raw OSError / NotADirectoryError from inside Hydra; a file-size limit failed with "unexpected pos"
from torch's zip writer after training."""

from __future__ import annotations

import errno
import os
import pathlib
import resource
import sys

import pytest
import torch

pytest.importorskip("hydra")

from support.app_cli import TOY, train_main, train_process  # noqa: E402

from zoo.app.compose import compose  # noqa: E402
from zoo.app.run import run  # noqa: E402
from zoo.train.checkpoints.format import CheckpointError, save_checkpoint  # noqa: E402
from zoo.train.output_checks import OutputNotWritable  # noqa: E402


def test_a_run_directory_under_a_file_is_refused_naming_the_file(tmp_path, monkeypatch, capsys):
    blocker = tmp_path / "results"
    blocker.write_text("a file where a directory was expected")
    assert train_main([*TOY, f"hydra.run.dir={blocker}/run"], monkeypatch) == 2
    err = capsys.readouterr().err
    assert f"error: cannot write the run's output to {blocker}/run: {blocker} is a file, not a directory" in err
    assert "Traceback" not in err
    with pytest.raises(OutputNotWritable, match=f"{blocker} is a file, not a directory"):
        run(compose(TOY), run_dir=blocker / "run")  # the library's entry refuses it too, before building


def test_a_run_directory_on_a_read_only_file_system_is_refused(tmp_path, monkeypatch, capsys):
    read_only = tmp_path / "mounted_read_only"
    real_mkdir = pathlib.Path.mkdir

    def mkdir(self, *args, **kwargs):  # what the kernel answers on a read-only mount
        if read_only in [self, *self.parents]:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "mkdir", mkdir)
    assert train_main([*TOY, f"hydra.run.dir={read_only}/run"], monkeypatch) == 2
    err = capsys.readouterr().err
    assert f"cannot write the run's output to {read_only}/run: it is on a read-only file system" in err
    assert "Traceback" not in err


@pytest.mark.skipif(sys.platform == "win32", reason="RLIMIT_FSIZE is POSIX")
def test_a_file_size_limit_below_the_checkpoint_is_refused_before_training(tmp_path):
    """``ulimit -f`` of 16 KiB: the tiny model's weights alone are larger, so the run stops before its
    first step, naming the checkpoint, the limit and the fix."""
    run_dir = tmp_path / "run"
    limit = 16 * 1024
    proc = train_process(
        [*TOY, f"hydra.run.dir={run_dir}"],
        preexec=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY)),
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    expected = f"cannot write checkpoint {run_dir}/checkpoints/last.pt: the file-size limit (ulimit -f, RLIMIT_FSIZE)"
    assert expected in proc.stderr and f"is {limit:,} bytes" in proc.stderr
    assert not (run_dir / "metrics.jsonl").exists() and not (run_dir / "checkpoints").exists()


@pytest.mark.skipif(sys.platform == "win32", reason="RLIMIT_FSIZE is POSIX")
def test_a_checkpoint_cut_off_by_the_file_size_limit_names_the_limit(tmp_path):
    """A limit above the weights but below the whole checkpoint (the optimiser's state): the save
    says the limit cut it off, not torch's "unexpected pos", and leaves no temp file."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, hard))
    try:
        with pytest.raises(CheckpointError, match=r"file-size limit \(ulimit -f, RLIMIT_FSIZE\) of 65,536 bytes"):
            save_checkpoint(tmp_path / "last.pt", {"model": {"w": torch.zeros(100_000)}})
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert list(tmp_path.iterdir()) == []
