"""Ring attention: dense causal attention over a sequence split across ranks.

Paper: "Ring Attention with Blockwise Transformers for Near-Infinite Context", Liu, Zaharia and
Abbeel 2023, arXiv:2310.01889. The ranks form a ring; each keeps its queries and passes its key/value
block to the next rank, C - 1 times, so every query meets every key block once while a rank holds
only two key blocks at a time (memory per rank independent of the total length). Each block's
partial result (output and log-sum-exp of its scores) merges into the running one with the online
softmax (Milakov and Gimelshein 2018): o = o_a exp(l_a - l) + o_b exp(l_b - l), l = log(e^l_a + e^l_b).

Backward runs the ring again: with the merged output O and log-sum-exp L, a block's share of the
gradient is that of softmax restricted to it (P = exp(S - L), D = rowsum(dO * O)), so each rank adds
its queries' dq and accumulates dk, dv for the block it holds; the accumulators travel with their
block and are home after one more hop. Only q, k, v, the output and L are kept for backward.

Causality is decided per pair of pieces by absolute position (``chunk.py``'s layouts cut equal pieces):
a key piece wholly before a query piece is attended in full, the same piece causally, a later one not
at all. Under the zigzag layout every step costs every rank two half blocks (balanced); under the
contiguous one rank r computes r full blocks and skips the rest.

Blocks run through torch's fused CPU flash kernel, which returns the log-sum-exp
(``aten._scaled_dot_product_flash_attention_for_cpu`` and its backward); on other devices (and with
``FUSED = False``, which the tests use to check both) through plain matmuls. Attention-weight dropout
is not implemented (the mechanism refuses it under context parallelism).

Shapes: q, k, v [b, h, t, k] (t = this rank's tokens); bias [b, 1, 1, t] additive (0 or -inf: key
padding) or None; lse [b, h, t].
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from zoo.parallel.exchange import post

FUSED = True  # the fused CPU kernel where it exists (False: plain matmuls everywhere, for the tests)


def _fused(q: Tensor) -> bool:
    return FUSED and q.device.type == "cpu"


def _mask(q: Tensor, k: Tensor, causal: bool, bias: Tensor | None) -> Tensor | None:
    """Additive float mask [b | 1, 1, n, m] (or None) for a block: causal inside it, key padding."""
    if not causal:
        return bias
    n, m = q.shape[2], k.shape[2]
    allowed = torch.ones(n, m, dtype=torch.bool, device=q.device).tril()
    mask = torch.zeros(n, m, dtype=q.dtype, device=q.device).masked_fill(~allowed, float("-inf"))[None, None]
    return mask if bias is None else mask + bias


def block_forward(
    q: Tensor, k: Tensor, v: Tensor, *, causal: bool, bias: Tensor | None, scale: float
) -> tuple[Tensor, Tensor]:
    """One block: q [b, h, n, k] over k, v [b, h, m, k] -> (out [b, h, n, k], lse [b, h, n]); a row
    with no key to see gets out 0 and lse -inf (it then weighs nothing in the merge)."""
    mask = _mask(q, k, causal, bias)
    if _fused(q):
        if mask is None:  # the kernel's own causal path, no mask tensor
            return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, scale=scale)
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, False, attn_mask=mask, scale=scale
        )
    else:
        scores = torch.einsum("bhnk,bhmk->bhnm", q, k) * scale
        if mask is not None:
            scores = scores + mask
        lse = torch.logsumexp(scores, dim=-1)
        out = torch.einsum("bhnm,bhmk->bhnk", torch.exp(scores - lse[..., None]).nan_to_num(0.0), v)
    if mask is not None:  # the kernel reports lse 0 for a row it could not see anything from
        empty = torch.isinf(mask).all(-1).expand(lse.shape)
        lse = lse.masked_fill(empty, float("-inf"))
        out = out.masked_fill(empty[..., None], 0.0)
    return out, lse


def block_backward(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    *,
    causal: bool,
    bias: Tensor | None,
    scale: float,
) -> tuple[Tensor, Tensor, Tensor]:
    """This block's share of (dq, dk, dv), given the merged ``out`` and ``lse`` of the rows (lse finite)."""
    mask = _mask(q, k, causal, bias)
    if _fused(q):
        op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward
        if mask is None:
            return op(dout, q, k, v, out, lse, 0.0, causal, scale=scale)
        return op(dout, q, k, v, out, lse, 0.0, False, attn_mask=mask, scale=scale)
    scores = torch.einsum("bhnk,bhmk->bhnm", q, k) * scale
    if mask is not None:
        scores = scores + mask
    p = torch.exp(scores - lse[..., None])
    dv = torch.einsum("bhnm,bhnk->bhmk", p, dout)
    dp = torch.einsum("bhnk,bhmk->bhnm", dout, v)
    ds = p * (dp - (dout * out).sum(-1, keepdim=True))
    return torch.einsum("bhnm,bhmk->bhnk", ds, k) * scale, torch.einsum("bhnm,bhnk->bhmk", ds, q) * scale, dv


def merge(acc: tuple[Tensor, Tensor] | None, out: Tensor, lse: Tensor) -> tuple[Tensor, Tensor]:
    """The online-softmax merge of a running (out, lse) with a block's (in the running dtype)."""
    if acc is None:
        return out.to(lse.dtype), lse
    acc_out, acc_lse = acc
    new = torch.logaddexp(acc_lse, lse)
    safe = new.masked_fill(torch.isinf(new), 0.0)  # both -inf: nothing seen yet, weights 0
    merged = acc_out * torch.exp(acc_lse - safe)[..., None] + out.to(lse.dtype) * torch.exp(lse - safe)[..., None]
    return merged, new


def relation(query: tuple[int, int], key: tuple[int, int]) -> str | None:
    """How a query piece [a, b) attends to a key piece of the same length: "full", "causal" or None."""
    if key[1] <= query[0]:
        return "full"
    if key[0] >= query[1]:
        return None
    if key == query:
        return "causal"
    raise ValueError(f"pieces {query} and {key} overlap partly: the layout must cut equal aligned pieces")


def _blocks(chunk: Any, source: int) -> list[tuple[int, int, str]]:
    """(query piece, key piece, relation) of every block this rank computes with ``source``'s keys."""
    mine, theirs = chunk.layout.pieces(chunk.rank), chunk.layout.pieces(source)
    found = [(i, j, relation(q, k)) for i, q in enumerate(mine) for j, k in enumerate(theirs)]
    return [(i, j, r) for i, j, r in found if r is not None]


def _neighbours(chunk: Any) -> tuple[int, int]:
    """Global ranks of the next and the previous rank on the ring."""
    return chunk.peers[(chunk.rank + 1) % chunk.size], chunk.peers[(chunk.rank - 1) % chunk.size]


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None, chunk: Any, scale: float) -> Tensor:
        piece = chunk.layout.piece_length
        nxt, prev = _neighbours(chunk)
        acc: list[tuple[Tensor, Tensor] | None] = [None] * (q.shape[2] // piece)
        held = [k, v] + ([bias] if bias is not None else [])
        for step in range(chunk.size):
            incoming = None
            if step < chunk.size - 1:  # the next block travels while this one is computed
                buffers = [x.new_empty(x.shape) for x in held]
                incoming = post(chunk.group, [(nxt, x) for x in held], [(prev, b) for b in buffers])
            kp, vp = held[0].split(piece, dim=2), held[1].split(piece, dim=2)
            bp = held[2].split(piece, dim=-1) if bias is not None else None
            for i, j, how in _blocks(chunk, (chunk.rank - step) % chunk.size):
                qi = q[:, :, i * piece : (i + 1) * piece]
                out, lse = block_forward(
                    qi, kp[j], vp[j], causal=how == "causal", bias=None if bp is None else bp[j], scale=scale
                )
                acc[i] = merge(acc[i], out, lse)
            if incoming is not None:
                incoming.wait()
                held = buffers
        out = torch.cat([a[0] for a in acc], dim=2).to(q.dtype)
        lse = torch.cat([a[1] for a in acc], dim=2)
        ctx.save_for_backward(q, k, v, bias, out, lse)
        ctx.chunk, ctx.scale = chunk, scale
        return out

    @staticmethod
    def backward(ctx, dout: Tensor) -> tuple[Any, ...]:
        q, k, v, bias, out, lse = ctx.saved_tensors
        chunk, scale = ctx.chunk, ctx.scale
        piece = chunk.layout.piece_length
        nxt, prev = _neighbours(chunk)
        lse = lse.masked_fill(torch.isinf(lse), 0.0)  # a row that saw nothing: P = exp(-inf) = 0 everywhere
        acc_dtype = lse.dtype
        dq = torch.zeros_like(q, dtype=acc_dtype)
        held = [k, v] + ([bias] if bias is not None else [])
        dk, dv = torch.zeros_like(k, dtype=acc_dtype), torch.zeros_like(v, dtype=acc_dtype)
        dout = dout.contiguous()
        for step in range(chunk.size):
            kp, vp = held[0].split(piece, dim=2), held[1].split(piece, dim=2)
            bp = held[2].split(piece, dim=-1) if bias is not None else None
            dkp, dvp = dk.split(piece, dim=2), dv.split(piece, dim=2)
            for i, j, how in _blocks(chunk, (chunk.rank - step) % chunk.size):
                rows = slice(i * piece, (i + 1) * piece)
                grads = block_backward(
                    dout[:, :, rows],
                    q[:, :, rows],
                    kp[j],
                    vp[j],
                    out[:, :, rows],
                    lse[:, :, rows],
                    causal=how == "causal",
                    bias=None if bp is None else bp[j],
                    scale=scale,
                )
                dq[:, :, rows] += grads[0]
                dkp[j].add_(grads[1])
                dvp[j].add_(grads[2])
            if chunk.size == 1:
                break
            # the block moves on with its gradient so far; after the last step only the gradient
            # moves, one hop more, to the rank that owns the block
            moving = held + [dk, dv] if step < chunk.size - 1 else [dk, dv]
            buffers = [x.new_empty(x.shape) for x in moving]
            post(chunk.group, [(nxt, x) for x in moving], [(prev, b) for b in buffers]).wait()
            if step < chunk.size - 1:
                held, (dk, dv) = buffers[:-2], buffers[-2:]
            else:
                dk, dv = buffers
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None


def ring_attention(
    q: Tensor, k: Tensor, v: Tensor, chunk: Any, *, key_valid: Tensor | None = None, scale: float | None = None
) -> Tensor:
    """Causal softmax(q k^T * scale) v of this rank's queries over the whole sequence's keys up to each:
    q, k, v [b, h, t, k] (this rank's rows, ``chunk``'s layout), key_valid [b, t] bool or None ->
    [b, h, t, k]. Every rank of the group calls it together."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    bias = None
    if key_valid is not None:
        bias = torch.zeros(key_valid.shape, dtype=q.dtype, device=q.device).masked_fill(~key_valid, float("-inf"))
        bias = bias[:, None, None, :]
    return _RingAttention.apply(q, k, v, bias, chunk, scale)
