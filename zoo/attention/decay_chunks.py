"""Linear attention with decay: the shared kernel behind ``retention`` and ``gla`` (nothing registers here).

The recurrence (RetNet, Sun et al. 2023, arXiv:2307.08621, eq. 1-3 with a fixed gamma per head; GLA,
Yang et al. 2023, arXiv:2312.06635, eq. 3 with a data-dependent decay per key dimension):

    S_i = diag(a_i) S_{i-1} + k_i v_i^T        S [f, e], a_i in (0, 1]^f (or one scalar per head)
    o_i = S_i^T q_i

given as ``log_decay`` = log a_i <= 0, [b, h, t] (scalar per head) or [b, h, t, f] (diagonal). Two forms:

- chunkwise-parallel (training, :func:`chunk_decay_attention`; GLA paper Section 3.2, RetNet eq. 7):
  the sequence is cut into chunks of C. With G_i = sum of log a over the chunk up to i (inclusive),
  inside a chunk o_i = sum_{j <= i} (q_i * exp(G_i - G_j)) . k_j v_j (C x C scores, the decay formed as
  a difference of logs, never a ratio of products, so nothing overflows: every exponent is <= 0; the
  diagonal form forms [16, 16, f] exponents inside secondary blocks of 16 and runs matmuls between them,
  ``diagonal_chunk_values``), across chunks the state carries on:
  o_i += (q_i * exp(G_i)) S_before, S_after = exp(G_C) S_before + sum_j (k_j * exp(G_C - G_j)) v_j^T.
  Only the n = t / C chunk states are stepped one after another. Cost O(t C (f + e) + t f e); no t x t
  tensor, no [t, f, e] tensor.
- recurrent (streaming, :func:`recurrent_decay_attention`): the loop above, one token at a time, with
  the state S as the whole memory (constant size: f x e per head, however long the stream).

Padding: a padded position gets k = 0 and log a = 0, so it neither decays nor updates the state (its
own output, never used, still reads it). The compute dtype is at least float32 (float32 where the decay
products need it: bfloat16's 8 bits cannot hold exp(G_i - G_j) over a chunk); the output comes back in
the input's dtype.

Shapes: q, k [b, h, t, f], v [b, h, t, e], state [b, h, f, e]; ``n`` chunks of ``c`` positions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor

SUB_CHUNK = 16  # the secondary blocks of the diagonal form: [16, 16, f] exponents, matmuls between blocks


@dataclass
class DecayState:
    """The state a causal decay layer carries between calls (detached): ``memory`` [b, h, f, e] (None
    before the first token) and ``seen``, the tokens streamed so far (where RetNet's rotation stands)."""

    memory: Tensor | None = None
    seen: int = 0

    @property
    def length(self) -> int:
        return 0  # a decayed sum: it remembers no token, nothing grows with the stream


def compute_dtype(x: Tensor) -> torch.dtype:
    """float32 for half and bfloat16 inputs (the decay products need it), else the input's own dtype."""
    return torch.promote_types(x.dtype, torch.float32)


def mask_padding(k: Tensor, log_decay: Tensor, pad_mask: Tensor | None) -> tuple[Tensor, Tensor]:
    """k [b, h, t, f] and log a [b, h, t(, f)] with padded positions neither writing nor decaying."""
    if pad_mask is None:
        return k, log_decay
    keep = pad_mask[:, None, :]
    log_decay = log_decay * (keep if log_decay.dim() == 3 else keep[..., None])
    return k * keep[..., None], log_decay


def decay_from_start(q: Tensor, log_decay: Tensor) -> Tensor:
    """q_i * exp(sum_{l <= i} log a_l): each query as it reads a state that stood before position 0.
    q [b, h, t, f], log a [b, h, t(, f)] -> [b, h, t, f] (every exponent <= 0)."""
    total = log_decay.cumsum(2)
    return q * (total[..., None] if total.dim() == 3 else total).exp()


def read_state(q: Tensor, log_decay: Tensor, state: Tensor) -> Tensor:
    """The part of o_i that a state S [b, h, f, e] from before position 0 contributes -> [b, h, t, e]."""
    return torch.einsum("bhtf,bhfe->bhte", decay_from_start(q, log_decay), state)


def chunk_decay_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    log_decay: Tensor,
    *,
    chunk_size: int,
    state: Tensor | None = None,
    segments: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """The chunkwise-parallel form: (o [b, h, t, e], S after the last position [b, h, f, e]). ``segments``
    long [b, t] (packed documents, ``documents.segment_ids``): the state is emptied where a segment starts,
    as if its decay were 0, by masks rather than a log decay of -inf (whose differences would be NaN): inside
    a chunk a query reads only keys of its segment, a query reads the state from before its chunk only if
    no segment started in between, a key writes into the chunk's state only if no segment starts after it,
    and the state passes a chunk only if no segment starts in it."""
    dtype = q.dtype
    work = compute_dtype(q)
    q, k, v, log_decay = (x.to(work) for x in (q, k, v, log_decay))
    b, h, t, f = q.shape
    e = v.shape[-1]
    diagonal = log_decay.dim() == 4
    c = min(chunk_size, t)  # one token (decoding) costs one product, not a C x C block
    n = -(-t // c)
    grow = n * c - t  # zeros past the end: no write (k = 0) and no decay (log a = 0)
    qc, kc, vc = (rearrange(F.pad(x, (0, 0, 0, grow)), "b h (n c) f -> b h n c f", c=c) for x in (q, k, v))
    if diagonal:
        g = rearrange(F.pad(log_decay, (0, 0, 0, grow)), "b h (n c) f -> b h n c f", c=c).cumsum(3)
    else:
        g = rearrange(F.pad(log_decay, (0, grow)), "b h (n c) -> b h n c", c=c).cumsum(3)
    seg = None
    if segments is not None:  # [b, n, c], the tail past t continuing the last segment
        seg = rearrange(torch.cat([segments, segments[:, -1:].expand(b, grow)], 1), "b (n c) -> b n c", c=c)
    if diagonal:
        out = diagonal_chunk_values(qc, kc, vc, g, seg=seg)
        last = g[:, :, :, -1:]  # [b, h, n, 1, f]
        read, write = qc * g.exp(), kc * (last - g).exp()
    else:
        later = torch.ones(c, c, dtype=torch.bool, device=q.device).triu(1)  # j > i: masked before exp
        if seg is not None:  # [b, 1, n, c, c]: keys of another segment are masked too
            later = later | (seg[:, None, :, :, None] != seg[:, None, :, None, :])
        gap = (g[..., :, None] - g[..., None, :]).masked_fill(later, float("-inf"))
        scores = torch.einsum("bhnif,bhnjf->bhnij", qc, kc) * gap.exp()
        out = torch.einsum("bhnij,bhnje->bhnie", scores, vc)
        last = g[..., -1:]  # [b, h, n, 1]
        read, write = qc * g.exp()[..., None], kc * (last - g).exp()[..., None]
    passed = last.squeeze(3).exp()  # [b, h, n(, f)]
    if seg is not None:
        before_chunk = torch.cat([seg[:, :1, :1], seg[:, :-1, -1:]], dim=1)  # [b, n, 1]: the segment entering it
        read = read * (seg == before_chunk)[:, None, :, :, None]
        write = write * (seg == seg[..., -1:])[:, None, :, :, None]
        open_chunk = seg[..., -1] == before_chunk[..., 0]  # [b, n]: no segment starts inside
        passed = passed * (open_chunk[:, None, :, None] if diagonal else open_chunk[:, None])
    # what each chunk adds to the state, and how much of the state it lets through
    added = torch.einsum("bhncf,bhnce->bhnfe", write, vc)
    passed = passed[..., None] if diagonal else passed[..., None, None]
    running = q.new_zeros(b, h, f, e) if state is None else state.to(work)
    before = []
    # n = t / C steps of the chunk-level recurrence, over chunks unbound once: indexing inside the loop would
    # make backward write a full-size zero gradient per chunk (O(t^2 / C) memory traffic)
    for passed_i, added_i in zip(passed.unbind(2), added.unbind(2), strict=True):
        before.append(running)
        running = passed_i * running + added_i
    out = out + torch.einsum("bhncf,bhnfe->bhnce", read, torch.stack(before, dim=2))
    out = rearrange(out, "b h n c e -> b h (n c) e")[:, :, :t]
    return out.to(dtype), running


def diagonal_chunk_values(
    qc: Tensor, kc: Tensor, vc: Tensor, g: Tensor, sub: int = SUB_CHUNK, seg: Tensor | None = None
) -> Tensor:
    """Inside each chunk, o_i = sum_{j <= i} (sum_f q_if k_jf exp(G_if - G_jf)) v_j, with G [b, h, n, c, f] the
    cumulative log decays of the chunk. The chunk is cut again into blocks of ``sub`` (the GLA paper's secondary
    level, Section 4.3): between blocks the decay factors through the position r before the query's block,
    (q_i exp(G_i - G_r)) . (k_j exp(G_r - G_j)) (j <= r < i: both exponents <= 0) and runs as a matmul; only
    inside a block are the [sub, sub, f] exponents formed. qc, kc [b, h, n, c, f], vc [b, h, n, c, e].
    ``seg`` [b, n, c] (packed documents): j reaches i only inside one segment, which factors through r too
    (query i keeps r's segment, key j keeps r's segment)."""
    c = qc.shape[3]
    sub = sub if c % sub == 0 else c  # a chunk that sub does not divide is one block
    blocks = c // sub
    qs, ks, vs, gs = (rearrange(x, "b h n (m s) f -> b h n m s f", s=sub) for x in (qc, kc, vc, g))
    # inside a block: the exponents themselves, the upper triangle masked before exp (never overflows)
    later = torch.ones(sub, sub, dtype=torch.bool, device=qc.device).triu(1)[:, :, None]
    if seg is not None:  # [b, 1, n, m, s, s, 1]
        segs = rearrange(seg, "b n (m s) -> b 1 n m s", s=sub)
        later = later | (segs[..., :, None] != segs[..., None, :])[..., None]
    gap = (gs[..., :, None, :] - gs[..., None, :, :]).masked_fill(later, float("-inf"))
    inside = (qs[..., :, None, :] * ks[..., None, :, :] * gap.exp()).sum(-1)  # [b, h, n, m, s, s]
    out = torch.einsum("bhnmij,bhnmje->bhnmie", inside, vs)
    if blocks > 1:  # earlier blocks of the chunk: G_r at the last position before each block (0 for the first)
        before = F.pad(gs[..., :-1, -1, :], (0, 0, 1, 0))  # [b, h, n, m, f]
        query = qs * (gs - before[..., None, :]).exp()
        earlier = torch.arange(c, device=qc.device)[None, :] < (torch.arange(blocks, device=qc.device) * sub)[:, None]
        exponent = (before[..., None, :] - g[:, :, :, None]).masked_fill(~earlier[..., None], float("-inf"))
        keys = kc[:, :, :, None] * exponent.exp()  # [b, h, n, m, c, f]: k_j exp(G_r - G_j), j before block m
        if seg is not None:  # r's segment [b, 1, n, m, 1] (r = the position before block m), kept on both sides
            at_r = F.pad(segs[..., :-1, -1], (1, 0))[..., None]
            query = query * (segs == at_r)[..., None]
            keys = keys * (seg[:, None, :, None, :] == at_r)[..., None]
        scores = torch.einsum("bhnmif,bhnmjf->bhnmij", query, keys)
        out = out + torch.einsum("bhnmij,bhnje->bhnmie", scores, vc)
    return rearrange(out, "b h n m s e -> b h n (m s) e")


def recurrent_decay_attention(
    q: Tensor, k: Tensor, v: Tensor, log_decay: Tensor, *, state: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """The recurrent form, token by token (streaming): (o [b, h, t, e], S after the last position)."""
    dtype = q.dtype
    work = compute_dtype(q)
    q, k, v, log_decay = (x.to(work) for x in (q, k, v, log_decay))
    b, h, t, f = q.shape
    decay = log_decay.exp()
    decay = decay[..., None] if decay.dim() == 4 else decay[..., None, None]  # [b, h, t, f or 1, 1]
    running = q.new_zeros(b, h, f, v.shape[-1]) if state is None else state.to(work)
    outs = []
    for i in range(t):
        running = decay[:, :, i] * running + k[:, :, i, :, None] * v[:, :, i, None, :]
        outs.append(torch.einsum("bhf,bhfe->bhe", q[:, :, i], running))
    return torch.stack(outs, dim=2).to(dtype), running


def decay_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    log_decay: Tensor,
    *,
    chunk_size: int,
    state: Tensor | None = None,
    segments: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """The form a call runs: recurrent for one token (decoding; a single token starts no segment),
    chunkwise-parallel otherwise."""
    if q.shape[2] == 1:
        return recurrent_decay_attention(q, k, v, log_decay, state=state)
    return chunk_decay_attention(q, k, v, log_decay, chunk_size=chunk_size, state=state, segments=segments)


def state_before_rank(chunk, added: Tensor, log_decay: Tensor) -> Tensor:
    """Context parallelism: the state S [b, h, f, e] standing before this rank's tokens. ``added``: what
    this rank's tokens leave in a state that starts empty [b, h, f, e]; ``log_decay`` [b, h, t(, f)]: its
    per-position log decays. Every rank sends (its total log decay, its added state) to the later ranks,
    which step the recurrence over the earlier ranks in order (an exclusive scan with decay; the
    gradient goes back to the ranks that sent)."""
    b, h, f, e = added.shape
    total = log_decay.sum(2)  # [b, h] or [b, h, f]: how much of an earlier state passes through this rank
    total = total[..., None].expand(b, h, f) if total.dim() == 2 else total
    rows = chunk.rows_before(torch.cat([total, added.flatten(2)], dim=-1))  # [b, h, rank + 1, f + f e]
    running = added.new_zeros(b, h, f, e)
    for r in range(rows.shape[2]):  # the last row is this rank's own, zeroed: it adds nothing
        passed, adds = rows[:, :, r, :f].exp(), rows[:, :, r, f:].unflatten(-1, (f, e))
        running = passed[..., None] * running + adds
    return running
