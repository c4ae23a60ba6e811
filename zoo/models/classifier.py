"""The sequence classifier (``kind="classifier"``): bidirectional encoder + mean or first-token
pooling + a linear layer (``head="linear"``) or a two-layer MLP (``head="mlp"``), for LRA-style tasks.

``head="mlp"`` is the head of the PyTorch LRA re-implementations (mlpen/Nystromformer
``LRA/code/model_wrapper.py``, ``SCHead``): Linear(d_model, d_ff) -> ReLU -> Linear(d_ff, n_classes),
no dropout. Their pooling is ``pooling="padded_mean"``: they zero the padded positions' outputs and
average over the whole padded length, so the pooled vector shrinks with the padding (and tells the
head the sequence's length); ``pooling="mean"`` averages over the real tokens.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from zoo.attention.documents import segment_ids
from zoo.config import ModelConfig
from zoo.models.base import HEAD, ModelOutput, TokenEmbedding, ZooModel
from zoo.models.inputs import (
    check_pad_mask,
    check_targets,
)
from zoo.stacks.build import build_stack, create_position


def classifier_head(config: ModelConfig, d_in: int) -> nn.Module | None:
    """The output head on a pooled vector of ``d_in`` features: linear, mlp, or None (head="none")."""
    if config.head == "none":
        return None
    if config.head == "mlp":
        return nn.Sequential(nn.Linear(d_in, config.d_ff), nn.ReLU(), nn.Linear(config.d_ff, config.n_classes))
    return nn.Linear(d_in, config.n_classes)


def pool(h: Tensor, pad_mask: Tensor | None, mode: str, length: int = 0) -> Tensor:
    """[n, t, d] -> [n, d]: the first position (``first``), the mean over the real positions (``mean``),
    or the padded outputs zeroed and the sum divided by the padded length, real or not (``padded_mean``):
    ``length`` where given (the length the input would be padded to, >= t), else t. With a key-masking
    attention, ``length`` L on t positions gives what the input padded to L gives: the L - t padded
    outputs are zeroed before the sum."""
    if mode == "first":
        return h[:, 0]
    if mode == "padded_mean" and length:
        if length < h.shape[1]:
            raise ValueError(f"pool_length={length} is shorter than the input ({h.shape[1]} positions)")
        kept = h if pad_mask is None else h * pad_mask.to(h.dtype)[..., None]
        return kept.sum(1) / length
    if pad_mask is None:
        return h.mean(1)
    weights = pad_mask.to(h.dtype)[..., None]
    if mode == "padded_mean":
        return (h * weights).mean(1)
    return (h * weights).sum(1) / weights.sum(1).clamp_min(1.0)


def pool_documents(h: Tensor, pad_mask: Tensor | None, documents: Tensor, mode: str, length: int = 0) -> Tensor:
    """``pool`` per packed document: h [b, t, d] -> [n, d], one vector per document that holds a real position,
    in row-major order. ``first``: its first position; ``mean``: the mean over its positions; ``padded_mean``:
    the sum over its positions divided by ``length`` where given (the length one document would be padded to)."""
    real = torch.ones_like(documents, dtype=torch.bool) if pad_mask is None else pad_mask
    key = segment_ids(documents) + torch.arange(h.shape[0], device=h.device)[:, None] * h.shape[1]
    _, index = torch.unique(key[real], return_inverse=True)  # 0 ... n - 1, row-major (the keys are sorted)
    n = int(index.max()) + 1 if index.numel() else 0
    vectors = h[real]  # [r, d]: the real positions, row-major
    if mode == "first":
        first = torch.full((n,), vectors.shape[0], dtype=torch.long, device=h.device)
        first = first.scatter_reduce(0, index, torch.arange(index.numel(), device=h.device), "amin")
        return vectors[first]
    sums = vectors.new_zeros(n, h.shape[-1]).index_add(0, index, vectors)
    if mode == "padded_mean" and length:
        return sums / length
    counts = torch.zeros(n, dtype=h.dtype, device=h.device).index_add(0, index, torch.ones_like(index, dtype=h.dtype))
    return sums / counts[:, None]


@HEAD.register("classifier")
class SequenceClassifier(ZooModel):
    attention_directions = ("bidirectional",)
    packs_documents = True  # documents=: one class per packed document, pooled over its own positions
    output_heads = ("linear", "mlp", "none")  # head="mlp": the PyTorch LRA code's classifier MLP

    def __init__(self, config: ModelConfig):
        super().__init__(config)
        self.embed = TokenEmbedding(config.vocab_size, config.d_model, init_std=config.token_init_std)
        self.position = create_position(config)
        self.drop = nn.Dropout(config.dropout)
        self.stack = build_stack(config, causal=False, cross=False, n_layers=config.n_layers, position=self.position)
        self.norm = self.final_norm()
        self.head = classifier_head(config, config.d_model)

    def training_batch(self, tokens: Tensor) -> dict[str, Tensor]:
        """[b, t + 1] random ids -> t tokens and one class per row (the last id, modulo n_classes)."""
        return {"tokens": tokens[:, :-1].contiguous(), "targets": tokens[:, -1] % self.config.n_classes}

    def output_flops(self, t: int) -> tuple[float, str]:
        if self.head is None:
            return 0.0, "no output head"
        weights = sum(p.numel() for name, p in self.head.named_parameters() if name.endswith("weight"))
        return 2.0 * weights, "classifier on the pooled vector"

    def forward(
        self,
        tokens: Tensor | None = None,
        targets: Tensor | None = None,
        *,
        embeds: Tensor | None = None,
        pad_mask: Tensor | None = None,
        state: Any = None,
        documents: Tensor | None = None,
    ) -> ModelOutput:
        """tokens [b, t] ids, or embeds [b, t, d_model] vectors (exactly one); targets [b] classes. ``documents``
        long [b, t]: packed rows (zoo/attention/documents.py): logits and targets are then one per document
        [n, C] / [n], documents in row-major order (row 0's in order, then row 1's, ...)."""
        if state is not None:
            raise ValueError("the classifier reads a whole sequence per call and takes no state")
        self.refuse_without_head(targets)
        x = self.input_vectors(self.embed, tokens, embeds)
        check_pad_mask(pad_mask, x[..., 0])
        if documents is None:
            out = self.stack(self.drop(self.position(x)), pad_mask=pad_mask)
            h = self.norm(out.x)  # [b, t, d]
            pooled = pool(h, pad_mask, self.config.pooling, self.config.pool_length)
        else:
            positions = self.packed_positions(documents, x, state)
            out = self.stack(self.drop(self.position(x, positions)), pad_mask=pad_mask, documents=documents)
            h = self.norm(out.x)
            pooled = pool_documents(h, pad_mask, documents, self.config.pooling, self.config.pool_length)
        logits = self.output_head(pooled)
        loss, stats = None, out.stats
        if targets is not None:
            n_classes = self.config.n_classes
            rows = pooled.shape[0]
            check_targets(targets, (rows,), n_classes, "classifier targets", what="n_classes", ignore=False)
            loss = F.cross_entropy(logits.float(), targets.long(), label_smoothing=self.config.label_smoothing)
            stats = {**stats, "scored": torch.tensor(targets.numel(), device=logits.device)}
        return ModelOutput(logits, loss, out.aux, None, stats, h)
