"""Training pieces shared by the Hydra application, the reproductions and the tests.

From Vaswani et al. 2017, Section 5.3: Adam(beta1=0.9, beta2=0.98, eps=1e-9) with
lrate = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5); label smoothing lives in the models'
loss (``ModelConfig.label_smoothing``). Plus what every variant needs around a step: summing the
weighted aux losses (span L1, ACT ponder cost), gradient clipping, and the post-step hooks some
mechanisms declare (``after_optimizer_step``, e.g. clamping a learned span).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from zoo.attention.base import Attention
from zoo.models.base import ModelOutput, map_tensors
from zoo.train.one_cycle import OneCycle


def adam(
    model: nn.Module,
    lr: float = 1.0,
    *,
    betas: tuple[float, float] = (0.9, 0.98),
    eps: float = 1e-9,
    weight_decay: float = 0.0,
    decoupled: bool = False,
) -> torch.optim.Optimizer:
    """The paper's Adam; with the Noam schedule ``lr`` is a multiplier (1.0 = the paper).

    ``weight_decay`` is Adam's L2 penalty (added to the gradient, so it passes through the moment
    estimates), or with ``decoupled=True`` AdamW's decay (Loshchilov & Hutter 2019, applied to the
    weights directly). The optimiser built is the one named: Adam stays Adam."""
    if decoupled:
        return torch.optim.AdamW(model.parameters(), lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
    return torch.optim.Adam(model.parameters(), lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)


def noam_lambda(d_model: int, warmup: int) -> Callable[[int], float]:
    """lrate(step) = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), step counted from 1."""
    if warmup < 1:
        raise ValueError(f"warmup must be >= 1, got {warmup}")

    def rate(step: int) -> float:
        step = max(step, 1)
        return d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)

    return rate


def cosine_lambda(warmup: int, total: int, min_ratio: float = 0.1) -> Callable[[int], float]:
    """Linear warm-up to 1 over ``warmup`` steps, then cosine decay to ``min_ratio`` at ``total``."""
    if total < 1 or warmup < 0:
        raise ValueError(f"need total >= 1 and warmup >= 0; got total={total}, warmup={warmup}")

    def rate(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return rate


def schedule(
    optimizer: torch.optim.Optimizer,
    name: str,
    *,
    d_model: int = 512,
    warmup: int = 4000,
    total: int = 100_000,
    min_ratio: float = 0.1,
) -> torch.optim.lr_scheduler.LambdaLR:
    """``noam`` (the paper's; use lr=1), ``cosine`` (warm-up + cosine down to ``min_ratio`` x lr),
    ``constant`` (a linear warm-up over ``warmup`` steps, then lr: the adaptive-span authors' LambdaLR
    ``min(1, step / warmup)``, their step counted from 1), or ``one_cycle`` (torch's OneCycleLR with a
    linear anneal: zoo/train/one_cycle.py)."""
    if name == "noam":
        fn = noam_lambda(d_model, max(1, warmup))  # warm-up 0 means the shortest, one step
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: fn(step + 1))
    if name == "cosine":
        return torch.optim.lr_scheduler.LambdaLR(optimizer, cosine_lambda(warmup, total, min_ratio))
    if name == "one_cycle":
        return OneCycle(optimizer, warmup=warmup, total=total)
    if name == "constant":  # the rate of update k (from 0) is lr * min(1, (k + 1) / warmup)
        return torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: min(1.0, (step + 1) / warmup) if warmup else 1.0
        )
    raise ValueError(f"unknown schedule {name!r}; valid: noam, cosine, constant, one_cycle")


def total_loss(out: ModelOutput) -> Tensor:
    """Task loss plus every (already weighted) auxiliary loss."""
    if out.loss is None:
        raise ValueError("the model returned no loss: pass targets")
    return out.loss + sum(out.aux_losses.values(), torch.zeros((), device=out.loss.device))


def after_optimizer_step(model: nn.Module) -> None:
    """Run every module's ``after_optimizer_step`` hook (e.g. clamp learned spans to [0, S])."""
    for module in model.modules():
        hook = getattr(module, "after_optimizer_step", None)
        if callable(hook):
            hook()


def set_training_progress(model: nn.Module, fraction: float) -> None:
    """Tell every module with a ``set_progress`` hook how far training is (steps done / planned),
    e.g. Al-Rfou et al. 2018's intermediate losses, which drop out on a schedule (zoo/models/al_rfou_losses.py)."""
    for module in model.modules():
        hook = getattr(module, "set_progress", None)
        if callable(hook):
            hook(min(max(fraction, 0.0), 1.0))


def detach_state(state: Any) -> Any:
    """Cut the graph between steps (truncated BPTT); mechanisms detach their own, this makes sure."""

    return map_tensors(state, lambda t: t.detach())


def carries_memory(model: nn.Module) -> bool:
    """True when ``model`` is a language model whose every attention keeps bounded segment memory
    (XL memory, the adaptive-span cache) and whose stack threads it: then training, evaluation
    and sampling carry its state from segment to segment, as the library's own loops do."""

    keeps = getattr(model, "attentions_keep_state", None)
    if getattr(getattr(model, "config", None), "kind", None) != "lm" or not callable(keeps) or not keeps():
        return False
    attentions = [m for m in model.modules() if isinstance(m, Attention)]
    return bool(attentions) and all(a.carries_segment_memory() for a in attentions)


def initial_state(model: nn.Module, batch_size: int) -> Any:
    """The state a stream starts from: ``model.init_state(batch_size)`` for a model that carries
    memory (:func:`carries_memory`), else None."""
    return model.init_state(batch_size) if carries_memory(model) else None


class TrainingDiverged(RuntimeError):
    """The loss (or the weights, or an evaluation) became NaN or infinite."""


def forward_backward(
    model: nn.Module,
    batch: dict[str, Tensor],
    *,
    state: Any = None,
    scale: float = 1.0,
    context: Callable[[], Any] = contextlib.nullcontext,
) -> tuple[ModelOutput, Tensor]:
    """Forward ``batch`` (keys: the model's call arguments) under ``context()`` (autocast, an
    activation meter) and backpropagate ``scale`` x the total loss (task loss + weighted aux
    losses). A NaN/inf loss raises :class:`TrainingDiverged` before any gradient is touched.
    Returns the output (``state`` detached) and the unscaled total loss."""
    with context():
        out = model(**batch, state=state) if state is not None else model(**batch)
        loss = total_loss(out)
    if not torch.isfinite(loss):
        raise TrainingDiverged(f"loss is {float(loss.detach())}")
    (loss * scale if scale != 1.0 else loss).backward()
    out.state = detach_state(out.state)
    return out, loss.detach()


def optimizer_step(
    model: nn.Module, optimizer: torch.optim.Optimizer, *, scheduler: Any = None, clip: float = 1.0
) -> Tensor:
    """Clip the gradient norm to ``clip`` (0 = no clipping), step the optimiser and the schedule,
    run the post-step hooks. Returns the gradient norm before clipping."""
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip if clip else float("inf"))
    optimizer.step()
    if scheduler is not None:
        scheduler.step()
    after_optimizer_step(model)
    return grad_norm


def train_step(
    model: nn.Module,
    batch: dict[str, Tensor],
    optimizer: torch.optim.Optimizer,
    *,
    scheduler: Any = None,
    clip: float = 1.0,
    state: Any = None,
) -> tuple[ModelOutput, Tensor]:
    """One optimisation step on ``batch`` (keys: the model's call arguments). Returns the output
    (its ``state`` detached, ready to carry into the next step) and the total loss.
    :class:`zoo.train.trainer.Trainer` runs the same two halves with gradient accumulation between them."""
    model.train()
    optimizer.zero_grad(set_to_none=True)
    out, loss = forward_backward(model, batch, state=state)
    optimizer_step(model, optimizer, scheduler=scheduler, clip=clip)
    return out, loss
