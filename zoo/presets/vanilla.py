"""Presets of the original Transformer (Vaswani et al. 2017, arXiv:1706.03762): base size by default."""

from __future__ import annotations

from typing import Any

from zoo.presets.factory import register_preset

BASE = dict(n_layers=6, d_model=512, d_ff=2048, n_heads=8, dropout=0.1)  # Vaswani et al. 2017, base
VASWANI = "Vaswani et al. 2017, Attention Is All You Need, arXiv:1706.03762"


@register_preset("vanilla_lm", "Decoder-only Transformer LM, base size (Vaswani et al. 2017)", paper=VASWANI)
def _vanilla_lm() -> dict[str, Any]:
    return dict(BASE, kind="lm")


@register_preset("vanilla_classifier", "Transformer encoder + mean pooling classifier, base size", paper=VASWANI)
def _vanilla_classifier() -> dict[str, Any]:
    return dict(BASE, kind="classifier")


@register_preset(
    "vanilla_seq2seq",
    "The original encoder-decoder Transformer, base size, three-way tied embeddings",
    paper=VASWANI,
)
def _vanilla_seq2seq() -> dict[str, Any]:
    return dict(BASE, kind="seq2seq", label_smoothing=0.1)
