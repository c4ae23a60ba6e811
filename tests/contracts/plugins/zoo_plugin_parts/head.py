"""A researcher's own head: a token tagger (``kind="plugin_head"``), one of ``n_classes`` labels per
token from a bidirectional encoder. Registered in ``zoo.models.HEAD`` when imported."""

from __future__ import annotations

from torch import Tensor, nn

from zoo.config import ModelConfig
from zoo.models.base import HEAD, ModelOutput, TokenEmbedding, ZooModel
from zoo.models.losses import token_loss
from zoo.stacks.build import build_stack, create_position


@HEAD.register("plugin_head")
class TokenTagger(ZooModel):
    def __init__(self, config: ModelConfig):
        super().__init__(config)
        self.embed = TokenEmbedding(config.vocab_size, config.d_model)
        self.position = create_position(config)
        self.stack = build_stack(config, causal=False, cross=False, n_layers=config.n_layers)
        self.norm = self.final_norm()
        self.head = nn.Linear(config.d_model, config.n_classes)

    def forward(self, tokens: Tensor, targets: Tensor | None = None, *, pad_mask=None, state=None) -> ModelOutput:
        out = self.stack(self.position(self.embed(tokens)), pad_mask=pad_mask)
        hidden = self.norm(out.x)
        logits = self.head(hidden)  # [b, t, n_classes]
        loss = None
        if targets is not None:
            loss, _ = token_loss(logits, targets, pad_mask, self.config.label_smoothing)
        return ModelOutput(logits, loss, out.aux, None, out.stats, hidden)
