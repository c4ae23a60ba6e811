"""Presets for the Long Range Arena (Tay et al. 2020, arXiv:2011.04006) that need their own head.

``two_tower_classifier``: the Retrieval (AAN) dual encoder, sized as LRA's released matching
configuration (4 layers, 4 heads, d = 128, MLP 512); swap the mechanism with ``attention=``.
"""

from __future__ import annotations

from typing import Any

from zoo.presets.factory import register_preset


@register_preset(
    "two_tower_classifier",
    "Two-tower (shared encoder) pair classifier of LRA Retrieval: [u, v, u*v, u-v] -> MLP",
    paper="Tay et al. 2021, Long Range Arena: A Benchmark for Efficient Transformers, arXiv:2011.04006",
)
def _two_tower_classifier() -> dict[str, Any]:
    return dict(
        kind="pair_classifier",
        n_layers=4,
        n_heads=4,
        d_model=128,
        d_ff=512,
        dropout=0.1,
        pooling="mean",
        residual={"name": "pre_norm"},
    )
