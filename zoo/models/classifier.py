"""The sequence classifier (``kind="classifier"``): bidirectional encoder + mean or first-token
pooling + a linear layer, for LRA-style tasks.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from zoo.config import ModelConfig
from zoo.models.base import HEAD, ModelOutput, TokenEmbedding, ZooModel
from zoo.models.inputs import (
    check_pad_mask,
    check_targets,
)
from zoo.stacks.build import build_stack, create_position


@HEAD.register("classifier")
class SequenceClassifier(ZooModel):
    def __init__(self, config: ModelConfig):
        super().__init__(config)
        self.embed = TokenEmbedding(config.vocab_size, config.d_model)
        self.position = create_position(config)
        self.drop = nn.Dropout(config.dropout)
        self.stack = build_stack(config, causal=False, cross=False, n_layers=config.n_layers, position=self.position)
        self.norm = self.final_norm()
        self.head = nn.Linear(config.d_model, config.n_classes) if config.head == "linear" else None

    def output_flops(self, t: int) -> tuple[float, str]:
        if self.head is None:
            return 0.0, "no output head"
        return 2.0 * self.head.weight.numel(), "classifier on the pooled vector"

    def forward(
        self,
        tokens: Tensor | None = None,
        targets: Tensor | None = None,
        *,
        embeds: Tensor | None = None,
        pad_mask: Tensor | None = None,
        state: Any = None,
    ) -> ModelOutput:
        """tokens [b, t] ids, or embeds [b, t, d_model] vectors (exactly one); targets [b] classes."""
        if state is not None:
            raise ValueError("the classifier reads a whole sequence per call and takes no state")
        self.refuse_without_head(targets)
        x = self.input_vectors(self.embed, tokens, embeds)
        check_pad_mask(pad_mask, x[..., 0])
        out = self.stack(self.drop(self.position(x)), pad_mask=pad_mask)
        h = self.norm(out.x)  # [b, t, d]
        if self.config.pooling == "first":
            pooled = h[:, 0]
        elif pad_mask is None:
            pooled = h.mean(1)
        else:
            weights = pad_mask.to(h.dtype)[..., None]
            pooled = (h * weights).sum(1) / weights.sum(1).clamp_min(1.0)
        logits = self.output_head(pooled)
        loss, stats = None, out.stats
        if targets is not None:
            n_classes = self.config.n_classes
            check_targets(targets, (x.shape[0],), n_classes, "classifier targets", what="n_classes", ignore=False)
            loss = F.cross_entropy(logits.float(), targets.long(), label_smoothing=self.config.label_smoothing)
            stats = {**stats, "scored": torch.tensor(targets.numel(), device=logits.device)}
        return ModelOutput(logits, loss, out.aux, None, stats, h)
