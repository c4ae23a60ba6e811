"""A kill -9 at a chosen instant of a real multirun, for the resume tests: imported by the
multirun under test (``imports=[sweep_killer]``), it SIGKILLs the whole process right after job
$ZOO_TEST_KILL_JOB has written ``last.pt`` at step $ZOO_TEST_KILL_STEP. Only once: the file
$ZOO_TEST_KILL_ONCE must exist, and is removed as the kill happens, so a resumed launch with the
very same overrides (imports included) runs through."""

import os
import signal
from pathlib import Path

import zoo.train.checkpointing

_save = zoo.train.checkpointing.save_checkpoint


def save_then_die(path, payload, **kwargs):
    written = _save(path, payload, **kwargs)
    once = Path(os.environ["ZOO_TEST_KILL_ONCE"])
    job = Path(path).parent.parent.name
    chosen = job == os.environ["ZOO_TEST_KILL_JOB"] and payload["step"] == int(os.environ["ZOO_TEST_KILL_STEP"])
    if chosen and Path(path).name == "last.pt" and once.exists():
        once.unlink()
        os.kill(os.getpid(), signal.SIGKILL)
    return written


zoo.train.checkpointing.save_checkpoint = save_then_die
