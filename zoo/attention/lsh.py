"""Locality-sensitive-hashing (LSH) attention (the full shared-QK attention it approximates: ``shared_qk.py``).

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
computed with one batched matmul, not a Python loop. In the causal case (the LM) the look-back
keys and values are not copied: all rounds' sorted chunks sit in one flat sequence behind a filler
chunk, and each chunk's key block (previous chunk, own chunk) is an overlapping strided window of
it, read in place by the matmul (chunk 0's look-back is masked whole, so what precedes it in the
flat sequence never counts).

Deviations (each on purpose, each tested):

- Rounds are sorted separately rather than as one concatenated sequence, so a chunk never mixes
  two rounds; chunk 0 looks back (wrapping around) to the round's last chunk.
- Causal mode, within-bucket window: a query sees the ``chunk_size`` most recent items of its own
  bucket (sorted distance <= chunk_size) instead of "own + previous chunk". In the paper's form
  the chunk boundaries depend on how many *later* tokens fall in lower buckets, so an output can
  change when a future token changes (information leaks from the future through the sort). With
  the window the key set of position i depends on tokens <= i only: strict causality, checked by
  perturbation in tests/parts/test_lsh.py. The window always fits in own + previous chunk, so the
  blocked computation is unchanged. ``look_back="chunk"`` restores the paper's form (every earlier
  same-bucket key of the own and the previous chunk) for comparison with the paper and with
  implementations that use it: its key set is still past positions only, but which past keys fall
  in the two chunks moves with the future's buckets (tests/parts/test_lsh.py shows both).
- Padding (the caller's pad_mask and the tail added to reach a multiple of ``chunk_size``) is
  hashed to an extra bucket sorted last, so padded tokens never take a real token's place in a
  chunk: outputs of real tokens do not depend on what the padding holds.
- No de-duplication of keys attended in several rounds (the paper's log N_ij term); the
  reference implementations (trax, reformer-pytorch) leave it off by default as well.
- Scores are q . k / sqrt(d_k) with k = q / |q|: the paper's form (Section 2 keeps the scaled
  dot product of the Transformer). trax and the Hugging Face port score q . k / |k| unscaled
  (their ``length_normalized`` divides by the RMS, then by sqrt(d_k): a unit key), so their
  logits are sqrt(d_k) times ours, a temperature the learned W_qk absorbs at a given point but
  not along training (the optimiser steps W_qk, not the logits). ``scale_scores=False`` scores as
  they do; equivalently, multiplying ``to_qk``'s weight and bias by sqrt(d_k) turns one form into
  the other (the angular hash is scale-free, so the buckets stay the same). tests/parts/test_lsh.py
  checks both.
- Hashing is seeded: the rotations are a function of (``seed``, layer index, step), where the
  step advances in ``after_optimizer_step``. Two calls between optimiser steps hash the same way
  (a recomputing stack gets the same buckets in backward without touching the RNG), while
  training still sees fresh rotations every step, as in the paper.

Positions inside attention: rope rotates the shared query-key vectors at their absolute positions
after hashing (the buckets stay a function of the content, so a shift of every position leaves the
key sets alone; rotation keeps |q|, so the unit keys are the rotated unit keys and oneself still
scores highest); a pair bias (ALiBi, T5) is added to each sorted chunk's scores from the original
positions that travel with the sorted items ([B, R, n, c, 2c], the size of the chunk scores).

Shapes: x [b, t, d]; pad_mask [b, t] bool (True = real). Internally B = b*h, R = n_hashes,
n = chunks per round, c = chunk size, k = head dim.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor

from zoo.attention.base import ATTENTION, AttnOutput, FlopCount, KeysPerQuery, StateContract, at_most_segment
from zoo.attention.lsh_stream import LSHCache, stream_lsh
from zoo.attention.shared_qk import SharedQKProjections
from zoo.attention.sorted_chunks import (
    _ChunkAttention,
    _Gather,
    _lead_chunk,
    _look_back,
    _static_masks,
    _UnitKeys,
)
from zoo.config import require
from zoo.precision import float32


@ATTENTION.register("lsh")
class LSHAttention(SharedQKProjections):
    no_packing_reason = "its sorted buckets do not mask keys of another document yet"
    takes_left_padding = True  # the bucket cache never keeps padding (lsh_stream.py)
    supports_memory = True  # a bucket cache continues a stream exactly (lsh_stream.py), given n_buckets
    content_routed = True  # the buckets (hence each query's key set) depend on the content
    position_kinds = ("rotary", "pair_bias")  # rotation after hashing; the bias on the sorted chunks' pairs
    lra_row = "Reformer"

    def context_refusal(self) -> str:
        return (
            "attention 'lsh' routes keys by content: which earlier keys a query sees depends on the hash buckets "
            "of every earlier token (sorted into chunks over the whole sequence), so a chunk cannot name the keys "
            "it reads without gathering all of them"
        )

    @dataclass
    class Options:
        n_hashes: int = 4  # rounds of hashing
        n_buckets: int = 0  # even; 0 = the number of chunks rounded up to even (average bucket ~ one chunk)
        chunk_size: int = 64
        attend_across_buckets: bool = False  # True: a chunk sees every key of its own + previous chunk
        # causal, same bucket: "window" = the chunk_size most recent same-bucket items (strictly causal);
        # "chunk" = the paper's every earlier same-bucket item of the own + previous chunk
        look_back: str = "window"
        seed: int = 0  # base seed of the random rotations
        bias: bool = True  # bias in the projections
        scale_scores: bool = True  # q . k / sqrt(d_k) (the paper); False: q . k unscaled, as trax and Hugging Face

        def __post_init__(self) -> None:
            require(
                isinstance(self.n_hashes, int) and self.n_hashes >= 1,
                f"n_hashes must be an int >= 1, got {self.n_hashes!r}",
            )
            require(
                isinstance(self.chunk_size, int) and self.chunk_size >= 1,
                f"chunk_size must be an int >= 1, got {self.chunk_size!r}",
            )
            require(
                isinstance(self.n_buckets, int)
                and self.n_buckets >= 0
                and self.n_buckets != 1
                and self.n_buckets % 2 == 0,
                "n_buckets must be 0 (auto) or an even int >= 2 (angular LSH takes the argmax over [xR; -xR]), got "
                f"{self.n_buckets!r}",
            )
            require(
                self.look_back in ("window", "chunk"),
                f"look_back must be 'window' (strictly causal) or 'chunk' (the paper's own + previous chunk), "
                f"got {self.look_back!r}",
            )

    def __init__(self, d_model: int, n_heads: int, **kwargs):
        super().__init__(d_model, n_heads, **kwargs)
        # advanced after each optimiser step: the rotations are a function of it (see module doc)
        self.register_buffer("hash_step", torch.zeros((), dtype=torch.long))  # saved, so resume replays the rotations
        self._rotation_cache: tuple[tuple, Tensor] | None = None

    @classmethod
    def contract_options(cls) -> dict:
        # several chunks and a padded tail at t = 7, 19, 33; a fixed bucket count, so it can stream
        return {"chunk_size": 4, "n_hashes": 2, "n_buckets": 4}

    @classmethod
    def contract_state(cls) -> StateContract:
        return StateContract(bound=4 * 4, exact_length=False)  # per round, chunk_size items of each bucket

    # -- streaming (lsh_stream.py) ------------------------------------------------------------------
    def stream_refusal(self) -> str | None:
        o = self.options
        why = None
        if o.n_buckets == 0:
            why = "n_buckets=0 sets the bucket count from each call's length; set attention.n_buckets (even, >= 2)"
        elif o.look_back == "chunk":
            why = "look_back='chunk' lets the chunk boundaries, set by later tokens, decide the keys; use 'window'"
        elif o.attend_across_buckets:
            why = "attend_across_buckets=True reads the whole sorted chunk, which later tokens reshuffle"
        if why and self.causal:
            return f"attention 'lsh' cannot continue a sequence from a state as built: {why}"
        return super().stream_refusal()

    def init_state(self, batch_size: int) -> LSHCache:
        super().init_state(batch_size)  # refuses, with the reason, a layer that cannot stream
        return LSHCache()

    def state_bound(self) -> int:
        """Per round, the ``chunk_size`` most recent items of each of the ``n_buckets`` buckets."""
        return self.options.n_buckets * self.options.chunk_size

    def state_read_share(self) -> float:
        """A step reads its own bucket's ``chunk_size`` slots per round (lsh_stream.py): one bucket in n_buckets."""
        return 1.0 / self.options.n_buckets

    def after_optimizer_step(self) -> None:
        self.hash_step += 1

    # -- what it sees and costs ------------------------------------------------------------------
    def keys_per_query(self, t: int) -> KeysPerQuery:
        """Each round, at most ``chunk_size`` keys of the query's own bucket in the causal window; up to
        twice that from the own and the previous chunk otherwise (bidirectional, ``look_back="chunk"``,
        across buckets): R x c or R x 2c at most over the rounds."""
        o = self.options
        window = self.causal and o.look_back == "window" and not o.attend_across_buckets
        per_round = min(o.chunk_size if window else 2 * o.chunk_size, t)
        keys = at_most_segment(float(o.n_hashes * per_round), t, self.causal)
        rule = "hashes x chunk (within buckets)" if window else "hashes x (own + previous chunk)"
        return KeysPerQuery(keys, rule, upper_bound=True)

    def forward_flops(self, t: int) -> FlopCount:
        """What is computed, not only what is attended: per head and round, each query chunk against its
        key block of 2c (scores and weighted values: 2 x 2 t h R 2c d_k), the projections to_qk, to_v,
        to_out (3 x 2 t d^2), and the hashing, done without gradient (2 t h d_k R n_buckets / 2)."""
        h, R, k = self.n_heads, self.options.n_hashes, self.head_dim
        c = min(self.options.chunk_size, t)
        padded = -(-t // c) * c
        n_buckets = self.n_buckets_for(padded)
        return FlopCount(
            forward={
                "projections": t * self.projection_flops(),
                "lsh_attention": 2.0 * 2 * padded * h * R * (2 * c) * k,
            },
            no_backward={"hashing": 2.0 * padded * h * k * R * (n_buckets // 2)},
        )

    # -- hashing -----------------------------------------------------------------------------
    def n_buckets_for(self, padded_length: int) -> int:
        """The bucket count used at this (chunk-padded) length; refuses one the length cannot hold."""
        c = min(self.options.chunk_size, padded_length)
        n_buckets = self.options.n_buckets
        if n_buckets == 0:
            n_chunks = padded_length // c
            return max(2, n_chunks + n_chunks % 2)
        if n_buckets > max(2, padded_length):
            raise ValueError(
                f"lsh: n_buckets={n_buckets} is too large for length {padded_length} (padded to a multiple of "
                "chunk_size); valid: an even number in "
                f"[2, {max(2, padded_length - padded_length % 2)}], or 0 for auto"
            )
        return n_buckets

    def rotations(self, n_buckets: int, device: torch.device, dtype: torch.dtype) -> Tensor:
        """[h, k, R, n_buckets/2] random rotations, a pure function of (seed, layer, step)."""
        key = (int(self.hash_step), self.layer_index, self.options.n_hashes, n_buckets, device, dtype)
        if self._rotation_cache is None or self._rotation_cache[0] != key:
            seed = (self.options.seed * 1_000_003 + self.layer_index * 10_007 + key[0]) % (2**63)
            g = torch.Generator().manual_seed(seed)
            r = torch.randn(self.n_heads, self.head_dim, self.options.n_hashes, n_buckets // 2, generator=g)
            self._rotation_cache = (key, r.to(device=device, dtype=dtype))
        return self._rotation_cache[1]

    def hash(self, qk: Tensor, real: Tensor, n_buckets: int) -> Tensor:
        """qk [b, h, t, k], real [b, t] -> buckets [b, h, R, t] in [0, n_buckets]; padding -> n_buckets."""
        # float32: the sort follows the argmax of the rotated vectors; in bf16 (8 bits) close
        # projections round together, so buckets would hinge on rounding and ties pile on one side
        with torch.no_grad(), float32(qk) as (qk,):
            rotated = torch.einsum("bhtk,hkrn->bhrtn", qk, self.rotations(n_buckets, qk.device, qk.dtype))
            # argmax over [xR ; -xR] without building the concatenation
            top, top_index = rotated.max(-1)
            bottom, bottom_index = rotated.min(-1)
            buckets = torch.where(top >= -bottom, top_index, bottom_index + n_buckets // 2)
            return buckets.masked_fill(~real[:, None, None, :], n_buckets)

    # -- forward -----------------------------------------------------------------------------
    def forward(
        self, x: Tensor, *, context: Tensor | None = None, pad_mask: Tensor | None = None, state=None
    ) -> AttnOutput:
        self.check_inputs(x, context, pad_mask, state)
        if state is not None:
            return self.continue_stream(x, pad_mask, state)
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
        qk = self.rotate(qk, positions)  # after hashing: the buckets are the content's (see the module notes)
        # sort by (bucket, position) within each round; ``order`` holds original positions
        order = (buckets * tp + positions).argsort(dim=-1)  # [b, h, R, tp]
        order = rearrange(order, "b h r t -> (b h) r t")
        B = b * h
        # flat row indices: sort picks rows of [(B t), k]; un-sort picks rows of [(B R t), k]
        undo = torch.empty_like(order).scatter_(-1, order, positions.expand_as(order))  # slot of each position
        sort_rows = (order + (torch.arange(B, device=x.device) * tp)[:, None, None]).reshape(-1)
        round_base = (torch.arange(B * R, device=x.device) * tp).view(B, R, 1)
        undo_rows, order_rows = (undo + round_base).reshape(-1), (order + round_base).reshape(-1)

        q_sorted = _Gather.apply(rearrange(qk, "b h t k -> (b h t) k"), sort_rows, undo_rows, R, tp).view(B, R, n, c, k)
        v_sorted = _Gather.apply(rearrange(v, "b h t k -> (b h t) k"), sort_rows, undo_rows, R, tp).view(B, R, n, c, k)
        bucket_sorted = rearrange(buckets, "b h r t -> (b h) r t").gather(-1, order).view(B, R, n, c)
        pos_sorted = order.view(B, R, n, c)

        across = self.options.attend_across_buckets
        causal_in_bucket = self.causal and not across
        window = self.options.look_back == "window"
        static_masked = _static_masks(n, c, causal_in_bucket, window, x.device)
        dropout = self.dropout if self.training else 0.0
        if causal_in_bucket and n > 1:
            # The causal LM case: chunk 0's look-back (the round's wrapped-around end) is masked
            # whole, so what it holds does not matter. The chunks of every round then sit in one
            # flat sequence behind one leading filler chunk, and chunk i's keys (chunk i - 1, then
            # chunk i) are a strided window of it: no look-back copy of keys, values or buckets.
            keys = _UnitKeys.apply(q_sorted, self.score_scale)  # scaled unit keys, in the lead-chunk layout
            values = _lead_chunk(rearrange(v_sorted, "B r n c k -> (B r n c) k"), c)
            bucket_keys = _lead_chunk(bucket_sorted.reshape(-1), c).as_strided(
                (B, R, n, 2 * c), (R * n * c, n * c, c, 1)
            )
            masked = (bucket_keys[..., None, :] != bucket_sorted[..., :, None]) | static_masked
            key_positions = _lead_chunk(pos_sorted.reshape(-1), c).as_strided(
                (B, R, n, 2 * c), (R * n * c, n * c, c, 1)
            )
        else:
            k_sorted = F.normalize(q_sorted, dim=-1)  # shared QK: keys are unit-length queries
            keys, values = _look_back(k_sorted), _look_back(v_sorted)  # [B, R, n, w, k], w = 2c (c if n == 1)
            key_positions = _look_back(pos_sorted)
            if across:  # keys of any bucket: causality and padding by position, per element
                real_sorted = (
                    rearrange(real[:, None].expand(b, h, tp), "b h t -> (b h) t")
                    .gather(-1, order.view(B, R * tp))
                    .view(B, R, n, c)
                )
                masked = ~_look_back(real_sorted)[..., None, :]
                if self.causal:
                    masked = masked | (_look_back(pos_sorted)[..., None, :] > pos_sorted[..., :, None])
            else:
                # Same bucket only. Within a bucket the sorted order is the position order, so
                # causality, the window and oneself are fixed slot patterns (static_masked; oneself
                # is a diagonal, see _ChunkAttention); padding sits in its own bucket, so the
                # bucket test alone keeps real queries off padded keys.
                masked = _look_back(bucket_sorted)[..., None, :] != bucket_sorted[..., :, None]
                if static_masked is not None:
                    masked = masked | static_masked
            q_sorted = q_sorted * self.score_scale  # (the lead-chunk keys carry the scale instead)
        bias = None
        if self.has_pair_bias:  # b(i - j) over the chunk's pairs, each row with its own head
            head = (torch.arange(B, device=x.device) % h).view(B, 1, 1, 1, 1)
            bias = self.pair_bias(pos_sorted[..., :, None] - key_positions[..., None, :], q_sorted.dtype, head)
        out_sorted, lse = _ChunkAttention.apply(q_sorted, keys, values, masked, dropout, bias)

        # un-sort: position p came from sorted slot undo[p]
        out = _Gather.apply(out_sorted.reshape(B * R * tp, k), undo_rows, order_rows, 1, tp).view(B, R, tp, k)
        if R > 1:
            z = lse.reshape(B, R, tp).gather(-1, undo)  # [B, R, tp]
            out = (out * torch.softmax(z, dim=1)[..., None]).sum(1)
        else:
            out = out[:, 0]
        out = rearrange(out[:, :t], "(b h) t k -> b t (h k)", b=b)
        return AttnOutput(self.to_out(out))

    def continue_stream(self, x: Tensor, pad_mask: Tensor | None, cache: LSHCache) -> AttnOutput:
        """The same attention over a stream fed in pieces, from the bucket cache (lsh_stream.py)."""
        qk, v = self.split_heads(self.to_qk(x)), self.split_heads(self.to_v(x))
        real = torch.ones(x.shape[:2], dtype=torch.bool, device=x.device) if pad_mask is None else pad_mask
        buckets = self.hash(qk, real, self.options.n_buckets)
        qk = self.rotate(qk, torch.arange(cache.next, cache.next + x.shape[1], device=x.device))  # cached rotated
        dropout = self.dropout if self.training else 0.0
        bias_of = (lambda distance, head: self.pair_bias(distance, qk.dtype, head)) if self.has_pair_bias else None
        out, cache = stream_lsh(
            qk * self.score_scale,  # the keys are its unit vectors: the scale reaches the queries only
            v,
            buckets,
            cache,
            chunk=self.options.chunk_size,
            n_buckets=self.options.n_buckets,
            dropout=dropout,
            bias_of=bias_of,
        )
        return AttnOutput(self.to_out(self.merge_heads(out)), state=cache)
