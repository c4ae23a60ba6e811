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

from zoo.build import attention_class, build_stack, create_position
from zoo.config import ModelConfig
from zoo.models import HEADS, ModelOutput, TokenEmbedding, ZooModel, check_pad_mask


def pool(h: Tensor, pad_mask: Tensor | None, mode: str) -> Tensor:
    """[n, t, d] -> [n, d]: the first position, or the mean over real positions."""
    if mode == "first":
        return h[:, 0]
    if pad_mask is None:
        return h.mean(1)
    weights = pad_mask.to(h.dtype)[..., None]
    return (h * weights).sum(1) / weights.sum(1).clamp_min(1.0)


class TwoTowerClassifier(ZooModel):
    def __init__(self, config: ModelConfig):
        super().__init__(config)
        d = config.d_model
        self.embed = TokenEmbedding(config.vocab_size, d)
        self.position = create_position(config)
        self.drop = nn.Dropout(config.dropout)
        causal = attention_class(config.attention).causal_only
        self.stack = build_stack(config, causal=causal, cross=False, n_layers=config.n_layers)
        self.norm = self.final_norm()
        activation = nn.GELU() if config.activation == "gelu" else nn.ReLU()
        self.interaction = nn.Sequential(
            nn.Linear(4 * d, config.d_ff),
            activation,
            nn.Dropout(config.dropout),
            nn.Linear(config.d_ff, config.n_classes),
        )

    def encode(self, tokens: Tensor, pad_mask: Tensor | None = None) -> tuple[Tensor, Any]:
        """One tower: [n, t] token ids -> (pooled [n, d], the stack's output with aux/stats)."""
        x = self.drop(self.position(self.embed(tokens)))
        out = self.stack(x, pad_mask=pad_mask)
        return pool(self.norm(out.x), pad_mask, self.config.pooling), out

    def forward(
        self, tokens: Tensor, targets: Tensor | None = None, *, pad_mask: Tensor | None = None, state: Any = None
    ) -> ModelOutput:
        if state is not None:
            raise ValueError("the two-tower classifier reads whole documents per call and takes no state")
        if not isinstance(tokens, Tensor) or tokens.dim() != 3 or tokens.shape[1] != 2:
            got = tuple(tokens.shape) if isinstance(tokens, Tensor) else type(tokens).__name__
            raise ValueError(f"a pair classifier takes tokens [b, 2, t] (two documents per row); got {got}")
        check_pad_mask(pad_mask, tokens)
        b = tokens.shape[0]
        # both towers in one pass: the encoder is shared, so the pair is just two batch rows
        flat_mask = rearrange(pad_mask, "b two t -> (b two) t") if pad_mask is not None else None
        pooled, out = self.encode(rearrange(tokens, "b two t -> (b two) t"), flat_mask)
        u, v = rearrange(pooled, "(b two) d -> two b d", two=2)
        logits = self.interaction(torch.cat([u, v, u * v, u - v], dim=-1))
        loss = None
        if targets is not None:
            if targets.shape != (b,):
                raise ValueError(f"pair classifier targets must be [b] = ({b},); got {tuple(targets.shape)}")
            if int(targets.min()) < 0 or int(targets.max()) >= self.config.n_classes:
                raise ValueError(f"pair classifier targets must lie in [0, n_classes={self.config.n_classes})")
            loss = F.cross_entropy(logits.float(), targets.long(), label_smoothing=self.config.label_smoothing)
        return ModelOutput(logits, loss, out.aux, None, out.stats)


HEADS["pair_classifier"] = TwoTowerClassifier
