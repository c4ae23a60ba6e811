"""Classifier presets whose mechanism pairs with the head: the global first token is what gets pooled.

- ``longformer_classifier``: Longformer (Beltagy et al. 2020, arXiv:2004.05150) classifies from the
  global [CLS] token (Section 6); here the first position is global (``global_tokens`` = 1) and pooled
  (``pooling=first``), window 256 per layer.
- ``bigbird_classifier``: BigBird (Zaheer et al. 2020, arXiv:2007.14062) ITC with 64-token blocks, 3
  random blocks; its first block is global, so the first token (pooled) sees every key.

Both are sized as LRA's released Text configuration (4 layers, d = 256, 4 heads, MLP 1,024, sequences up
to 4K); the other LRA mechanisms swap into ``vanilla_classifier`` with ``attention=<name>``: their
options need nothing from the head.
"""

from __future__ import annotations

from typing import Any

from zoo.presets.factory import register_preset

LRA_TEXT = dict(
    kind="classifier",
    n_layers=4,
    d_model=256,
    n_heads=4,
    d_ff=1024,
    max_len=4096,
    dropout=0.1,
    pooling="first",
    residual={"name": "pre_norm"},
)


@register_preset(
    "longformer_classifier",
    "Longformer encoder (window 256, the first token global) pooling that token, LRA Text size (Beltagy et al. 2020)",
    tiny=dict(attention={"window": 4}, max_len=64),
    paper="Beltagy et al. 2020, Longformer: The Long-Document Transformer, arXiv:2004.05150",
)
def _longformer_classifier() -> dict[str, Any]:
    return dict(LRA_TEXT, attention={"name": "longformer", "window": 256, "global_tokens": 1})


@register_preset(
    "bigbird_classifier",
    "BigBird ITC encoder (blocks of 64, 3 random) pooling the first token of its global block, LRA Text size "
    "(Zaheer et al. 2020)",
    tiny=dict(attention={"block": 4, "random_blocks": 1}, max_len=64),
    paper="Zaheer et al. 2020, Big Bird: Transformers for Longer Sequences, arXiv:2007.14062",
)
def _bigbird_classifier() -> dict[str, Any]:
    return dict(LRA_TEXT, attention={"name": "bigbird", "block": 64, "random_blocks": 3})
