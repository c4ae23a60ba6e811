"""Scoring: the task metric of a model on a split, and the scalars a step logs.

:func:`evaluate_model` carries the model's state from segment to segment on contiguous data for
every model that keeps segment memory (:func:`zoo.train.steps.carries_memory`: Transformer-XL's
memory, the adaptive-span cache), exactly as the library's own loops do, so a memory model is
scored with its memory, as in its paper's evaluation.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from zoo.config import IGNORE_INDEX
from zoo.data.base import Task, metric_value
from zoo.parallel.context import ContextParallel
from zoo.train import distributed
from zoo.train.steps import initial_state


def score_batch(logits: Tensor, batch: dict[str, Tensor]) -> tuple[float, float, float]:
    """(summed NLL in nats, correct predictions, scored items) of one batch (LM or classifier)."""
    targets = batch["targets"]
    if logits.dim() == 3:  # LM: [b, t, V]
        targets = targets.masked_fill(~batch["pad_mask"], IGNORE_INDEX) if "pad_mask" in batch else targets
        flat_logits, flat_targets = logits.float().flatten(0, 1), targets.flatten()
    else:  # classifier: [b, C]
        flat_logits, flat_targets = logits.float(), targets
    scored = flat_targets != IGNORE_INDEX
    nll = F.cross_entropy(flat_logits, flat_targets, ignore_index=IGNORE_INDEX, reduction="sum")
    correct = ((flat_logits.argmax(-1) == flat_targets) & scored).sum()
    return float(nll), float(correct), float(scored.sum())


PER_ELEMENT_STATS = 64  # a 1-D statistic this short (one value per head) is logged per element too


def scalar_stats(stats: dict[str, Any], prefix: str) -> dict[str, float]:
    """Mechanism statistics (tensors or numbers) as named floats for the loggers: a tensor's mean, and a short
    1-D one (a value per head, e.g. adaptive span's ``span``) also element by element as ``<key>/<i>``, so a
    training run's log holds each head's trajectory."""
    out = {}
    for key, value in stats.items():
        if isinstance(value, Tensor) and value.numel():
            out[f"{prefix}{key}"] = float(value.detach().float().mean())
            if value.dim() == 1 and 1 < value.numel() <= PER_ELEMENT_STATS:
                out.update({f"{prefix}{key}/{i}": v for i, v in enumerate(value.detach().float().tolist())})
        elif isinstance(value, (int, float)):
            out[f"{prefix}{key}"] = float(value)
    return out


@torch.no_grad()
def evaluate_model(
    model: nn.Module,
    task: Task,
    split: str = "val",
    max_batches: int | None = 0,
    *,
    device: torch.device | None = None,
    autocast: Callable[[], Any] = contextlib.nullcontext,
    rank: int = 0,
    world_size: int = 1,
) -> dict[str, float]:
    """The task metric of ``model`` on ``split`` (``max_batches`` 0/None = the whole split). A model split
    over a context group (:class:`~zoo.parallel.context.ContextParallel`) scores its chunk of each batch;
    the sum over every rank then counts each token once. ``rank``/``world_size``: the data replica."""
    device = device or next(model.parameters()).device
    was_training = model.training
    model.eval()
    nll = correct = count = 0.0
    state: Any = None
    for index, batch in enumerate(task.eval_batches(split, max_batches, rank=rank, world_size=world_size)):
        batch = {k: v.to(device) for k, v in batch.items()}
        if task.contiguous and task.starts_stream(index, split):
            state = initial_state(model, next(iter(batch.values())).shape[0])
        with autocast():
            out = model(**batch, state=state) if state is not None else model(**batch)
        state = out.state if task.contiguous else None
        n, c, k = score_batch(out.logits, model.local_batch(batch) if isinstance(model, ContextParallel) else batch)
        nll, correct, count = nll + n, correct + c, count + k
    model.train(was_training)
    nll, correct, count = distributed.all_sum([nll, correct, count], device)
    return {
        f"{split}/loss": nll / max(count, 1),
        f"{split}/accuracy": correct / max(count, 1),
        f"{split}/{task.metric}": metric_value(task.metric, nll, correct, count),
        f"{split}/scored": count,
    }
