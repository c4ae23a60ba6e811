"""The sorted-chunk kernels behind LSH attention (``lsh.py``): not a mechanism, nothing registers here.

After LSH sorts every hash round by (bucket, position) and cuts it into chunks of c, each chunk
attends to its own and the previous chunk. These hand-written autograd functions keep that
O(t * c): permutations whose backward is a gather (:class:`_Gather`), shared-QK unit keys written
straight into a "lead chunk" layout whose overlapping windows are strided views
(:class:`_UnitKeys`, :func:`_windows`), and chunk attention that keeps only the probabilities for
backward and returns the log-sum-exp normalisers that combine the rounds (:class:`_ChunkAttention`).

Shapes: B = batch x heads, R = hash rounds, n = chunks per round, c = chunk size, k = head dim,
w = keys per chunk (2c, or c with one chunk).
"""

from __future__ import annotations

import torch
from torch import Tensor

SELF_SCORE = -1e5  # the paper's score for attending to oneself: used only when nothing else is allowed
MASKED_SCORE = -1e9  # finite, so a query that may see nothing (padding) gets no NaN


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
    at offset w - c of its block. ``bias`` [..., c, w] or None: added to the scores (a pair bias; its
    gradient is the scores'). Hand-written backward so that only the probabilities are kept
    (not scores and probabilities, as autograd through logsumexp + exp would) and one exp pass
    serves both outputs: lse = max(s) - log(max(p)), since p_max = exp(max(s) - lse)."""

    @staticmethod
    def forward(
        ctx, q: Tensor, keys: Tensor, values: Tensor, masked: Tensor, dropout: float, bias: Tensor | None = None
    ):
        ctx.q_shape, ctx.lead_chunk, ctx.dropout = q.shape, keys.dim() == 2, dropout
        ctx.set_materialize_grads(False)
        c = q.shape[-2]
        if ctx.lead_chunk:  # one batch axis, so that the strided windows go to bmm as they are
            q = q.reshape(-1, c, q.shape[-1])
            masked = masked.reshape(q.shape[0], c, 2 * c)
        keys_w, values_w = (_windows(keys, c), _windows(values, c)) if ctx.lead_chunk else (keys, values)
        scores = torch.matmul(q, keys_w.transpose(-1, -2))
        if bias is not None:
            scores += bias.reshape(scores.shape)
        # oneself: one diagonal of each [c, w] block, written through a view rather than a
        # masked pass over all scores
        scores.diagonal(offset=keys_w.shape[-2] - c, dim1=-2, dim2=-1).fill_(SELF_SCORE)
        scores.masked_fill_(masked, MASKED_SCORE)
        top = scores.amax(-1, keepdim=True)
        probs = torch.softmax(scores, dim=-1)
        del scores
        lse = (top - torch.log(probs.amax(-1, keepdim=True))).squeeze(-1)
        dropped = None
        if dropout > 0:
            # the 1 / (1 - p) rescale goes on the output [.., c, k], not on the weights [.., c, 2c]:
            # one pass over the weights (the masked fill) instead of three (bool cast, product, rescale)
            dropped = torch.rand_like(probs) < dropout
            out = torch.matmul(probs.masked_fill(dropped, 0.0), values_w).mul_(1 / (1 - dropout))
        else:
            out = torch.matmul(probs, values_w)
        ctx.save_for_backward(q, keys, values, probs, dropped)
        return out.view(*ctx.q_shape[:-1], out.shape[-1]), lse.view(ctx.q_shape[:-1])

    @staticmethod
    def backward(ctx, d_out: Tensor | None, d_lse: Tensor | None):
        q, keys, values, probs, dropped = ctx.saved_tensors
        c = q.shape[-2]
        keys_w, values_w = (_windows(keys, c), _windows(values, c)) if ctx.lead_chunk else (keys, values)
        if d_out is None:
            d_out = torch.zeros(*probs.shape[:-1], values.shape[-1], dtype=probs.dtype, device=probs.device)
        d_out = d_out.reshape(*probs.shape[:-1], d_out.shape[-1])
        # out = s (P o M) V with s = 1 / (1 - p): the rescale rides on d_out (the small tensor), the
        # mask M zeroes the dropped weights' gradients in place
        weights = probs
        if dropped is not None:
            d_out = d_out * (1 / (1 - ctx.dropout))
            weights = probs.masked_fill(dropped, 0.0)
        d_probs = torch.matmul(d_out, values_w.transpose(-1, -2))
        if dropped is not None:
            d_probs.masked_fill_(dropped, 0.0)
        # softmax backward in one fused kernel, plus d lse / d scores = probs
        d_scores = torch._softmax_backward_data(d_probs, probs, -1, probs.dtype)
        if d_lse is not None:
            d_scores.addcmul_(probs, d_lse.reshape(probs.shape[:-1])[..., None])
        # the own key's score is the constant SELF_SCORE, not q . k: no gradient flows through it
        # (it matters where oneself is all a query sees: there its weight is 1)
        d_scores.diagonal(offset=probs.shape[-1] - c, dim1=-2, dim2=-1).zero_()
        # the bias is the sixth input when given: its gradient is the scores'
        wants_bias = len(ctx.needs_input_grad) > 5 and ctx.needs_input_grad[5]
        d_bias = d_scores.view(*ctx.q_shape[:-1], d_scores.shape[-1]) if wants_bias else None
        extra = (d_bias,) if len(ctx.needs_input_grad) > 5 else ()
        d_q = torch.matmul(d_scores, keys_w).view(ctx.q_shape)
        if not ctx.lead_chunk:
            return (
                d_q,
                torch.matmul(d_scores.transpose(-1, -2), q),
                torch.matmul(weights.transpose(-1, -2), d_out),
                None,
                None,
                *extra,
            )
        # each window's two halves separately, folded back onto the lead-chunk layout
        own, previous = slice(c, None), slice(None, c)
        d_keys = _unwindow(*(torch.matmul(d_scores[..., half].transpose(-1, -2), q) for half in (own, previous)))
        d_values = _unwindow(*(torch.matmul(weights[..., half].transpose(-1, -2), d_out) for half in (own, previous)))
        return d_q, d_keys, d_values, None, None, *extra
