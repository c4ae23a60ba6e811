"""Additive and multiplicative attention scores, the family the Transformer grew out of.

Papers: "Neural Machine Translation by Jointly Learning to Align and Translate", Bahdanau et al.
2015, arXiv:1409.0473 (``concat``: score(s, h) = v^T tanh(W_s s + W_h h)); "Effective Approaches
to Attention-based Neural Machine Translation", Luong et al. 2015, arXiv:1508.04025 (``dot``:
s^T h, and ``general``: s^T W_a h).

Deviations: the scores are computed per head over projected queries/keys (multi-head, like the
rest of the zoo) rather than over RNN states, and the output is projected back to d. ``concat``
materialises a [b, h, t, s, k] tensor: its cost is O(t * s * d) by nature, which is why the
Transformer replaced it with the scaled dot product.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from zoo.attention.base import (
    ATTENTION,
    Attention,
    AttnOutput,
    KeysPerQuery,
    StateContract,
    causal_allowed,
    dense_keys,
    guard_empty_rows,
)
from zoo.attention.documents import packed_segments
from zoo.attention.vanilla import KVCache, extend_cache, stream_positions
from zoo.config import require

SCORES = ("dot", "general", "concat")


@ATTENTION.register("additive")
class AdditiveAttention(Attention):
    packs_documents = True  # the document test joins its dense score mask
    takes_left_padding = True  # left-padded rows decode as alone (tests/contracts/test_generate.py)
    projection_features = ("qk_norm",)
    no_projection_reason = (
        "its scores are Bahdanau's tanh network over every pair (already bounded), and its KV cache is not grouped"
    )
    supports_cross = True
    supports_memory = True  # a KV cache of projected keys and values continues a stream (causal use)
    position_kinds = (
        "rotary",
        "pair_bias",
    )  # rotary only with score="dot" (position_refusal); the bias joins the scores

    @dataclass
    class Options:
        score: str = "concat"  # dot | general | concat
        bias: bool = True  # bias in the q/k/v/output projections

        def __post_init__(self) -> None:
            require(self.score in SCORES, f"score must be one of {', '.join(SCORES)}; got {self.score!r}")

    def context_refusal(self) -> str:
        return (
            f"attention 'additive' (score={self.options.score}) is dense and its scores are not the scaled dot "
            "product ring attention's fused blocks compute; run it in one process"
        )

    def __init__(self, d_model: int, n_heads: int, **kwargs):
        super().__init__(d_model, n_heads, **kwargs)
        h, k = self.n_heads, self.head_dim
        self.add_projections(bias=self.options.bias)
        self.attn_dropout = nn.Dropout(self.dropout)
        if self.options.score == "general":
            self.w_a = nn.Parameter(torch.randn(h, k, k) * k**-0.5)  # per-head bilinear form
        elif self.options.score == "concat":
            self.w_s = nn.Parameter(torch.randn(h, k, k) * k**-0.5)
            self.w_h = nn.Parameter(torch.randn(h, k, k) * k**-0.5)
            self.v_a = nn.Parameter(torch.randn(h, k) * k**-0.5)

    @classmethod
    def contract_state(cls) -> StateContract:
        return StateContract(bound=None)  # dense: every earlier key stays visible, the cache grows

    def position_refusal(self, position) -> str | None:
        if position.rotary and self.options.score != "dot":
            return (
                f"score={self.options.score!r} is not a dot product of the rotated query and key (W_a or tanh sits "
                "between them), so a rotation would not make it depend on i - j only; use score='dot', or a pair "
                "bias (alibi, t5_bias)"
            )
        return super().position_refusal(position)

    def init_state(self, batch_size: int) -> KVCache:
        return KVCache()  # a bidirectional self-attention is refused when the state is used (check_inputs)

    def keys_per_query(self, t: int) -> KeysPerQuery:
        return dense_keys(t, self.causal)

    def projection_flops(self) -> float:
        """q, k, v, output, plus the per-head score weights: W_a on each query (general); W_s on each
        query and W_h on each key (concat). concat's tanh over [t, s, k] is element-wise: not counted."""
        per_head = {"dot": 0, "general": 1, "concat": 2}[self.options.score] * self.head_dim * self.head_dim
        return super().projection_flops() + 2.0 * self.n_heads * per_head

    def scores(self, q: Tensor, k: Tensor) -> Tensor:
        """q: [b, h, t, k], k: [b, h, s, k] -> [b, h, t, s]"""
        score = self.options.score
        if score == "dot":
            return torch.einsum("bhtk,bhsk->bhts", q, k)
        if score == "general":
            return torch.einsum("bhtk,hkl,bhsl->bhts", q, self.w_a, k)
        query_part = torch.einsum("bhtk,hkl->bhtl", q, self.w_s)[:, :, :, None]  # [b, h, t, 1, k]
        key_part = torch.einsum("bhsk,hkl->bhsl", k, self.w_h)[:, :, None]  # [b, h, 1, s, k]
        return torch.einsum("bhtsl,hl->bhts", torch.tanh(query_part + key_part), self.v_a)

    def forward(
        self,
        x: Tensor,
        *,
        context: Tensor | None = None,
        pad_mask: Tensor | None = None,
        state=None,
        documents: Tensor | None = None,
    ) -> AttnOutput:
        """``documents`` [b, t] (packed rows, self-attention): the document test joins the score mask."""
        self.check_inputs(x, context, pad_mask, state)
        packed_segments(self, documents, x, state)  # refuses a state or a bad ids tensor
        source = x if context is None else context
        q = self.split_heads(self.to_q(x))
        k, v = self.split_heads(self.to_k(source)), self.split_heads(self.to_v(source))
        new_state, bias = None, None
        if context is None:  # self-attention: positions inside attention apply (cross-attention: two timelines)
            positions, key_positions = stream_positions(state, x.shape[1], x.device)
            q, k = self.rotate(q, positions), self.rotate(k, positions)
        if state is not None and context is None:  # self-attention continuing a stream: [cache ; segment]
            k, v, pad_mask, store = extend_cache(state, k, v, pad_mask, self.registry_name)
            new_state = KVCache(k.detach(), v.detach(), pad_mask, next=int(positions[-1]) + 1, store=store)
        if context is None:
            bias = self.pair_bias(positions[:, None] - key_positions[None, :], q.dtype)  # [h, t, s] or None
        t, s = q.shape[2], k.shape[2]
        allowed = None
        if self.causal and context is None:
            allowed = causal_allowed(t, s, x.device)[None, None]
        if pad_mask is not None:
            key_ok = pad_mask[:, None, None, :]
            allowed = key_ok if allowed is None else allowed & key_ok
        if documents is not None:
            same = (documents[:, :, None] == documents[:, None, :])[:, None]  # [b, 1, t, t]
            allowed = same if allowed is None else allowed & same
        scores = self.scores(q, k)
        if bias is not None:
            scores = scores + bias
        if allowed is not None:
            scores = scores.masked_fill(~guard_empty_rows(allowed), float("-inf"))
        weights = self.attn_dropout(torch.softmax(scores, dim=-1))
        out = torch.einsum("bhts,bhsk->bhtk", weights, v)
        return AttnOutput(self.to_out(self.merge_heads(out)), state=new_state)
