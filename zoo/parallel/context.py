"""Context parallelism for a causal language model: N ranks share each sequence (``trainer.context_parallel=N``).

The processes form a ``DeviceMesh`` of data x context (:func:`context_mesh`): the ranks of one row read
the same rows of data (a data-parallel replica) and each holds one chunk of every sequence
(``chunk.py``'s layouts). :class:`ContextParallel` wraps a built model:

- the model is called on this rank's chunk while :func:`zoo.parallel.chunk.splitting` is active, so
  position signals number tokens by their place in the whole sequence and every attention layer runs
  its ``attend_chunk``, which reads from the other ranks only what its pattern sees;
- the loss is the whole sequence's: the value is the mean over every scored token of the context group
  (identical on its ranks); the gradient each rank backpropagates is its share (its tokens' summed loss
  over the group's count), so the gradients summed over the context ranks are the whole loss's;
  auxiliary losses are averaged over the context ranks the same way (exact for a loss that is the same
  on every rank, like a learned span's penalty, or a mean over equally many tokens per rank); the
  logged statistics are averaged too, ``scored`` summed;
- :meth:`ContextParallel.sync_gradients` sums the gradients over the context ranks and averages them
  over the data replicas (one all-reduce over the world, in place of DDP's);
- a state (XL memory, the adaptive-span cache) goes in and comes out as the whole sequence's, the same
  on every rank, so checkpoints and evaluation carry it as one process would;
- random draws are the same on every rank of a group (one seed, the same calls): draws made per sequence
  (random position offsets) agree as they must, and a dropout mask repeats at the same offset of every
  chunk, which one process would not do (the equality tests run without dropout).

Refused up front, with the part's reason (``context_refusal``): heads other than the LM, Al-Rfou
et al.'s auxiliary losses (their extra targets lie in the next chunk), a stack that does not say it runs
on chunks, and every attention layer that does not say what it reads of other chunks.

Use in a loop of one's own (under ``torchrun``)::

    dist.init_process_group("gloo")
    cp = ContextParallel(model, context_mesh(2))     # 2 ranks per sequence, world / 2 data replicas
    rows = task.batch("train", i, rank=cp.data_rank, world_size=cp.data_size)   # whole sequences
    out = cp(rows["tokens"], rows["targets"])        # out.loss: the whole sequence's mean
    out.loss.backward(); cp.sync_gradients(); optimizer.step()
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from zoo.blocks import Block
from zoo.models.base import ModelOutput
from zoo.parallel.chunk import LAYOUTS, Chunk, Layout, splitting


def context_mesh(context: int, device_type: str = "cpu") -> DeviceMesh:
    """A (data, context) mesh over every process: world / ``context`` replicas of ``context`` ranks,
    ranks d * context ... d * context + context - 1 sharing replica d's sequences."""
    world = dist.get_world_size()
    if not (isinstance(context, int) and context >= 1 and world % context == 0):
        raise ValueError(
            f"trainer.context_parallel={context} must be a positive divisor of the number of processes ({world}): "
            f"each sequence is shared by that many ranks and the rest form data-parallel replicas"
        )
    return init_device_mesh(device_type, (world // context, context), mesh_dim_names=("data", "context"))


def blocks_of(model: nn.Module) -> list[Block]:
    return [m for m in model.stack.modules() if isinstance(m, Block)]


def context_refusal(model: nn.Module) -> str | None:
    """Why ``model`` cannot run with its sequences split over ranks (asked of its parts), or None."""
    config = model.config
    if config.kind != "lm":
        return (
            f"context parallelism splits a causal language model's sequences; {config.name!r} is a {config.kind!r} "
            "model"
        )
    if config.aux_losses:
        return "aux_losses (Al-Rfou et al.'s intermediate and multiple-target losses) read targets of the next chunk"
    reason = model.stack.context_refusal()
    if reason is not None:
        return reason
    for i, block in enumerate(blocks_of(model)):
        reason = block.attention.context_refusal() or block.feed_forward.context_refusal()
        if reason is not None:
            return f"layer {i}: {reason}"
    return None


def pick_layout(model: nn.Module, layout: str) -> str:
    """``layout`` (contiguous | zigzag), or for "auto" the first of the layers' preferences all of them run on."""
    accepted = [block.attention.context_layouts() for block in blocks_of(model)]
    if layout == "auto":
        return next(kind for kind in accepted[0] if all(kind in a for a in accepted))
    if layout not in LAYOUTS:
        raise ValueError(f"trainer.context_layout must be auto, {' or '.join(LAYOUTS)}; got {layout!r}")
    for block, kinds in zip(blocks_of(model), accepted):
        if layout not in kinds:
            raise ValueError(
                f"trainer.context_layout={layout}: attention {block.attention.registry_name!r} runs on "
                f"{' or '.join(kinds)} chunks only (a bounded pattern reads a halo from its left neighbour); use auto"
            )
    return layout


class ContextParallel(nn.Module):
    """``model`` (a causal LM) with every sequence split over the context ranks of ``mesh``; called like
    the model, with whole sequences on every rank of a context group. ``logits`` and ``hidden`` come
    back for this rank's chunk (:meth:`shard` cuts the matching targets); loss, aux losses and state are
    the whole sequence's."""

    def __init__(self, model: nn.Module, mesh: DeviceMesh, *, layout: str = "auto"):
        super().__init__()
        reason = context_refusal(model)
        if reason is not None:
            raise ValueError(f"{model.config.name} cannot run with its sequences split over ranks: {reason}")
        if mesh.mesh_dim_names != ("data", "context") or mesh.size() != dist.get_world_size():
            raise ValueError("the mesh must be context_mesh(N): (data, context) over every process")
        self.model, self.mesh = model, mesh
        self.group = mesh.get_group("context")
        self.size, self.rank = mesh.size(1), mesh.get_local_rank("context")
        self.data_size, self.data_rank = mesh.size(0), mesh.get_local_rank("data")
        self.peers = tuple(dist.get_global_rank(self.group, r) for r in range(self.size))
        self.layout_kind = pick_layout(model, layout)
        for tensor in [*model.parameters(), *model.buffers()]:  # every rank starts from rank 0's weights
            dist.broadcast(tensor.data, src=0)

    @property
    def config(self):
        return self.model.config

    def layout(self, length: int) -> Layout:
        """The split of a sequence of ``length`` positions; refuses a length that does not divide."""
        pieces = self.size * (2 if self.layout_kind == "zigzag" else 1)
        if length % pieces:
            raise ValueError(
                f"sequence length {length} (trainer.seq_len) must be a multiple of {pieces}: "
                f"trainer.context_parallel={self.size} ranks hold {pieces} equal pieces ({self.layout_kind} layout)"
            )
        return Layout(self.layout_kind, self.size, length)

    def chunk(self, length: int) -> Chunk:
        return Chunk(self.layout(length), self.rank, self.group, self.peers)

    def shard(self, x: Tensor | None, dim: int = 1) -> Tensor | None:
        """This rank's part of a whole-sequence tensor [b, T, ...] (None stays None)."""
        return None if x is None else self.layout(x.shape[dim]).shard(x, self.rank, dim)

    def local_batch(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        """A batch of whole sequences ({tokens, targets, pad_mask}: [b, T]) cut to this rank's chunk."""
        return {key: self.shard(value) for key, value in batch.items()}

    # -- what the trainer and the step helpers ask of a model --------------------------------------------
    def init_state(self, batch_size: int) -> Any:
        return self.model.init_state(batch_size)

    def attentions_keep_state(self) -> bool:
        return self.model.attentions_keep_state()

    def forward(
        self,
        tokens: Tensor | None = None,
        targets: Tensor | None = None,
        *,
        embeds: Tensor | None = None,
        pad_mask: Tensor | None = None,
        state: Any = None,
    ) -> ModelOutput:
        """Whole sequences in (tokens [b, T] or embeds [b, T, d], the same on every rank of the group);
        this rank's chunk of logits and hidden states out, with the whole sequence's loss and state."""
        length = (tokens if tokens is not None else embeds).shape[1]
        with splitting(self.chunk(length)):
            out = self.model(
                self.shard(tokens),
                self.shard(targets),
                embeds=self.shard(embeds),
                pad_mask=self.shard(pad_mask),
                state=state,
            )
        if out.state is not None:  # the model counted this rank's tokens; the stream moved on by the sequence
            out.state = dataclasses.replace(out.state, offset=(state.offset if state is not None else 0) + length)
        return self.whole_sequence(out)

    def whole_sequence(self, out: ModelOutput) -> ModelOutput:
        """Loss, aux losses and statistics over the context group (one all-reduce): values of the whole
        sequence, gradients of this rank's share (see the module notes)."""
        names = sorted(out.aux_losses)
        stats = {k: v for k, v in sorted(out.stats.items()) if isinstance(v, Tensor) and k != "scored"}
        scored = out.stats.get("scored")
        local_sum = out.loss * scored if out.loss is not None else None
        head = [local_sum, scored] if local_sum is not None else []
        values = [*head, *(out.aux_losses[n] for n in names), *stats.values()]
        if not values:
            return out
        flat = torch.cat([v.detach().reshape(-1).to(torch.float64) for v in values])
        dist.all_reduce(flat, group=self.group)
        parts = iter(flat.split([v.numel() for v in values]))
        if local_sum is not None:
            total_sum, total_scored = next(parts), next(parts)
            count = total_scored.clamp_min(1).to(out.loss.dtype)
            share = local_sum / count
            out.loss = share + (total_sum.to(share.dtype) / count - share).detach()
            out.stats["scored"] = total_scored.reshape(scored.shape).to(scored.dtype)
        for name in names:
            value = out.aux_losses[name]
            share = value / self.size
            out.aux_losses[name] = (
                share + (next(parts).reshape(value.shape).to(value.dtype) / self.size - share).detach()
            )
        for key, value in stats.items():
            out.stats[key] = (next(parts) / self.size).reshape(value.shape).to(value.dtype)
        return out

    @torch.no_grad()
    def sync_gradients(self) -> None:
        """Sum every gradient over the context ranks (each holds its share) and average over the data
        replicas: one all-reduce over the world, divided by the number of replicas. A parameter this rank
        did not use contributes zeros."""
        params = [p for p in self.model.parameters() if p.requires_grad]
        for dtype in dict.fromkeys(p.dtype for p in params):
            group = [p for p in params if p.dtype == dtype]
            flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in group])
            dist.all_reduce(flat)
            flat /= self.data_size
            for p, part in zip(group, flat.split([p.numel() for p in group])):
                p.grad = part.view_as(p).clone()
