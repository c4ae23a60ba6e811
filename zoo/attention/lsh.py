"""Locality-sensitive-hashing (LSH) attention, and the full shared-QK attention it approximates.

Paper: "Reformer: The Efficient Transformer", Kitaev, Kaiser & Levskaya 2020, arXiv:2001.04451,
Section 2 (shared-QK attention, angular LSH, sorted chunks, multi-round hashing).

Per head and per hash round r:

1. Shared query-key space: one projection gives the queries q; the keys are the length-normalised
   queries, k_j = q_j / ||q_j||. A token never attends to itself unless nothing else is
   available (its own key would always win: q_i . k_i is the largest dot product), so its own
   score is replaced by -1e5, as in the paper.
2. Angular LSH: h(x) = argmax([xR ; -xR]) with a random rotation R [k, n_buckets/2] per head and
   round.
3. Sort by (bucket, position); cut the sorted sequence into chunks of ``chunk_size``; each chunk
   attends to itself and the previous chunk, within its own bucket, causally by original position.
4. Each round yields outputs o_r and their log-sum-exp normalisers z_r; the rounds combine as
   o = sum_r exp(z_r - logsumexp_r z_r) o_r, i.e. one softmax over the union of the rounds' keys.
5. Un-sort back to the original order.

Complexity: O(t * chunk) memory and time per head and round, plus the O(t log t) sort. Nothing of
size t x t is ever built: the scores live in blocks [b*h, rounds, n_chunks, chunk, 2*chunk],
computed with one batched matmul, not a Python loop.

Deviations (each on purpose, each tested):

- Rounds are sorted separately rather than as one concatenated sequence, so a chunk never mixes
  two rounds; chunk 0 looks back (wrapping around) to the round's last chunk.
- Causal mode, within-bucket window: a query sees the ``chunk_size`` most recent items of its own
  bucket (sorted distance <= chunk_size) instead of "own + previous chunk". In the paper's form
  the chunk boundaries depend on how many *later* tokens fall in lower buckets, so an output can
  change when a future token changes (information leaks from the future through the sort). With
  the window the key set of position i depends on tokens <= i only: strict causality, checked by
  perturbation in tests/test_lsh.py. The window always fits in own + previous chunk, so the
  blocked computation is unchanged.
- Padding (the caller's pad_mask and the tail added to reach a multiple of ``chunk_size``) is
  hashed to an extra bucket sorted last, so padded tokens never take a real token's place in a
  chunk: outputs of real tokens do not depend on what the padding holds.
- No de-duplication of keys attended in several rounds (the paper's log N_ij term); the
  reference implementations (trax, reformer-pytorch) leave it off by default as well.
- Hashing is seeded: the rotations are a function of (``seed``, layer index, step), where the
  step advances in ``after_optimizer_step``. Two calls between optimiser steps hash the same way
  (a recomputing stack gets the same buckets in backward without touching the RNG), while
  training still sees fresh rotations every step, as in the paper.

Shapes: x [b, t, d]; pad_mask [b, t] bool (True = real). Internally B = b*h, R = n_hashes,
n = chunks per round, c = chunk size, k = head dim.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from zoo.attention.base import Attention, AttnOutput, causal_allowed, guard_empty_rows
from zoo.config import require
from zoo.registry import ATTENTION

SELF_SCORE = -1e5  # the paper's score for attending to oneself: used only when nothing else is allowed
MASKED_SCORE = -1e9  # finite, so a query that may see nothing (padding) gets no NaN


class SharedQKProjections(Attention):
    """The parameters shared by ``lsh`` and ``shared_qk`` (same names, so weights transfer)."""

    no_cross_reason = "shared-QK attention derives its keys from the queries (k = q / |q|), so keys cannot come from another sequence"

    def __init__(self, d_model: int, n_heads: int, **kwargs):
        super().__init__(d_model, n_heads, **kwargs)
        bias = self.options.bias
        self.to_qk = nn.Linear(d_model, d_model, bias=bias)
        self.to_v = nn.Linear(d_model, d_model, bias=bias)
        self.to_out = nn.Linear(d_model, d_model, bias=bias)


@ATTENTION.register("lsh")
class LSHAttention(SharedQKProjections):
    content_routed = True  # the buckets (hence each query's key set) depend on the content

    @dataclass
    class Options:
        n_hashes: int = 4  # rounds of hashing
        n_buckets: int = 0  # even; 0 = the number of chunks rounded up to even (average bucket ~ one chunk)
        chunk_size: int = 64
        attend_across_buckets: bool = False  # True: a chunk sees every key of its own + previous chunk
        seed: int = 0  # base seed of the random rotations
        bias: bool = True  # bias in the projections

        def __post_init__(self) -> None:
            require(isinstance(self.n_hashes, int) and self.n_hashes >= 1, f"n_hashes must be an int >= 1, got {self.n_hashes!r}")
            require(isinstance(self.chunk_size, int) and self.chunk_size >= 1, f"chunk_size must be an int >= 1, got {self.chunk_size!r}")
            require(
                isinstance(self.n_buckets, int) and self.n_buckets >= 0 and self.n_buckets != 1 and self.n_buckets % 2 == 0,
                f"n_buckets must be 0 (auto) or an even int >= 2 (angular LSH takes the argmax over [xR; -xR]), got {self.n_buckets!r}",
            )

    def __init__(self, d_model: int, n_heads: int, **kwargs):
        super().__init__(d_model, n_heads, **kwargs)
        # advanced after each optimiser step: the rotations are a function of it (see module doc)
        self.register_buffer("hash_step", torch.zeros((), dtype=torch.long), persistent=False)
        self._rotation_cache: tuple[tuple, Tensor] | None = None

    @classmethod
    def contract_options(cls) -> dict:
        return {"chunk_size": 4, "n_hashes": 2}  # several chunks and a padded tail at t = 7, 19, 33

    def after_optimizer_step(self) -> None:
        self.hash_step += 1

    def check_inputs(self, x, context, pad_mask, state) -> None:
        if context is not None:
            raise ValueError(f"{self.registry_name} cannot do cross-attention (context=...): {self.no_cross_reason}; use e.g. vanilla for cross_attention")
        super().check_inputs(x, context, pad_mask, state)

    # -- hashing -----------------------------------------------------------------------------
    def n_buckets_for(self, padded_length: int) -> int:
        """The bucket count used at this (chunk-padded) length; refuses one the length cannot hold."""
        c = min(self.options.chunk_size, padded_length)
        n_buckets = self.options.n_buckets
        if n_buckets == 0:
            n_chunks = padded_length // c
            return max(2, n_chunks + n_chunks % 2)
        if n_buckets > max(2, padded_length):
            raise ValueError(f"lsh: n_buckets={n_buckets} is too large for length {padded_length} (padded to a multiple of chunk_size); valid: an even number in [2, {max(2, padded_length - padded_length % 2)}], or 0 for auto")
        return n_buckets

    def rotations(self, n_buckets: int, device: torch.device, dtype: torch.dtype) -> Tensor:
        """[h, k, R, n_buckets/2] random rotations, a pure function of (seed, layer, step)."""
        key = (int(self.hash_step), self.options.n_hashes, n_buckets, device, dtype)
        if self._rotation_cache is None or self._rotation_cache[0] != key:
            seed = (self.options.seed * 1_000_003 + self.layer_index * 10_007 + key[0]) % (2**63)
            g = torch.Generator().manual_seed(seed)
            r = torch.randn(self.n_heads, self.head_dim, self.options.n_hashes, n_buckets // 2, generator=g)
            self._rotation_cache = (key, r.to(device=device, dtype=dtype))
        return self._rotation_cache[1]

    def hash(self, qk: Tensor, real: Tensor, n_buckets: int) -> Tensor:
        """qk [b, h, t, k], real [b, t] -> buckets [b, h, R, t] in [0, n_buckets]; padding -> n_buckets."""
        with torch.no_grad():
            rotated = torch.einsum("bhtk,hkrn->bhrtn", qk, self.rotations(n_buckets, qk.device, qk.dtype))
            # argmax over [xR ; -xR] without building the concatenation
            top, top_index = rotated.max(-1)
            bottom, bottom_index = rotated.min(-1)
            buckets = torch.where(top >= -bottom, top_index, bottom_index + n_buckets // 2)
            return buckets.masked_fill(~real[:, None, None, :], n_buckets)

    # -- forward -----------------------------------------------------------------------------
    def forward(self, x: Tensor, *, context: Tensor | None = None, pad_mask: Tensor | None = None, state=None) -> AttnOutput:
        self.check_inputs(x, context, pad_mask, state)
        b, t, _ = x.shape
        h, R, k = self.n_heads, self.options.n_hashes, self.head_dim
        c = min(self.options.chunk_size, t)
        tp = -(-t // c) * c  # padded length: a multiple of the chunk size
        n = tp // c
        n_buckets = self.n_buckets_for(tp)

        qk = self.split_heads(self.to_qk(x))  # [b, h, t, k]
        v = self.split_heads(self.to_v(x))
        real = torch.ones(b, t, dtype=torch.bool, device=x.device) if pad_mask is None else pad_mask
        if tp != t:
            qk, v = F.pad(qk, (0, 0, 0, tp - t)), F.pad(v, (0, 0, 0, tp - t))
            real = F.pad(real, (0, tp - t), value=False)

        buckets = self.hash(qk, real, n_buckets)  # [b, h, R, tp]
        positions = torch.arange(tp, device=x.device)
        # sort by (bucket, position) within each round; ``order`` holds original positions
        order = (buckets * tp + positions).argsort(dim=-1)  # [b, h, R, tp]
        order = rearrange(order, "b h r t -> (b h) r t")
        B = b * h
        flat = order + (torch.arange(B, device=x.device) * tp)[:, None, None]  # rows of [(b h t), k]
        flat = flat.reshape(-1)

        q_sorted = rearrange(qk, "b h t k -> (b h t) k").index_select(0, flat)
        v_sorted = rearrange(v, "b h t k -> (b h t) k").index_select(0, flat)
        q_sorted = q_sorted.view(B, R, n, c, k)
        v_sorted = v_sorted.view(B, R, n, c, k)
        k_sorted = F.normalize(q_sorted, dim=-1)  # shared QK: keys are unit-length queries
        bucket_sorted = rearrange(buckets, "b h r t -> (b h) r t").gather(-1, order).view(B, R, n, c)
        pos_sorted = order.view(B, R, n, c)
        real_sorted = rearrange(real[:, None].expand(b, h, tp), "b h t -> (b h) t").gather(-1, order.view(B, R * tp)).view(B, R, n, c)

        keys, values = _look_back(k_sorted), _look_back(v_sorted)  # [B, R, n, 2c or c, k]
        key_pos, key_bucket, key_real = _look_back(pos_sorted), _look_back(bucket_sorted), _look_back(real_sorted)

        scores = torch.matmul(q_sorted * k**-0.5, keys.transpose(-1, -2))  # [B, R, n, c, w]
        q_pos = pos_sorted[..., :, None]
        masked = ~key_real[..., None, :]
        if self.causal:
            masked = masked | (key_pos[..., None, :] > q_pos)
        if not self.options.attend_across_buckets:
            masked = masked | (key_bucket[..., None, :] != bucket_sorted[..., :, None])
            if self.causal and n > 1:
                masked = masked | _outside_window(c, x.device)
        scores = scores.masked_fill(key_pos[..., None, :] == q_pos, SELF_SCORE).masked_fill(masked, MASKED_SCORE)

        lse = torch.logsumexp(scores, dim=-1, keepdim=True)  # [B, R, n, c, 1]
        weights = torch.exp(scores - lse)
        weights = F.dropout(weights, self.dropout, self.training)
        out_sorted = torch.matmul(weights, values)  # [B, R, n, c, k]

        # un-sort: position order[i] came from sorted slot i
        undo = torch.empty_like(order).scatter_(-1, order, positions.expand_as(order))  # [B, R, tp]
        undo_flat = (undo + (torch.arange(B * R, device=x.device) * tp).view(B, R, 1)).reshape(-1)
        out = out_sorted.reshape(B * R * tp, k).index_select(0, undo_flat).view(B, R, tp, k)
        if R > 1:
            z = lse.reshape(B, R, tp).gather(-1, undo)  # [B, R, tp]
            out = (out * torch.softmax(z, dim=1)[..., None]).sum(1)
        else:
            out = out[:, 0]
        out = rearrange(out[:, :t], "(b h) t k -> b t (h k)", b=b)
        return AttnOutput(self.to_out(out))


def _look_back(x: Tensor) -> Tensor:
    """Keys of each chunk: the previous chunk (wrapping around) then its own. [B, R, n, c, ...] ->
    [B, R, n, 2c, ...]; with one chunk only its own (the "previous" would be itself twice)."""
    if x.shape[2] == 1:
        return x
    return torch.cat([x.roll(1, dims=2), x], dim=3)


_WINDOW_CACHE: dict[tuple[int, torch.device], Tensor] = {}


def _outside_window(c: int, device: torch.device) -> Tensor:
    """bool [c, 2c]: True where key slot j (previous chunk 0..c-1, own chunk c..2c-1) lies more than
    c sorted places before query slot a (key sorted index < query sorted index - c)."""
    key = (c, device)
    if key not in _WINDOW_CACHE:
        a = torch.arange(c, device=device)[:, None]
        j = torch.arange(2 * c, device=device)[None, :]
        _WINDOW_CACHE[key] = j < a
    return _WINDOW_CACHE[key]


@ATTENTION.register("shared_qk")
class SharedQKAttention(SharedQKProjections):
    """Full attention with LSH's shared query-key space (keys = unit-length queries, no attention to
    oneself unless nothing else is visible): the paper's "full attention" baseline (Table 2), with
    the same parameter names as ``lsh`` so a model trained with one evaluates with the other.
    Dense, O(t^2), through fused SDPA."""

    @dataclass
    class Options:
        bias: bool = True

    def check_inputs(self, x, context, pad_mask, state) -> None:
        if context is not None:
            raise ValueError(f"{self.registry_name} cannot do cross-attention (context=...): {self.no_cross_reason}; use e.g. vanilla for cross_attention")
        super().check_inputs(x, context, pad_mask, state)

    def forward(self, x: Tensor, *, context: Tensor | None = None, pad_mask: Tensor | None = None, state=None) -> AttnOutput:
        self.check_inputs(x, context, pad_mask, state)
        q = self.split_heads(self.to_qk(x))
        v = self.split_heads(self.to_v(x))
        t = x.shape[1]
        eye = torch.eye(t, dtype=torch.bool, device=x.device)
        allowed = causal_allowed(t, t, x.device) if self.causal else torch.ones(t, t, dtype=torch.bool, device=x.device)
        allowed = (allowed & ~eye)[None, None]  # [1, 1, t, t]
        if pad_mask is not None:
            allowed = allowed & pad_mask[:, None, None, :]
        allowed = allowed | (eye & ~allowed.any(-1, keepdim=True))  # oneself, when nothing else is visible
        allowed = guard_empty_rows(allowed)
        out = F.scaled_dot_product_attention(q, F.normalize(q, dim=-1), v, attn_mask=allowed, dropout_p=self.dropout if self.training else 0.0)
        return AttnOutput(self.to_out(self.merge_heads(out)))
