"""The two-tower (dual encoder) classifier of the Long Range Arena "Retrieval" task.

Tay et al. 2020 ("Long Range Arena", arXiv:2011.04006, Section 2.2.3): both documents go through
one shared Transformer encoder; their pooled vectors ``u`` and ``v`` are combined as
``[u, v, u * v, u - v]`` and a two-layer MLP classifies the pair. Pooling is the config's
(``mean`` over real tokens, or the ``first`` token); LRA pools a prepended CLS token, which
``first`` approximates without adding one.

Called as ``model(tokens, targets=None, *, pad_mask=None)`` with ``tokens`` [b, 2, t] (the two
documents of each pair), ``pad_mask`` [b, 2, t] bool (True = real token), ``targets`` [b];
returns logits [b, n_classes]. Registered as the ``pair_classifier`` head.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from zoo.config import ModelConfig
from zoo.models.base import HEAD, ModelOutput, TokenEmbedding, ZooModel
from zoo.models.classifier import classifier_head, pool
from zoo.models.inputs import check_pad_mask
from zoo.stacks.build import attention_class, build_stack, create_position


@HEAD.register("pair_classifier")
class TwoTowerClassifier(ZooModel):
    output_heads = ("linear", "mlp", "none")  # head="mlp": the PyTorch LRA code's classifier MLP

    def __init__(self, config: ModelConfig):
        super().__init__(config)
        d = config.d_model
        self.embed = TokenEmbedding(config.vocab_size, d, init_std=config.token_init_std)
        self.position = create_position(config)
        self.drop = nn.Dropout(config.dropout)
        parts = config.attention if isinstance(config.attention, list) else [config.attention]
        causal = any(attention_class(part).causal_only for part in parts)
        self.stack = build_stack(config, causal=causal, cross=False, n_layers=config.n_layers, position=self.position)
        self.norm = self.final_norm()
        activation = nn.GELU() if config.activation == "gelu" else nn.ReLU()
        # the interaction MLP is this model's head: head="none" drops it (out.hidden only); head="mlp" is the
        # PyTorch LRA code's (SCHeadDual: ReLU, no dropout), head="linear" ours (the configured activation, dropout)
        self.head = (
            classifier_head(config, 4 * d)
            if config.head in ("none", "mlp")
            else nn.Sequential(
                nn.Linear(4 * d, config.d_ff),
                activation,
                nn.Dropout(config.dropout),
                nn.Linear(config.d_ff, config.n_classes),
            )
        )

    def encode(
        self, tokens: Tensor | None, pad_mask: Tensor | None = None, embeds: Tensor | None = None
    ) -> tuple[Tensor, Any]:
        """One tower: [n, t] token ids (or [n, t, d] vectors) -> (normed hidden [n, t, d], stack output)."""
        x = self.drop(self.position(self.input_vectors(self.embed, tokens, embeds)))
        out = self.stack(x, pad_mask=pad_mask)
        return self.norm(out.x), out

    def forward(
        self,
        tokens: Tensor | None = None,
        targets: Tensor | None = None,
        *,
        embeds: Tensor | None = None,
        pad_mask: Tensor | None = None,
        state: Any = None,
    ) -> ModelOutput:
        """tokens [b, 2, t] (or embeds [b, 2, t, d]); logits [b, n_classes]; hidden [b, 2, t, d]."""
        if state is not None:
            raise ValueError("the two-tower classifier reads whole documents per call and takes no state")
        self.refuse_without_head(targets)
        pair = tokens if tokens is not None else embeds
        if not isinstance(pair, Tensor) or pair.dim() != (3 if tokens is not None else 4) or pair.shape[1] != 2:
            got = tuple(pair.shape) if isinstance(pair, Tensor) else type(pair).__name__
            raise ValueError(
                f"a pair classifier takes tokens [b, 2, t] or embeds [b, 2, t, d] (two documents per row); got {got}"
            )
        b = pair.shape[0]
        check_pad_mask(pad_mask, pair[..., 0] if embeds is not None else pair)
        # both towers in one pass: the encoder is shared, so the pair is just two batch rows
        flat_mask = rearrange(pad_mask, "b two t -> (b two) t") if pad_mask is not None else None
        flat_tokens = rearrange(tokens, "b two t -> (b two) t") if tokens is not None else None
        flat_embeds = rearrange(embeds, "b two t d -> (b two) t d") if embeds is not None else None
        hidden, out = self.encode(flat_tokens, flat_mask, flat_embeds)
        pooled = pool(hidden, flat_mask, self.config.pooling, self.config.pool_length)
        u, v = rearrange(pooled, "(b two) d -> two b d", two=2)
        logits = self.output_head(torch.cat([u, v, u * v, u - v], dim=-1))
        loss = None
        if targets is not None:
            if targets.shape != (b,):
                raise ValueError(f"pair classifier targets must be [b] = ({b},); got {tuple(targets.shape)}")
            if int(targets.min()) < 0 or int(targets.max()) >= self.config.n_classes:
                raise ValueError(f"pair classifier targets must lie in [0, n_classes={self.config.n_classes})")
            loss = F.cross_entropy(logits.float(), targets.long(), label_smoothing=self.config.label_smoothing)
        return ModelOutput(logits, loss, out.aux, None, out.stats, rearrange(hidden, "(b two) t d -> b two t d", two=2))
