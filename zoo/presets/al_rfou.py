"""The deep character Transformer of Al-Rfou et al. 2018 (arXiv:1808.04444): T64, with its auxiliary losses."""

from __future__ import annotations

from typing import Any

from zoo.models.al_rfou_losses import PAPER_MULTI_TARGET_WEIGHT
from zoo.presets.factory import register_preset


@register_preset(
    "al_rfou_lm",
    "Al-Rfou et al. 2018 T64 character LM: 64 layers, d 512, d_ff 2048, context 512, intermediate-layer and "
    "multiple-target losses on",
    tiny=dict(n_layers=4, max_len=64),
    paper="Al-Rfou et al. 2018, Character-Level Language Modeling with Deeper Self-Attention, arXiv:1808.04444",
)
def _al_rfou_lm() -> dict[str, Any]:
    # Section 3: hidden 512, filter 2048, 512-character context, dropout 0.55, learned positions at every layer
    return dict(
        kind="lm",
        n_layers=64,
        d_model=512,
        n_heads=8,
        d_ff=2048,
        dropout=0.55,
        max_len=512,
        position={"name": "learned", "every_layer": True},
        aux_losses={"intermediate": True, "multi_target": PAPER_MULTI_TARGET_WEIGHT, "layer_heads": True},
    )
