"""Recompute-in-backward for attention kernels whose saved intermediates outweigh their inputs.

Not a mechanism (nothing registers here). Some attention computations cannot use a fused kernel's
backward: adaptive span's soft mask needs a gradient for the spans, so SDPA takes its math path and
keeps the weights of the whole band; the Sparse Transformer's merged head normalises two differently
shaped score tensors together and keeps both. :func:`recompute_in_backward` keeps only the inputs
(q, k, v, spans: O(t d)) and runs the same computation again under autograd when backward needs
it, the recomputation of Chen et al. 2016 ("Training Deep Nets with Sublinear Memory Cost",
arXiv:1604.06174) applied to one attention call, through the zoo's one recomputation primitive
(:func:`zoo.recompute.recompute`). Gradients are those of the wrapped function exactly (the same
operations run, with the same random numbers for dropout, under the same autocast state); the price is
one more forward pass of the attention in backward. The band exists only while one layer's backward
runs, never for all layers at once.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from zoo.recompute import recompute


def recompute_in_backward(fn: Callable[..., Tensor], *inputs: Tensor | None, stochastic: bool = False) -> Tensor:
    """``fn(*inputs)`` keeping only ``inputs`` for backward, which runs ``fn`` again under autograd.

    ``fn`` must be a function of ``inputs`` alone (tensors or None; anything else it uses is fixed:
    closures over ints, flags, modules' constants) returning one tensor. ``stochastic``: ``fn``
    draws random numbers (dropout); the generator state is saved and restored for the second run.
    Without a gradient to compute (inference, or no input requiring one) ``fn`` simply runs."""
    if not torch.is_grad_enabled() or not any(x is not None and x.requires_grad for x in inputs):
        return fn(*inputs)
    return recompute(fn, *inputs, preserve_rng_state=stochastic)
