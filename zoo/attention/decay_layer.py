"""The layer plumbing ``retention`` and ``gla`` share around the decay kernel (nothing registers here).

A subclass says how a layer turns its input into q, k [b, h, t, f], v [b, h, t, e] and log decays
[b, h, t(, f)] (``project``) and how the heads' outputs [b, h, t, e] become the layer's [b, t, d]
(``finish``: norm, gate, output projection); this class runs the kernel (``decay_chunks.py``),
carries the constant-size stream state and splits a sequence over the ranks of a context group.

Contract: causal only (both papers define decoders). Padded positions neither decay nor write the state.
The state is the decayed sum S [b, h, f, e] and the count of tokens seen (RetNet's rotation angle); it
remembers no token (``state_bound`` 0) and threading it through segments equals one call exactly.
"""

from __future__ import annotations

import torch
from torch import Tensor

from zoo.attention.base import Attention, AttnOutput, FlopCount, KeysPerQuery, StateContract, dense_keys
from zoo.attention.decay_chunks import (
    DecayState,
    chunk_decay_attention,
    decay_attention,
    mask_padding,
    read_state,
    state_before_rank,
)
from zoo.attention.documents import packed_segments
from zoo.config import require


class DecayAttention(Attention):
    causal_only = True
    supports_memory = True  # the decayed sum, constant size
    packs_documents = True  # the chunk kernel empties the state at each document's first token
    score_terms = 2
    # read by the projection options of the modern block (n_kv_heads, qk_norm, softcap) where they exist
    no_projection_reason = (
        "its projections are the paper's own (expand_k / expand_v widths, decay gates), and no softmax score is "
        "formed to cap; grouped keys/values and QK-norm are not implemented for it"
    )

    def project(self, x: Tensor, positions: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """x [b, t, d] at absolute ``positions`` [t] -> (q, k [b, h, t, f], v [b, h, t, e], log a)."""
        raise NotImplementedError

    def finish(self, x: Tensor, out: Tensor) -> Tensor:
        """The heads' outputs [b, h, t, e] (x [b, t, d] the layer's input, for gates) -> [b, t, d]."""
        raise NotImplementedError

    @classmethod
    def contract_state(cls) -> StateContract:
        return StateContract(bound=0)  # a decayed sum: no token kept, exact at any length

    def init_state(self, batch_size: int) -> DecayState:
        super().init_state(batch_size)
        return DecayState()

    def state_bound(self) -> int:
        return 0

    def keys_per_query(self, t: int) -> KeysPerQuery:
        keys = dense_keys(t, True)
        return KeysPerQuery(keys.keys, "dense causal, through the decayed state (no score per key past the chunk)")

    def head_dims(self) -> tuple[int, int]:
        """(f, e): key and value dims per head."""
        return self.key_dim, self.value_dim

    def expanded_head_dims(self) -> tuple[int, int]:
        """(f, e) from the options expand_k and expand_v: q/k are expand_k * d_model wide, v expand_v * d_model,
        split over the heads; refused unless both are whole numbers of features divisible by n_heads."""
        name, h, o = self.registry_name, self.n_heads, self.options
        dims = []
        for label, ratio in (("expand_k", o.expand_k), ("expand_v", o.expand_v)):
            width = self.d_model * ratio
            require(
                width == int(width) and int(width) % h == 0,
                f"{name}: {label} * d_model = {width} must be a whole number of features divisible by n_heads={h}",
            )
            dims.append(int(width) // h)
        return dims[0], dims[1]

    def forward_flops(self, t: int) -> FlopCount:
        f, e = self.head_dims()
        c = min(self.options.chunk_size, t)
        heads = self.n_heads
        intra = 2.0 * t * c * (f + e)  # C x C scores and their values, per chunk (the full block is computed)
        carried = 2.0 * 2 * t * f * e  # each chunk reads the state and writes what it adds
        return FlopCount(
            {"projections": t * self.projection_flops(), "intra-chunk": heads * intra, "decayed state": heads * carried}
        )

    def checked_state(self, state: DecayState | None, x: Tensor) -> Tensor | None:
        memory = None if state is None else state.memory
        if memory is not None and memory.shape[0] != x.shape[0]:
            raise ValueError(
                f"{self.registry_name}: the state holds batch size {memory.shape[0]}, the input {x.shape[0]}"
            )
        return memory

    def forward(
        self,
        x: Tensor,
        *,
        context: Tensor | None = None,
        pad_mask: Tensor | None = None,
        state=None,
        documents: Tensor | None = None,
    ) -> AttnOutput:
        """``documents`` [b, t] (packed rows): the decayed sum starts empty at every document's first token
        (``segments`` of the chunk kernel); the rotation keeps the row's positions (it depends on i - j only)."""
        self.check_inputs(x, context, pad_mask, state)
        segments = packed_segments(self, documents, x, state)
        memory = self.checked_state(state, x)
        seen = 0 if state is None else state.seen
        positions = torch.arange(seen, seen + x.shape[1], device=x.device)
        q, k, v, log_decay = self.project(x, positions)
        k, log_decay = mask_padding(k, log_decay, pad_mask)
        chunk_size = self.options.chunk_size
        out, final = decay_attention(q, k, v, log_decay, chunk_size=chunk_size, state=memory, segments=segments)
        new_state = None if state is None else DecayState(final.detach(), seen + x.shape[1])
        return AttnOutput(self.finish(x, out), state=new_state)

    # -- context parallelism: the earlier ranks' decayed sums ---------------------------------------------
    def context_refusal(self) -> str | None:
        return None

    def attend_chunk(self, x: Tensor, chunk, *, pad_mask: Tensor | None = None, state=None, **kwargs) -> AttnOutput:
        """Of the earlier ranks a decay layer reads only the state they leave: each rank runs its tokens from
        an empty state, sends (its total decay, the state it adds) to the later ranks, and adds what the
        state before it contributes to its queries (the outputs are linear in the starting state)."""
        self.check_inputs(x, None, pad_mask, None)
        self.refuse_chunk_state(state)
        q, k, v, log_decay = self.project(x, chunk.positions(x.device))
        k, log_decay = mask_padding(k, log_decay, pad_mask)
        out, added = chunk_decay_attention(q, k, v, log_decay, chunk_size=self.options.chunk_size)
        before = state_before_rank(chunk, added, log_decay)
        out = out + read_state(q, log_decay, before).to(out.dtype)
        return AttnOutput(self.finish(x, out))
