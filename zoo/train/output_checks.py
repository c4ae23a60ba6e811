"""Whether a run can write where it is told to, asked before any work: a run directory on a read-only
file system, one whose parent is a file, or a file-size limit (``ulimit -f``, RLIMIT_FSIZE) below the
checkpoint it will write is refused naming the path and the cause, instead of failing later with a
raw ``OSError`` from a ``mkdir`` or "unexpected pos" from the zip writer of ``torch.save``.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

try:
    import resource
except ImportError:  # pragma: no cover - not POSIX: no file-size limit to ask
    resource = None  # type: ignore[assignment]

from zoo.train.rundir import RunDirError

CAUSES = {
    errno.EROFS: "it is on a read-only file system",
    errno.ENOTDIR: "a parent of it is a file, not a directory",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted there",
    errno.EFBIG: "the file-size limit (ulimit -f) was reached",
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "the disk quota is exhausted",
}


class OutputNotWritable(RunDirError):
    """The run's output location cannot be written: the path and the cause are in the message."""


def os_error_cause(exc: OSError) -> str:
    """What an ``OSError`` from making or writing an output means, in words."""
    return CAUSES.get(exc.errno, exc.strerror or type(exc).__name__)


def unwritable_reason(path: str | Path) -> str | None:
    """Why a directory cannot be made (or written) at ``path``, or None when it can: the nearest
    part of it that exists must be a directory we may write into, on a writable file system."""
    path = Path(os.path.abspath(path))
    existing = path
    while not os.path.lexists(existing) and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        if existing == path:
            return f"{path} is a file, not a directory"
        return f"{existing} is a file, not a directory, so {path} cannot be made under it"
    if os.access(existing, os.W_OK | os.X_OK):
        return None
    try:
        read_only = bool(os.statvfs(existing).f_flag & os.ST_RDONLY)
    except (OSError, AttributeError):
        read_only = False
    where = existing if existing == path else f"{existing} (where {path} would be made)"
    return f"{where} is on a read-only file system" if read_only else f"{where} is not writable (permission denied)"


def file_size_limit() -> int | None:
    """This process's limit on the size of a file it writes (bytes; ``ulimit -f``), None when unlimited."""
    if resource is None:
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
    return None if soft == resource.RLIM_INFINITY else int(soft)


def check_output(run_dir: str | Path, *, checkpoint: str | Path | None = None, checkpoint_bytes: int = 0) -> None:
    """Refuse, naming the path and the cause, a run directory that cannot be written, or a file-size
    limit below ``checkpoint_bytes`` (the least the checkpoint at ``checkpoint`` will hold)."""
    reason = unwritable_reason(run_dir)
    if reason:
        raise OutputNotWritable(f"cannot write the run's output to {run_dir}: {reason}; choose another run directory")
    limit = file_size_limit()
    if checkpoint is not None and limit is not None and checkpoint_bytes > limit:
        raise OutputNotWritable(
            f"cannot write checkpoint {checkpoint}: the file-size limit (ulimit -f, RLIMIT_FSIZE) is {limit:,} bytes "
            f"and the checkpoint holds at least {checkpoint_bytes:,} (the model's weights alone); raise the limit "
            "(ulimit -f unlimited) or run with trainer.checkpoints=false"
        )
