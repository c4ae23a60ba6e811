"""Run a function on N local processes joined by gloo (forked, one thread each) and collect what each
rank returns: the context-parallel tests and ``zoo.bench.context`` on one machine (a cluster launches
with ``torchrun`` or SLURM instead). A rank that raises reports its traceback and the call fails with
it; a rank that hangs is killed after ``timeout`` seconds."""

from __future__ import annotations

import io
import multiprocessing as mp
import os
import socket
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, world: int, port: int, fn: Callable, args: tuple, results: Any, threads: int) -> None:
    # what torchrun sets: the trainer reads its rank from the environment
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world)
    )
    try:
        torch.set_num_threads(threads)  # small ops on a loaded machine: several threads per rank are far slower
        dist.init_process_group("gloo", rank=rank, world_size=world)
        value = fn(rank, world, *args)
        buffer = io.BytesIO()
        torch.save(value, buffer)  # bytes, not shared memory: the rank may exit before the parent reads
        results.put((rank, buffer.getvalue(), None))
    except BaseException:
        results.put((rank, None, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_ranks(world: int, fn: Callable, *args: Any, timeout: float = 240.0, threads: int = 1) -> list[Any]:
    """``fn(rank, world, *args)`` on ``world`` forked processes (``threads`` torch threads each) joined by
    gloo; returns what each returned (tensors and plain types), by rank."""
    ctx = mp.get_context("fork")
    results, port = ctx.Queue(), free_port()
    procs = [ctx.Process(target=_rank_main, args=(r, world, port, fn, args, results, threads)) for r in range(world)]
    for p in procs:
        p.start()
    got: dict[int, Any] = {}
    try:
        for _ in procs:
            rank, value, error = results.get(timeout=timeout)
            if error is not None:
                raise RuntimeError(f"rank {rank} failed:\n{error}")
            got[rank] = torch.load(io.BytesIO(value), weights_only=False)
    finally:
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
    return [got[r] for r in range(world)]
