"""Causal LMs on linear attention with decay or a Taylor feature map: RetNet, GLA, Based.

- ``retnet_lm``: multi-scale retention (Sun et al. 2023, arXiv:2307.08621), the sizes of the paper's 1.3B
  row (d 2048, 24 layers, 8 heads: 256-wide q/k heads, values and gate 2d wide).
- ``gla_lm``: gated linear attention (Yang et al. 2023, arXiv:2312.06635), the sizes of the 340M row
  (d 1024, 24 layers, 4 heads, expand_k 0.5, expand_v 1, gate rank 16).
- ``based_lm``: Based (Arora et al. 2024, arXiv:2402.18668), near the 360M row's width (d 1024, 16 heads of
  feature_dim 16, window 64), each layer holding both attentions (``zoo/attention/based.py``).

The block is the Transformer++ block (pre-RMSNorm, SwiGLU of 2/3 x 4d rounded to a multiple of 256, no
biases, a plain N(0, 0.02) token table, untied output: ``zoo/presets/transformer_pp.py``,
``recurrent_block``), as flash-linear-attention builds GLA and Based; RetNet's paper uses LayerNorm and a
GELU FFN of 2d there instead (a deviation of ``retnet_lm``, as of fla's RetNet). Parameter counts are not
claimed against the papers' rows. No position at the input: the mechanisms order tokens themselves
(RetNet's decay and rotation, GLA's decays, Based's causal sums and window). No dropout.
"""

from __future__ import annotations

from typing import Any

from zoo.presets.factory import register_preset
from zoo.presets.transformer_pp import recurrent_block

RETNET = "Sun et al. 2023, Retentive Network: A Successor to Transformer for Large Language Models, arXiv:2307.08621"
GLA = "Yang et al. 2023, Gated Linear Attention Transformers with Hardware-Efficient Training, arXiv:2312.06635"
BASED = (
    "Arora et al. 2024, Simple linear attention language models balance the recall-throughput tradeoff, "
    "arXiv:2402.18668"
)


@register_preset(
    "retnet_lm",
    "RetNet LM: multi-scale retention (fixed decay per head, xPos rotation, group norm, swish gate) in the "
    "Transformer++ block, the 1.3B row's width and depth (Sun et al. 2023)",
    tiny=dict(attention={"chunk_size": 8}),
    paper=RETNET,
)
def _retnet_lm() -> dict[str, Any]:
    attention = {"name": "retention", "expand_k": 1.0, "expand_v": 2.0}
    return recurrent_block(d_model=2048, n_layers=24, n_heads=8, d_ff=8192, attention=attention)


@register_preset(
    "gla_lm",
    "GLA LM: gated linear attention (data-dependent decay per key dim, low-rank gate, output gate, norm) in the "
    "Transformer++ block, the 340M row's width and depth (Yang et al. 2023)",
    tiny=dict(attention={"chunk_size": 8, "gate_low_rank_dim": 4}),
    paper=GLA,
)
def _gla_lm() -> dict[str, Any]:
    attention = {"name": "gla", "expand_k": 0.5, "expand_v": 1.0, "gate_low_rank_dim": 16}
    return recurrent_block(d_model=1024, n_layers=24, n_heads=4, d_ff=4096, attention=attention)


@register_preset(
    "based_lm",
    "Based LM: Taylor-feature linear attention beside a 64-key sliding window in each layer of a Transformer++ block "
    "(Arora et al. 2024)",
    tiny=dict(attention={"chunk_size": 8, "feature_dim": 4, "window_size": 8}),
    paper=BASED,
)
def _based_lm() -> dict[str, Any]:
    attention = {"name": "based", "feature_dim": 16, "window_size": 64}
    return recurrent_block(d_model=1024, n_layers=24, n_heads=16, d_ff=4096, attention=attention)
