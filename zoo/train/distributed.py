"""Data-parallel helpers for ``torchrun``: rank/world from the environment, gloo on CPU and nccl on
CUDA, and sums across ranks. A single process is world size 1 and every helper is a no-op."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def from_env() -> DistInfo:
    """Read torchrun's RANK / WORLD_SIZE / LOCAL_RANK (defaults: one process)."""
    return DistInfo(
        int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("LOCAL_RANK", 0))
    )


def setup(device: torch.device) -> DistInfo:
    """Join the process group torchrun set up (once); gloo for CPU, nccl for CUDA."""
    info = from_env()
    if info.enabled and not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return info


def all_sum(values: list[float], device: torch.device) -> list[float]:
    """Sum each value over ranks (eval statistics)."""
    if not (dist.is_available() and dist.is_initialized()):
        return values
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()


def barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def broadcast_flag(flag: bool, device: torch.device) -> bool:
    """True on every rank when rank 0 says so (e.g. stop on the time budget together)."""
    if not (dist.is_available() and dist.is_initialized()):
        return flag
    t = torch.tensor([1 if flag else 0], device=device)
    dist.broadcast(t, 0)
    return bool(t.item())
