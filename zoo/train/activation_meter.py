"""Activation memory (bytes of the tensors autograd saves for backward) and step timing.

One meter for the trainer's ``mem/act_mib`` (``act_mib`` in ``result.json`` and the sweep summary)
and ``zoo.bench``'s ``act_mib``: a
``saved_tensors_hooks`` pack hook sees every tensor saved for backward; each storage is counted
once (views share one), and the module's parameters are left out (they are not activations)::

    meter = ActivationMeter(model)
    with meter:
        loss = model(tokens, targets).loss
    meter.bytes, meter.megabytes

Throughput is measured the same way in both places too: tokens of a forward + backward over its
seconds (:func:`synchronize` around it on CUDA), the median over steps after the first.
"""

from __future__ import annotations

import resource
from typing import Any

import torch
from torch import Tensor, nn
from torch.distributed.tensor import DTensor


class ActivationMeter:
    """Counts unique storages saved for backward while the meter is entered (parameters excluded)."""

    def __init__(self, module: nn.Module | None = None):
        params = list(module.parameters()) if module is not None else []
        # sharded (FSDP): a unit's weights are gathered into new storages around its forward, so they are
        # looked up when a tensor is saved, among the parameters the module holds at that moment
        self.module = module if any(isinstance(p, DTensor) for p in params) else None
        self.param_storages = set() if self.module is not None else {p.untyped_storage().data_ptr() for p in params}
        self.seen: dict[int, int] = {}
        self._hooks: Any = None

    def pack(self, tensor: Tensor) -> Tensor:
        storage = tensor.untyped_storage()
        ptr = storage.data_ptr()
        if ptr not in self.param_storages and ptr not in self.seen and not self.gathered_parameter(ptr):
            self.seen[ptr] = storage.nbytes()
        return tensor

    def gathered_parameter(self, ptr: int) -> bool:
        if self.module is None:
            return False
        for p in self.module.parameters():
            if not isinstance(p, DTensor) and p.untyped_storage().data_ptr() == ptr:
                self.param_storages.add(ptr)
                return True
        return False

    def __enter__(self) -> ActivationMeter:
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self.pack, lambda t: t)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._hooks.__exit__(*exc)
        self._hooks = None

    @property
    def bytes(self) -> int:
        return sum(self.seen.values())

    @property
    def megabytes(self) -> float:
        return self.bytes / 2**20


def synchronize(device: torch.device | str) -> None:
    """CUDA runs kernels asynchronously: wait for them so that a clock reading covers the work."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_memory_mib(device: torch.device, act_mib: float | None = None) -> dict[str, float]:
    """MiB (2**20 bytes), named as in ``zoo.bench``: ``act_mib`` (the activation meter, first step),
    ``gpu_peak_mib`` (CUDA max allocated), ``rss_peak_mib`` (the process's peak resident set)."""
    out = {"rss_peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    if device.type == "cuda":
        out["gpu_peak_mib"] = torch.cuda.max_memory_allocated(device) / 2**20
    if act_mib is not None:
        out["act_mib"] = act_mib
    return out
