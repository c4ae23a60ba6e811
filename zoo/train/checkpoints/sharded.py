"""Sharded checkpoints of an FSDP run (``trainer.fsdp=true``), written and read through
``torch.distributed.checkpoint`` (DCP), with the single-file format's rules (:mod:`.format`).

A sharded checkpoint is a directory ``checkpoints/last.dcp/``:

- ``.metadata`` and ``__<rank>_0.distcp``: DCP's files, the model's and the optimiser's state, each rank
  writing its own shards; read back onto any number of ranks (DCP reshards), one included;
- ``run.pt``: everything else a resume needs, as the single-file checkpoint holds it (step, schedule,
  RNG, carried state, progress, configs: :func:`zoo.train.checkpoints.resume.run_record`), from rank 0;
- ``SHA256SUMS``: the SHA-256 of every other file (``sha256sum -c`` reads it), checked before anything
  is read; a file missing, added or changed is refused naming it and the newest sound checkpoint.

Read as data: ``run.pt`` and DCP's tensors with ``torch.load(weights_only=True)``; DCP's own reader
unpickles ``.metadata`` and its non-tensor entries (the optimiser's hyper-parameters) with plain pickle,
so :class:`DataOnlyReader` reads the metadata with an unpickler that builds DCP's metadata classes and
nothing else, and :class:`DataOnlyPlanner` reads entries with ``weights_only=True``.

Written atomically: every rank writes into ``.last.dcp.tmp/``, rank 0 adds ``run.pt`` and the checksums
once all shards are in, then moves the old directory aside (``.last.dcp.old``), the new one into place,
and removes the old one. A kill between those renames leaves no ``last.dcp``: :func:`complete_sharded_saves`
(at the next run's start) puts back the new one if its checksums hold, else the old one. Weights that
are not finite on any rank are never written (every rank refuses together).

:func:`zoo.train.checkpoints.convert.to_single_file` turns a sharded checkpoint into the single ``.pt``
file every other tool reads (evaluate, sample, export): ``python experiments/export.py last.dcp --single-file last.pt``.
"""

from __future__ import annotations

import io
import os
import pickle
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import StorageMeta
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from zoo.train.checkpoints.format import CHECKPOINT_FORMAT, CheckpointError, sha256_of
from zoo.train.rundir import safe_path

SHARDED_SUFFIX = ".dcp"
MANIFEST = "SHA256SUMS"
RUN_FILE = "run.pt"
# the classes DCP's .metadata pickle names (torch 2.13): its dataclasses, torch.Size, dtypes, layouts, paths
METADATA_GLOBALS = {
    "torch.distributed.checkpoint.metadata": None,  # any class of the module
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},
    "torch": {"Size"},
    "pathlib": {"PosixPath", "WindowsPath", "PurePosixPath", "PureWindowsPath", "Path"},
    "collections": {"OrderedDict"},
}


def is_sharded(path: str | Path) -> bool:
    return Path(path).is_dir()


def _is_main() -> bool:
    return not dist.is_initialized() or dist.get_rank() == 0


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


# -- checksums ---------------------------------------------------------------------------------------


def write_manifest(directory: Path) -> None:
    lines = [f"{sha256_of(p)}  {p.name}\n" for p in sorted(directory.iterdir()) if p.name != MANIFEST]
    with open(directory / MANIFEST, "x") as f:
        f.writelines(lines)
        f.flush()
        os.fsync(f.fileno())


def manifest_problem(directory: str | Path) -> str | None:
    """None when every file of ``directory`` matches ``SHA256SUMS`` (and nothing is missing or added)."""
    directory = Path(directory)
    manifest = directory / MANIFEST
    if not manifest.is_file():
        return f"it has no checksum file {MANIFEST}"
    recorded = dict(reversed(line.split(None, 1)) for line in manifest.read_text().splitlines() if line.strip())
    recorded = {name.strip(): digest for name, digest in recorded.items()}
    present = {p.name for p in directory.iterdir() if p.name != MANIFEST}
    if present != set(recorded):
        odd = sorted(present ^ set(recorded))
        return f"its files do not match {MANIFEST} (missing or added: {', '.join(odd)})"
    for name, digest in sorted(recorded.items()):
        actual = sha256_of(directory / name)
        if actual != digest:
            return f"the SHA-256 of {name} is {actual} but {MANIFEST} records {digest}"
    return None


def newest_sound_sharded(directory: Path, exclude: Path | None = None) -> Path | None:
    candidates = [p for p in directory.glob(f"*{SHARDED_SUFFIX}") if p.is_dir() and p != exclude]
    for candidate in sorted(candidates, key=lambda p: p.stat().st_mtime, reverse=True):
        if manifest_problem(candidate) is None:
            return candidate
    return None


def checked_directory(path: Path) -> None:
    """Refuse (every rank alike: rank 0 checks, the verdict is broadcast) a directory whose checksums fail."""
    problem = [manifest_problem(path) if path.is_dir() else f"{path} is not a directory"] if _is_main() else [None]
    if dist.is_initialized():
        dist.broadcast_object_list(problem, src=0)
    if problem[0] is not None:
        sound = newest_sound_sharded(path.parent, exclude=path) if path.parent.is_dir() else None
        where = f"the newest sound checkpoint beside it is {sound}" if sound else f"no sound one in {path.parent}"
        raise CheckpointError(f"refusing sharded checkpoint {path}: {problem[0]}; {where}")


# -- reading as data ----------------------------------------------------------------------------------


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        allowed = METADATA_GLOBALS.get(module, set())
        dtype = module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)
        if module in METADATA_GLOBALS and (allowed is None or name in allowed or dtype):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"DCP metadata names {module}.{name}, which is not one of DCP's metadata classes")


class DataOnlyReader(FileSystemReader):
    """DCP's file reader, its ``.metadata`` unpickled into DCP's metadata classes only."""

    def read_metadata(self, *args: Any, **kwargs: Any):
        path = Path(self.path) / ".metadata"
        try:
            metadata = _MetadataUnpickler(io.BytesIO(path.read_bytes())).load()
        except (pickle.UnpicklingError, EOFError, AttributeError, ValueError) as exc:
            raise CheckpointError(f"refusing sharded checkpoint {self.path}: {exc}") from None
        metadata.storage_meta = StorageMeta()  # as DCP's reader does
        metadata.storage_meta.load_id = self.load_id
        return metadata


class DataOnlyPlanner(DefaultLoadPlanner):
    """DCP's load planner, its non-tensor entries read with ``torch.load(weights_only=True)``."""

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        try:
            obj = torch.load(value, weights_only=True)
        except Exception as exc:  # noqa: BLE001 - pickled code
            raise CheckpointError(f"refusing a sharded checkpoint entry {read_item.dest_index.fqn}: {exc}") from None
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj


def read_run_file(path: Path) -> dict[str, Any]:
    try:
        record = torch.load(path / RUN_FILE, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - pickled code, a truncated file
        reason = str(exc)[:300]
        raise CheckpointError(f"refusing sharded checkpoint {path}: {RUN_FILE} is not data ({reason})") from None
    if not isinstance(record, dict) or record.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(f"{path} is not a transformer-zoo sharded checkpoint (no {CHECKPOINT_FORMAT} {RUN_FILE})")
    return record


# -- writing and reading the state ----------------------------------------------------------------------


def save_sharded(
    path: Path, *, model: nn.Module, optimizer: torch.optim.Optimizer, record: dict[str, Any] | None, run_dir: Path
) -> Path:
    """Write ``path`` (a ``.dcp`` directory) from every rank: the shards, then rank 0's ``record`` and the
    checksums, then the atomic swap (see the module notes). Called on every rank together."""
    safe_path(run_dir, path)
    tmp = path.with_name(f".{path.name}.tmp")
    if _is_main():
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    _barrier()
    model_state, optim_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optimizer": optim_state}, storage_writer=FileSystemWriter(tmp))
    if _is_main():
        with open(tmp / RUN_FILE, "xb") as f:
            torch.save(record, f)
            f.flush()
            os.fsync(f.fileno())
        write_manifest(tmp)
        old = path.with_name(f".{path.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        if path.exists():
            os.replace(path, old)
        os.replace(tmp, path)  # a kill between the two renames: complete_sharded_saves puts it right
        shutil.rmtree(old, ignore_errors=True)
    _barrier()
    return path


def load_sharded(
    path: Path, *, model: nn.Module, optimizer: torch.optim.Optimizer | None, verify: bool = True
) -> dict[str, Any]:
    """Load the model's (and optimiser's) state of the sharded checkpoint ``path`` into ``model`` (sharded
    over any number of ranks, or a plain module in one process); returns its ``run.pt`` record.
    ``verify=False``: the checksums were checked just before (:func:`checked_directory`)."""
    path = Path(path)
    if verify:
        checked_directory(path)
    record = read_run_file(path)
    optimizers = (optimizer,) if optimizer is not None else ()
    model_state, optim_state = get_state_dict(model, optimizers)
    state = {"model": model_state, **({"optimizer": optim_state} if optimizer is not None else {})}
    reader = DataOnlyReader(path)
    reader.read_metadata()  # refused here, by name, rather than inside DCP's collective
    try:
        dcp.load(state, storage_reader=reader, planner=DataOnlyPlanner(), no_dist=not dist.is_initialized())
    except CheckpointError:
        raise
    except Exception as exc:  # noqa: BLE001 - DCP reports a missing key or a shape as a CheckpointException
        reason = str(exc)[:500]
        raise CheckpointError(f"sharded checkpoint {path} does not fit this model/optimiser: {reason}") from None
    set_state_dict(model, optimizers, model_state_dict=state["model"], optim_state_dict=state.get("optimizer", {}))
    return record


def complete_sharded_saves(directory: str | Path) -> list[Path]:
    """After a save killed between its renames: put back the new checkpoint if sound, else the old one;
    remove what is left of unfinished saves. Returns the checkpoints put back."""
    directory, restored = Path(directory), []
    if not directory.is_dir():
        return restored
    unfinished = [*directory.glob(f".*{SHARDED_SUFFIX}.tmp"), *directory.glob(f".*{SHARDED_SUFFIX}.old")]
    for leftover in sorted(unfinished, key=lambda p: p.suffix != ".tmp"):  # a sound new one first
        target = directory / leftover.name[1:].rsplit(".", 1)[0]
        if not target.exists() and manifest_problem(leftover) is None:
            os.replace(leftover, target)
            restored.append(target)
        else:
            shutil.rmtree(leftover, ignore_errors=True)
    return restored
