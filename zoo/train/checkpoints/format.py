"""Checkpoints as data: what a training run saves, how it is written, and how it is read back.

A checkpoint is one ``torch.save`` file holding only tensors and plain Python types (dict, list,
tuple, str, int, float, bool, None):

- ``model`` / ``optimizer`` / ``scheduler``: state dicts; ``step``, ``best``, ``world_size``;
  ``evaluation``: the latest evaluation's step, metric name and value;
- ``rng``: the Python, NumPy and torch generator states as integer lists and tensors;
- ``state``: the carried segment memory, its dataclasses turned into tagged dicts
  (:func:`state_to_data`), rebuilt only as dataclasses of the ``zoo`` package (:func:`state_from_data`);
- ``model_config``, ``task``, ``optim``, ``config``: plain dicts.

It is read with ``torch.load(weights_only=True)``, which builds tensors and plain types and
nothing else, so a crafted file cannot run code; anything else is refused naming the file. Every
checkpoint has a SHA-256 sidecar (``last.pt.sha256``, ``sha256sum`` format), checked before the
file is read: a corrupt file is refused naming it and the newest sound checkpoint beside it. A
checkpoint copied without its sidecar is checked against the CRC-32 its zip container (``torch.save``'s
format) records for every entry: a mismatch is refused naming the file and the entry; a file that
passes loads, with a warning that its SHA-256 was never checked (it is never called sound). The checksums
live in ``checksums.py``.

Writes are atomic and a failed write removes its temp files. A checkpoint and its sidecar are two
files, so they cannot be renamed into place at once: the new sidecar is written in full (as a temp
file) *before* the checkpoint is renamed over the old one, then renamed itself. A kill between the
two renames leaves the new checkpoint beside the old sidecar and the pending one, which records the
new digest: :func:`verify_checksum` accepts the checkpoint on it, and :func:`complete_saves` (at
the next run's start) finishes the rename. At no instant is a sound checkpoint refused.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import random
import shutil
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from zoo.registry import import_plugins
from zoo.train.checkpoints.checksums import (
    CHECKSUM_SUFFIX,
    checksum_path,
    complete_saves,
    newest_sound_checkpoint,
    pending_checksum_path,
    pending_checksums,
    recorded_digest,
    sha256_of,
    verify_checksum,
    write_checksum,
    write_checksum_file,
    zip_entry_problem,
)
from zoo.train.output_checks import file_size_limit
from zoo.train.rundir import open_exclusive, safe_path

CHECKPOINT_FORMAT = "transformer-zoo/checkpoint/v2"
STATE_TAG = "__dataclass__"
# modules whose state classes moved when zoo/ was laid out as a folder per axis: format v2 checkpoints
# written before that name the old module (``zoo.models:ModelState``) and still load
MOVED_STATE_MODULES = {"zoo.models": "zoo.models.base"}

__all__ = [
    "CHECKPOINT_FORMAT",
    "STATE_TAG",
    "MOVED_STATE_MODULES",
    "CheckpointError",
    "UncheckedCheckpointWarning",
    "seed_everything",
    "rng_state",
    "set_rng_state",
    "state_to_data",
    "state_class",
    "state_from_data",
    "is_temp_file",
    "sweep_temp_files",
    "save_checkpoint",
    "import_recorded",
    "load_checkpoint",
    # the checksums' home is checksums.py; importable from here as before
    "CHECKSUM_SUFFIX",
    "checksum_path",
    "complete_saves",
    "newest_sound_checkpoint",
    "pending_checksum_path",
    "pending_checksums",
    "recorded_digest",
    "sha256_of",
    "verify_checksum",
    "write_checksum",
    "write_checksum_file",
    "zip_entry_problem",
]


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used: unreadable, corrupt, not data, not ours, or not this run's."""


class UncheckedCheckpointWarning(UserWarning):
    """A checkpoint loaded without its checksum file: nothing checked that it is intact."""


# -- seeds and random generators -------------------------------------------------------------------


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def rng_state() -> dict[str, Any]:
    """Every generator a training step draws from, as tensors and plain types."""
    version, words, gauss = random.getstate()
    _, key, pos, has_gauss, cached = np.random.get_state(legacy=True)
    state = {
        "python": {"version": version, "words": torch.tensor(words, dtype=torch.int64), "gauss": gauss},
        "numpy": {
            "key": torch.from_numpy(key.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = list(torch.cuda.get_rng_state_all())
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    py, npy = state["python"], state["numpy"]
    random.setstate((py["version"], tuple(int(w) for w in py["words"].tolist()), py["gauss"]))
    key = npy["key"].numpy().astype(np.uint32)
    np.random.set_state(("MT19937", key, npy["pos"], npy["has_gauss"], npy["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# -- carried state <-> data ------------------------------------------------------------------------


def state_to_data(state: Any) -> Any:
    """A model's carried state (nested dataclasses, lists, dicts of tensors) as tensors and plain
    types: each dataclass becomes a dict tagged with its class (``module:QualName``)."""
    if isinstance(state, Tensor):
        return state.detach().cpu()
    if dataclasses.is_dataclass(state) and not isinstance(state, type):
        cls = type(state)
        fields = {f.name: state_to_data(getattr(state, f.name)) for f in dataclasses.fields(state) if f.init}
        return {STATE_TAG: f"{cls.__module__}:{cls.__qualname__}", **fields}
    if isinstance(state, (list, tuple)):
        return type(state)(state_to_data(s) for s in state)
    if isinstance(state, dict):
        return {k: state_to_data(v) for k, v in state.items()}
    if state is None or isinstance(state, (bool, int, float, str)):
        return state
    raise CheckpointError(
        f"cannot store a {type(state).__name__} of the carried state in a checkpoint (tensors, "
        "dataclasses and plain types only)"
    )


def state_class(tag: str) -> type:
    """The dataclass a tag names: only classes of already imported ``zoo`` modules qualify."""
    module_name, _, qualname = tag.partition(":")
    module_name = MOVED_STATE_MODULES.get(module_name, module_name)
    module = sys.modules.get(module_name)
    if not (module_name == "zoo" or module_name.startswith("zoo.")) or module is None:
        raise CheckpointError(f"carried state names class {tag!r}; only dataclasses of loaded zoo modules are rebuilt")
    cls: Any = module
    for part in qualname.split("."):
        cls = getattr(cls, part, None)
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        raise CheckpointError(f"carried state names {tag!r}, which is not a zoo dataclass")
    return cls


def state_from_data(data: Any, device: torch.device | str = "cpu") -> Any:
    """Inverse of :func:`state_to_data`, tensors moved to ``device``."""
    if isinstance(data, Tensor):
        return data.to(device)
    if isinstance(data, dict):
        if STATE_TAG in data:
            fields = {k: state_from_data(v, device) for k, v in data.items() if k != STATE_TAG}
            return state_class(data[STATE_TAG])(**fields)
        return {k: state_from_data(v, device) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return type(data)(state_from_data(d, device) for d in data)
    return data


# -- writing and reading -----------------------------------------------------------------------------


def is_temp_file(path: Path) -> bool:
    return path.name.startswith(".") and ".tmp" in path.name


def sweep_temp_files(directory: str | Path) -> list[Path]:
    """Remove temp files that killed or failed saves left behind (``.last.pt.tmp<pid>``)."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    stale = [p for p in directory.iterdir() if is_temp_file(p) and (p.is_file() or p.is_symlink())]
    for path in stale:
        path.unlink()
    return stale


def _os_errno(exc: BaseException) -> int | None:
    """The errno of the first ``OSError`` in ``exc``'s chain, or None."""
    while exc is not None:
        if isinstance(exc, OSError) and exc.errno is not None:
            return exc.errno
        exc = exc.__cause__ or exc.__context__
    return None


def save_checkpoint(path: str | Path, payload: dict[str, Any], *, run_dir: str | Path | None = None) -> Path:
    """Write ``payload`` atomically with its checksum sidecar, the sidecar's content written before
    the checkpoint is renamed into place (see the module's docstring): a crash mid-write leaves the
    previous pair intact, a failed write leaves no temp file. With ``run_dir``, the path must lie
    inside it and no link on the way is followed."""
    path = Path(path)
    if run_dir is not None:
        safe_path(run_dir, path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp, pending = path.with_name(f".{path.name}.tmp{os.getpid()}"), pending_checksum_path(path)
    try:
        with open_exclusive(tmp, "wb") as f:
            torch.save(payload, f)
            f.flush()
            os.fsync(f.fileno())
        write_checksum_file(pending, path.name, sha256_of(tmp))
        os.replace(tmp, path)  # a kill here: the new checkpoint, the old sidecar and the pending one
        os.replace(pending, checksum_path(path))
    except Exception as exc:
        written = tmp.stat().st_size if tmp.is_file() else 0
        for leftover in (tmp, pending):
            if os.path.lexists(leftover):
                os.unlink(leftover)
        limit = file_size_limit()
        if limit is not None and (written >= limit or _os_errno(exc) == errno.EFBIG):
            raise CheckpointError(  # torch's zip writer says only "unexpected pos"
                f"cannot write checkpoint {path}: the file-size limit (ulimit -f, RLIMIT_FSIZE) of {limit:,} bytes "
                f"cut it off ({type(exc).__name__}: {str(exc)[:200]}); raise the limit (ulimit -f unlimited)"
            ) from None
        if _os_errno(exc) == errno.ENOSPC:
            free = shutil.disk_usage(path.parent).free
            raise CheckpointError(
                f"no space left on device: {path} (could not write the checkpoint; {free / 2**20:.1f} MiB free there)"
            ) from None
        if isinstance(exc, CheckpointError):
            raise
        raise CheckpointError(f"cannot write checkpoint {path}: {type(exc).__name__}: {exc}") from exc
    return path


def import_recorded(cfg: dict[str, Any], checkpoint: str | Path) -> list[str]:
    """Import the modules a run named in ``imports`` (its own parts; ``cfg`` is the checkpoint's app
    config), so its model can be rebuilt; a module that is gone is refused naming the checkpoint."""
    modules = list(cfg.get("imports") or [])
    try:
        return import_plugins(modules)
    except ImportError as exc:
        raise ImportError(
            f"checkpoint {checkpoint} was trained with parts of your own (imports={modules}): {exc}; "
            "its model can be rebuilt only with that code back"
        ) from exc


def load_checkpoint(path: str | Path, *, verify: bool = True) -> dict[str, Any]:
    """Read one of our checkpoints as data, refusing anything else with the reason.

    The checksum sidecar is checked first (``verify=False`` skips it, for a file you checked
    yourself): a mismatch is refused; without a sidecar (a copy made without it) the zip container's
    per-entry CRC-32s are checked instead (a mismatch refused naming the entry) and the load warned
    about; then ``torch.load(weights_only=True)`` builds tensors and plain types only, so a
    file that would run code when unpickled is refused without running anything."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path} (trainer.resume / checkpoint=)")
    sidecar = checksum_path(path)
    if verify and not sidecar.is_file() and not pending_checksums(path):
        problem = zip_entry_problem(path)
        if problem:
            raise CheckpointError(
                f"refusing checkpoint {path}: {problem} (corrupt: a damaged copy); it has no checksum file "
                f"{sidecar.name} beside it"
            )
        warnings.warn(
            f"checkpoint {path} has no checksum file {sidecar.name} beside it: loaded as data, its zip entries "
            f"matching their CRC-32s, but its SHA-256 was never checked (copy the .sha256 file with it, or "
            f"write one: cd {path.parent} && sha256sum {path.name} > {sidecar.name})",
            UncheckedCheckpointWarning,
            stacklevel=2,
        )
    elif verify:
        problem = verify_checksum(path)
        if problem:
            sound = newest_sound_checkpoint(path.parent, exclude=path)
            where = f"the newest sound checkpoint beside it is {sound}" if sound else f"no sound one in {path.parent}"
            raise CheckpointError(
                f"refusing checkpoint {path}: {problem} (corrupt or not written by this trainer); {where}"
            )
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - pickled code, truncated file, not a torch file
        text = str(exc)
        if "weights_only" in text or "Unsupported global" in text or "Unpickler" in text:
            reason = text.strip().splitlines()[0][:300]
            raise CheckpointError(
                f"refusing checkpoint {path}: it holds objects other than tensors and plain data, "
                f"which could run code when loaded ({reason})"
            ) from None
        raise CheckpointError(
            f"cannot read checkpoint {path}: {type(exc).__name__}: {text[:300]} (corrupt or not a torch file)"
        ) from None
    if not isinstance(payload, dict) or payload.get("format") != CHECKPOINT_FORMAT:
        found = payload.get("format") if isinstance(payload, dict) else type(payload).__name__
        raise CheckpointError(
            f"{path} is not a transformer-zoo checkpoint (format {found!r}, expected {CHECKPOINT_FORMAT!r})"
        )
    missing = [k for k in ("model", "model_config", "step") if k not in payload]
    if missing:
        raise CheckpointError(f"checkpoint {path} is incomplete: missing {', '.join(missing)}")
    return payload
