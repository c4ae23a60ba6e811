"""Checks on what callers pass to a model: token ids, targets, padding masks, generation arguments.

Every model forward and ``generate`` goes through these, so a bad input ends in a ``ValueError``
(or :class:`~zoo.config.ArgumentTypeError`, also a ``TypeError``) that names the argument and what
is allowed, before any torch kernel sees it, rather than in a NaN or a deep traceback.

The rules, the same for every head:

- An empty batch or sequence (``b == 0`` or ``t == 0``) is refused: there is nothing to attend
  over, and a mean over zero positions is NaN.
- Targets are integer ids: a float tensor is refused, never truncated. An id outside
  ``[0, n_values)`` is refused unless it is the ignore index -100 (an LM's "not scored").
- A well-formed batch whose every target is ignored (all -100 or all padding) is accepted: its
  loss is 0 (still attached to the graph, so backward gives zero gradients) and
  ``out.stats["scored"]`` says how many targets were scored (0). It is never NaN.

Shapes: tokens [b, t] int; pad_mask [b, t] bool (True = real token); LM targets [b, t] int.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from zoo.config import IGNORE_INDEX, ArgumentTypeError, check_type

INTEGER_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


def describe(value: Any) -> str:
    """'shape (2, 5) dtype torch.float32' for a tensor, else the type name."""
    if isinstance(value, Tensor):
        return f"shape {tuple(value.shape)} dtype {value.dtype}"
    return type(value).__name__


def check_tokens(tokens: Any, name: str, vocab_size: int | None) -> None:
    """``tokens``: an integer tensor [b, t] with b, t >= 1 and every id in [0, vocab_size).

    ``vocab_size=None`` checks the structure only (no device sync): for an early check whose ids
    the embedding checks anyway."""
    if not (isinstance(tokens, Tensor) and tokens.dtype in INTEGER_DTYPES and tokens.dim() == 2):
        raise ArgumentTypeError(f"{name} must be an integer tensor [b, t] of token ids; got {describe(tokens)}")
    if tokens.numel() == 0:
        raise ValueError(
            f"{name} is empty (shape {tuple(tokens.shape)}): a batch needs at least one row of at least one token"
        )
    if vocab_size is None:
        return
    low, high = int(tokens.min()), int(tokens.max())
    if low < 0 or high >= vocab_size:
        raise ValueError(f"{name}: token ids must lie in [0, vocab_size={vocab_size}); got min {low}, max {high}")


def check_embeds(embeds: Any, name: str, d_model: int, dtype: torch.dtype) -> None:
    """``embeds``: a float tensor [b, t, d_model] of the model's dtype with b, t >= 1 (vectors fed
    in place of token ids)."""
    if not (isinstance(embeds, Tensor) and embeds.is_floating_point() and embeds.dim() == 3):
        raise ArgumentTypeError(f"{name} must be a float tensor [b, t, d_model={d_model}]; got {describe(embeds)}")
    if embeds.shape[-1] != d_model:
        width = embeds.shape[-1]
        raise ValueError(f"{name} has width {width} but the model's d_model is {d_model}: project to {d_model} first")
    if embeds.shape[0] == 0 or embeds.shape[1] == 0:
        raise ValueError(f"{name} is empty (shape {tuple(embeds.shape)}): a batch needs at least one row of one vector")
    if embeds.dtype != dtype:
        raise ValueError(f"{name} dtype {embeds.dtype} differs from the model's {dtype}; cast one")


def check_pad_mask(pad_mask: Tensor | None, tokens: Tensor, name: str = "pad_mask") -> None:
    """``pad_mask``: None or a bool tensor shaped like ``tokens`` (True = real token)."""
    if pad_mask is None:
        return
    if not isinstance(pad_mask, Tensor) or pad_mask.dtype != torch.bool or tuple(pad_mask.shape) != tuple(tokens.shape):
        raise ValueError(
            f"{name} must be a bool tensor shaped like the tokens {tuple(tokens.shape)} (True = real token); "
            f"got {describe(pad_mask)}"
        )


def check_targets(
    targets: Any,
    shape: tuple[int, ...],
    n_values: int,
    name: str = "targets",
    *,
    what: str = "vocab_size",
    ignore: bool = True,
) -> None:
    """``targets``: an integer tensor of ``shape`` holding ids in [0, n_values) (or -100 when ``ignore``)."""
    if not (isinstance(targets, Tensor) and targets.dtype in INTEGER_DTYPES):
        raise ArgumentTypeError(
            f"{name} must be an integer tensor of ids (never floats: they would be truncated); got {describe(targets)}"
        )
    if tuple(targets.shape) != tuple(shape):
        legend = "[b, t]" if len(shape) == 2 else "[b]" if len(shape) == 1 else "shaped"
        raise ValueError(f"{name} must be {legend} = {tuple(shape)}; got {tuple(targets.shape)}")
    scored = targets[targets != IGNORE_INDEX] if ignore else targets
    if scored.numel() and (int(scored.min()) < 0 or int(scored.max()) >= n_values):
        allowed = f"[0, {what}={n_values})" + (f" or {IGNORE_INDEX} (not scored)" if ignore else "")
        raise ValueError(f"{name} must lie in {allowed}; got min {int(scored.min())}, max {int(scored.max())}")


def check_same_batch(**tensors: Tensor) -> None:
    """All named tensors share their batch size (dim 0): ``check_same_batch(src=src, tgt=tgt)``."""
    sizes = {name: int(t.shape[0]) for name, t in tensors.items() if isinstance(t, Tensor)}
    if len(set(sizes.values())) > 1:
        listed = ", ".join(f"{name} has {size}" for name, size in sizes.items())
        raise ValueError(f"batch sizes differ: {listed}; every row of {' and '.join(sizes)} must belong together")


def check_count(value: Any, name: str, minimum: int) -> None:
    """``value`` is an int >= ``minimum`` (a batch size, a number of tokens, a beam width)."""
    check_type(value, int, name)
    if value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value}")


def count_scored(targets: Tensor, pad_mask: Tensor | None) -> Tensor:
    """How many targets enter the loss: not -100 and not padding."""
    scored = targets != IGNORE_INDEX
    return (scored & pad_mask).sum() if pad_mask is not None else scored.sum()


def scored_loss(loss_sum: Tensor, scored: Tensor, logits: Tensor) -> Tensor:
    """Mean loss over ``scored`` targets; 0 (attached to ``logits``' graph) when none was scored."""
    return torch.where(scored > 0, loss_sum / scored.clamp_min(1), logits.sum() * 0.0)
