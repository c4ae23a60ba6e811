"""Multi-head scaled dot-product attention.

Paper: "Attention Is All You Need", Vaswani et al. 2017, arXiv:1706.03762, Section 3.2.

Computed through ``torch.nn.functional.scaled_dot_product_attention`` so the fused CPU/GPU kernels
run. The mask passed to it is the cheapest one that expresses the pattern (measured in DESIGN.md):
``is_causal=True`` when there is no padding and no cache offset, a broadcast key-padding mask
[b, 1, 1, s] when there is padding but no causality, and a full [b, 1, t, s] mask only when causality
and padding (or a cache offset) must be combined.

Deviations: none in the maths. The KV cache (``state``) is ours: incremental decoding keeps the
projected keys/values of earlier tokens (detached) so each new token costs O(s), not O(s^2).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from zoo.attention.base import (
    ATTENTION,
    Attention,
    AttnOutput,
    KeysPerQuery,
    StateContract,
    causal_allowed,
    dense_keys,
    guard_empty_rows,
    join_key_padding,
)
from zoo.config import require


@dataclass
class KVCache:
    """Keys/values of the tokens seen so far. k, v: [b, h, m, k]; pad_mask: [b, m] or None.

    ``static`` marks a cross-attention cache (keys/values of the encoder output, computed once)."""

    k: Tensor | None = None
    v: Tensor | None = None
    pad_mask: Tensor | None = None
    static: bool = False

    @property
    def length(self) -> int:
        return 0 if self.k is None else self.k.shape[2]


@ATTENTION.register("vanilla")
class VanillaAttention(Attention):
    supports_memory = True  # KV cache for incremental decoding
    supports_cross = True
    memory_option = "max_cache"
    lra_row = "Transformer"

    @dataclass
    class Options:
        bias: bool = True  # bias in the q/k/v/output projections
        max_cache: int = 0  # keep at most this many cached tokens (0 = unbounded)

        def __post_init__(self) -> None:
            require(self.max_cache >= 0, f"max_cache must be >= 0 (0 = unbounded), got {self.max_cache}")

    @classmethod
    def contract_options(cls) -> dict:
        return {"max_cache": 40}  # a bounded cache, so the contract sees it stop growing

    @classmethod
    def contract_state(cls) -> StateContract:
        return StateContract(bound=40, exact_for=40)  # exact while the cache still holds every token

    def __init__(self, d_model: int, n_heads: int, **kwargs):
        super().__init__(d_model, n_heads, **kwargs)
        self.add_projections(bias=self.options.bias)

    def init_state(self, batch_size: int) -> KVCache:
        return KVCache()

    def carries_segment_memory(self) -> bool:
        return self.options.max_cache > 0  # an unbounded KV cache is for decoding, not carried in training

    def memory_keys(self) -> int:
        return self.options.max_cache if self.carries_segment_memory() else 0

    def keys_per_query(self, t: int) -> KeysPerQuery:
        return dense_keys(t, self.causal, self.memory_keys())

    def forward(
        self, x: Tensor, *, context: Tensor | None = None, pad_mask: Tensor | None = None, state: KVCache | None = None
    ) -> AttnOutput:
        self.check_inputs(x, context, pad_mask, state)
        q = self.split_heads(self.to_q(x))  # [b, h, t, k]
        if context is not None:
            k, v, key_pad, new_state = self._cross_keys(context, pad_mask, state)
            causal = False
        else:
            k, v, key_pad, new_state = self._self_keys(x, pad_mask, state)
            causal = self.causal
        t, s = q.shape[2], k.shape[2]
        mask, is_causal = _sdpa_mask(t, s, causal, key_pad, x.device)
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=is_causal, dropout_p=self.dropout if self.training else 0.0
        )
        return AttnOutput(self.to_out(self.merge_heads(out)), state=new_state)

    def _self_keys(self, x: Tensor, pad_mask: Tensor | None, state: KVCache | None):
        k, v = self.split_heads(self.to_k(x)), self.split_heads(self.to_v(x))
        if state is None:
            return k, v, pad_mask, None
        require(not state.static, "vanilla: a cross-attention cache was passed to self-attention")
        if state.k is not None:
            if state.k.shape[0] != x.shape[0]:
                raise ValueError(f"vanilla: KV cache holds batch size {state.k.shape[0]}, input has {x.shape[0]}")
            pad_mask = join_key_padding(state.pad_mask, state.length, pad_mask, x)
            k, v = torch.cat([state.k, k], dim=2), torch.cat([state.v, v], dim=2)
        keep = self.options.max_cache
        cache = KVCache(k.detach(), v.detach(), None if pad_mask is None else pad_mask)
        if keep and cache.length > keep:
            cache = KVCache(
                cache.k[:, :, -keep:], cache.v[:, :, -keep:], None if pad_mask is None else pad_mask[:, -keep:]
            )
        return k, v, pad_mask, cache

    def _cross_keys(self, context: Tensor, pad_mask: Tensor | None, state: KVCache | None):
        if state is not None and state.k is not None:  # encoder keys/values computed once per sequence
            return state.k, state.v, state.pad_mask, state
        k, v = self.split_heads(self.to_k(context)), self.split_heads(self.to_v(context))
        new_state = None if state is None else KVCache(k.detach(), v.detach(), pad_mask, static=True)
        return k, v, pad_mask, new_state


def _sdpa_mask(
    t: int, s: int, causal: bool, key_pad: Tensor | None, device: torch.device
) -> tuple[Tensor | None, bool]:
    """The cheapest SDPA mask for (causality, key padding, cache offset s - t).

    Returns (attn_mask, is_causal). attn_mask is bool, True = may attend, broadcastable to
    [b, h, t, s]."""
    if not causal:
        if key_pad is None:
            return None, False
        return guard_empty_rows(key_pad[:, None, None, :]), False
    if key_pad is None:
        if s == t:
            return None, True  # fused causal kernel, no mask tensor at all
        if t == 1:
            return None, False  # one new token after a cache sees every cached key
        return causal_allowed(t, s, device), False
    allowed = causal_allowed(t, s, device)[None, None] & key_pad[:, None, None, :]
    return guard_empty_rows(allowed), False
