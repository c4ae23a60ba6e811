"""Data-parallel helpers for ``torchrun``: rank/world from the environment, gloo on CPU and nccl on
CUDA, and sums across ranks. A single process is world size 1 and every helper is a no-op.

With context parallelism (``trainer.context_parallel=N``, ``zoo/parallel``) N consecutive ranks share
each sequence: they read the same rows, so the data is split over ``data_world = world_size / N``
replicas and rank r reads replica ``data_rank = r // N``'s rows."""

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
    context: int = 1  # ranks sharing each sequence (context parallelism)
    own_group: bool = False  # the one-process group setup() made (destroyed by teardown)

    @property
    def data_rank(self) -> int:
        """Which data-parallel replica this rank belongs to (the rows it reads)."""
        return self.rank // self.context

    @property
    def data_world(self) -> int:
        """Data-parallel replicas: processes / ranks per sequence."""
        return self.world_size // self.context

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def from_env(context: int = 1) -> DistInfo:
    """Read torchrun's RANK / WORLD_SIZE / LOCAL_RANK (defaults: one process); ``context`` ranks share
    each sequence, refused unless they divide the processes."""
    info = DistInfo(
        int(os.environ.get("RANK", 0)),
        int(os.environ.get("WORLD_SIZE", 1)),
        int(os.environ.get("LOCAL_RANK", 0)),
        context,
    )
    if context > 1 and info.world_size % context:
        launch = "torchrun --nproc_per_node=N" if info.world_size == 1 else f"{info.world_size} processes"
        raise ValueError(
            f"trainer.context_parallel={context} ranks share each sequence, but this run has {info.world_size} "
            f"process(es): launch a multiple of {context} ({launch}), or set trainer.context_parallel=1"
        )
    return info


def setup(device: torch.device, context: int = 1, *, one_process_group: bool = False) -> DistInfo:
    """Join the process group torchrun set up (once); gloo for CPU, nccl for CUDA. A single process
    started without torchrun gets a group of one when ``one_process_group`` (FSDP shards over a mesh,
    even of one rank, so ``trainer.fsdp=true`` runs, saves and resumes the same way in one process)."""
    info = from_env(context)
    backend = "nccl" if device.type == "cuda" else "gloo"
    if info.enabled and not dist.is_initialized():
        dist.init_process_group(backend)
    elif one_process_group and not dist.is_initialized():
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
        info.own_group = True
    return info


def teardown(info: DistInfo) -> None:
    """Destroy the one-process group :func:`setup` made (torchrun's group is the launcher's business)."""
    if info.own_group and dist.is_initialized():
        dist.destroy_process_group()
        info.own_group = False


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
