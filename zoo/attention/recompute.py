"""Recomputation in backward: the one primitive every part that trades compute for activation memory calls.

Not a mechanism (nothing registers here). Paper: "Training Deep Nets with Sublinear Memory Cost", Chen, Xu,
Zhang & Guestrin 2016, arXiv:1604.06174: keep a function's inputs, drop what it saves for backward, and run it
again when backward needs it.

:func:`recompute` runs ``fn(*args, **kwargs)`` under ``torch.utils.checkpoint.checkpoint(use_reentrant=False)``
(any outputs: dataclasses, dicts, states; keyword arguments; nesting), the recomputation replaying what the
forward ran under (:class:`Replaying`):

- the random numbers (dropout, LSH rotations, the universal stack's offsets): the CPU and device generators'
  states are restored (``preserve_rng_state``), so the same masks are drawn;
- the autocast state (:class:`zoo.precision.AutocastState`): backward runs outside the autocast region, and a
  bf16 forward recomputed in float32 would differentiate another function;
- the chunk of a sequence split over ranks (``zoo.parallel.chunk.active_chunk``), so a recomputed layer reads
  the same keys;
- :func:`recomputing` answers True, so a part whose forward has a side effect that must happen once per step
  (Performer's redraw counter) leaves it out of the second run.

Who calls it:

- attention computations that cannot use a fused kernel's backward (:func:`recompute_in_backward`): adaptive
  span's soft mask needs a gradient for the spans, so SDPA takes its math path and keeps the weights of the
  whole band; the Sparse Transformer's merged head normalises two differently shaped score tensors together and
  keeps both; pair-bias attention. Only the inputs (q, k, v, spans: O(t d)) are kept; the band exists only while
  one layer's backward runs, never for all layers at once;
- activation checkpointing of whole blocks or their attention sub-layers (:mod:`zoo.stacks.checkpointing`:
  ``trainer.activation_checkpointing``, ``zoo.bench --activation-checkpointing``, the hub's
  ``gradient_checkpointing_enable``);
- the reversible stack keeps its own autograd function (it rebuilds each layer's input from its output, which
  no checkpoint does) and replays its recomputation under :class:`Replaying` too.

Gradients are those of the wrapped function exactly; the price is one more forward pass of it in backward.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from zoo.parallel.chunk import active_chunk, splitting
from zoo.precision import AutocastState

_RECOMPUTING: ContextVar[bool] = ContextVar("zoo_recomputing", default=False)

# torch's non-reentrant checkpoint: what :func:`recompute` calls unless given another (the hub passes HF's)
NON_REENTRANT: Callable[..., Any] = functools.partial(checkpoint, use_reentrant=False)


def recomputing() -> bool:
    """True while backward recomputes a forward (a side effect that counts calls must not run again)."""
    return _RECOMPUTING.get()


class Replaying:
    """What a recomputation runs under: the forward's autocast state and chunk, :func:`recomputing` True.
    Re-enterable: torch enters the same recompute context again when backward runs more than once."""

    def __init__(self, autocast: AutocastState, chunk: Any = None):
        self.autocast, self.chunk = autocast, chunk
        self.entered: list[tuple[Any, contextlib.ExitStack]] = []

    def __enter__(self) -> None:
        stack = contextlib.ExitStack()
        stack.enter_context(self.autocast.replay())
        stack.enter_context(splitting(self.chunk))
        self.entered.append((_RECOMPUTING.set(True), stack))

    def __exit__(self, *exc: Any) -> None:
        token, stack = self.entered.pop()
        _RECOMPUTING.reset(token)
        stack.close()


def recompute(
    fn: Callable[..., Any],
    *args: Any,
    preserve_rng_state: bool = True,
    checkpoint_fn: Callable[..., Any] | None = None,
    **kwargs: Any,
) -> Any:
    """``fn(*args, **kwargs)``, keeping only its inputs for backward, which runs ``fn`` again (module notes).

    ``fn`` must compute the same thing when called again with the same inputs: the generator state, the
    autocast state and the sequence chunk are replayed; anything else it reads must not have changed by the
    time backward runs. ``preserve_rng_state=False`` skips saving the generators (``fn`` draws nothing).
    ``checkpoint_fn``: torch's ``checkpoint`` with keywords bound (``use_reentrant=False``; HF's
    ``gradient_checkpointing_kwargs``), called as ``checkpoint_fn(fn, *args, context_fn=..., **kwargs)``.
    Without a gradient to compute, ``fn`` simply runs. Under ``torch.compile`` the checkpoint is traced into the
    graph without the replay context (dynamo takes none): the compiled graph decides the recomputation itself."""
    run = checkpoint_fn or NON_REENTRANT
    if not torch.is_grad_enabled():
        return fn(*args, **kwargs)
    if torch.compiler.is_compiling():
        return run(fn, *args, preserve_rng_state=preserve_rng_state, **kwargs)
    device = next((x.device for x in args if isinstance(x, torch.Tensor)), torch.device("cpu"))
    autocast, chunk = AutocastState.now(device), active_chunk()

    def contexts() -> tuple[contextlib.AbstractContextManager, contextlib.AbstractContextManager]:
        return contextlib.nullcontext(), Replaying(autocast, chunk)

    return run(fn, *args, context_fn=contexts, preserve_rng_state=preserve_rng_state, **kwargs)


def recompute_in_backward(fn: Callable[..., Tensor], *inputs: Tensor | None, stochastic: bool = False) -> Tensor:
    """``fn(*inputs)`` keeping only ``inputs`` for backward, which runs ``fn`` again under autograd.

    ``fn`` must be a function of ``inputs`` alone (tensors or None; anything else it uses is fixed:
    closures over ints, flags, modules' constants) returning one tensor. ``stochastic``: ``fn``
    draws random numbers (dropout); the generator state is saved and restored for the second run.
    Without a gradient to compute (inference, or no input requiring one) ``fn`` simply runs."""
    if not torch.is_grad_enabled() or not any(x is not None and x.requires_grad for x in inputs):
        return fn(*inputs)
    return recompute(fn, *inputs, preserve_rng_state=stochastic)
