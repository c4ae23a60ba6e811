"""Packed rows: several documents concatenated in one row, kept apart inside every mechanism that accepts them.

Not a mechanism (nothing registers here). A packed batch carries ``documents``, long [b, t]: the index of the
document each position belongs to inside its row, non-decreasing along the row (0, 0, 0, 1, 1, 2, ...). The tail
of a row that no document fills is padding (``pad_mask`` False) and may carry any id. We chose ids over
cumulative lengths (flash-attn's ``cu_seqlens``) because they are the same shape as ``pad_mask`` and thread
through the model the same way, every mask below is one comparison of them, and a context-parallel split or
a batch slice cuts them like any other per-position tensor.

What each family makes of them (zoo/attention/<part>.py says which it is, by ``packs_documents``):

- dense and pattern attention: a query sees a key only inside its own document (:func:`same_document`, a
  [b, 1, t, s] mask ANDed with the pattern; FlexAttention: the same test as its ``mask_mod``);
- recurrent (decay, delta, state-space) forms: the state is emptied at the first position of every document
  (:func:`document_starts`): nothing written before a boundary is read after it;
- positions: a signal added at the input numbers each document from 0 (:func:`positions_in_documents`);
  relative schemes (rope, ALiBi, T5 buckets) depend on i - j only, which is the same inside a document whether
  counted from the row's start or the document's, so they keep the row's positions.

A language model's targets are cut per document before packing (zoo/data/packing.py): the last token of one
document never predicts the first of the next.
"""

from __future__ import annotations

import torch
from torch import Tensor


def check_documents(documents: Tensor, x: Tensor, name: str) -> None:
    """``documents`` must be an integer tensor [b, t] matching x [b, t, ...], non-decreasing along each row."""
    ok = isinstance(documents, Tensor) and not documents.is_floating_point() and documents.dtype != torch.bool
    if not (ok and tuple(documents.shape) == tuple(x.shape[:2])):
        shape = tuple(documents.shape) if isinstance(documents, Tensor) else type(documents).__name__
        raise ValueError(f"{name}: documents must be an integer tensor [b, t] = {tuple(x.shape[:2])}; got {shape}")
    if documents.shape[1] > 1 and bool((documents[:, 1:] < documents[:, :-1]).any()):
        raise ValueError(f"{name}: documents must number a row's documents in order (non-decreasing along t)")


def same_document(documents: Tensor) -> Tensor:
    """bool [b, 1, t, t]: query i and key j of a row lie in the same document (broadcasts over heads)."""
    return (documents[:, :, None] == documents[:, None, :])[:, None]


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
