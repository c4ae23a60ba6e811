"""Sparse Sinkhorn attention: blocks attend to a learned, Sinkhorn-balanced soft sorting of the blocks.

Paper: "Sparse Sinkhorn Attention", Tay, Bahri, Yang, Metzler, Juan 2020, arXiv:2002.11296, Section 3
(sorting network, Sinkhorn balancing, sparse attention, causal variant, SortCut).

The sequence is cut into n blocks of ``block`` positions. Per head:

1. Sorting network: block sums psi(X)_i = sum of block i's tokens (padding left out); R = relu(psi(X) W_P
   + b_P) [n, n] (W_P: d -> ``max_len`` / block columns, the first n used; ``max_len`` left 0 is the
   model's max_len).
2. Gumbel-Sinkhorn: S = exp of (R + Gumbel noise in training) / ``temperature``, balanced by
   ``sinkhorn_iterations`` alternating row and column normalisations (in log space): a soft permutation.
3. Sorted keys and values: block i of the sorted sequence is sum_j S_ij K_j (the same for V).
4. Attention: each query block attends to its sorted block and, with ``local`` (default), to its own
   block, under one softmax: 2 x block keys per query, O(t block) scores, never t x t.

SortCut (``sortcut`` = c > 0, bidirectional): every query attends to the first c blocks of the sorted
sequence only (c x block keys, no local block): O(t c block).

Causal: the block representation that sorts block i is the sum of the blocks before it (so nothing in or
after block i decides its sort), block i may only be assigned earlier blocks (j < i), and the local block
is masked causally. Balancing: rows only (a softmax over j < i); column normalisation would rescale row
i by later rows, i.e. by later tokens, so it is left out in causal use (the first block has no earlier
block and attends locally only).

Shapes: x [b, t, d] -> q, k, v [b, h, t, k] -> blocks [b, h, n, block, k]; R, S [b, h, n, n];
out [b, t, d].

Positions inside attention: rope rotates every query and key at its absolute position before the sort,
so a query's score with a sorted key sum_j S_ij R_{p_j} k_{p_j} is the same mixture of rotated products
q^T R_{p_j - p} k_{p_j}, each relative. A pair bias is refused: a sorted key mixes keys at several
positions, so it has no one distance i - j to bias.

Streaming (causal, :class:`SinkhornCache`): block i is sorted by the blocks before it and mixes only
them, its own block is masked causally, so a stream continues exactly from the keys and values seen so
far, which of them are real, and the running block sums the sorting network reads; each call computes
the query blocks its tokens fall in. The state grows with the stream, up to ``max_len`` tokens.

Deviations: whether the paper's sorted attention keeps the local block is an option here (default on);
Gumbel noise is used in training only. Padding: padded keys and values are zeroed before sorting, a block
of padding only neither sorts nor is sorted (its row and column are masked out of the balancing), and
padded keys are masked in attention.
A length longer than ``max_len`` is refused (W_P has no columns for its blocks).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from einops import rearrange
from torch import Tensor, nn

from zoo.attention.base import (
    ATTENTION,
    Attention,
    AttnOutput,
    FlopCount,
    KeysPerQuery,
    StateContract,
    dense_keys,
    require_length,
)
from zoo.attention.blocked import attend_masked, pad_time, padded_length
from zoo.config import require


def sinkhorn(logits: Tensor, allowed: Tensor, iterations: int, columns: bool = True) -> Tensor:
    """Balance exp(logits) [..., n, n] over the ``allowed`` entries by alternating row and column
    normalisations in log space (rows only when ``columns`` is False); entries not allowed, and rows or
    columns with nothing allowed, come out 0."""
    masked = -1e9  # finite: an all-masked row must not make NaN gradients; masked again after every step
    log = logits.masked_fill(~allowed, masked)
    for _ in range(iterations if columns else 1):
        log = (log - torch.logsumexp(log, dim=-1, keepdim=True)).masked_fill(~allowed, masked)
        if columns:
            log = (log - torch.logsumexp(log, dim=-2, keepdim=True)).masked_fill(~allowed, masked)
    return torch.exp(log) * allowed


@dataclass
class SinkhornCache:
    """A causal stream's past: keys (rotated) and values [b, h, s, k], which are real (valid [b, s]), the
    block sums of the layer's inputs [b, blocks begun, d] (padding left out), and the next position."""

    k: Tensor | None = None
    v: Tensor | None = None
    valid: Tensor | None = None
    sums: Tensor | None = None
    next: int = 0

    @property
    def length(self) -> int:
        return self.next


@ATTENTION.register("sinkhorn")
class SinkhornAttention(Attention):
    no_packing_reason = "sorts blocks of the whole row against each other, which mixes documents"
    projection_features = ("grouped_kv", "qk_norm")  # the stream keeps grouped keys; widened where scored
    no_projection_reason = (
        "it sorts blocks by a learned network and scores them through SDPA, writing no score out to cap"
    )
    position_kinds = ("rotary",)  # q and k rotated before the sort (see the module notes)
    no_position_reason = (
        "a sorted key is a mixture sum_j S_ij k_j of keys at several positions (a soft permutation of blocks), "
        "so its score has no single distance i - j for a bias b(i - j)"
    )
    supports_memory = True  # causal: the keys, values and block sums seen so far (up to max_len tokens)
    length_option = "max_len"
    lra_row = "Sinkhorn Trans."

    def context_refusal(self) -> str:
        return (
            "attention 'sinkhorn' sorts blocks by a learned soft permutation over every earlier block (content "
            "routed), so a chunk's keys are mixtures of all earlier chunks' blocks; not written"
        )

    @dataclass
    class Options:
        block: int = 64  # positions per block
        max_len: int = 0  # the longest sequence (sorting network: max_len / block columns); 0 = the model's
        sinkhorn_iterations: int = 8  # row + column normalisations (bidirectional)
        temperature: float = 0.75  # tau of the Gumbel-Sinkhorn
        gumbel: bool = True  # Gumbel noise on the sorting logits in training
        sortcut: int = 0  # c > 0: every query attends to the first c sorted blocks only (bidirectional)
        local: bool = True  # attend to the own block besides the sorted one
        bias: bool = True  # bias in the projections

        def __post_init__(self) -> None:
            require(self.block >= 1, f"block must be >= 1, got {self.block}")
            require(self.max_len >= 0, f"max_len must be >= 0 (0 = the model's max_len), got {self.max_len}")
            require(self.sinkhorn_iterations >= 1, f"sinkhorn_iterations must be >= 1, got {self.sinkhorn_iterations}")
            require(self.temperature > 0, f"temperature must be > 0, got {self.temperature}")
            require(self.sortcut >= 0, f"sortcut must be >= 0 (0 = off), got {self.sortcut}")

    @classmethod
    def contract_options(cls) -> dict:
        return {"block": 4, "max_len": 96, "sinkhorn_iterations": 3}

    @classmethod
    def contract_state(cls) -> StateContract:
        return StateContract(bound=None)  # every earlier block can be sorted into a later one

    def init_state(self, batch_size: int) -> SinkhornCache:
        super().init_state(batch_size)  # a bidirectional layer refuses, saying why
        return SinkhornCache()

    def __init__(self, d_model: int, n_heads: int, **kwargs):
        super().__init__(d_model, n_heads, **kwargs)
        o = self.options
        require(
            not (self.causal and o.sortcut),
            "sinkhorn: SortCut attends to the first sorted blocks of the whole sequence; it has no causal form",
        )
        require_length(o.max_len, "sinkhorn")
        self.add_projections(bias=o.bias)
        self.n_blocks = -(-o.max_len // o.block)
        self.sort_net = nn.Linear(d_model, n_heads * self.n_blocks, bias=o.bias)  # W_P, b_P per head

    def keys_per_query(self, t: int) -> KeysPerQuery:
        o = self.options
        keys = dense_keys(t, self.causal)
        attended = o.sortcut * o.block if o.sortcut else (2 if o.local else 1) * o.block
        return KeysPerQuery(keys.keys, f"every earlier block through the sort; {attended} keys attended")

    def forward_flops(self, t: int) -> FlopCount:
        o, d = self.options, self.d_model
        n = -(-t // o.block)
        attended = o.sortcut * o.block if o.sortcut else (2 if o.local else 1) * o.block
        return FlopCount(
            {
                "projections": t * 2.0 * sum(m.weight.numel() for m in (self.to_q, self.to_k, self.to_v, self.to_out)),
                "sorting network": n * 2.0 * d * self.n_heads * n,
                "sorting": 2 * 2.0 * n * t * d,  # S K and S V
                "attention": 2.0 * t * self.score_terms * d * attended,
            }
        )

    def sort_matrix(self, sums: Tensor, valid: Tensor, n: int) -> Tensor:
        """S [b, h, n, n]: row i = how block i's sorted block mixes the key blocks. sums [b, n, d]: each
        block's sum of real inputs; valid [b, T] (T = n block)."""
        o = self.options
        if self.causal:  # block i is sorted by the blocks before it only
            sums = torch.cumsum(sums, dim=1) - sums
        logits = torch.relu(self.sort_net(sums))  # [b, n, h N]
        logits = rearrange(logits, "b n (h m) -> b h n m", h=self.n_heads)[..., :n]
        if self.training and o.gumbel:
            uniform = torch.rand_like(logits).clamp(1e-9, 1 - 1e-9)
            logits = logits - torch.log(-torch.log(uniform))
        real_block = rearrange(valid, "b (n s) -> b n s", s=o.block).any(-1)  # [b, n]
        allowed = real_block[:, None, :, None] & real_block[:, None, None, :]  # [b, 1, n, n]: padding blocks out
        if self.causal:
            allowed = allowed & torch.ones(n, n, dtype=torch.bool, device=sums.device).tril(-1)
        return sinkhorn(logits / o.temperature, allowed, o.sinkhorn_iterations, columns=not self.causal)

    def forward(
        self, x: Tensor, *, context: Tensor | None = None, pad_mask: Tensor | None = None, state=None
    ) -> AttnOutput:
        self.check_inputs(x, context, pad_mask, state)
        o = self.options
        b, t, _ = x.shape
        start = state.next if state is not None else 0
        end = start + t
        require(
            end <= o.max_len,
            f"sinkhorn: sequence length {end} is longer than max_len={o.max_len} ({self.n_blocks} blocks)",
        )
        size, length = o.block, padded_length(end, o.block)
        n = length // size
        real = torch.ones(b, t, dtype=torch.bool, device=x.device) if pad_mask is None else pad_mask
        positions = torch.arange(start, end, device=x.device)
        q, k, v = (self.split_heads(p(x)) for p in (self.to_q, self.to_k, self.to_v))
        q, k = self.rotate(q, positions), self.rotate(k, positions)  # rope (else themselves), before the sort
        keep = real[:, None, :, None].to(x.dtype)
        k, v = k * keep, v * keep
        sums = x.new_zeros(b, n, x.shape[-1])  # block sums of the real inputs, the earlier ones from the state
        if state is not None and state.sums is not None:
            sums[:, : state.sums.shape[1]] = state.sums
            k, v = torch.cat([state.k, k], dim=2), torch.cat([state.v, v], dim=2)
            real = torch.cat([state.valid, real], dim=1)
        sums = sums.index_add(1, positions // size, x * keep[:, 0])
        valid = torch.nn.functional.pad(real, (0, length - end), value=False)
        s = self.sort_matrix(sums, valid, n)
        k, v = pad_time(k, length), pad_time(v, length)
        new_state = None
        if state is not None:
            new_state = SinkhornCache(k[:, :, :end].detach(), v[:, :, :end].detach(), real.detach(), sums.detach(), end)
        k, v = self.expand_kv(k, v)  # the stream keeps grouped keys and values; every query head scores them
        kb, vb = (rearrange(z, "b h (n s) k -> b h n s k", s=size) for z in (k, v))
        blocks_valid = rearrange(valid, "b (n s) -> b n s", s=size)
        if o.sortcut:  # bidirectional only: never a state
            out = self.sortcut_attention(pad_time(q, length), s, kb, vb, blocks_valid)
            return AttnOutput(self.to_out(self.merge_heads(out[:, :, :t])))
        first = start // size  # the query blocks this call's tokens fall in: first ... n - 1
        qb = pad_time(torch.nn.functional.pad(q, (0, 0, start - first * size, 0)), (n - first) * size)
        out = self.sorted_attention(qb, s[:, :, first:], kb, vb, blocks_valid, first)
        out = out[:, :, start - first * size : start - first * size + t]
        return AttnOutput(self.to_out(self.merge_heads(out)), state=new_state)

    def sortcut_attention(self, q: Tensor, s: Tensor, kb: Tensor, vb: Tensor, blocks_valid: Tensor) -> Tensor:
        """Every query [b, h, T, k] to the first c sorted blocks only (SortCut) -> [b, h, T, k]."""
        cut = min(self.options.sortcut, s.shape[-1])
        ks, vs = (
            rearrange(torch.einsum("bhij,bhjsk->bhisk", s[:, :, :cut], z), "b h c s k -> b h (c s) k") for z in (kb, vb)
        )
        weights = torch.einsum("bhij,bjs->bhis", s[:, :, :cut], blocks_valid.to(kb.dtype))
        slot_valid = rearrange(weights > 0, "b h c s -> b h 1 (c s)")
        return attend_masked(q, ks, vs, slot_valid, dropout=self.dropout if self.training else 0.0)

    def sorted_attention(
        self, qb: Tensor, s: Tensor, kb: Tensor, vb: Tensor, blocks_valid: Tensor, first: int
    ) -> Tensor:
        """Query blocks first ... n - 1 (qb [b, h, (n - first) block, k]; s [b, h, n - first, n] their rows
        of the sort) to their sorted block and, with ``local``, their own block -> [b, h, (n - first) block, k]."""
        size = self.options.block
        ks, vs = (torch.einsum("bhij,bhjsk->bhisk", s, z) for z in (kb, vb))  # sorted blocks [b, h, m, s, k]
        slot_valid = torch.einsum("bhij,bjs->bhis", s, blocks_valid.to(kb.dtype)) > 0  # [b, h, m, s]
        keys, values, mask = ks, vs, slot_valid[:, :, :, None, :].expand(-1, -1, -1, size, -1)
        if self.options.local:
            keys, values = torch.cat([kb[:, :, first:], ks], dim=3), torch.cat([vb[:, :, first:], vs], dim=3)
            own = blocks_valid[:, None, first:, None, :].expand(-1, 1, -1, size, -1)  # [b, 1, m, s, s]
            if self.causal:
                own = own & torch.ones(size, size, dtype=torch.bool, device=kb.device).tril()
            mask = torch.cat([own.expand(-1, self.n_heads, -1, -1, -1), mask], dim=-1)
        out = attend_masked(
            rearrange(qb, "b h (n s) k -> b (h n) s k", s=size),
            rearrange(keys, "b h n w k -> b (h n) w k"),
            rearrange(values, "b h n w k -> b (h n) w k"),
            rearrange(mask, "b h n s w -> b (h n) s w"),
            dropout=self.dropout if self.training else 0.0,
        )
        return rearrange(out, "b (h n) s k -> b h (n s) k", h=self.n_heads)
