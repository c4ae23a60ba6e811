"""Rows of documents: one document per padded row, or several packed into full rows (``data.pack=true``).

A corpus of short documents (IMDb reviews, the lines of a play) padded one per row spends most of its compute
on padding; packed, each row holds as many whole documents as fit, and the batch carries ``documents``
long [b, t] (each position's document within its row, zoo/attention/documents.py) so that every mechanism
keeps each token inside its own document, or refuses packing with its reason (``ZooModel.packing_refusal``).

Packing is first fit over the most recent ``OPEN_ROWS`` rows that still have room, in the order given (the
task shuffles it, seeded): a document goes into the first of them it fits, else starts a new row. Documents
are never split (a class belongs to a whole review; a line's last token predicts nothing of the next line).
A document longer than a row is cut to the row, as the padded layout cuts it.

Targets are cut per document before packing: a language model's targets are each document's own next tokens
(its last input predicts its last token), so the last token of one document never predicts the first of the
next; a classifier's are one class per document, in row-major order (row 0's documents, then row 1's, ...).

Shapes: R rows of T positions; ``tokens`` / ``pad_mask`` / ``documents`` [R, T]; LM ``targets`` [R, T]
(-100 = not scored); classifier ``labels`` [N] with ``label_start`` [R + 1] (row r's are
labels[label_start[r]:label_start[r + 1]]).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from zoo.config import IGNORE_INDEX

OPEN_ROWS = 64  # rows still taking documents: first fit over these keeps packing linear in the documents


@dataclass
class Rows:
    """A split laid out in rows (padded one document per row, or packed)."""

    tokens: Tensor  # [R, T] long, 0 past the documents
    pad_mask: Tensor  # [R, T] bool, True = a document's token
    documents: Tensor | None = None  # [R, T] long when packed
    targets: Tensor | None = None  # [R, T] LM targets
    labels: Tensor | None = None  # [N] classes, row-major, classifier
    label_start: Tensor | None = None  # [R + 1]

    def __len__(self) -> int:
        return self.tokens.shape[0]

    @property
    def real_tokens(self) -> int:
        return int(self.pad_mask.sum())

    def batch(self, pick: Tensor) -> dict[str, Tensor]:
        """The model's call arguments for rows ``pick`` (long [b])."""
        out = {"tokens": self.tokens[pick], "pad_mask": self.pad_mask[pick]}
        if self.documents is not None:
            out["documents"] = self.documents[pick]
        if self.targets is not None:
            out["targets"] = self.targets[pick]
        else:
            starts, ends = self.label_start[pick].tolist(), self.label_start[pick + 1].tolist()
            out["targets"] = torch.cat([self.labels[a:b] for a, b in zip(starts, ends)])
        return out


def pack_order(lengths: list[int], width: int) -> list[list[int]]:
    """The documents (indices into ``lengths``, each cut to ``width``) of each row, packed first fit over the
    ``OPEN_ROWS`` most recent rows with room."""
    rows: list[list[int]] = []
    room: list[int] = []
    open_rows: list[int] = []
    for index, length in enumerate(lengths):
        length = min(length, width)
        home = next((r for r in open_rows if room[r] >= length), None)
        if home is None:
            rows.append([])
            room.append(width)
            home = len(rows) - 1
            open_rows.append(home)
            if len(open_rows) > OPEN_ROWS:
                open_rows.pop(0)
        rows[home].append(index)
        room[home] -= length
        if room[home] == 0:
            open_rows.remove(home)
    return rows


def lay_out(
    documents: list[Tensor],
    width: int,
    *,
    pack: bool,
    targets: list[Tensor] | None = None,
    labels: list[int] | None = None,
) -> Rows:
    """``documents`` (long [n_i] each) in rows of ``width``: one per row, or packed (``pack``). Exactly one of
    ``targets`` (a language model's, long [n_i] each, cut per document) or ``labels`` (one class each)."""
    lengths = [len(d) for d in documents]
    order = pack_order(lengths, width) if pack else [[i] for i in range(len(documents))]
    n = len(order)
    tokens = torch.zeros(n, width, dtype=torch.long)
    pad_mask = torch.zeros(n, width, dtype=torch.bool)
    ids = torch.zeros(n, width, dtype=torch.long)
    lm = torch.full((n, width), IGNORE_INDEX, dtype=torch.long) if targets is not None else None
    row_labels: list[int] = []
    starts = [0]
    for r, members in enumerate(order):
        at = 0
        for k, index in enumerate(members):
            length = min(lengths[index], width)
            tokens[r, at : at + length] = documents[index][:length]
            pad_mask[r, at : at + length] = True
            ids[r, at : at + length] = k
            if lm is not None:
                lm[r, at : at + length] = targets[index][:length]
            at += length
        ids[r, at:] = len(members)  # the padding tail: an id of its own, masked by pad_mask
        if labels is not None:
            row_labels.extend(labels[i] for i in members)
            starts.append(len(row_labels))
    if labels is not None:
        return Rows(tokens, pad_mask, ids if pack else None, None, torch.tensor(row_labels), torch.tensor(starts))
    return Rows(tokens, pad_mask, ids if pack else None, lm)
