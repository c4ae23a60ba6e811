"""BigBird: block-sparse attention of a sliding window, global blocks and random blocks (ITC).

Paper: "Big Bird: Transformers for Longer Sequences", Zaheer, Guruganesh, Dubey, Ainslie, Alberti,
Ontanon, Pham, Ravula, Wang, Yang, Ahmed 2020, arXiv:2007.14062, Section 2 and Appendix D (the blocked
ITC implementation, as HF transformers' BigBirdBlockSparseAttention computes it).

The sequence is cut into n blocks of ``block`` positions. Query block i attends to
- the ``window`` blocks centred on it (i - W ... i + W, W = window // 2),
- the ``global_blocks`` = g first and g last blocks (ITC: global tokens taken from the sequence),
- ``random_blocks`` = r blocks drawn per head and row among the blocks not already in the two sets;
and a global query block (one of the first or last g) attends to every key. Each key block counts once.

Random blocks are drawn by a generator seeded with (``seed``, the layer's index, n), so they are fixed
for a given length, in training and at evaluation alike (as the paper's code and HF in training, which
reseed every call); ``resample=True`` draws fresh ones every training call instead (evaluation stays
seeded). Where fewer than r blocks are left to draw from (short sequences), a row takes those there are.

Computation: per head and query block, its key blocks are gathered ([b, h, n, K b, k], K = window +
2 g + r blocks) and one fused SDPA runs over all of them; the global rows are one 2 g b x t product.
Cost O(t (window + 2 g + r) b), never t x t. A length that does not fill the last block is padded.

Shapes: x [b, t, d] -> q, k, v [b, h, t, k] -> blocks [b, h, n, block, k] -> out [b, t, d].

Deviations: HF's eval mode draws no random blocks (its table is all block 0, so block 0 is counted r + 1
times); ours keeps the seeded draw. The number of global blocks is an option (HF and the paper's
ITC experiments: 1 at each end). No causal form: global and random blocks see the whole sequence, and
the paper's block-sparse attention is an encoder's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor

from zoo.attention.base import ATTENTION, Attention, AttnOutput, KeysPerQuery, guard_empty_rows
from zoo.attention.blocked import pad_time, padded_length
from zoo.attention.pair_bias import guard_rows
from zoo.config import require


@ATTENTION.register("bigbird")
class BigBirdAttention(Attention):
    no_packing_reason = "has global and random keys that reach across the whole row"
    projection_features = ("grouped_kv", "qk_norm")  # keeps no state: keys widened once projected
    no_projection_reason = "its scores go through fused SDPA kernels and are never written out to cap"
    # rope: q and k rotated at their positions before the blocks are gathered; a pair bias from the gathered
    # blocks' positions, added to the scores each query block computes (window, global, random alike)
    position_kinds = ("rotary", "pair_bias")
    supports_causal = False
    no_causal_reason = (
        "its global and random blocks see the whole sequence; the paper's block-sparse ITC attention is an encoder's"
    )
    lra_row = "BigBird"

    @dataclass
    class Options:
        block: int = 64  # positions per block
        window: int = 3  # blocks in the sliding window (odd), centred on the query's block
        global_blocks: int = 1  # g: the first g and the last g blocks are global
        random_blocks: int = 3  # r: random key blocks per query block and head
        seed: int = 0  # the random blocks' generator (with the layer's index and the length)
        resample: bool = False  # True: fresh random blocks every training call
        bias: bool = True  # bias in the q/k/v/output projections

        def __post_init__(self) -> None:
            require(self.block >= 1, f"block must be >= 1, got {self.block}")
            require(
                self.window >= 1 and self.window % 2 == 1, f"window must be an odd number of blocks, got {self.window}"
            )
            require(self.global_blocks >= 0, f"global_blocks must be >= 0, got {self.global_blocks}")
            require(self.random_blocks >= 0, f"random_blocks must be >= 0, got {self.random_blocks}")

    @classmethod
    def contract_options(cls) -> dict:
        return {"block": 4, "random_blocks": 2}

    def __init__(self, d_model: int, n_heads: int, **kwargs):
        super().__init__(d_model, n_heads, **kwargs)
        self.add_projections(bias=self.options.bias)

    # -- which key blocks each query block sees ---------------------------------------------------------
    def static_blocks(self, n: int, device=None) -> tuple[Tensor, Tensor]:
        """Window and global key blocks of every query block: (index [n, S], kept [n, S]); a block out of
        range, or a global block already in the window, is not kept (each key counts once)."""
        o = self.options
        w, g = o.window // 2, min(o.global_blocks, n)
        rows = torch.arange(n, device=device)[:, None]
        window = rows + torch.arange(-w, w + 1, device=device)[None, :]
        ends = torch.cat([torch.arange(g, device=device), torch.arange(n - g, n, device=device)]).unique()
        glob = ends[None, :].expand(n, -1)
        index = torch.cat([window, glob], dim=1)
        kept = (index >= 0) & (index < n)
        kept[:, window.shape[1] :] &= (glob - rows).abs() > w  # a global block inside the window: once
        return index.clamp(0, n - 1), kept

    def random_table(self, n: int, device=None) -> tuple[Tensor, Tensor]:
        """Random key blocks per head and query block: (index [h, n, r], kept [n, r]), drawn without
        replacement among the blocks neither in the row's window nor global."""
        o = self.options
        r = o.random_blocks
        index, kept = self.static_blocks(n)
        spare = index.masked_fill(~kept, n)  # blocks not kept go to a spare column
        taken = torch.zeros(n, n + 1, dtype=torch.bool).scatter_(1, spare, True)[:, :n]  # blocks the row sees
        if self.training and o.resample:
            noise = torch.rand(self.n_heads, n, n)
        else:
            generator = torch.Generator().manual_seed(o.seed * 1_000_003 + self.layer_index * 10_007 + n)
            noise = torch.rand(self.n_heads, n, n, generator=generator)
        noise = noise.masked_fill(taken, 2.0)  # never drawn while a free block is left
        r_eff = min(r, n)
        picked = noise.topk(r_eff, dim=-1, largest=False).indices  # [h, n, r_eff]
        free = (~taken).sum(-1)  # [n]
        usable = torch.arange(r_eff)[None, :] < free[:, None]
        return picked.to(device), usable.to(device)

    def key_blocks(self, n: int, device=None) -> tuple[Tensor, Tensor]:
        """All key blocks per head and query block: (index [h, n, K], kept [n, K])."""
        static, kept = self.static_blocks(n, device)
        random, usable = self.random_table(n, device)
        index = torch.cat([static[None].expand(self.n_heads, -1, -1), random], dim=-1)
        return index, torch.cat([kept, usable], dim=-1)

    def keys_per_query(self, t: int) -> KeysPerQuery:
        o = self.options
        n = -(-t // o.block)
        _, kept = self.key_blocks(n)
        g = min(o.global_blocks, n)
        blocks = kept.sum(-1).double()
        blocks[:g] = n
        blocks[n - g :] = n
        keys = min(float(blocks.mean()) * o.block, float(t))
        return KeysPerQuery(keys, f"{o.window} window + {2 * g} global + {o.random_blocks} random blocks of {o.block}")

    # -- attention ---------------------------------------------------------------------------------------
    def forward(
        self, x: Tensor, *, context: Tensor | None = None, pad_mask: Tensor | None = None, state=None
    ) -> AttnOutput:
        self.check_inputs(x, context, pad_mask, state)
        q, k, v = (self.split_heads(proj(x)) for proj in (self.to_q, self.to_k, self.to_v))
        positions = torch.arange(x.shape[1], device=x.device)
        q, k = self.rotate(q, positions), self.rotate(k, positions)  # rope (else q, k themselves)
        k, v = self.expand_kv(k, v)
        return AttnOutput(self.to_out(self.merge_heads(self.attend(q, k, v, pad_mask))))

    def scores_mask(self, mask: Tensor, distance: Tensor, dtype: torch.dtype, head: Tensor | None = None) -> Tensor:
        """SDPA's mask for the pairs ``mask`` allows: itself without a pair bias; with one, b_h(distance)
        (query minus key position, long, broadcastable with ``mask``; ``head``: each entry's head, see
        ``Position.distance_bias``) with -inf where not allowed (a row with no key: 0s; the caller zeroes it)."""
        if not self.has_pair_bias:
            return guard_empty_rows(mask)
        return guard_rows(self.pair_bias(distance, dtype, head=head).masked_fill(~mask, float("-inf")))[0]

    def attend(self, q: Tensor, k: Tensor, v: Tensor, pad_mask: Tensor | None) -> Tensor:
        """q, k, v [b, h, t, k] -> [b, h, t, k]."""
        o = self.options
        b, h, t, _ = q.shape
        size = o.block
        length = padded_length(t, size)
        n = length // size
        g = min(o.global_blocks, n)
        dropout = self.dropout if self.training else 0.0
        valid = torch.zeros(b, length, dtype=torch.bool, device=q.device)
        valid[:, :t] = True if pad_mask is None else pad_mask
        q, k, v = (pad_time(x, length) for x in (q, k, v))
        out = torch.zeros_like(q)
        middle = slice(g, n - g)  # query blocks that are not global
        if n > 2 * g:
            index, kept = self.key_blocks(n, q.device)
            index, kept = index[:, middle], kept[middle]  # [h, m, K], [m, K]
            heads = torch.arange(h, device=q.device)[:, None, None]
            kb, vb = (rearrange(x, "b h (n s) k -> b h n s k", s=size)[:, heads, index] for x in (k, v))
            kb, vb = (rearrange(x, "b h m K s k -> b (h m) (K s) k") for x in (kb, vb))  # [b, h m, K s, k]
            key_valid = rearrange(valid, "b (n s) -> b n s", s=size)[:, index] & kept[None, None, :, :, None]
            mask = rearrange(key_valid, "b h m K s -> b (h m) 1 (K s)")
            qb = rearrange(q[:, :, g * size : (n - g) * size], "b h (m s) k -> b (h m) s k", s=size)
            has_key = mask.any(-1, keepdim=True)
            attn_mask = guard_empty_rows(mask)
            if self.has_pair_bias:  # query (g + m) s + i minus key index[h, m, K] s + j, each entry with its head
                query = torch.arange(g * size, (n - g) * size, device=q.device).view(1, -1, size, 1)  # [1, m, s, 1]
                key = rearrange(index[..., None] * size + torch.arange(size, device=q.device), "h m K s -> h m 1 (K s)")
                distance = rearrange(query - key, "h m s e -> 1 (h m) s e")
                head = rearrange(torch.arange(h, device=q.device).expand(index.shape[1], h), "m h -> 1 (h m) 1 1")
                attn_mask = self.scores_mask(mask, distance, q.dtype, head)
            res = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=attn_mask, dropout_p=dropout)
            res = rearrange(res * has_key, "b (h m) s k -> b h (m s) k", h=h)
            out[:, :, g * size : (n - g) * size] = res
        rows = torch.cat([torch.arange(0, g * size), torch.arange(max(g, n - g) * size, length)]).to(q.device)
        if rows.numel():  # global query blocks: every real key
            mask = valid[:, None, None, :]
            distance = rows[:, None] - torch.arange(length, device=q.device)[None, :]  # [R, length]
            attn_mask = self.scores_mask(mask, distance, q.dtype)
            res = F.scaled_dot_product_attention(q[:, :, rows], k, v, attn_mask=attn_mask, dropout_p=dropout)
            out[:, :, rows] = res * mask.any(-1, keepdim=True)
        return out[:, :, :t]
