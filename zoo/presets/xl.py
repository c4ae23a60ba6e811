"""The recurrence family: Transformer-XL (Dai et al. 2019, arXiv:1901.02860) and its gated,
reordered descendants from GTrXL (Parisotto et al. 2019, arXiv:1910.06764).

All three share the size of Transformer-XL's 12-layer enwik8 model (d 512, 8 heads, FFN 2,048,
segment = memory = 512) and ``xl_rel`` attention with no absolute position signal; they differ
only in the residual, so ``transformer_xl`` / ``trxl_i`` / ``gtrxl`` is the paper's ablation:

- ``transformer_xl``: post-norm, as the reference Transformer-XL;
- ``trxl_i``: identity-map reordering (LayerNorm on the sub-layer input, ReLU on its output);
- ``gtrxl``: the reordering plus the GRU-type gate (b_g = 2) in place of each residual add.
"""

from __future__ import annotations

from typing import Any

from zoo.presets.factory import register_preset

DAI = "Dai et al. 2019, Transformer-XL: Attentive Language Models Beyond a Fixed-Length Context, arXiv:1901.02860"
PARISOTTO = "Parisotto et al. 2019, Stabilizing Transformers for Reinforcement Learning, arXiv:1910.06764"

XL_BASE = dict(
    kind="lm",
    n_layers=12,
    d_model=512,
    n_heads=8,
    d_ff=2048,
    dropout=0.1,
    position={"name": "none"},
    attention={"name": "xl_rel", "mem_len": 512},
)
TINY_XL = {"attention": {"mem_len": 16, "block_size": 8}}


@register_preset(
    "transformer_xl",
    "Transformer-XL: relative attention over a segment memory, 12L d512 (Dai et al. 2019)",
    tiny=TINY_XL,
    paper=DAI,
)
def _transformer_xl() -> dict[str, Any]:
    return dict(XL_BASE, residual={"name": "post_norm"})


@register_preset(
    "trxl_i",
    "TrXL-I: Transformer-XL with identity-map reordering, no gate (Parisotto et al. 2019 ablation)",
    tiny=TINY_XL,
    paper=PARISOTTO,
)
def _trxl_i() -> dict[str, Any]:
    return dict(XL_BASE, residual={"name": "identity_map"})


@register_preset(
    "gtrxl",
    "GTrXL: Transformer-XL with identity-map reordering and GRU gating, b_g = 2 (Parisotto et al. 2019)",
    tiny=TINY_XL,
    paper=PARISOTTO,
)
def _gtrxl() -> dict[str, Any]:
    return dict(XL_BASE, residual={"name": "gru_gate", "gate_bias": 2.0})
