"""The zoo's decoding state seen through ``transformers``' cache interface, so HF's ``generate`` (and
anything else that threads ``cache`` / ``past_key_values``) runs on the zoo's own caches: KV caches,
XL memories, recurrent states of the linear family, whatever each mechanism keeps.

The zoo state (:class:`zoo.models.base.ModelState`, or the encoder-decoder's ``Seq2SeqState``) stays
opaque: the adapter only answers what generation asks (how many tokens it has seen, beam reordering,
batch expansion) through the zoo's own :func:`zoo.models.base.map_tensors` / ``reorder_state``, and the
wrapper feeds it back as ``model(tokens, state=cache.state)`` and keeps the state the call returns.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import Cache

from zoo.models.base import map_tensors, reorder_state


class ZooCache(Cache):
    """A ``transformers.Cache`` holding one zoo state (``state``: what the last call returned)."""

    is_compileable = False  # the zoo's states are Python objects of any shape, not static tensors

    def __init__(self, state: Any):
        super().__init__(layers=[])
        self.state = state

    def __repr__(self) -> str:
        return f"ZooCache(offset={self.state.offset}, batch_size={self.state.batch_size})"

    def __len__(self) -> int:
        return len(self.state.layers or [])

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Tokens the state has seen (its offset): the next call continues at this position."""
        return int(self.state.offset)

    def get_max_length(self, layer_idx: int | None = None) -> int:
        return -1  # each mechanism bounds its own state (a window, a memory, a recurrent state)

    @property
    def is_linear(self) -> list[bool]:
        return [False]  # generation slices the prompt by get_seq_length, as for a KV cache

    @property
    def is_initialized(self) -> bool:
        return True

    @property
    def batch_size(self) -> int:
        return int(self.state.batch_size)

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Beam search: keep rows ``beam_idx`` of every per-row tensor in the state (what every row shares, the
        caches' ``NOT_PER_ROW`` fields, stays). Refused, before anything moves, when a per-row tensor's first
        axis is not the batch: picking its rows would mix up the beams without an error."""
        rows = self.state.batch_size
        per_row = tensors(self.state, rows_only=True)
        odd = sorted({tuple(t.shape) for t in per_row if t.dim() > 0 and t.shape[0] != rows})
        if odd:
            raise NotImplementedError(
                f"this zoo state holds tensors whose first axis is not the batch ({rows} rows): shapes {odd[:4]}; "
                "its rows cannot be reordered for beam search. Use num_beams=1, or use_cache=False (every "
                "prefix recomputed)"
            )
        self.state = reorder_state(self.state, beam_idx.to(torch.long))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self.reorder_cache(indices)

    def batch_repeat_interleave(self, repeats: int) -> None:
        index = torch.arange(self.state.batch_size).repeat_interleave(repeats)
        device = next((t.device for t in tensors(self.state)), None)
        self.reorder_cache(index.to(device) if device is not None else index)

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError(
            "a zoo state cannot be cropped: recurrent and memory states do not keep per-token entries to drop "
            "(assisted / speculative decoding needs a croppable KV cache)"
        )

    def reset(self) -> None:
        raise NotImplementedError("a zoo state is not reset in place: start generation again without a cache")


def tensors(state: Any, *, rows_only: bool = False) -> list[torch.Tensor]:
    """Every tensor inside a (nested) zoo state (``rows_only``: those a cache keeps one row per batch row of,
    leaving out the fields it marks as shared by every row: ``zoo.attention.state.NOT_PER_ROW``)."""
    found: list[torch.Tensor] = []
    map_tensors(state, lambda t: found.append(t) or t, rows_only=rows_only)
    return found
