"""Causal LMs on linear attention with decay or a Taylor feature map: RetNet, GLA, Based.

- ``retnet_lm``: multi-scale retention (Sun et al. 2023, arXiv:2307.08621), the sizes of the paper's 1.3B
  row (d 2048, 24 layers, 8 heads: 256-wide q/k heads, values and gate 2d wide).
- ``gla_lm``: gated linear attention (Yang et al. 2023, arXiv:2312.06635), the sizes of the 340M row
  (d 1024, 24 layers, 4 heads, expand_k 0.5, expand_v 1, gate rank 16).
- ``based_lm``: Based (Arora et al. 2024, arXiv:2402.18668), near the 360M row's width (d 1024, 16 heads of
  feature_dim 16, window 64), each layer holding both attentions (``zoo/attention/based.py``).

Deviations (the same for the three): the block is the zoo's pre-norm block (LayerNorm, GELU MLP of 4d),
not the papers' (RetNet: LayerNorm + GELU FFN of 2d; GLA and Based: Llama's RMSNorm + SwiGLU), since a
modern block is not on main yet; so parameter counts differ from the papers' rows and are not claimed.
No position at the input: the mechanisms order tokens themselves (RetNet's decay and rotation, GLA's
decays, Based's causal sums and window). No dropout.
"""

from __future__ import annotations

from typing import Any

from zoo.presets.factory import register_preset

BLOCK = dict(kind="lm", residual={"name": "pre_norm"}, position={"name": "none"}, activation="gelu", dropout=0.0)
RETNET = "Sun et al. 2023, Retentive Network: A Successor to Transformer for Large Language Models, arXiv:2307.08621"
GLA = "Yang et al. 2023, Gated Linear Attention Transformers with Hardware-Efficient Training, arXiv:2312.06635"
BASED = (
    "Arora et al. 2024, Simple linear attention language models balance the recall-throughput tradeoff, "
    "arXiv:2402.18668"
)


@register_preset(
    "retnet_lm",
    "RetNet LM: multi-scale retention (fixed decay per head, xPos rotation, group norm, swish gate) in a pre-norm "
    "block, the 1.3B row's width and depth (Sun et al. 2023)",
    tiny=dict(attention={"chunk_size": 8}),
    paper=RETNET,
)
def _retnet_lm() -> dict[str, Any]:
    attention = {"name": "retention", "expand_k": 1.0, "expand_v": 2.0}
    return dict(BLOCK, d_model=2048, n_layers=24, n_heads=8, d_ff=8192, attention=attention)


@register_preset(
    "gla_lm",
    "GLA LM: gated linear attention (data-dependent decay per key dim, low-rank gate, output gate, norm) in a "
    "pre-norm block, the 340M row's width and depth (Yang et al. 2023)",
    tiny=dict(attention={"chunk_size": 8, "gate_low_rank_dim": 4}),
    paper=GLA,
)
def _gla_lm() -> dict[str, Any]:
    attention = {"name": "gla", "expand_k": 0.5, "expand_v": 1.0, "gate_low_rank_dim": 16}
    return dict(BLOCK, d_model=1024, n_layers=24, n_heads=4, d_ff=4096, attention=attention)


@register_preset(
    "based_lm",
    "Based LM: Taylor-feature linear attention beside a 64-key sliding window in each layer of a pre-norm block "
    "(Arora et al. 2024)",
    tiny=dict(attention={"chunk_size": 8, "feature_dim": 4, "window_size": 8}),
    paper=BASED,
)
def _based_lm() -> dict[str, Any]:
    attention = {"name": "based", "feature_dim": 16, "window_size": 64}
    return dict(BLOCK, d_model=1024, n_layers=24, n_heads=16, d_ff=4096, attention=attention)
