"""Longformer: a (dilated) sliding window plus global tokens.

Paper: "Longformer: The Long-Document Transformer", Beltagy, Peters, Cohan 2020, arXiv:2004.05150,
Section 3.1 (sliding window, dilated sliding window, global attention with its own projections).

Query i (0-based) sees, bidirectional, the keys i + r d for |r| <= w (``window`` = 2w, ``dilation`` = d)
and the ``global_tokens`` = g first positions; a global query (i < g) sees every key, through its own
projections Q_g, K_g, V_g (``global_projections``, as the paper and HF's LongformerSelfAttention do).
Each key counts once (a global key inside the window is not seen twice). Causal: i sees the window's
left half i - r d, 0 <= r <= w, and the g first positions as sinks (every later query sees them; the
autoregressive form has no global attention, Section 4), all with the window's projections.

Global tokens are given per call through the option: the first g positions are global in every call
(the classifier's first token with g = 1). The option, not a tensor argument, because every caller
(the classifier, the two-tower encoder, sweeps, bench) already passes x and a padding mask through one
contract; a mask of global positions would have to be threaded through every head, stack and block for
one mechanism. A task that needs other positions global puts them first.

Computation: blocked, never t x t. The sequence is split into its d residue classes (dilation becomes
a plain window inside each class); queries go in blocks of w, each attending to its own block and the
neighbouring ones under one static relative mask (``blocked.banded_attention``), and to the g global
keys appended to every block under the same softmax (removed from the window so none counts twice).
The g global rows are one g x t product. Cost O(t (w + g)).

Streaming (causal): a fixed rule over absolute positions, so ``PatternAttention`` continues a stream from
a cache of the g sinks and the w d most recent keys (``state_bound`` = g + w d).

Shapes: x [b, t, d] -> q, k, v [b, h, t, k] -> out [b, t, d]; per residue class [(b d), h, t / d, k].

Deviations: the window is symmetric with w = window / 2 keys on each side (HF: ``attention_window`` / 2),
so ``window`` must be even. Positions beyond the first g cannot be made global (see above).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from einops import rearrange, repeat
from torch import Tensor, nn

from zoo.attention.base import ATTENTION, AttnOutput, KeysPerQuery, StateContract, causal_allowed
from zoo.attention.blocked import PatternAttention, attend_masked, banded_attention, pad_time, padded_length
from zoo.config import require


@ATTENTION.register("longformer")
class LongformerAttention(PatternAttention):
    takes_left_padding = True  # the window depends on i - j only; global tokens excepted (left_padding_refusal)
    projection_features = ()
    no_projection_reason = (
        "its global tokens project queries, keys and values with matrices of their own (Beltagy et al. 2020, "
        "Section 3.1), which the shared projection options do not reach"
    )
    # rope: q and k (and the global rows' Q_g, K_g) rotated at their positions before the residue classes
    # are formed; a pair bias b_h(i - j) on the window (class distance x dilation), on the global keys every
    # block sees (each class at its own positions) and on the global rows
    position_kinds = ("rotary", "pair_bias")
    lra_row = "Longformer"

    @dataclass
    class Options:
        window: int = 256  # 2w: w keys on each side of a query (causal: w before it)
        dilation: int = 1  # d: every d-th position inside the window
        global_tokens: int = 1  # g: the first g positions are global (the classifier's first token)
        global_projections: bool = True  # global rows use their own Q_g, K_g, V_g (bidirectional)
        bias: bool = True  # bias in the projections

        def __post_init__(self) -> None:
            require(self.window >= 2 and self.window % 2 == 0, f"window must be an even int >= 2, got {self.window}")
            require(self.dilation >= 1, f"dilation must be >= 1, got {self.dilation}")
            require(self.global_tokens >= 0, f"global_tokens must be >= 0, got {self.global_tokens}")

    def left_padding_refusal(self) -> str | None:
        if self.options.global_tokens:
            return (
                f"attention 'longformer' makes the stream's first global_tokens={self.options.global_tokens} "
                "positions global, which are padding in a left-padded row rather than its first tokens"
            )
        return super().left_padding_refusal()

    @classmethod
    def contract_options(cls) -> dict:
        return {"window": 6, "dilation": 2, "global_tokens": 2}

    @classmethod
    def contract_state(cls) -> StateContract:
        return StateContract(bound=2 + 3 * 2)  # g + w d under contract_options()

    def __init__(self, d_model: int, n_heads: int, **kwargs):
        super().__init__(d_model, n_heads, **kwargs)
        o = self.options
        self.global_rows = None
        if not self.causal and o.global_tokens and o.global_projections:
            self.global_rows = nn.ModuleDict({n: nn.Linear(d_model, d_model, bias=o.bias) for n in ("q", "k", "v")})

    @property
    def sinks(self) -> int:
        return self.options.global_tokens

    def state_bound(self) -> int:
        o = self.options
        return o.global_tokens + o.window // 2 * o.dilation

    def allowed(self, i: Tensor, j: Tensor) -> Tensor:
        """Causal rule over absolute positions: the dilated left window, or a global (sink) position."""
        o = self.options
        back = i - j
        window = (back <= o.window // 2 * o.dilation) & (back % o.dilation == 0)
        return (back >= 0) & (window | (j < o.global_tokens))

    def keys_per_query(self, t: int) -> KeysPerQuery:
        """Counted exactly: the window's keys inside the sequence and past the global ones, plus the
        global keys (causal: those before the query); a global row sees every key (causal: every earlier)."""
        o = self.options
        w, d, g = o.window // 2, o.dilation, min(o.global_tokens, t)
        i = torch.arange(t)
        keys = torch.full((t,), float(g))
        for r in range(-w, (0 if self.causal else w) + 1):
            j = i + r * d
            keys += ((j >= g) & (j < t)).float()
        keys[:g] = (i[:g] + 1).float() if self.causal else float(t)
        rule = f"window {o.window} (dilation {d}) + {g} global"
        return KeysPerQuery(float(keys.mean()), rule)

    def forward(
        self, x: Tensor, *, context: Tensor | None = None, pad_mask: Tensor | None = None, state=None
    ) -> AttnOutput:
        if self.global_rows is None or state is not None:
            return super().forward(x, context=context, pad_mask=pad_mask, state=state)
        self.check_inputs(x, context, pad_mask, state)
        q, k, v = (self.split_heads(proj(x)) for proj in (self.to_q, self.to_k, self.to_v))
        positions = torch.arange(x.shape[1], device=x.device)
        out = self.attend(self.rotate(q, positions), self.rotate(k, positions), v, pad_mask)
        g = min(self.options.global_tokens, x.shape[1])  # the global rows again, through Q_g, K_g, V_g
        qg = self.rotate(self.split_heads(self.global_rows["q"](x[:, :g])), positions[:g])
        kg = self.rotate(self.split_heads(self.global_rows["k"](x)), positions)
        vg = self.split_heads(self.global_rows["v"](x))
        bias = self.distance_bias(positions[:g, None] - positions[None, :], q.dtype)
        out_g = attend_masked(qg, kg, vg, self.key_mask(pad_mask, kg), dropout=self.attn_dropout, bias=bias)
        return AttnOutput(self.to_out(self.merge_heads(torch.cat([out_g, out[:, :, g:]], dim=2))))

    @staticmethod
    def key_mask(pad_mask: Tensor | None, q: Tensor) -> Tensor:
        """[b, 1, 1, s] for queries/keys q [b, h, s, k]: every real key."""
        if pad_mask is None:
            return torch.ones(q.shape[0], 1, 1, q.shape[2], dtype=torch.bool, device=q.device)
        return pad_mask[:, None, None, :]

    def attend(self, q: Tensor, k: Tensor, v: Tensor, pad_mask: Tensor | None = None) -> Tensor:
        """q, k, v [b, h, t, k] -> [b, h, t, k]: the window and the global keys; global rows see every key."""
        o = self.options
        b, h, t, _ = q.shape
        w, d, g = o.window // 2, o.dilation, min(o.global_tokens, t)
        valid = torch.ones(b, t, dtype=torch.bool, device=q.device) if pad_mask is None else pad_mask
        n = -(-t // d)  # positions per residue class
        length = padded_length(n, w)  # each class padded to whole blocks of w

        def by_class(x: Tensor) -> Tensor:  # [b, h, t, k] -> [(b d), h, n, k]
            return rearrange(pad_time(x, n * d), "b h (n d) k -> (b d) h n k", d=d)

        position = torch.arange(n * d, device=q.device)
        local = torch.nn.functional.pad(valid, (0, n * d - t), value=False) & (position >= g)  # globals: once
        local = torch.nn.functional.pad(rearrange(local, "b (n d) -> (b d) n", d=d), (0, length - n), value=False)
        causal = self.causal

        def allowed(qi: Tensor, dd: Tensor) -> Tensor:  # dd: key offset from the block start
            back = qi - dd
            return (back >= 0) & (back <= w) if causal else back.abs() <= w

        shared = None
        if g:
            k_s, v_s = (repeat(x[:, :, :g], "b h g k -> (b d) h g k", d=d) for x in (k, v))
            allowed_s = repeat(valid[:, :g], "b g -> (b d) n g", d=d, n=length // w)
            shared = (k_s, v_s, allowed_s)
            if self.has_pair_bias:  # class c's query at class position p sits at p d + c: its own distances
                query = torch.arange(length, device=q.device)[None, :] * d + torch.arange(d, device=q.device)[:, None]
                bias_s = self.distance_bias(
                    query[..., None] - torch.arange(g, device=q.device), q.dtype
                )  # [h, d, L, g]
                bias_s = repeat(bias_s, "h d (n s) g -> (b d) h n s g", b=b, s=w)
                shared = (*shared, bias_s)
        band_bias = (lambda distance: self.distance_bias(distance * d, q.dtype)) if self.has_pair_bias else None
        out = banded_attention(
            by_class(q),
            by_class(k),
            by_class(v),
            local,
            block=w,
            before=1,
            after=0 if causal else 1,
            allowed=allowed,
            dropout=self.attn_dropout,
            shared=shared,
            bias=band_bias,
        )
        out = rearrange(out[:, :, :n], "(b d) h n k -> b h (n d) k", d=d)[:, :, :t]
        if not g:
            return out
        # the global rows: every key (causal: every earlier one; they are the first g positions)
        mask = self.key_mask(pad_mask, k)
        keys = g if causal else t
        bias = self.distance_bias(position[:g, None] - position[None, :keys], q.dtype)  # [h, g, keys] or None
        if causal:
            mask = mask[..., :g] & causal_allowed(g, g, q.device)
        out_g = attend_masked(q[:, :, :g], k[:, :, :keys], v[:, :, :keys], mask, dropout=self.attn_dropout, bias=bias)
        return torch.cat([out_g, out[:, :, g:]], dim=2)
