"""Recompute-in-backward for attention kernels whose saved intermediates outweigh their inputs.

Not a mechanism (nothing registers here). Some attention computations cannot use a fused kernel's
backward: adaptive span's soft mask needs a gradient for the spans, so SDPA takes its math path and
keeps the weights of the whole band; the Sparse Transformer's merged head normalises two differently
shaped score tensors together and keeps both. :func:`recompute_in_backward` keeps only the inputs
(q, k, v, spans: O(t d)) and runs the same computation again under autograd when backward needs
it, the recomputation of Chen et al. 2016 ("Training Deep Nets with Sublinear Memory Cost",
arXiv:1604.06174) applied to one attention call. Gradients are those of the wrapped function
exactly (the same operations run, with the same random numbers for dropout, under the same
autocast state: :class:`zoo.precision.AutocastState`); the price is one
more forward pass of the attention in backward. The band exists only while one layer's backward
runs, never for all layers at once.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from zoo.precision import AutocastState


class _Recomputed(torch.autograd.Function):
    @staticmethod
    def forward(ctx, fn: Callable[..., Tensor], stochastic: bool, *inputs: Tensor | None) -> Tensor:
        ctx.fn = fn
        ctx.rng = None
        if stochastic:  # dropout: backward must draw the same mask
            device = next(x.device for x in inputs if x is not None)
            ctx.rng = (
                device,
                torch.get_rng_state(),
                torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
            )
        ctx.save_for_backward(*inputs)
        ctx.autocast = AutocastState.now(next(x.device for x in inputs if x is not None))  # bf16: replayed in backward
        with torch.no_grad():
            return fn(*inputs)

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        inputs = [
            None if x is None else x.detach().requires_grad_(need)
            for x, need in zip(ctx.saved_tensors, ctx.needs_input_grad[2:])
        ]
        devices = [ctx.rng[0]] if ctx.rng is not None and ctx.rng[0].type == "cuda" else []
        with torch.enable_grad(), torch.random.fork_rng(devices=devices, enabled=ctx.rng is not None):
            if ctx.rng is not None:
                torch.set_rng_state(ctx.rng[1])
                if devices:
                    torch.cuda.set_rng_state(ctx.rng[2], devices[0])
            with ctx.autocast.replay():
                out = ctx.fn(*inputs)
        wanted = [x for x in inputs if x is not None and x.requires_grad]
        grads = iter(torch.autograd.grad(out, wanted, grad_out, allow_unused=True)) if wanted else iter(())
        return (None, None, *(next(grads) if x is not None and x.requires_grad else None for x in inputs))


def recompute_in_backward(fn: Callable[..., Tensor], *inputs: Tensor | None, stochastic: bool = False) -> Tensor:
    """``fn(*inputs)`` keeping only ``inputs`` for backward, which runs ``fn`` again under autograd.

    ``fn`` must be a function of ``inputs`` alone (tensors or None; anything else it uses is fixed:
    closures over ints, flags, modules' constants) returning one tensor. ``stochastic``: ``fn``
    draws random numbers (dropout); the generator state is saved and restored for the second run.
    Without a gradient to compute (inference, or no input requiring one) ``fn`` simply runs."""
    if not torch.is_grad_enabled() or not any(x is not None and x.requires_grad for x in inputs):
        return fn(*inputs)
    return _Recomputed.apply(fn, stochastic, *inputs)
