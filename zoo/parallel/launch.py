"""Run a function on N real processes joined by gloo (forked, one thread each) and collect what each
rank returns: the harness of the context-parallel tests. A rank that raises reports its traceback;
a rank that hangs is killed after ``timeout`` seconds and the test fails, naming it."""

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


def _rank_main(rank: int, world: int, port: int, fn: Callable, args: tuple, results: Any) -> None:
    # what torchrun sets: the trainer reads its rank from the environment
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world)
    )
    try:
        torch.set_num_threads(1)  # small ops on a loaded 2-core machine: several threads are far slower
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


def run_ranks(world: int, fn: Callable, *args: Any, timeout: float = 240.0) -> list[Any]:
    """``fn(rank, world, *args)`` on ``world`` forked processes; returns their results by rank."""
    ctx = mp.get_context("fork")
    results, port = ctx.Queue(), free_port()
    procs = [ctx.Process(target=_rank_main, args=(r, world, port, fn, args, results)) for r in range(world)]
    for p in procs:
        p.start()
    got: dict[int, Any] = {}
    try:
        for _ in procs:
            rank, value, error = results.get(timeout=timeout)
            if error is not None:
                raise AssertionError(f"rank {rank} failed:\n{error}")
            got[rank] = torch.load(io.BytesIO(value), weights_only=False)
    finally:
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
    return [got[r] for r in range(world)]
