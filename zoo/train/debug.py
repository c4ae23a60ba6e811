"""Debugging aids of a training run, switched on by ``conf/debug/`` (``debug=profile``,
``debug=anomaly``): a ``torch.profiler`` trace of a few steps written into the run directory, and
autograd anomaly detection. (Overfitting one batch only changes which batches the trainer reads:
``trainer.overfit_batches``, in the trainer.)
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import torch

from zoo.train.rundir import make_dir, safe_path, write_text

PROFILE_DIR = "profile"


class StepProfiler:
    """``with StepProfiler(run_dir, steps, device) as profiler:`` ... ``profiler.step()`` after each
    optimiser step. With ``steps`` > 0 it skips the first step (a warm-up: allocations, lazy
    initialisation), records the next ``steps``, then writes ``profile/trace.json`` (open it in
    Perfetto or chrome://tracing) and ``profile/ops.txt`` (the operators by their own CPU time) into
    the run directory; with 0 it does nothing. A run that ends before the window closes writes what
    was recorded."""

    def __init__(self, run_dir: str | Path, steps: int, device: torch.device, *, write: bool = True):
        self.run_dir, self.steps, self.device, self.write = Path(run_dir), steps, device, write
        self._profiler: Any = None

    def __enter__(self) -> StepProfiler:
        if self.steps > 0:
            from torch.profiler import ProfilerActivity, profile, schedule

            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.device.type == "cuda" else [])
            self._profiler = profile(
                activities=activities,
                schedule=schedule(wait=0, warmup=1, active=self.steps, repeat=1),
                on_trace_ready=self._save,
            )
            self._profiler.__enter__()
        return self

    def step(self) -> None:
        if self._profiler is not None:
            self._profiler.step()

    def __exit__(self, *exc: Any) -> None:
        if self._profiler is not None:
            self._profiler.__exit__(*exc)
            self._profiler = None

    def _save(self, profiler: Any) -> None:
        if not self.write:
            return
        folder = make_dir(self.run_dir, self.run_dir / PROFILE_DIR)
        trace = safe_path(self.run_dir, folder / "trace.json")
        trace.unlink(missing_ok=True)  # torch writes with open(path, "w"): never through an old file
        profiler.export_chrome_trace(str(trace))
        sort = "self_cuda_time_total" if self.device.type == "cuda" else "self_cpu_time_total"
        table = profiler.key_averages().table(sort_by=sort, row_limit=40)
        write_text(self.run_dir, folder / "ops.txt", f"{self.steps} optimiser steps after one warm-up step\n{table}\n")


def anomaly_detection(enabled: bool) -> contextlib.AbstractContextManager:
    """Autograd anomaly detection while training (slow: for finding where a NaN is made); off,
    whatever the caller had set stays as it was."""
    return torch.autograd.set_detect_anomaly(True) if enabled else contextlib.nullcontext()
