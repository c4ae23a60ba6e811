"""The one-cycle learning-rate policy (Smith & Topin 2019, "Super-Convergence", arXiv:1708.07120) as
``torch.optim.lr_scheduler.OneCycleLR`` runs it with a linear anneal and its default constants, the
schedule of the PyTorch LRA re-implementations (mlpen/Nystromformer ``LRA/code/run_tasks.py``,
reused by Skyformer): their 37-38% ListOps comes from it, so their setting here uses it as they do.

Two phases over ``total`` optimiser steps, with ``peak`` the configured ``optim.lr``:

- steps 0 ... p - 1 (p = ``pct_start * total``, i.e. ``warmup``): the rate rises linearly from
  peak / 25 to the peak, and Adam's beta1 falls linearly from 0.95 to 0.85;
- then to step total - 1: the rate falls linearly to peak / 25 / 10^4 and beta1 rises back to 0.95.

The rate is a LambdaLR factor (so resuming and ``optim.lr`` changes work as for every schedule here);
beta1 is written into each parameter group at every step, as OneCycleLR's ``cycle_momentum`` does
(it overrides the configured ``optim.betas[0]``; beta2 is left alone). SGD's ``momentum`` is cycled
the same way. The test compares both sequences with torch's OneCycleLR step by step.
"""

from __future__ import annotations

import torch

DIV_FACTOR = 25.0  # OneCycleLR's default: the rate starts at peak / 25
FINAL_DIV_FACTOR = 1e4  # ... and ends at (peak / 25) / 1e4
BASE_MOMENTUM, MAX_MOMENTUM = 0.85, 0.95  # OneCycleLR's defaults, cycled opposite to the rate


def _phases(warmup: int, total: int) -> tuple[float, float]:
    """The last step of each phase, as OneCycleLR computes them (pct_start = warmup / total)."""
    return float(warmup) - 1.0, float(total) - 1.0


def one_cycle_factor(step: int, warmup: int, total: int) -> float:
    """Rate at ``step`` divided by the peak rate. Past the last step it stays at its final value (the
    factor a scheduler holds after the last optimiser step; a linear anneal carried on would turn negative
    there, and OneCycleLR raises instead)."""
    first_end, last_end = _phases(warmup, total)
    step = min(step, int(last_end))
    initial = 1.0 / DIV_FACTOR
    final = initial / FINAL_DIV_FACTOR
    if step <= first_end:
        return initial + (1.0 - initial) * step / first_end if first_end > 0 else 1.0
    return 1.0 + (final - 1.0) * (step - first_end) / max(last_end - first_end, 1e-12)


def one_cycle_momentum(step: int, warmup: int, total: int) -> float:
    """beta1 (Adam) or momentum (SGD) at ``step`` (held at its final value past the last step)."""
    first_end, last_end = _phases(warmup, total)
    step = min(step, int(last_end))
    if step <= first_end:
        pct = step / first_end if first_end > 0 else 1.0
        return MAX_MOMENTUM + (BASE_MOMENTUM - MAX_MOMENTUM) * pct
    pct = (step - first_end) / max(last_end - first_end, 1e-12)
    return BASE_MOMENTUM + (MAX_MOMENTUM - BASE_MOMENTUM) * pct


class OneCycle(torch.optim.lr_scheduler.LambdaLR):
    """LambdaLR with the one-cycle rate, cycling beta1 / momentum alongside it."""

    def __init__(self, optimizer: torch.optim.Optimizer, *, warmup: int, total: int):
        if not 0 < warmup < total:
            raise ValueError(f"one_cycle needs 0 < optim.warmup < trainer.max_steps; got {warmup}, {total}")
        self.warmup, self.total = warmup, total
        super().__init__(optimizer, lambda step: one_cycle_factor(step, warmup, total))
        self.set_momentum()

    def step(self, epoch: int | None = None) -> None:
        super().step(epoch)
        self.set_momentum()

    def set_momentum(self) -> None:
        momentum = one_cycle_momentum(self.last_epoch, self.warmup, self.total)
        for group in self.optimizer.param_groups:
            if "betas" in group:
                group["betas"] = (momentum, *group["betas"][1:])
            elif "momentum" in group:
                group["momentum"] = momentum
