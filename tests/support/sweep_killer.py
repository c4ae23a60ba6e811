"""A kill -9 at a chosen instant of a real multirun, for the resume tests: imported by the
multirun under test (``imports=[sweep_killer]``), it SIGKILLs the whole process right after job
$ZOO_TEST_KILL_JOB's ``last.pt`` is renamed into place for the $ZOO_TEST_KILL_STEP-th time (the
step, with a checkpoint every step), before its checksum is: the worst instant for the pair. Only
once: the file $ZOO_TEST_KILL_ONCE must exist, and is removed as the kill happens, so a resumed
launch with the very same overrides (imports included) runs through."""

import os
import signal
from collections import Counter
from pathlib import Path

_replace = os.replace
_renames: Counter = Counter()


def replace_then_die(source, target):
    _replace(source, target)
    target = Path(target)
    once = Path(os.environ["ZOO_TEST_KILL_ONCE"])
    if target.name == "last.pt" and target.parent.parent.name == os.environ["ZOO_TEST_KILL_JOB"]:
        _renames[target] += 1
        if _renames[target] == int(os.environ["ZOO_TEST_KILL_STEP"]) and once.exists():
            once.unlink()
            os.kill(os.getpid(), signal.SIGKILL)


os.replace = replace_then_die
