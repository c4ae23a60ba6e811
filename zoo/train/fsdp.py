"""Fully sharded data parallelism (FSDP2, ``torch.distributed.fsdp.fully_shard``): ``trainer.fsdp=true``.

Every rank of the run's one device mesh (:func:`zoo.train.distributed.run_mesh`: data x context) holds
a 1/world slice of every parameter, of its gradient and of the optimiser's state. Each block of the
stack is its own FSDP unit (its weights are gathered just before its forward and freed after it, and
again for its backward); the model itself is the root unit (embeddings, final norm, head). Gradients
are reduce-scattered over all ranks with the sum divided by the number of data replicas: the ranks
of a context group each hold a share of the sequence's loss (``zoo.parallel.context``), so their
gradients add up, while replicas average as under DDP; with no context parallelism this is DDP's
mean.

Mixed precision (``trainer.precision``): the forward runs under the same autocast as without FSDP
(:mod:`zoo.precision`), so the FSDP policy gathers the weights in their own dtype (float32; float64
in the equality tests) and reduces the gradients in float32 (``reduce_dtype``) at bf16 as at fp32.
A bf16 all-gather (``param_dtype=bfloat16``) is not offered: it would round the parameters the parts
deliberately keep in float32 under autocast (adaptive span's projection, the universal stack's halting
unit, RMSNorm's weight: ``grep -rn "# float32:" zoo``), so a bf16 run under FSDP would no longer train
the model a bf16 run trains on one process.

Refused at build time with the reason (:func:`fsdp_refusal`): a model without blocks to shard, a stack
whose backward calls its blocks' branches outside ``Block.forward`` (the reversible stack: FSDP
gathers a unit's weights only around that unit's forward and backward). Blocks that share a parameter (adaptive
span's relative key table) form one unit together (:func:`shard_groups`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from zoo.blocks import Block
from zoo.precision import PRECISIONS


def shard_units(model: nn.Module) -> list[Block]:
    """The blocks that become FSDP units: every :class:`~zoo.blocks.Block` not inside another one."""
    units: list[Block] = []
    for module in model.modules():
        if isinstance(module, Block) and not any(u is not module and _contains(u, module) for u in units):
            units.append(module)
    return units


def _contains(outer: nn.Module, inner: nn.Module) -> bool:
    return any(m is inner for m in outer.modules())


def fsdp_refusal(model: nn.Module) -> str | None:
    """Why ``model`` cannot be sharded block by block (asked of its stacks and its parameters), or None."""
    units = shard_units(model)
    if not units:
        return f"{model.config.name!r} has no blocks to shard"
    for stack in (m for m in model.modules() if hasattr(m, "fsdp_refusal")):
        reason = stack.fsdp_refusal()
        if reason is not None:
            return reason
    return None


def shard_groups(units: list[Block]) -> list[list[Block]]:
    """The FSDP units: one block each, except blocks that share a parameter (a table every layer reads,
    e.g. adaptive span's relative keys), which form one unit together, gathered and freed together."""
    groups: list[list[Block]] = []
    for unit in units:
        own = {id(p) for p in unit.parameters()}
        sharing = [g for g in groups if any(id(p) in own for block in g for p in block.parameters())]
        groups = [g for g in groups if all(g is not s for s in sharing)] + [[b for g in sharing for b in g] + [unit]]
    order = {id(unit): i for i, unit in enumerate(units)}
    return sorted(groups, key=lambda g: order[id(g[0])])


def mixed_precision(precision: str) -> MixedPrecisionPolicy:
    """The FSDP policy of ``trainer.precision``: weights gathered in their own dtype, gradients reduced in
    float32 (kept at float64 in float64 runs: ``reduce_dtype`` only ever widens); the forward's bf16 is
    autocast's, as without FSDP (see the module notes for why not a bf16 all-gather)."""
    if precision not in PRECISIONS:
        raise ValueError(f"trainer.precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    return MixedPrecisionPolicy(param_dtype=None, reduce_dtype=None, output_dtype=None, cast_forward_inputs=False)


def shard_model(model: nn.Module, mesh: DeviceMesh, *, precision: str = "fp32") -> nn.Module:
    """Shard ``model`` in place over every rank of ``mesh`` (data x context, flattened): each block a unit,
    the model the root. Every rank starts from rank 0's weights. Returns the model (now an FSDPModule)."""
    reason = fsdp_refusal(model)
    if reason is not None:
        raise ValueError(f"trainer.fsdp=true: {model.config.name} cannot be sharded block by block: {reason}")
    for tensor in [*model.parameters(), *model.buffers()]:  # the same start on every rank, as DDP does
        dist.broadcast(tensor.data, src=0)
    shard_mesh = mesh._flatten("shard") if mesh.ndim > 1 else mesh  # every rank holds 1/world of each weight
    policy = mixed_precision(precision)
    for group in shard_groups(shard_units(model)):
        fully_shard(group if len(group) > 1 else group[0], mesh=shard_mesh, mp_policy=policy)
    fully_shard(model, mesh=shard_mesh, mp_policy=policy)
    replicas = mesh.size(0) if mesh.ndim > 1 else mesh.size()
    for module in model.modules():  # context ranks add their shares of the loss, replicas average
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(float(replicas))
            # gloo has no pre-scaled sum (ReduceOp.PREMUL_SUM): sum, then divide on each rank
            module.set_force_sum_reduction_for_comms(mesh.device_type == "cpu")
    return model


@contextlib.contextmanager
def gradient_sync(model: nn.Module, enabled: bool) -> Iterator[None]:
    """Reduce-scatter the gradients after this backward (``enabled``), or accumulate them unsharded for a
    later micro-batch (FSDP's ``no_sync``)."""
    if enabled or not isinstance(model, FSDPModule):
        yield
        return
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


def local(tensor: Tensor) -> Tensor:
    """This rank's shard of a DTensor (a plain tensor as it is)."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def all_finite(model: nn.Module) -> bool:
    """Every parameter finite on every rank (all ranks get the same answer, so they refuse a save together)."""
    finite = all(bool(torch.isfinite(local(p)).all()) for p in model.parameters())
    if not (dist.is_available() and dist.is_initialized()):
        return finite
    flag = torch.tensor([int(finite)], device=next(local(p) for p in model.parameters()).device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def rank_bytes(model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> dict[str, int]:
    """Bytes this rank holds of the parameters and of the optimiser's state (its shards under FSDP)."""
    params = sum(local(p).numel() * local(p).element_size() for p in model.parameters())
    state = 0
    for entry in optimizer.state.values() if optimizer is not None else ():
        for value in entry.values():
            if isinstance(value, Tensor) and value.dim() > 0:  # a step counter is a scalar
                state += local(value).numel() * local(value).element_size()
    return {"param_bytes": params, "optimizer_bytes": state}
