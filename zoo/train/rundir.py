"""The run directory: one per run, never shared, and never written through a planted link.

- :func:`run_id` is a short random token made once per process (and handed to its children, e.g.
  ``torchrun`` ranks and launcher jobs, through ``ZOO_RUN_ID``); the app's ``hydra.run.dir`` and
  ``hydra.sweep.dir`` end with it, so two runs started in the same second get two directories.
- :func:`claim` takes the directory for one run: an exclusive lock on ``.run.lock`` held until
  the run ends (two runs started at once into one directory: the second is refused, never
  interleaved; the lock dies with its process, so a killed run leaves nothing stale), then the
  check that it holds no run unless the run resumes.
- :func:`safe_path`, :func:`write_text` and :func:`open_append` write only to real files inside
  the run directory: a symbolic link planted at an artefact (``metrics.jsonl``, ``result.json``,
  ``config.json``, ``checkpoints/`` ...) is refused with its name, never followed.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import IO

try:  # POSIX advisory locks; elsewhere the claim falls back to the artefact check alone
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

# what a run writes; Hydra's own ``.hydra/`` and ``*.log`` may exist before the run starts
RUN_ARTEFACTS = ("checkpoints", "metrics.jsonl", "metrics.csv", "result.json", "config.json")
RUN_ID_ENV = "ZOO_RUN_ID"
LOCK_NAME = ".run.lock"  # held (flock) by the run using the directory; holds that run's process id


class RunDirError(RuntimeError):
    """The run directory cannot be used: it holds another run, or a link points out of it."""


def run_id() -> str:
    """A per-process token for unique run directories (inherited by child processes).

    ``torchrun`` ranks are separate processes that must agree on one directory: they share
    ``TORCHELASTIC_RUN_ID``, so it seeds the token there."""
    token = os.environ.get(RUN_ID_ENV)
    if not token:
        elastic = os.environ.get("TORCHELASTIC_RUN_ID", "")
        token = elastic.replace("-", "")[:8] if elastic and elastic != "none" else secrets.token_hex(3)
        os.environ[RUN_ID_ENV] = token
    return token


class RunClaim:
    """A run's hold on its directory: the open, locked ``.run.lock`` (released by :meth:`release`,
    or by the operating system when the process ends, however it ends)."""

    def __init__(self, run_dir: Path, fd: int | None):
        self.run_dir, self._fd = run_dir, fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the lock
            self._fd = None

    def __del__(self) -> None:
        self.release()


def _lock(run_dir: Path) -> tuple[int | None, bool]:
    """(descriptor holding the exclusive lock on ``.run.lock``, whether this call created the file);
    a directory locked by another live run is refused naming its process."""
    if fcntl is None:
        return None, False
    path = safe_path(run_dir, run_dir / LOCK_NAME)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
        created = True
    except FileExistsError:
        fd = os.open(path, os.O_RDWR | getattr(os, "O_NOFOLLOW", 0))
        created = False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise RunDirError(
            f"run directory {run_dir} is in use by another run (process {holder}); wait for it to end, "
            "or start this one elsewhere (hydra.run.dir=...)"
        ) from None
    return fd, created


def claim(run_dir: str | Path, *, resuming: bool) -> RunClaim:
    """Take ``run_dir`` for one run: lock it (atomic: of two runs started together, one gets it),
    then refuse it if it already holds a run's artefacts, unless resuming. A refused claim leaves
    the directory as it found it."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    fd, created = _lock(run_dir)
    found = [name for name in RUN_ARTEFACTS if os.path.lexists(run_dir / name)]
    if found and not resuming:
        if created:  # ours, and locked: a run that opened it meanwhile found it locked and was refused
            os.unlink(run_dir / LOCK_NAME)
        if fd is not None:
            os.close(fd)
        raise RunDirError(
            f"run directory {run_dir} already holds a run ({', '.join(found)}); start this one elsewhere "
            f"(hydra.run.dir=... or a new run_dir) or continue that run with trainer.resume=auto"
        )
    if fd is not None:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return RunClaim(run_dir, fd)


def safe_path(run_dir: str | Path, path: str | Path) -> Path:
    """``path`` after checking that it lies in ``run_dir`` and that neither it nor any directory
    between them is a symbolic link (the run directory itself may be one: that is the user's)."""
    run_dir, path = Path(run_dir), Path(path)
    try:
        relative = path.relative_to(run_dir)
    except ValueError:
        raise RunDirError(f"refusing to write {path}: it is outside the run directory {run_dir}") from None
    current = run_dir
    for part in relative.parts:
        current = current / part
        if current.is_symlink():
            raise RunDirError(
                f"refusing to write {path}: {current} is a symbolic link (to {os.readlink(current)}); "
                f"a run writes only inside its directory {run_dir}: remove the link"
            )
    return path


def make_dir(run_dir: str | Path, path: str | Path) -> Path:
    path = safe_path(run_dir, path)
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_text(run_dir: str | Path, path: str | Path, text: str) -> Path:
    """Write ``text`` atomically (a fresh temp file renamed over ``path``, never through a link)."""
    path = safe_path(run_dir, path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open_exclusive(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)
    return path


def open_exclusive(path: str | Path, mode: str = "wb") -> IO:
    """A new file (an existing file or link of that name is removed first, never followed)."""
    if os.path.lexists(path):
        os.unlink(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
    return os.fdopen(fd, mode)


def open_append(run_dir: str | Path, path: str | Path) -> IO:
    """``path`` opened for appending text; a link there is refused, not followed."""
    path = safe_path(run_dir, path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
    return os.fdopen(fd, "a")
