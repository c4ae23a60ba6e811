"""The span cache of ``adaptive_span`` (Sukhbaatar et al. 2019, arXiv:1905.07799; ``adaptive_span.py``
holds the mechanism): the last ``cache_size`` inputs of the layer, carried between calls like
Transformer-XL's memory, and their padding. Shapes: x [b, m, d]; pad_mask [b, m] (True = real) or None.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from zoo.attention.append import AppendStore, append, needs_gradient, new_store, slide
from zoo.attention.base import join_key_padding


@dataclass
class SpanCache:
    """Inputs of the last ``cache_size`` tokens of this layer. x: [b, m, d]; pad_mask: [b, m] or None;
    ``next``: the absolute position of the next token (the cached inputs sit just before it)."""

    x: Tensor | None = None
    pad_mask: Tensor | None = None
    next: int = 0
    store: AppendStore | None = field(default=None, compare=False, repr=False)  # x views it (append.py)

    @property
    def length(self) -> int:
        return 0 if self.x is None else self.x.shape[1]


def check_span_cache(state: SpanCache, b: int, d_model: int) -> None:
    """Refuse a state that is not a span cache, or one from another batch size or model width."""
    if not isinstance(state, SpanCache):
        raise ValueError(
            f"adaptive_span: state must be a SpanCache (from init_state or a previous call), got {type(state).__name__}"
        )
    if state.x is not None and (state.x.shape[0] != b or state.x.shape[2] != d_model):
        raise ValueError(
            f"adaptive_span: cache holds [b={state.x.shape[0]}, m, d={state.x.shape[2]}] but the input is "
            f"[b={b}, t, d={d_model}]"
        )


def next_span_cache(
    past: Tensor | None,
    past_pad: Tensor | None,
    x: Tensor,
    pad_mask: Tensor | None,
    next_position: int,
    keep: int,
    store: AppendStore | None = None,
) -> SpanCache:
    """The last ``keep`` (the layer's ``cache_size``) inputs (detached, so no gradient crosses segments).
    Without gradient they are appended in place and the window slides over its storage
    (zoo/attention/append.py); in training the cache is a tensor of its own, since a later segment's graph
    keeps views of it."""
    pad = join_key_padding(past_pad, 0 if past is None else past.shape[1], pad_mask, x)
    pad = None if pad is None else pad[:, -keep:]
    if needs_gradient(x):
        xs = x.detach() if past is None else torch.cat([past, x.detach()], dim=1)
        return SpanCache(xs[:, -keep:], pad, next=next_position)
    store, (xs,) = new_store([x], [1]) if past is None else append(store, [past], [x], [1])
    if xs.shape[1] > keep:
        (xs,) = slide(store, [xs], keep)
    return SpanCache(xs, pad, next=next_position, store=store)
