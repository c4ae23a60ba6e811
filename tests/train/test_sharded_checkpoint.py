"""The sharded checkpoint format of FSDP runs (zoo/train/checkpoints/sharded.py), in one process without a
process group (DCP then reads and writes as one rank): it round-trips the model and optimiser; every file
is checked against SHA256SUMS before anything is read; DCP's pickled metadata is read as data only; a save
killed between its renames is put right at the next start."""

from __future__ import annotations

import os
import pickle
import shutil

import pytest
import torch

import zoo
from zoo.train.checkpoints.format import CHECKPOINT_FORMAT, CheckpointError, load_checkpoint
from zoo.train.checkpoints.sharded import (
    MANIFEST,
    complete_sharded_saves,
    load_sharded,
    manifest_problem,
    save_sharded,
    write_manifest,
)

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


def trained():
    torch.manual_seed(0)
    model = zoo.create_model("vanilla_lm", vocab_size=32, d_model=16, n_heads=2, d_ff=32, n_layers=2)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    tokens = torch.randint(0, 32, (2, 8))
    model(tokens, tokens).loss.backward()
    optimizer.step()
    return model, optimizer


@pytest.fixture
def saved(tmp_path):
    model, optimizer = trained()
    path = tmp_path / "checkpoints" / "last.dcp"
    record = {"format": CHECKPOINT_FORMAT, "step": 1}
    save_sharded(path, model=model, optimizer=optimizer, record=record, run_dir=tmp_path)
    return path, model, optimizer


def test_round_trip(saved):
    path, model, optimizer = saved
    fresh, fresh_optimizer = trained()
    with torch.no_grad():
        for p in fresh.parameters():
            p.zero_()
    record = load_sharded(path, model=fresh, optimizer=fresh_optimizer)
    assert record["step"] == 1 and manifest_problem(path) is None
    with pytest.raises(CheckpointError, match="sharded checkpoint of an FSDP run .* --single-file"):
        load_checkpoint(path)  # what evaluate / sample read: told how to convert it
    for (name, a), b in zip(model.state_dict().items(), fresh.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)
    for a, b in zip(optimizer.state.values(), fresh_optimizer.state.values()):
        torch.testing.assert_close(a["exp_avg_sq"], b["exp_avg_sq"], rtol=0, atol=0)


def test_a_changed_added_or_missing_file_is_refused_naming_it(saved, tmp_path):
    path, model, optimizer = saved
    shard = next(path.glob("__0_*.distcp"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 1
    shard.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=f"SHA-256 of {shard.name} is .* but {MANIFEST} records"):
        load_sharded(path, model=model, optimizer=optimizer)
    (path / "extra").write_text("x")
    assert "missing or added: extra" in manifest_problem(path)
    (path / MANIFEST).unlink()
    assert manifest_problem(path) == f"it has no checksum file {MANIFEST}"


class RunsCode:
    def __reduce__(self):
        return (os.system, ("touch ran",))


def test_pickled_metadata_that_would_run_code_is_refused_without_running(saved, tmp_path, monkeypatch):
    """A crafted checkpoint (its checksums rewritten too) reaches DCP's metadata: refused by the unpickler."""
    path, model, optimizer = saved
    monkeypatch.chdir(tmp_path)
    (path / ".metadata").write_bytes(pickle.dumps(RunsCode()))
    (path / MANIFEST).unlink()
    write_manifest(path)
    with pytest.raises(CheckpointError, match="os.system|posix.system"):
        load_sharded(path, model=model, optimizer=optimizer)
    assert not (tmp_path / "ran").exists()


def test_a_save_killed_between_its_renames_is_completed(saved):
    """Killed after moving the old one aside: the new one goes into place when sound, else the old one."""
    path, *_ = saved
    old, new = path.with_name(f".{path.name}.old"), path.with_name(f".{path.name}.tmp")
    shutil.copytree(path, new)
    os.replace(path, old)
    assert complete_sharded_saves(path.parent) == [path] and manifest_problem(path) is None
    assert not old.exists() and not new.exists()
    shutil.copytree(path, new)
    (new / MANIFEST).unlink()  # killed before its checksums were written
    os.replace(path, old)
    assert complete_sharded_saves(path.parent) == [path] and manifest_problem(path) is None
    assert not old.exists() and not new.exists()
