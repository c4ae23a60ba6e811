"""Full attention in a shared query-key space: the baseline LSH attention approximates.

Paper: "Reformer: The Efficient Transformer", Kitaev, Kaiser & Levskaya 2020, arXiv:2001.04451,
Section 2 ("shared-QK attention") and Table 2's "full attention" rows.

One projection gives the queries q; the keys are the length-normalised queries, k_j = q_j / ||q_j||.
A token never attends to itself unless nothing else is visible (its own key would always win). The
parameters (``to_qk``, ``to_v``, ``to_out``) are named as ``lsh``'s, so a model trained with one
evaluates with the other. Dense, O(t^2), through fused SDPA; in causal use a KV cache of unit keys
and values continues a stream (``state``), growing with it as dense attention's context does.

Shapes: x [b, t, d]; pad_mask [b, t] bool (True = real).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
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


class SharedQKProjections(Attention):
    """The parameters shared by ``lsh`` and ``shared_qk`` (same names, so weights transfer)."""

    no_packing_reason = "does not mask keys of another document yet"

    no_projection_reason = (
        "queries and keys are one shared projection (to_qk, Kitaev et al. 2020), so keys cannot have fewer "
        "heads or a norm of their own"
    )

    no_cross_reason = (
        "shared-QK attention derives its keys from the queries (k = q / |q|), so keys cannot come from another sequence"
    )

    def __init__(self, d_model: int, n_heads: int, **kwargs):
        super().__init__(d_model, n_heads, **kwargs)
        bias = self.options.bias
        self.to_qk = nn.Linear(d_model, d_model, bias=bias)
        self.to_v = nn.Linear(d_model, d_model, bias=bias)
        self.to_out = nn.Linear(d_model, d_model, bias=bias)

    @property
    def score_scale(self) -> float:
        """What q . k is multiplied by, k the unit key: 1 / sqrt(d_k), the paper's scaled dot product
        (``scale_scores=True``), or 1, trax's and the Hugging Face port's (their ``length_normalized``
        key divided by sqrt(d_k) is the unit key, and the query is not scaled): sqrt(d_k) times hotter."""
        return self.head_dim**-0.5 if self.options.scale_scores else 1.0

    def check_inputs(self, x, context, pad_mask, state) -> None:
        if context is not None:
            raise ValueError(
                f"{self.registry_name} cannot do cross-attention (context=...): {self.no_cross_reason}; "
                "use e.g. vanilla for cross_attention"
            )
        super().check_inputs(x, context, pad_mask, state)


@ATTENTION.register("shared_qk")
class SharedQKAttention(SharedQKProjections):
    """Full attention with LSH's shared query-key space (keys = unit-length queries, no attention to
    oneself unless nothing else is visible): the paper's "full attention" baseline (Table 2), with
    the same parameter names as ``lsh`` so a model trained with one evaluates with the other.
    Dense, O(t^2), through fused SDPA."""

    takes_left_padding = True  # left-padded rows decode as alone (tests/contracts/test_generate.py)
    packs_documents = True  # its dense [b, 1, t, t] mask takes the document test too

    supports_memory = True  # a KV cache of unit keys and values: a stream continues exactly (causal use)
    # rotation keeps |q|, so the unit keys of rotated queries are the rotated unit keys; the bias joins
    # the [t, s] mask this dense layer builds anyway
    position_kinds = ("rotary", "pair_bias")

    @dataclass
    class Options:
        bias: bool = True
        scale_scores: bool = True  # q . k / sqrt(d_k); False: q . k unscaled, as trax (see score_scale)

    @classmethod
    def contract_state(cls) -> StateContract:
        return StateContract(bound=None)  # dense: every earlier key stays visible, the cache grows

    def init_state(self, batch_size: int) -> KVCache:
        super().init_state(batch_size)  # refuses a bidirectional layer, with the reason
        return KVCache()

    def context_refusal(self) -> str:
        return (
            "attention 'shared_qk' lets a token see its own key only when nothing else is visible, which depends "
            "on every earlier key's padding; ring attention here runs causal dot-product blocks without that rule"
        )

    def keys_per_query(self, t: int) -> KeysPerQuery:
        return dense_keys(t, self.causal)

    def forward(
        self,
        x: Tensor,
        *,
        context: Tensor | None = None,
        pad_mask: Tensor | None = None,
        state: KVCache | None = None,
        documents: Tensor | None = None,
    ) -> AttnOutput:
        """``documents`` [b, t] (packed rows): the dense mask keeps each query to its own document (a query sees
        itself when nothing else of its document is visible, as at a stream's start)."""
        self.check_inputs(x, context, pad_mask, state)
        packed_segments(self, documents, x, state)  # refuses a state or a bad ids tensor
        positions, key_positions = stream_positions(state, x.shape[1], x.device)
        q = self.rotate(self.split_heads(self.to_qk(x)), positions)
        keys, v = F.normalize(q, dim=-1), self.split_heads(self.to_v(x))
        new_state = None
        if state is not None:  # [cache ; segment]: the segment's queries sit at the end
            keys, v, pad_mask, store = extend_cache(state, keys, v, pad_mask, self.registry_name)
            new_state = KVCache(keys.detach(), v.detach(), pad_mask, next=int(positions[-1]) + 1, store=store)
        t, s = x.shape[1], keys.shape[2]
        eye = torch.arange(s, device=x.device)[None, :] == torch.arange(t, device=x.device)[:, None] + (s - t)
        allowed = causal_allowed(t, s, x.device) if self.causal else torch.ones(t, s, dtype=torch.bool, device=x.device)
        allowed = (allowed & ~eye)[None, None]  # [1, 1, t, s]
        if pad_mask is not None:
            allowed = allowed & pad_mask[:, None, None, :]
        if documents is not None:
            allowed = allowed & (documents[:, :, None] == documents[:, None, :])[:, None]
        allowed = allowed | (eye & ~allowed.any(-1, keepdim=True))  # oneself, when nothing else is visible
        mask = guard_empty_rows(allowed)
        bias = self.pair_bias(positions[:, None] - key_positions[None, :], q.dtype)  # [h, t, s] or None
        if bias is not None:
            mask = bias.masked_fill(~mask, float("-inf"))  # [1 or b, h, t, s]
        out = F.scaled_dot_product_attention(
            q, keys, v, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0, scale=self.score_scale
        )
        return AttnOutput(self.to_out(self.merge_heads(out)), state=new_state)
