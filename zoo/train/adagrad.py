"""Adagrad with a clipped step per parameter tensor: the optimiser of the adaptive-span authors
(Sukhbaatar et al. 2019; facebookresearch/adaptive-span, ``experiments/enwik8.sh``: ``--optim adagrad
--lr 0.07 --grad-clip 0.03``), ``optim.name=adagrad`` with ``optim.parameter_clip``.

Adagrad (Duchi et al. 2011) keeps the running sum of squared gradients s and steps
``w -= rate * g / (sqrt(s) + eps)``. The authors' clipping is not the usual clip of the model's total
gradient norm: for each parameter tensor whose gradient norm |g| exceeds ``clip``, the *rate* of that
tensor's step is scaled by ``clip / (|g| + 1e-10)``, while s still accumulates the unclipped g. So a large
gradient on one tensor neither shrinks the steps of the others nor is forgotten by the running sum.
With ``clip=0`` this is torch's Adagrad (no learning-rate decay, no initial accumulator).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor


class ParameterClippedAdagrad(torch.optim.Optimizer):
    def __init__(
        self,
        params: Iterable[Tensor],
        lr: float = 1e-2,
        *,
        eps: float = 1e-10,
        clip: float = 0.0,
        weight_decay: float = 0.0,
    ):
        if lr <= 0 or eps < 0 or clip < 0 or weight_decay < 0:
            raise ValueError(
                f"need lr > 0, eps >= 0, clip >= 0, weight_decay >= 0; got {lr}, {eps}, {clip}, {weight_decay}"
            )
        super().__init__(params, {"lr": lr, "eps": eps, "clip": clip, "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is None:
                    continue
                if param.grad.is_sparse:
                    raise ValueError("ParameterClippedAdagrad takes dense gradients (no sparse embeddings)")
                grad = param.grad
                if group["weight_decay"]:
                    grad = grad.add(param, alpha=group["weight_decay"])  # an L2 penalty, as torch's Adagrad
                state = self.state[param]
                if not state:
                    state["sum"] = torch.zeros_like(param, memory_format=torch.preserve_format)
                state["sum"].addcmul_(grad, grad)
                rate = torch.full((), group["lr"], dtype=param.dtype, device=param.device)
                if group["clip"] > 0:  # a tensor-valued factor: no host sync per parameter
                    norm = grad.norm()
                    rate = torch.where(norm > group["clip"], rate * group["clip"] / (norm + 1e-10), rate)
                param.sub_(grad / (state["sum"].sqrt() + group["eps"]) * rate)
        return loss
