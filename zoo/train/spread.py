"""How a training run spreads over its processes, on one device mesh: data parallelism (DDP), context
parallelism (``trainer.context_parallel=N``, :mod:`zoo.parallel.context`) and fully sharded data
parallelism (``trainer.fsdp=true``, :mod:`zoo.train.fsdp`), alone or together.

The mesh is ``(data, context)`` over every process (:func:`zoo.parallel.context.context_mesh`): the
ranks of one context group share each sequence, the groups are data replicas. DDP replicates over
``data``; FSDP shards every weight over the whole mesh (data x context flattened) and reduces the
gradients itself, in place of DDP's all-reduce and of the context group's gradient sum.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from zoo.parallel.context import ContextParallel, context_mesh
from zoo.train.distributed import DistInfo
from zoo.train.fsdp import gradient_sync, shard_model
from zoo.train.options import TrainerOptions


@dataclass
class Spread:
    """What the training step calls (``net``) and how its gradients meet across ranks."""

    model: nn.Module
    net: nn.Module
    context: ContextParallel | None = None
    mesh: DeviceMesh | None = None
    fsdp: bool = False

    def sync(self, last: bool) -> contextlib.AbstractContextManager:
        """What a micro-batch's backward runs under: on all but the ``last`` of a step the gradients stay
        local (DDP's ``no_sync``, FSDP's ``set_requires_gradient_sync(False)``)."""
        if self.fsdp:
            return gradient_sync(self.model, last)
        if last or self.context is not None or not isinstance(self.net, nn.parallel.DistributedDataParallel):
            return contextlib.nullcontext()
        return self.net.no_sync()

    def reduce_gradients(self) -> None:
        """After the last micro-batch: the context group's gradient sum (FSDP and DDP reduce in backward)."""
        if self.context is not None and not self.fsdp:
            self.context.sync_gradients()


def spread_model(model: nn.Module, opts: TrainerOptions, info: DistInfo, device: torch.device) -> Spread:
    """Wrap ``model`` (on ``device``) for the run ``opts`` and the process group ``info`` describe."""
    mesh = context_mesh(opts.context_parallel, device.type) if info.enabled or opts.fsdp else None
    spread = Spread(model, model, mesh=mesh, fsdp=opts.fsdp)
    if opts.context_parallel > 1:  # N ranks share each sequence
        spread.context = ContextParallel(model, mesh, layout=opts.context_layout)
        spread.context.layout(opts.seq_len)  # refuses a length the ranks cannot split, before any step
        spread.net = spread.context
    if opts.fsdp:
        shard_model(model, mesh, precision=opts.precision)
    elif info.enabled and spread.context is None:
        device_ids = [device.index] if device.type == "cuda" else None
        spread.net = nn.parallel.DistributedDataParallel(model, device_ids=device_ids, device_mesh=mesh["data"])
    if opts.compile:  # the training forward only; the model (evaluation, checkpoints) stays eager
        spread.net = torch.compile(spread.net)
    return spread
