"""Packed rows: several documents concatenated in one row, kept apart inside every mechanism that accepts them.

Not a mechanism (nothing registers here). A packed batch carries ``documents``, long [b, t]: the index of the
document each position belongs to inside its row, non-decreasing along the row (0, 0, 0, 1, 1, 2, ...). The tail
of a row that no document fills is padding (``pad_mask`` False) and may carry any id. We chose ids over
cumulative lengths (flash-attn's ``cu_seqlens``) because they are the same shape as ``pad_mask`` and thread
through the model the same way, every mask below is one comparison of them, and a context-parallel split or
a batch slice cuts them like any other per-position tensor.

What each family makes of them (zoo/attention/<part>.py says which it is, by ``packs_documents``):

- dense attention: a query sees a key only inside its own document (ids equal, ANDed with causality and
  padding), a block of queries at a time over the keys their documents span (:func:`document_spans`), so
  short documents cost about t x (block + document length) scores, not t x t; FlexAttention: the same test
  as its ``mask_mod``;
- recurrent (decay, delta, state-space) forms: the state is emptied at the first position of every document
  (:func:`document_starts`): nothing written before a boundary is read after it;
- positions: a signal added at the input numbers each document from 0 (:func:`positions_in_documents`);
  relative schemes (rope, ALiBi, T5 buckets) depend on i - j only, which is the same inside a document whether
  counted from the row's start or the document's, so they keep the row's positions.

A language model's targets are cut per document before packing (zoo/data/packing.py): the last token of one
document never predicts the first of the next.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor


def check_documents(documents: Tensor, x: Tensor, name: str, *, in_order: bool = True) -> None:
    """``documents`` must be an integer tensor [b, t] matching x [b, t, ...], non-decreasing along each row
    (``in_order``: read back from the device, so the model checks it once per call and its layers skip it)."""
    ok = isinstance(documents, Tensor) and not documents.is_floating_point() and documents.dtype != torch.bool
    if not (ok and tuple(documents.shape) == tuple(x.shape[:2])):
        shape = tuple(documents.shape) if isinstance(documents, Tensor) else type(documents).__name__
        raise ValueError(f"{name}: documents must be an integer tensor [b, t] = {tuple(x.shape[:2])}; got {shape}")
    if in_order and documents.shape[1] > 1 and bool((documents[:, 1:] < documents[:, :-1]).any()):
        raise ValueError(f"{name}: documents must number a row's documents in order (non-decreasing along t)")


def document_starts(documents: Tensor) -> Tensor:
    """bool [b, t]: position i opens a document (i > 0 and its id differs from position i - 1's). Position 0
    is False: whatever stood before the row (an empty state) is already nothing to forget."""
    starts = torch.zeros_like(documents, dtype=torch.bool)
    starts[:, 1:] = documents[:, 1:] != documents[:, :-1]
    return starts


def positions_in_documents(documents: Tensor) -> Tensor:
    """long [b, t]: each position's place inside its own document (0 at every document's first token)."""
    t = documents.shape[1]
    index = torch.arange(t, device=documents.device).expand_as(documents)
    first = torch.where(document_starts(documents), index, torch.zeros_like(index))
    return index - first.cummax(dim=1).values


def segment_ids(documents: Tensor) -> Tensor:
    """long [b, t]: 0, 0, 1, 1, 1, 2, ... the number of boundaries up to each position (ids relabelled from 0
    per row), for kernels that compare a position's segment with a chunk's."""
    return document_starts(documents).long().cumsum(dim=1)


def document_spans(documents: Tensor, block: int, causal: bool) -> list[tuple[int, int, int, int]]:
    """(q0, q1, k0, k1) for each block of ``block`` queries: the keys [k0, k1) that any query of the block may
    see in any row, from the start of the first query's document to the block's end (causal) or the end of
    the last query's document. A packed row of short documents then costs about t x (block + a document's
    length) scores instead of t x t: the dense mechanisms attend block by block over these spans."""
    t = documents.shape[1]
    index = torch.arange(t, device=documents.device)
    start = index - positions_in_documents(documents)  # [b, t]: where each position's document starts
    end = index + positions_in_documents(documents.flip(1)).flip(1) + 1  # one past where it ends
    spans = []
    for q0 in range(0, t, block):
        q1 = min(q0 + block, t)
        k0 = int(start[:, q0].min())
        k1 = q1 if causal else int(end[:, q1 - 1].max())
        spans.append((q0, q1, k0, k1))
    return spans


def packed_segments(attention: Any, documents: Tensor | None, x: Tensor, state: Any) -> Tensor | None:
    """The segment ids [b, t] a recurrent kernel resets at, for a call of ``attention`` on x [b, t, d] with
    ``documents`` (None when the call is not packed). Refuses, with the reason, a layer that cannot pack as it
    is built (``packing_refusal``) and a state (a packed row starts fresh)."""
    if documents is None:
        return None
    reason = attention.packing_refusal()
    if reason is not None:
        raise ValueError(reason)
    if state is not None:
        raise ValueError(f"{attention.registry_name}: packed documents start fresh in every row: pass state=None")
    check_documents(documents, x, attention.registry_name, in_order=False)  # the model checked the order
    return segment_ids(documents)
