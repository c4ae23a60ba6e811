"""Adaptive-span language model (Sukhbaatar et al. 2019, arXiv:1905.07799), the paper's small model.

12 layers, d_model 512, FFN 2048, 8 heads, dropout 0.3, post-norm blocks as in the authors' code;
every head learns its span up to S = 8192 with ramp R = 32 and L1 coefficient 0.5e-6 (the paper's
value at S = 8192; 2e-6 at smaller S). Train it on consecutive segments (512 tokens in the paper)
carrying ``out.state`` so the span cache holds the previous segments. Positions: the paper's
learned relative key embeddings (``relative_keys``), one table shared by every layer as in the
authors' code (``share_relative_keys``), and no absolute signal. The preset used
absolute sinusoids before; with them the model never found a copy 200 characters back that the
authors' code learns in a few hundred steps (results/adaptive_span_range).
``attention={"mode": "dynamic"}`` gives the dynamic-span variant, ``{"mode": "fixed"}`` the
fixed-span baseline of the same maximum.
"""

from __future__ import annotations

from typing import Any

from zoo.presets.factory import register_preset


@register_preset(
    "adaptive_span_lm",
    "Causal LM with learned per-head attention spans (Sukhbaatar et al. 2019), small model, S = 8192",
    tiny={"attention": {"max_span": 16, "ramp": 4, "block_size": 8}, "dropout": 0.0},
    paper="Sukhbaatar et al. 2019, Adaptive Attention Span in Transformers, arXiv:1905.07799",
)
def _adaptive_span_lm() -> dict[str, Any]:
    return dict(
        kind="lm",
        n_layers=12,
        d_model=512,
        d_ff=2048,
        n_heads=8,
        dropout=0.3,
        position={"name": "none"},
        attention={
            "name": "adaptive_span",
            "max_span": 8192,
            "ramp": 32,
            "l1": 0.5e-6,
            "mode": "learned",
            "relative_keys": True,
            "share_relative_keys": True,  # one table for all layers, as the authors' key_pe
        },
    )
