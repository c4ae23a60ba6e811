"""What the tests of the app's command line share: the overrides of a toy sweep job,
experiments/train.py's command line run in this process (as ``python experiments/train.py ...``)
or in a process of its own, and a snapshot of a directory's files to tell whether a launch wrote
anything."""

from __future__ import annotations

import csv
import hashlib
import os
import subprocess
import sys
from pathlib import Path

from support.app_overrides import TINY
from support.script_modules import load_script

ROOT = Path(__file__).resolve().parents[2]
# a sweep's job: TINY's model and batches, two steps, evaluated once at the end
TOY = [o for o in TINY if not o.startswith(("trainer.max_steps=", "trainer.eval_every="))]
TOY += ["trainer.max_steps=2", "trainer.eval_every=0"]


def script_main(script: str, argv: list[str], monkeypatch) -> int:
    """``python experiments/SCRIPT ARGV`` run in this process (a Hydra entry point: train.py, study.py);
    returns the exit status (0 when it returns). In-process saves the interpreter's start and torch's
    import, about 5 s a call on this machine."""
    from hydra.core.global_hydra import GlobalHydra

    module = load_script(ROOT / "experiments" / script)
    monkeypatch.setattr(sys, "argv", [script, *argv])
    GlobalHydra.instance().clear()
    try:
        module.main()
    except SystemExit as exc:
        return int(exc.code or 0)
    finally:
        GlobalHydra.instance().clear()
    return 0


def train_main(argv: list[str], monkeypatch) -> int:
    """experiments/train.py's main in this process; returns the exit status (0 when it returns)."""
    return script_main("train.py", argv, monkeypatch)


def train_process(
    argv: list[str], env: dict[str, str] | None = None, timeout: float = 300, preexec=None
) -> subprocess.CompletedProcess:
    """``python experiments/train.py ARGV`` in a process of its own (one thread; tests/ importable);
    ``preexec`` runs in the child before it starts (e.g. a resource limit)."""
    paths = [str(ROOT), str(Path(__file__).parent)]
    full_env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths), OMP_NUM_THREADS="1", **(env or {}))
    full_env.pop("WORLD_SIZE", None)
    cmd = [sys.executable, str(ROOT / "experiments" / "train.py"), *argv]
    return subprocess.run(cmd, env=full_env, capture_output=True, text=True, timeout=timeout, preexec_fn=preexec)


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path) as f:
        return list(csv.DictReader(f))


def snapshot(directory: Path) -> dict[str, tuple[str, int]]:
    """Every file under ``directory``: (SHA-256, modification time in ns), by relative path."""
    return {
        str(p.relative_to(directory)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }
