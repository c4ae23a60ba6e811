"""Training pieces shared by the Hydra application, the reproductions and the tests.

From Vaswani et al. 2017, Section 5.3: Adam(beta1=0.9, beta2=0.98, eps=1e-9) with
lrate = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5); label smoothing lives in the models'
loss (``ModelConfig.label_smoothing``). Plus what every variant needs around a step: summing the
weighted aux losses (span L1, ACT ponder cost), gradient clipping, and the post-step hooks some
mechanisms declare (``after_optimizer_step``, e.g. clamping a learned span).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from zoo.models import ModelOutput


def adam(model: nn.Module, lr: float = 1.0, *, betas: tuple[float, float] = (0.9, 0.98), eps: float = 1e-9, weight_decay: float = 0.0) -> torch.optim.Optimizer:
    """The paper's Adam; with the Noam schedule ``lr`` is a multiplier (1.0 = the paper)."""
    if weight_decay:
        return torch.optim.AdamW(model.parameters(), lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
    return torch.optim.Adam(model.parameters(), lr=lr, betas=betas, eps=eps)


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


def schedule(optimizer: torch.optim.Optimizer, name: str, *, d_model: int = 512, warmup: int = 4000, total: int = 100_000) -> torch.optim.lr_scheduler.LambdaLR:
    """``noam`` (the paper's; use lr=1), ``cosine`` (warm-up + cosine), or ``constant``."""
    if name == "noam":
        fn = noam_lambda(d_model, warmup)
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: fn(step + 1))
    if name == "cosine":
        return torch.optim.lr_scheduler.LambdaLR(optimizer, cosine_lambda(warmup, total))
    if name == "constant":
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    raise ValueError(f"unknown schedule {name!r}; valid: noam, cosine, constant")


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


def detach_state(state: Any) -> Any:
    """Cut the graph between steps (truncated BPTT); mechanisms detach their own, this makes sure."""
    from zoo.models import map_tensors

    return map_tensors(state, lambda t: t.detach())


def train_step(model: nn.Module, batch: dict[str, Tensor], optimizer: torch.optim.Optimizer, *, scheduler: Any = None, clip: float = 1.0, state: Any = None) -> tuple[ModelOutput, Tensor]:
    """One optimisation step on ``batch`` (keys: the model's call arguments). Returns the output
    (its ``state`` detached, ready to carry into the next step) and the total loss."""
    model.train()
    out = model(**batch, state=state) if state is not None else model(**batch)
    loss = total_loss(out)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if clip:
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    optimizer.step()
    if scheduler is not None:
        scheduler.step()
    after_optimizer_step(model)
    out.state = detach_state(out.state)
    return out, loss.detach()
