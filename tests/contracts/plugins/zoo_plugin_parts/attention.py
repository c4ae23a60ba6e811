"""A researcher's own attention: softmax attention with a learned temperature per head.

Registered as ``plugin_attention`` when imported. It answers none of the knowledge questions
(``keys_per_query``, ``forward_flops``), so describe and the benchmark report it as unknown.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from zoo.attention.base import ATTENTION, Attention, AttnOutput, causal_allowed, guard_empty_rows


@ATTENTION.register("plugin_attention")
class TemperatureAttention(Attention):
    def __init__(self, d_model: int, n_heads: int, **kwargs):
        super().__init__(d_model, n_heads, **kwargs)
        self.add_projections()
        self.log_temperature = nn.Parameter(torch.zeros(n_heads, 1, 1))  # [h, 1, 1]

    def forward(self, x: Tensor, *, context=None, pad_mask=None, state=None) -> AttnOutput:
        self.check_inputs(x, context, pad_mask, state)
        q, k, v = (self.split_heads(proj(x)) for proj in (self.to_q, self.to_k, self.to_v))  # [b, h, t, k]
        t = x.shape[1]
        allowed = causal_allowed(t, t, x.device)[None, None] if self.causal else None
        if pad_mask is not None:
            keys = pad_mask[:, None, None, :]
            allowed = keys if allowed is None else allowed & keys
        if allowed is not None:
            allowed = guard_empty_rows(allowed)
        q = q * self.log_temperature.exp()
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=allowed, dropout_p=self.dropout if self.training else 0.0
        )
        return AttnOutput(self.to_out(self.merge_heads(out)))
