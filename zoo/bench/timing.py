"""The one timing core: timed steps, paired alternating rounds and their ratios, activation bytes.

``python -m zoo.bench``, the LRA Table 2 timing (:func:`zoo.app.lra_speed.measure_speed`) and the
experiment scripts that time things all measure here, so a speed-up means the same everywhere:

- one step is timed with :func:`clocked` (any callable) or :func:`timed_step` (forward + backward of
  a loss closure), synchronised on CUDA before and after;
- variants compared with each other run in **paired rounds** (:func:`paired_rounds`): each round
  times one step of every variant back to back, in an order rotated by one each round
  (A B C, B C A, C A B), after one warm-up round that is not recorded. On a shared machine the
  load drifts by several times within minutes; timing one variant after another would turn their
  ratio into a ratio of two load levels, while each round gives ratios under nearly the same load
  and no variant always runs first or last. :func:`paired_ratios` turns the rounds into each
  variant's median seconds and its median speed-up over a baseline with the min-max over rounds;
- activation memory is the bytes of tensors saved for backward, counted by
  :class:`zoo.train.activation_meter.ActivationMeter` (the trainer's ``act_mib`` too): exact and noise-free on CPU.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from zoo.train.activation_meter import ActivationMeter, synchronize
from zoo.train.options import pick_device as trainer_pick_device

Step = Callable[[], float]  # runs one step, returns its seconds


def pick_device(name: str = "auto") -> torch.device:
    """``--device``: auto (CUDA when present, else CPU), cpu, cuda, cuda:N (the trainer's rule)."""

    try:
        return trainer_pick_device(name)
    except ValueError as error:
        message = str(error).replace("trainer.device=auto", "--device auto")
        raise ValueError(message.replace("trainer.device", "--device")) from None


def clocked(fn: Callable[[], Any], device: torch.device | str = "cpu") -> Step:
    """A step for :func:`paired_rounds`: calls ``fn()`` and returns its seconds, synchronised on CUDA
    before and after so the clock covers the kernels ``fn`` queued."""

    def step() -> float:
        synchronize(device)
        start = time.perf_counter()
        fn()
        synchronize(device)
        return time.perf_counter() - start

    return step


def timed_step(module: nn.Module, loss_fn: Callable[[Tensor], Tensor], tokens: Tensor) -> float:
    """Seconds of one forward + backward (synchronised on CUDA before and after)."""
    synchronize(tokens.device)
    start = time.perf_counter()
    loss_fn(tokens).backward()
    synchronize(tokens.device)
    elapsed = time.perf_counter() - start
    module.zero_grad(set_to_none=True)
    return elapsed


def time_steps(
    module: nn.Module,
    loss_fn: Callable[[Tensor], Tensor],
    tokens: Tensor,
    warmup: int,
    repeats: int,
    max_seconds: float,
) -> list[float]:
    """Seconds per forward + backward; fewer repeats when one step alone exceeds ``max_seconds``."""
    module.train()
    times = []
    for i in range(warmup + repeats):
        elapsed = timed_step(module, loss_fn, tokens)
        if i >= warmup:
            times.append(elapsed)
        if elapsed > max_seconds and (i >= warmup or warmup + repeats > 1):
            if i < warmup:  # a warm-up this slow: time one more step and stop
                times.append(timed_step(module, loss_fn, tokens))
            break
    return times


def activation_bytes(module: nn.Module, loss_fn: Callable[[Tensor], Tensor], tokens: Tensor) -> int:
    """Bytes saved for backward by one forward of ``loss_fn(tokens)`` (``module``'s parameters excluded)."""
    with ActivationMeter(module) as meter:
        loss = loss_fn(tokens)
    del loss  # the count is complete once forward has run; a backward here would only cost time
    return meter.bytes


def gpu_peak_mib(module: nn.Module, loss_fn: Callable[[Tensor], Tensor], tokens: Tensor) -> float:
    """Peak CUDA memory allocated during one training step (weights, activations, gradients, workspace)."""
    synchronize(tokens.device)
    torch.cuda.reset_peak_memory_stats(tokens.device)
    timed_step(module, loss_fn, tokens)
    return torch.cuda.max_memory_allocated(tokens.device) / 2**20


def rss_kib() -> int:
    """Resident memory of this process now (KiB)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * (os.sysconf("SC_PAGE_SIZE") // 1024)


# -- paired timing: variants in alternating rounds ----------------------------------------------


def rotation(labels: list[str], round_index: int) -> list[str]:
    """The order of round ``round_index``: ``labels`` rotated left by ``round_index``."""
    shift = round_index % len(labels)
    return labels[shift:] + labels[:shift]


def paired_rounds(
    steps: dict[str, Step],
    rounds: int,
    *,
    probe: Step | None = None,
    progress: Callable[[str], None] = print,
) -> list[dict[str, float]]:
    """Seconds per step of every variant in ``rounds`` recorded rounds, after one warm-up round that is
    not recorded; ``steps[label]()`` runs one step and returns its seconds. ``probe`` (the matmul
    rate probe of ``--flops``) runs before and after each round; its faster time is recorded."""
    labels = list(steps)
    recorded = []
    for round_index in range(-1, rounds):  # round -1: warm-up (allocator, lazy init, compilation)
        seconds = {"matmul_probe": probe()} if probe else {}
        ran = {label: steps[label]() for label in rotation(labels, round_index + 1)}
        seconds.update((label, ran[label]) for label in labels)  # recorded in the given order
        if probe:
            seconds["matmul_probe"] = min(seconds["matmul_probe"], probe())
        progress(
            f"round {round_index:2d}  "
            + "  ".join(f"{k} {v * 1e3:,.1f} ms" for k, v in seconds.items())
            + f"  load {os.getloadavg()[0]:.1f}"
        )
        if round_index >= 0:
            recorded.append(seconds)
    return recorded


def paired_ratios(rounds: list[dict[str, float]], baseline: str) -> dict[str, dict[str, float]]:
    """Per variant: median seconds, and the speed-up over ``baseline`` (baseline time / variant time,
    taken per round: > 1 is faster) as the median over rounds with its min and max."""
    if not rounds or baseline not in rounds[0]:
        raise ValueError(
            f"--baseline {baseline!r} is not a measured variant; "
            f"choose one of: {', '.join(k for k in (rounds[0] if rounds else {}) if k != 'matmul_probe')}"
        )
    out = {}
    for label in (k for k in rounds[0] if k != "matmul_probe"):
        ratios = [r[baseline] / r[label] for r in rounds]
        out[label] = dict(
            median_s=statistics.median(r[label] for r in rounds),
            ratio=statistics.median(ratios),
            ratio_min=min(ratios),
            ratio_max=max(ratios),
        )
    return out


def matmul_probe(length: int, shape: dict[str, int], device: torch.device) -> tuple[Step, float]:
    """(seconds of one [t, d] x [d, d_ff] matmul, its FLOPs): the machine's achievable matmul rate at
    the feed-forward's shape, under the round's load."""
    a = torch.randn(length * shape["batch"], shape["d_model"], device=device)
    b = torch.randn(shape["d_model"], shape["d_ff"], device=device)

    def probe() -> float:
        synchronize(device)
        start = time.perf_counter()
        for _ in range(10):
            torch.mm(a, b)
        synchronize(device)
        return (time.perf_counter() - start) / 10

    return probe, 2.0 * a.shape[0] * a.shape[1] * b.shape[1]
