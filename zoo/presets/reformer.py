"""Reformer presets (Kitaev et al. 2020, "Reformer: The Efficient Transformer", arXiv:2001.04451).

``reformer`` combines the paper's three savers: LSH attention (zoo/attention/lsh.py), the
reversible stack (zoo/stacks/reversible.py) and the chunked feed-forward. ``reformer_full`` is its
ablation with full shared-QK attention in the same reversible, chunked skeleton (the paper's
"full attention" baseline). Both use pre-norm residuals: the reversible coupling needs additive
ones. Deviation: sinusoidal positions instead of the paper's axial position embeddings.
"""

from __future__ import annotations

from typing import Any

from zoo.presets.factory import register_preset

LSH = {"name": "lsh", "n_hashes": 4, "chunk_size": 64, "n_buckets": 0}  # n_buckets 0: ~one chunk per bucket
COMMON = dict(
    kind="lm",
    n_layers=6,
    d_model=512,
    d_ff=2048,
    n_heads=8,
    dropout=0.1,
    ff_chunk_size=256,
    max_len=65536,
    residual={"name": "pre_norm"},
    stack={"name": "reversible"},
)
TINY = dict(attention={"chunk_size": 8}, ff_chunk_size=8)


@register_preset(
    "reformer",
    "Reformer LM: LSH attention (4 hashes, chunk 64) + reversible stack + chunked feed-forward (Kitaev et al. 2020)",
    tiny=TINY,
    example_length=24,
)
def _reformer() -> dict[str, Any]:
    return dict(COMMON, attention=dict(LSH))


@register_preset(
    "reformer_full",
    "Reformer ablation: full shared-QK attention inside the reversible, chunked-feed-forward stack",
    tiny=dict(ff_chunk_size=8),
    example_length=24,
)
def _reformer_full() -> dict[str, Any]:
    return dict(COMMON, attention={"name": "shared_qk"})
