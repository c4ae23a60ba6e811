"""Stopping a run between steps: the first Ctrl-C or SIGTERM (what Slurm and containers send) is
noted and the run stops after the step in progress, so the checkpoint it saves resumes exactly; a
second one stops at once (:class:`ImmediateInterrupt`, possibly mid-step: nothing is saved)."""

from __future__ import annotations

import signal
import threading
from typing import Any


class ImmediateInterrupt(KeyboardInterrupt):
    """A second Ctrl-C / SIGTERM: stop now, possibly mid-step, so no checkpoint is written."""


class StopSignals:
    """``with StopSignals() as stop:`` ... ``stop.received`` is ``"SIGINT"``/``"SIGTERM"`` once one
    came. Handlers are installed only on the main thread (elsewhere signals cannot be handled) and
    the previous ones are put back on exit."""

    def __init__(self) -> None:
        self.received: str | None = None
        self._previous: dict[int, Any] = {}

    def _handler(self, signum: int, frame: Any) -> None:
        if self.received is not None:
            raise ImmediateInterrupt
        self.received = signal.Signals(signum).name
        what = "Ctrl-C" if signum == signal.SIGINT else self.received
        print(f"\n{what}: finishing this step, then saving a checkpoint ({what} again to stop now)", flush=True)

    def __enter__(self) -> StopSignals:
        self.received = None
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._handler) for s in (signal.SIGINT, signal.SIGTERM)}
        return self

    def __exit__(self, *exc: Any) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}
