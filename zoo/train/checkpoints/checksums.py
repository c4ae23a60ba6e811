"""A checkpoint's SHA-256 sidecar (``last.pt.sha256``, ``sha256sum`` format) and the CRC-32s of its zip
container: written with the checkpoint, checked before it is read (``format.py``: what a checkpoint holds,
how it is saved and loaded), and the repair of a save killed between its two renames (a pending sidecar
whose digest is the checkpoint's becomes its sidecar)."""

from __future__ import annotations

import hashlib
import os
import zipfile
from pathlib import Path

from zoo.train.rundir import open_exclusive

CHECKSUM_SUFFIX = ".sha256"


def checksum_path(path: str | Path) -> Path:
    path = Path(path)
    return path.with_name(path.name + CHECKSUM_SUFFIX)


def sha256_of(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def pending_checksum_path(path: str | Path) -> Path:
    """Where a save writes the new sidecar before the checkpoint is renamed into place."""
    sidecar = checksum_path(path)
    return sidecar.with_name(f".{sidecar.name}.tmp{os.getpid()}")


def pending_checksums(path: str | Path) -> list[Path]:
    """Sidecars of saves killed between their two renames (any process's)."""
    sidecar = checksum_path(path)
    return sorted(sidecar.parent.glob(f".{sidecar.name}.tmp*"))


def recorded_digest(sidecar: Path) -> str | None:
    words = sidecar.read_text().split()[:1] if sidecar.is_file() else []
    return words[0] if words else None


def write_checksum_file(target: Path, checkpoint_name: str, digest: str) -> Path:
    """A ``sha256sum``-format line for ``checkpoint_name``, written to ``target`` (a fresh file, synced)."""
    with open_exclusive(target, "w") as f:
        f.write(f"{digest}  {checkpoint_name}\n")
        f.flush()
        os.fsync(f.fileno())
    return target


def write_checksum(path: str | Path, digest: str | None = None) -> Path:
    """Write ``<path>.sha256`` (``sha256sum -c`` reads it) for an existing checkpoint file."""
    path = Path(path)
    sidecar, tmp = checksum_path(path), pending_checksum_path(path)
    try:
        write_checksum_file(tmp, path.name, digest or sha256_of(path))
        os.replace(tmp, sidecar)
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)
    return sidecar


def verify_checksum(path: str | Path) -> str | None:
    """None when ``path`` matches its sidecar (or the pending sidecar of a save killed between its
    two renames), else what is wrong."""
    path = Path(path)
    sidecar = checksum_path(path)
    pending = pending_checksums(path)
    if not sidecar.is_file() and not pending:
        return f"it has no checksum file {sidecar.name} beside it"
    actual = sha256_of(path)
    if any(recorded_digest(p) == actual for p in [sidecar, *pending]):
        return None
    expected = recorded_digest(sidecar)
    return f"its SHA-256 is {actual} but {sidecar.name} records {expected or 'nothing'}"


def zip_entry_problem(path: str | Path) -> str | None:
    """What is wrong with the zip container ``torch.save`` wrote at ``path``, by the CRC-32 it records
    for every entry (a bit flip in any tensor's bytes shows), or None. A file that is not a zip (a legacy
    torch file, a truncated one) is left to the reader, which refuses what it cannot read."""
    if not zipfile.is_zipfile(path):
        return None
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()  # reads every entry, comparing its bytes with the recorded CRC-32
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
        return f"its zip container cannot be read ({type(exc).__name__}: {exc})"
    return None if bad is None else f"entry {bad!r} of its zip container does not match the CRC-32 recorded for it"


def complete_saves(directory: str | Path) -> list[Path]:
    """Finish the saves killed between their two renames: a pending sidecar whose digest is the
    checkpoint's becomes its sidecar (one that matches nothing is left for the temp-file sweep).
    Returns the checkpoints repaired."""
    directory = Path(directory)
    repaired = []
    for checkpoint in sorted(directory.glob("*.pt")) if directory.is_dir() else []:
        pending = pending_checksums(checkpoint)
        if not pending or verify_checksum(checkpoint) is not None:
            continue
        actual, sidecar = sha256_of(checkpoint), checksum_path(checkpoint)
        if recorded_digest(sidecar) == actual:
            continue
        os.replace(next(p for p in pending if recorded_digest(p) == actual), sidecar)
        repaired.append(checkpoint)
    return repaired


def newest_sound_checkpoint(directory: str | Path, exclude: str | Path | None = None) -> Path | None:
    """The most recently written checkpoint in ``directory`` whose checksum holds."""
    directory = Path(directory)
    if not directory.is_dir():
        return None
    excluded = Path(exclude).resolve() if exclude else None
    candidates = [p for p in directory.glob("*.pt") if p.is_file() and p.resolve() != excluded]
    for candidate in sorted(candidates, key=lambda p: p.stat().st_mtime, reverse=True):
        if verify_checksum(candidate) is None:
            return candidate
    return None
