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
  logits are sqrt(d_k) times ours, a temperature the learned W_qk absorbs. To reproduce their
  outputs, multiply ``to_qk``'s weight and bias by sqrt(d_k) (the angular hash is scale-free, so
  the buckets stay the same); tests/parts/test_lsh.py checks this conversion.
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

from zoo.attention.base import (
    ATTENTION,
    Attention,
    AttnOutput,
    FlopCount,
    KeysPerQuery,
    at_most_segment,
    causal_allowed,
    dense_keys,
    guard_empty_rows,
)
from zoo.config import require

SELF_SCORE = -1e5  # the paper's score for attending to oneself: used only when nothing else is allowed
MASKED_SCORE = -1e9  # finite, so a query that may see nothing (padding) gets no NaN


class SharedQKProjections(Attention):
    """The parameters shared by ``lsh`` and ``shared_qk`` (same names, so weights transfer)."""

    no_cross_reason = (
        "shared-QK attention derives its keys from the queries (k = q / |q|), so keys cannot come from another sequence"
    )

    def __init__(self, d_model: int, n_heads: int, **kwargs):
        super().__init__(d_model, n_heads, **kwargs)
        bias = self.options.bias
        self.to_qk = nn.Linear(d_model, d_model, bias=bias)
        self.to_v = nn.Linear(d_model, d_model, bias=bias)
        self.to_out = nn.Linear(d_model, d_model, bias=bias)

    def check_inputs(self, x, context, pad_mask, state) -> None:
        if context is not None:
            raise ValueError(
                f"{self.registry_name} cannot do cross-attention (context=...): {self.no_cross_reason}; "
                "use e.g. vanilla for cross_attention"
            )
        super().check_inputs(x, context, pad_mask, state)


@ATTENTION.register("lsh")
class LSHAttention(SharedQKProjections):
    content_routed = True  # the buckets (hence each query's key set) depend on the content
    lra_row = "Reformer"

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
        return {"chunk_size": 4, "n_hashes": 2}  # several chunks and a padded tail at t = 7, 19, 33

    def after_optimizer_step(self) -> None:
        self.hash_step += 1

    # -- what it sees and costs ------------------------------------------------------------------
    def keys_per_query(self, t: int) -> KeysPerQuery:
        """Each round, at most ``chunk_size`` keys of the query's own bucket (the causal window; own +
        previous chunk otherwise): R x c at most over the rounds."""
        keys = at_most_segment(float(self.options.n_hashes * min(self.options.chunk_size, t)), t, self.causal)
        return KeysPerQuery(keys, "hashes x chunk (within buckets)", upper_bound=True)

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
        with torch.no_grad():
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
            keys = _UnitKeys.apply(q_sorted, k**-0.5)  # scaled unit keys, in the lead-chunk layout
            values = _lead_chunk(rearrange(v_sorted, "B r n c k -> (B r n c) k"), c)
            bucket_keys = _lead_chunk(bucket_sorted.reshape(-1), c).as_strided(
                (B, R, n, 2 * c), (R * n * c, n * c, c, 1)
            )
            masked = (bucket_keys[..., None, :] != bucket_sorted[..., :, None]) | static_masked
        else:
            k_sorted = F.normalize(q_sorted, dim=-1)  # shared QK: keys are unit-length queries
            keys, values = _look_back(k_sorted), _look_back(v_sorted)  # [B, R, n, w, k], w = 2c (c if n == 1)
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
            q_sorted = q_sorted * k**-0.5  # (the lead-chunk keys carry the scale instead)
        out_sorted, lse = _ChunkAttention.apply(q_sorted, keys, values, masked, dropout)

        # un-sort: position p came from sorted slot undo[p]
        out = _Gather.apply(out_sorted.reshape(B * R * tp, k), undo_rows, order_rows, 1, tp).view(B, R, tp, k)
        if R > 1:
            z = lse.reshape(B, R, tp).gather(-1, undo)  # [B, R, tp]
            out = (out * torch.softmax(z, dim=1)[..., None]).sum(1)
        else:
            out = out[:, 0]
        out = rearrange(out[:, :t], "(b h) t k -> b t (h k)", b=b)
        return AttnOutput(self.to_out(out))


class _Gather(torch.autograd.Function):
    """rows = x.index_select(0, index) whose backward is a gather too, not a scatter-add.

    Every round of ``index`` is a permutation, so the gradient of x is the gradient rows picked by
    the inverse permutation (``back_index``), summed over the ``rounds`` that each hold one copy
    of every row. index_select's own backward (index_add, a scatter) is several times slower."""

    @staticmethod
    def forward(ctx, x: Tensor, index: Tensor, back_index: Tensor, rounds: int, length: int):
        ctx.save_for_backward(back_index)
        ctx.rounds, ctx.length, ctx.rows = rounds, length, x.shape[0]
        return x.index_select(0, index)

    @staticmethod
    def backward(ctx, grad: Tensor):
        (back_index,) = ctx.saved_tensors
        picked = grad.index_select(0, back_index)
        if ctx.rounds > 1:  # [(B R t), k] -> sum over R -> [(B t), k]
            picked = picked.view(-1, ctx.rounds, ctx.length, picked.shape[-1]).sum(1).view(ctx.rows, -1)
        return picked, None, None, None, None


def _lead_chunk(x: Tensor, c: int) -> Tensor:
    """[N c, ...] -> [(N + 1) c, ...]: one filler chunk (zeros) in front, so that the windows
    (chunk i - 1, chunk i) of all N chunks are one strided view (see :func:`_windows`)."""
    out = x.new_empty((x.shape[0] + c, *x.shape[1:]))
    out[:c] = 0  # F.pad would fill the whole output first, one more pass over it
    out[c:] = x
    return out


class _UnitKeys(torch.autograd.Function):
    """Shared-QK keys scale * q / |q| (|q| clamped at 1e-12, as F.normalize), written straight
    into the lead-chunk layout: one pass instead of normalise, scale the queries, then copy.

    q [..., c, k] (sorted chunks, contiguous) -> [(N + 1) c, k] with N = q.numel() / (c k)."""

    @staticmethod
    def forward(ctx, q: Tensor, scale: float):
        c, k = q.shape[-2:]
        norm = torch.linalg.vector_norm(q, dim=-1, keepdim=True)
        inverse = scale / norm.clamp_min(1e-12)
        keys = q.new_empty(q.numel() // k + c, k)
        keys[:c] = 0
        torch.mul(q.reshape(-1, k), inverse.reshape(-1, 1), out=keys[c:])
        ctx.scale = scale
        ctx.save_for_backward(q, norm)
        return keys

    @staticmethod
    def backward(ctx, d_keys: Tensor):
        q, norm = ctx.saved_tensors
        c, k = q.shape[-2:]
        d_keys = d_keys[c:].view(q.shape)  # the filler chunk comes from nowhere
        # d(s q / |q|) = s / |q| (dk - q (q . dk) / |q|^2), and s / 1e-12 dk where the norm is clamped
        clamped = norm <= 1e-12
        inverse = ctx.scale / norm.clamp_min(1e-12)
        along = torch.where(clamped, 0.0, inverse * (q * d_keys).sum(-1, keepdim=True) / norm.clamp_min(1e-12) ** 2)
        return torch.addcmul(d_keys * inverse, q, along, value=-1), None


def _windows(x: Tensor, c: int) -> Tensor:
    """Strided (overlapping) view of a :func:`_lead_chunk` layout [(N + 1) c, k] as [N, 2c, k]:
    window i = rows i c ... (i + 2) c - 1, i.e. the chunk before chunk i, then chunk i."""
    n_chunks, k = x.shape[0] // c - 1, x.shape[1]
    return x.as_strided((n_chunks, 2 * c, k), (c * k, k, 1))


def _unwindow(own: Tensor, previous: Tensor) -> Tensor:
    """Gradient of :func:`_windows`: own / previous [N, c, k] (the window's two halves) ->
    [(N + 1) c, k]; chunk j collects its own half of window j and the previous half of window j + 1."""
    n_chunks, c, k = own.shape
    grad = own.new_empty((n_chunks + 1) * c, k)
    grad[n_chunks * c :] = own[-1]
    torch.add(
        own.reshape(n_chunks * c, k)[: (n_chunks - 1) * c],
        previous.reshape(n_chunks * c, k)[c:],
        out=grad[c : n_chunks * c],
    )
    grad[:c] = previous[0]
    return grad


def _look_back(x: Tensor) -> Tensor:
    """Keys of each chunk: the previous chunk (wrapping around) then its own. [B, R, n, c, ...] ->
    [B, R, n, 2c, ...]; with one chunk only its own (the "previous" would be itself twice)."""
    if x.shape[2] == 1:
        return x
    return torch.cat([x.roll(1, dims=2), x], dim=3)


_MASK_CACHE: dict[tuple, Tensor | None] = {}


def _static_masks(n: int, c: int, causal_in_bucket: bool, window: bool, device: torch.device) -> Tensor | None:
    """Slot patterns of a query chunk against its key block, fixed by the sorted layout.

    Key slots: with n > 1, 0..c-1 are the previous chunk and c..2c-1 the own one; with n == 1 only
    the own, so the query's own key is at slot (w - c) + its own slot (one diagonal of the block).
    Returns masked [n, c, w] or None. When ``causal_in_bucket`` (causal, same-bucket keys only) a
    same-bucket key is in the query's past exactly when its sorted slot is earlier, so masked =
    later slots | slots more than c places back (the window; not with ``window=False``, the paper's
    whole previous chunk) | the wrapped-around "previous" chunk of chunk 0 (it holds the round's end)."""
    key = (n, c, causal_in_bucket, window, device)
    if key not in _MASK_CACHE:
        a = torch.arange(c, device=device)[:, None]  # query slot
        own = c if n > 1 else 0  # slot of the query's own chunk start in the key block
        j = torch.arange(own + c, device=device)[None, :]  # key slot
        masked = None
        if causal_in_bucket:
            masked = (j > own + a) | (j < a if n > 1 and window else torch.zeros_like(j, dtype=torch.bool))
            masked = masked.expand(n, c, own + c).clone()
            if n > 1:
                masked[0, :, :c] = True
        _MASK_CACHE[key] = masked
    return _MASK_CACHE[key]


class _ChunkAttention(torch.autograd.Function):
    """softmax(q k^T + masks) v over the sorted blocks, returning the log-sum-exp normalisers too.

    q [..., c, k]; keys/values [..., w, k] or, in the lead-chunk layout, [(N + 1) c, k] with N the
    number of query chunks, read through :func:`_windows` (w = 2c); q . k is the score, so the
    1 / sqrt(d_k) scale is already on q (look-back blocks) or on the keys (lead-chunk layout).
    masked bool broadcastable to [..., c, w]; a query's own key (score SELF_SCORE) is the diagonal
    at offset w - c of its block. Hand-written backward so that only the probabilities are kept
    (not scores and probabilities, as autograd through logsumexp + exp would) and one exp pass
    serves both outputs: lse = max(s) - log(max(p)), since p_max = exp(max(s) - lse)."""

    @staticmethod
    def forward(ctx, q: Tensor, keys: Tensor, values: Tensor, masked: Tensor, dropout: float):
        ctx.q_shape, ctx.lead_chunk, ctx.dropout = q.shape, keys.dim() == 2, dropout
        ctx.set_materialize_grads(False)
        c = q.shape[-2]
        if ctx.lead_chunk:  # one batch axis, so that the strided windows go to bmm as they are
            q = q.reshape(-1, c, q.shape[-1])
            masked = masked.reshape(q.shape[0], c, 2 * c)
        keys_w, values_w = (_windows(keys, c), _windows(values, c)) if ctx.lead_chunk else (keys, values)
        scores = torch.matmul(q, keys_w.transpose(-1, -2))
        # oneself: one diagonal of each [c, w] block, written through a view rather than a
        # masked pass over all scores
        scores.diagonal(offset=keys_w.shape[-2] - c, dim1=-2, dim2=-1).fill_(SELF_SCORE)
        scores.masked_fill_(masked, MASKED_SCORE)
        top = scores.amax(-1, keepdim=True)
        probs = torch.softmax(scores, dim=-1)
        del scores
        lse = (top - torch.log(probs.amax(-1, keepdim=True))).squeeze(-1)
        keep = None
        if dropout > 0:
            keep = torch.rand_like(probs) >= dropout
            out = torch.matmul(probs * keep / (1 - dropout), values_w)
        else:
            out = torch.matmul(probs, values_w)
        ctx.save_for_backward(q, keys, values, probs, keep)
        return out.view(*ctx.q_shape[:-1], out.shape[-1]), lse.view(ctx.q_shape[:-1])

    @staticmethod
    def backward(ctx, d_out: Tensor | None, d_lse: Tensor | None):
        q, keys, values, probs, keep = ctx.saved_tensors
        c = q.shape[-2]
        keys_w, values_w = (_windows(keys, c), _windows(values, c)) if ctx.lead_chunk else (keys, values)
        if d_out is None:
            d_out = torch.zeros(*probs.shape[:-1], values.shape[-1], dtype=probs.dtype, device=probs.device)
        d_out = d_out.reshape(*probs.shape[:-1], d_out.shape[-1])
        d_probs = torch.matmul(d_out, values_w.transpose(-1, -2))
        weights = probs
        if keep is not None:
            scale = keep / (1 - ctx.dropout)
            weights = probs * scale
            d_probs = d_probs * scale
        # softmax backward in one fused kernel, plus d lse / d scores = probs
        d_scores = torch._softmax_backward_data(d_probs, probs, -1, probs.dtype)
        if d_lse is not None:
            d_scores.addcmul_(probs, d_lse.reshape(probs.shape[:-1])[..., None])
        # the own key's score is the constant SELF_SCORE, not q . k: no gradient flows through it
        # (it matters where oneself is all a query sees: there its weight is 1)
        d_scores.diagonal(offset=probs.shape[-1] - c, dim1=-2, dim2=-1).zero_()
        d_q = torch.matmul(d_scores, keys_w).view(ctx.q_shape)
        if not ctx.lead_chunk:
            return (
                d_q,
                torch.matmul(d_scores.transpose(-1, -2), q),
                torch.matmul(weights.transpose(-1, -2), d_out),
                None,
                None,
            )
        # each window's two halves separately, folded back onto the lead-chunk layout
        own, previous = slice(c, None), slice(None, c)
        d_keys = _unwindow(*(torch.matmul(d_scores[..., half].transpose(-1, -2), q) for half in (own, previous)))
        d_values = _unwindow(*(torch.matmul(weights[..., half].transpose(-1, -2), d_out) for half in (own, previous)))
        return d_q, d_keys, d_values, None, None


@ATTENTION.register("shared_qk")
class SharedQKAttention(SharedQKProjections):
    """Full attention with LSH's shared query-key space (keys = unit-length queries, no attention to
    oneself unless nothing else is visible): the paper's "full attention" baseline (Table 2), with
    the same parameter names as ``lsh`` so a model trained with one evaluates with the other.
    Dense, O(t^2), through fused SDPA."""

    @dataclass
    class Options:
        bias: bool = True

    def keys_per_query(self, t: int) -> KeysPerQuery:
        return dense_keys(t, self.causal)

    def forward(
        self, x: Tensor, *, context: Tensor | None = None, pad_mask: Tensor | None = None, state=None
    ) -> AttnOutput:
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
        out = F.scaled_dot_product_attention(
            q, F.normalize(q, dim=-1), v, attn_mask=allowed, dropout_p=self.dropout if self.training else 0.0
        )
        return AttnOutput(self.to_out(self.merge_heads(out)))
