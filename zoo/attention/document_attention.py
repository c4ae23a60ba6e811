"""Dense self-attention over packed documents: what ``vanilla`` runs when a call carries ``documents``.

Not a mechanism (nothing registers here): a mixin for a dense layer with ``vanilla``'s projections, options
(``softcap``, ``backend``) and ``_self_keys``. Each query sees only keys of its own document
(zoo/attention/documents.py), on each of the layer's paths:

- SDPA a block of ``DOCUMENT_BLOCK`` queries at a time over the keys their documents span (``document_spans``:
  short documents cost about t x (block + a document's length) scores, not t x t), the document test ANDed with
  causality and key padding, a pair bias (ALiBi, T5) added to the mask;
- Gemma 2's soft-capped scores (``softcap``), the test joined to each block's mask;
- FlexAttention (``backend=flex``): the test inside the BlockMask's ``mask_mod``, so blocks between documents
  are skipped.

Positions stay the row's: rope and the pair biases depend on i - j only, which is the same inside a document
wherever it starts. A packed row is a fresh stream: no cache is read or made.

Shapes: x [b, t, d]; documents, pad_mask [b, t]; q, k, v [b, h, t, k].
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from zoo.attention.base import AttnOutput
from zoo.attention.documents import check_documents, document_spans
from zoo.attention.flex import flex_attend, use_flex
from zoo.attention.masks import guard_empty_rows
from zoo.attention.projections import softcapped_attention

DOCUMENT_BLOCK = 256  # queries per block over packed documents: each block reads only the keys its documents span


class DocumentAttention:
    """``attend_documents`` for a dense self-attention layer (mixed into ``VanillaAttention``)."""

    def attend_documents(self, x: Tensor, pad_mask: Tensor | None, documents: Tensor) -> AttnOutput:
        """x [b, t, d] in packed rows (``documents`` long [b, t]) -> each query attending within its document."""
        check_documents(documents, x, self.registry_name, in_order=False)  # the model checked the order
        q, k, v, key_pad, _, q_pos, k_pos = self._self_keys(self.split_heads(self.to_q(x)), x, pad_mask, None)
        k, v = self.expand_kv(k, v)
        dropout = self.dropout if self.training else 0.0

        def allowed(q0: int, q1: int, k0: int, k1: int) -> Tensor:  # [b, 1, q1 - q0, k1 - k0]
            mask = (documents[:, q0:q1, None] == documents[:, None, k0:k1])[:, None]
            if self.causal:
                mask = mask & (k_pos[None, k0:k1] <= q_pos[q0:q1, None])
            return mask if key_pad is None else mask & key_pad[:, None, None, k0:k1]

        def bias(q0: int, q1: int, k0: int, k1: int) -> Tensor | None:  # [h, q1 - q0, k1 - k0]
            return self.pair_bias(q_pos[q0:q1, None] - k_pos[None, k0:k1], q.dtype)

        t = x.shape[1]
        if self.options.softcap:
            out = softcapped_attention(
                q,
                k,
                v,
                cap=self.options.softcap,
                allowed=lambda start, stop: allowed(start, stop, 0, t),
                bias=lambda start, stop: bias(start, stop, 0, t),
                dropout=dropout,
            )
        elif use_flex(self.options.backend, x.device, self.registry_name, dropout):
            rule = (lambda h, i, j: j <= i) if self.causal else (lambda h, i, j: j >= 0)
            positions = torch.arange(t, device=x.device)
            out = flex_attend(
                q,
                k,
                v,
                rule,
                query_positions=positions,
                key_positions=positions,
                valid=key_pad,
                heads_differ=False,
                cache_key=(self.registry_name, self.causal, "documents"),
                bias=self.flex_bias(q_pos, k_pos, q.dtype),
                documents=documents,
            )
        else:  # a block of queries at a time, over the keys its documents span
            outs = []
            for q0, q1, k0, k1 in document_spans(documents, DOCUMENT_BLOCK, self.causal):
                mask = guard_empty_rows(allowed(q0, q1, k0, k1))
                scores_bias = bias(q0, q1, k0, k1)
                if scores_bias is not None:
                    mask = scores_bias[None].masked_fill(~mask, float("-inf"))
                queries, keys, values = q[:, :, q0:q1], k[:, :, k0:k1], v[:, :, k0:k1]
                outs.append(F.scaled_dot_product_attention(queries, keys, values, attn_mask=mask, dropout_p=dropout))
            out = torch.cat(outs, dim=2)
        return AttnOutput(self.to_out(self.merge_heads(out)))
