"""Context parallelism measured on one machine: activation bytes per rank, the longest sequence a per-rank
budget holds, and the time of a training step with N ranks (gloo) beside one process.

Every measurement runs in fresh processes (:func:`zoo.parallel.launch.run_ranks`, one thread each): N = 1
is the plain model in one process, N > 1 the model under :class:`~zoo.parallel.context.ContextParallel`
with each sequence split over the N ranks. The study ``context_parallel`` (``zoo/studies/context_parallel.py``)
runs them.

- Bytes: the tensors one forward saves for backward on each rank (``ActivationMeter``, the trainer's
  ``act_mib``: exact on CPU), the received halo and ring blocks included; buffers that live only inside
  a step (the ring's block in flight, a chunk's score mask) are not counted.
- Longest within a budget: the largest length on a grid whose most loaded rank saves at most the budget,
  found by doubling and then bisection, every probe a real forward on N processes (never extrapolated).
- Time: forward + backward (+ the gradient all-reduce) of one step, in rounds; each round launches every
  N once in an order rotated round by round, so the ratio to one process is taken under nearly the same
  load. On a 2-core CPU with gloo, N processes share the same two cores: this measures the cost of the
  exchanges, not a speed-up.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from zoo.bench.timing import rotation
from zoo.parallel.context import ContextParallel, context_mesh
from zoo.parallel.launch import run_ranks
from zoo.presets import create_model
from zoo.train.activation_meter import ActivationMeter


@dataclass(frozen=True)
class Setup:
    """A model to split: ``preset`` with ``overrides`` at the benchmark's shape (``shape``)."""

    label: str
    preset: str = "vanilla_lm"
    overrides: dict[str, Any] = field(default_factory=dict)
    shape: dict[str, Any] = field(
        default_factory=lambda: {
            "vocab_size": 256,
            "d_model": 128,
            "n_heads": 4,
            "n_layers": 2,
            "d_ff": 512,
            "dropout": 0.0,
            "max_len": 1 << 20,
        }
    )

    def build(self) -> torch.nn.Module:
        torch.manual_seed(0)
        return create_model(self.preset, **{**self.shape, **self.overrides})


def _net(setup: Setup, world: int) -> tuple[torch.nn.Module, torch.nn.Module]:
    model = setup.build()
    return model, (model if world == 1 else ContextParallel(model, context_mesh(world)))


def _bytes_on_rank(rank: int, world: int, setup: Setup, length: int) -> int:
    model, net = _net(setup, world)
    tokens = torch.randint(0, setup.shape["vocab_size"], (1, length), generator=torch.Generator().manual_seed(0))
    meter = ActivationMeter(model)
    with meter:
        net(tokens, tokens)
    return meter.bytes


def bytes_per_rank(setup: Setup, world: int, length: int) -> list[int]:
    """Bytes one forward over a sequence of ``length`` saves for backward, on each of ``world`` ranks."""
    return run_ranks(world, _bytes_on_rank, setup, length, timeout=1800)


def longest_within(setup: Setup, world: int, budget: int, grain: int) -> dict[str, Any]:
    """The longest multiple of ``grain`` whose most loaded rank saves at most ``budget`` bytes, and every
    probe made to find it (length -> bytes of the most loaded rank)."""
    probes: dict[int, int] = {}

    def fits(length: int) -> bool:
        probes[length] = max(bytes_per_rank(setup, world, length))
        return probes[length] <= budget

    low, high = 0, grain
    while fits(high):  # doubling until a length does not fit
        low, high = high, 2 * high
    while high - low > grain:
        mid = (low + high) // 2 // grain * grain
        low, high = (mid, high) if fits(mid) else (low, mid)
    return {"longest": low, "bytes_at_longest": probes.get(low), "probes": probes}


def _steps_on_rank(rank: int, world: int, setup: Setup, length: int, steps: int) -> list[float]:
    model, net = _net(setup, world)
    tokens = torch.randint(0, setup.shape["vocab_size"], (1, length), generator=torch.Generator().manual_seed(0))
    times = []
    for step in range(steps + 1):  # the first step warms up, unrecorded
        model.zero_grad(set_to_none=True)
        dist.barrier()
        start = time.perf_counter()
        net(tokens, tokens).loss.backward()
        if world > 1:
            net.sync_gradients()
        dist.barrier()  # the step ends when the slowest rank is done
        if step:
            times.append(time.perf_counter() - start)
    return times


def step_rounds(
    setup: Setup, runs: list[tuple[int, int]], length: int, rounds: int, steps: int
) -> list[dict[str, Any]]:
    """``rounds`` rounds; in each, every (ranks, threads per rank) of ``runs`` (in a rotated order) times
    ``steps`` steps after a warm-up; one row per round and run with the median step time."""
    rows = []
    labels = [f"{world}x{threads}" for world, threads in runs]
    for index in range(rounds):
        for label in rotation(labels, index):
            world, threads = (int(x) for x in label.split("x"))
            times = run_ranks(world, _steps_on_rank, setup, length, steps, timeout=1800, threads=threads)[0]
            rows.append(
                {
                    "setup": setup.label,
                    "ranks": world,
                    "threads": threads,
                    "round": index,
                    "step_s": statistics.median(times),
                }
            )
    return rows
