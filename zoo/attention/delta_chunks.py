"""The chunkwise-parallel and recurrent forms shared by ``deltanet``, ``gated_deltanet`` and ``mamba2``
(nothing registers here).

One recurrence covers the three, per head, with a matrix state S [k, e] (keys x values):

    S_t = a_t S_{t-1} + k_t u_t^T,   o_t = S_t^T q_t
    u_t = beta_t (v_t - a_t S_{t-1}^T k_t)     (the delta rule: Schlag et al. 2021, arXiv:2102.11174)
    u_t = v_t                                   (no beta: decayed linear attention, Mamba-2's SSD)

with a_t = exp(g_t) a scalar decay per head and token (g = 0: DeltaNet; Gated DeltaNet, Yang et al. 2024,
arXiv:2412.06464, the gated delta rule; Mamba-2, Dao & Gu 2024, arXiv:2405.21060, the SSD recurrence).

Chunkwise form (Yang et al. 2024, arXiv:2406.06484, Section 3, with the decay as arXiv:2412.06464 adds it):
cut the sequence into chunks of C positions; inside a chunk, with G_i = sum_{j <= i} g_j
and Gamma_ij = exp(G_i - G_j) (i >= j),

    (I + A) [U | W] = [diag(beta) V | diag(beta exp(G)) K],   A = strict_lower(diag(beta) K K^T * Gamma)

(the WY representation, solved as a unit lower-triangular system: the UT transform; solved from the right on
the transposes, LAPACK's column-major layout, which spares torch a copy of each block), then from the chunk's
start state S_0

    V_new = U - W S_0
    O = (Q * exp(G)) S_0 + lower(Q K^T * Gamma) V_new
    S_C = exp(G_C) S_0 + (K * exp(G_C - G))^T V_new.

Without beta, U = V and W = 0 (the SSD's diagonal and off-diagonal blocks). Cost per chunk O(C^2 (k + e)
+ C k e), O(t C (k + e) + t k e) in all; only C x C matrices, never t x t. The state passes from chunk to
chunk in a loop over t / C chunks (without beta the loop only adds each chunk's batched increment). Without
g the decays are skipped, not multiplied by ones.

Shapes: q, k [b, h, t, k]; v [b, h, t, e]; beta, g [b, h, t]; state [b, h, k, e]; ``n`` chunks of ``c``.
Padding: a position with k = 0 and g = 0 leaves the state as it was (u is added times k); callers zero
k (and g) at padded positions.
Precision: under bf16 / fp16 the products of decays and the triangular solve run in float32 (marked
below): a cumulated log-decay in 8 bits loses the ratio of two decays.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor

from zoo.parallel.exchange import Route, gather_earlier


def l2_normalise(x: Tensor, eps: float = 1e-6) -> Tensor:
    """x / sqrt(|x|^2 + eps) over the last dimension (flash-linear-attention's and Qwen3-Next's l2norm)."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def float32_island(form: Callable[..., tuple[Tensor, Tensor]]) -> Callable[..., tuple[Tensor, Tensor]]:
    """Run a form (q, k, v, beta, g, state, ...) with autocast off and its tensors in at least float32
    (float64 stays float64), returning (o, state) in q's dtype: under bf16 the cumulated log-decays, their
    ratios and the triangular solve keep float32."""

    @functools.wraps(form)
    def run(q: Tensor, *args: Any) -> tuple[Tensor, Tensor]:
        dtype = q.dtype
        wide = torch.promote_types(dtype, torch.float32)
        with torch.autocast(q.device.type, enabled=False):
            out, state = form(*(x.to(wide) if isinstance(x, Tensor) else x for x in (q, *args)))
        return out.to(dtype), state.to(dtype)

    return run


def times(x: Tensor, *factors: Tensor | None) -> Tensor:
    """``x`` times each factor that is given (a missing decay or segment mask multiplies by nothing)."""
    for factor in factors:
        if factor is not None:
            x = x * factor
    return x


@float32_island
def chunk_delta_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor | None,
    g: Tensor | None,
    state: Tensor | None = None,
    chunk_size: int = 64,
    segments: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """The chunkwise-parallel form (module docstring) -> (o [b, h, t, e], state after the last position
    [b, h, k, e]). ``beta`` None: no delta rule (u = v); ``g`` None: no decay; ``state`` None: zeros.
    ``segments`` [b, t] (packed documents, ``documents.segment_ids``): the state is emptied where a segment
    starts: Gamma is 0 between segments (so the triangular solve stays inside each), a position reads (and its
    W corrects) the chunk's start state only if no segment started before it in the chunk, a key writes into
    the end state only if none starts after it, and the start state passes only a chunk no segment starts in."""
    b, h, t, dk = k.shape
    dv = v.shape[-1]
    c = min(chunk_size, t)  # one token (decoding) costs no C x C block
    pad = -t % c  # zeros past the end: k = 0 adds nothing, g = 0 decays nothing
    q, k, v = (rearrange(F.pad(x, (0, 0, 0, pad)), "b h (n c) f -> b h n c f", c=c) for x in (q, k, v))
    lower = torch.ones(c, c, dtype=torch.bool, device=q.device).tril()
    plain = g is None and segments is None  # Gamma is the lower triangle: masks, not products
    decayed = to_end = end = None  # no decay: nothing decays (no exp, no products by ones)
    if g is None:
        gamma = lower if segments is None else lower.to(q.dtype)
    else:
        cum = rearrange(F.pad(g, (0, pad)), "b h (n c) -> b h n c", c=c).cumsum(-1)  # G within each chunk
        # Gamma_ij = exp(G_i - G_j) on and below the diagonal; above it -inf before exp (no overflow), so 0
        gamma = (cum[..., :, None] - cum[..., None, :]).masked_fill(~lower, float("-inf")).exp()
        decayed = cum.exp()[..., None]  # exp(G_i): [b, h, n, c, 1]
        to_end = (cum[..., -1:] - cum).exp()[..., None]  # exp(G_C - G_i)
        end = cum[..., -1].exp()[..., None, None]  # exp(G_C): [b, h, n, 1, 1]
    read = write = None
    if segments is not None:
        seg = rearrange(torch.cat([segments, segments[:, -1:].expand(b, pad)], 1), "b (n c) -> b 1 n c", c=c)
        entering = torch.cat([seg[..., :1, :1], seg[..., :-1, -1:]], dim=2)  # [b, 1, n, 1]
        gamma = gamma * (seg[..., :, None] == seg[..., None, :])
        read, write = (seg == entering)[..., None].to(q.dtype), (seg == seg[..., -1:])[..., None].to(q.dtype)
        passes = (seg[..., -1:] == entering)[..., None].to(q.dtype)  # [b, 1, n, 1, 1]
        end = passes if end is None else end * passes
    if beta is None:
        u, w = v, None
    else:
        beta = rearrange(F.pad(beta, (0, pad)), "b h (n c) -> b h n c 1", c=c)
        kb = k * beta
        strict = kb @ k.transpose(-1, -2)
        strict = strict.tril(-1) if plain else (strict * gamma).tril(-1)
        rhs = torch.cat([v * beta, times(kb, decayed, read)], -1)
        # (I + A)^-1 rhs as rhs^T (I + A)^-T: the transposes are in LAPACK's layout (about 2x faster here)
        solved = torch.linalg.solve_triangular(strict.mT, rhs.mT, upper=True, left=False, unitriangular=True).mT
        u, w = solved[..., :dv], solved[..., dv:]
    scores = q @ k.transpose(-1, -2)
    scores = scores.tril() if plain else scores * gamma  # lower-triangular: gamma is 0 above the diagonal
    q_decayed, k_to_end = times(q, decayed, read), times(k, to_end, write)
    s = q.new_zeros(b, h, dk, dv) if state is None else state
    # the chunks are unbound once (indexing inside the loop would make backward write a full-size zero
    # gradient per chunk: O(t^2 / C) memory traffic)
    end_decay = [None] * q.shape[2] if end is None else end.unbind(2)
    if w is None:
        # no delta rule: the state's chain is S_C = exp(G_C) S_0 + K_end^T V, its increments batched before the
        # loop; the outputs read the stacked chunk-start states in one batched product
        starts = []
        for added_i, decay_i in zip((k_to_end.transpose(-1, -2) @ u).unbind(2), end_decay):
            starts.append(s)
            s = (s if decay_i is None else s * decay_i) + added_i
        out = q_decayed @ torch.stack(starts, 2) + scores @ u  # [b, h, n, c, e]
    else:
        outs = []
        for w_i, u_i, q_i, scores_i, k_i, decay_i in zip(
            w.unbind(2), u.unbind(2), q_decayed.unbind(2), scores.unbind(2), k_to_end.unbind(2), end_decay
        ):
            v_new = u_i - w_i @ s
            outs.append(q_i @ s + scores_i @ v_new)
            s = (s if decay_i is None else s * decay_i) + k_i.transpose(-1, -2) @ v_new
        out = torch.stack(outs, 2)
    out = rearrange(out, "b h n c e -> b h (n c) e")[:, :, :t]
    return out, s


@float32_island
def recurrent_delta_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor | None,
    g: Tensor | None,
    state: Tensor | None = None,
    segments: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """The recurrent form, token by token (module docstring): what decoding runs, constant state
    [b, h, k, e]. Same arguments and result as :func:`chunk_delta_rule` (the state emptied where a segment
    starts)."""
    b, h, t, dk = k.shape
    s = q.new_zeros(b, h, dk, v.shape[-1]) if state is None else state
    outs = []
    steps = [x.unbind(2) if x is not None else [None] * t for x in (q, k, v, beta, g)]  # unbound once, as above
    kept = [None] * t
    if segments is not None:  # 0 where a segment starts (the state before it is forgotten), else 1
        kept = F.pad((segments[:, 1:] == segments[:, :-1]).to(q.dtype), (1, 0), value=1.0).unbind(1)
    for q_i, k_i, v_i, beta_i, g_i, kept_i in zip(*steps, kept):
        if kept_i is not None:
            s = s * kept_i[:, None, None, None]
        if g_i is not None:
            s = s * g_i[..., None, None].exp()
        u = v_i
        if beta_i is not None:
            u = beta_i[..., None] * (u - torch.einsum("bhke,bhk->bhe", s, k_i))
        s = s + k_i[..., :, None] * u[..., None, :]
        outs.append(torch.einsum("bhke,bhk->bhe", s, q_i))
    return torch.stack(outs, 2), s


def delta_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor | None,
    g: Tensor | None,
    state: Tensor | None,
    chunk_size: int,
    segments: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """The chunk form for a segment of at least one chunk (training, a prompt), the recurrent form for
    shorter ones (decoding): equal results, the cheaper form for the length. ``segments``: packed documents."""
    if q.shape[2] >= chunk_size:
        return chunk_delta_rule(q, k, v, beta, g, state, chunk_size, segments)
    return recurrent_delta_rule(q, k, v, beta, g, state, segments)


# -- context parallelism: the state before this rank's part, from the earlier ranks' transitions ---------


def delta_rule_over_ranks(
    q: Tensor, k: Tensor, v: Tensor, beta: Tensor | None, g: Tensor | None, chunk, chunk_size: int
) -> Tensor:
    """:func:`chunk_delta_rule` over this rank's part of a sequence split over a context group
    (``chunk``: :class:`zoo.parallel.chunk.Chunk`, contiguous layout), equal to one process.

    The recurrence is affine in the state: over a part, S_end = M S_start + N with M [k, k] (the product
    of the decays and of the (I - beta k k^T)) and N [k, e]. Run from the augmented state [I | 0] with the
    augmented values [0 | v], the chunk form returns [M | N] as its state and, for each position, the part
    of its output that the incoming state reaches (q^T M_t) beside the part that it does not (q^T N_t), in
    one pass. Each rank sends its [M | N] to the later ranks (the gradient returns to it) and composes what
    the earlier ranks sent, in rank order, into its S_start: an exclusive scan of affine maps, in place of
    the exclusive sum of plain linear attention. Shapes as :func:`chunk_delta_rule`; returns o."""
    b, h, t, dk = k.shape
    dv = v.shape[-1]
    identity = torch.eye(dk, dtype=k.dtype, device=k.device).expand(b, h, dk, dk)
    start = torch.cat([identity, k.new_zeros(b, h, dk, dv)], -1)
    values = torch.cat([v.new_zeros(b, h, t, dk), v], -1)
    out, transition = chunk_delta_rule(q, k, values, beta, g, start, chunk_size)  # [b, h, t, k + e], [b, h, k, k + e]
    rows = transition.flatten(2).unsqueeze(2)  # [b, h, 1, k (k + e)]: one row per rank
    first = torch.zeros(1, dtype=torch.long, device=k.device)
    sends = tuple((chunk.peers[r], first) for r in range(chunk.rank + 1, chunk.size))
    receives = tuple((chunk.peers[r], 1) for r in range(chunk.rank))
    gathered = gather_earlier(Route(chunk.group, sends, receives, 2), rows)  # [b, h, rank + 1, k (k + e)]
    s = k.new_zeros(b, h, dk, dv)
    for r in range(chunk.rank):  # compose the earlier ranks' maps in order: S <- M_r S + N_r
        m_n = gathered[:, :, r].unflatten(-1, (dk, dk + dv))
        s = m_n[..., :dk] @ s + m_n[..., dk:]
    # the own row joins as an exact zero, so the exchange's node runs backward on every rank, also on the
    # first, where the later ranks' gradients of what it sent arrive (as Chunk.sum_before does)
    own = gathered[:, :, chunk.rank, :1, None]
    s = s + own.masked_fill(own.new_ones((), dtype=torch.bool), 0.0)
    return out[..., :dk] @ s + out[..., dk:]
