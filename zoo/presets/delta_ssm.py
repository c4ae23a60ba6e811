"""Presets of the delta-rule and state-space language models: DeltaNet (Yang et al. 2024, arXiv:2406.06484),
Gated DeltaNet (Yang, Kautz, Hatamizadeh 2024, arXiv:2412.06464) and Mamba-2 (Dao & Gu 2024,
arXiv:2405.21060), each at its 1.3B row's width and depth.

The mixers follow flash-linear-attention's configs (the papers' code): DeltaNet 2048 wide, 24 layers, 16
heads of 128, no output gate; Gated DeltaNet 2048 wide, 21 layers, a key dim of 0.75 x 2048 with the values
twice as wide (expand_v 2) and the output gate; Mamba-2 2048 wide, d_state 128, expand 2, heads of 64, one
group, chunks of 256.

Every block is the Transformer++ block as fla builds these models (``recurrent_block``: pre-RMSNorm, a
SwiGLU of 3 x 2048 x 5632, no biases, a plain N(0, 0.02) token table, untied output). Deviations: Gated
DeltaNet's 6 heads of 256 become 8 heads of 192 (the same key dim, 1536; the skeleton takes n_heads dividing
d_model). Mamba-2's 1.3B model stacks 48 mixer-only blocks; here 21 blocks of mixer + MLP. No position
signal: the short convolutions and the decays order the tokens, as in the papers.

``gated_deltanet_h1_lm``: the Gated DeltaNet paper's first hybrid (H1), gated delta-rule layers and
sliding-window attention layers interleaved, through per-layer hybrids (``attention=[...]``, cycled): here
``local_1d`` with a 2,048-key window (its block of 128 and 1,920 keys before it). Deviation: its window layers
take no positions (the zoo applies one position scheme to every layer, and the delta-rule layers refuse
rotary with the reason), so they read order from the recurrent layers around them.
"""

from __future__ import annotations

from typing import Any

from zoo.presets.factory import register_preset
from zoo.presets.transformer_pp import recurrent_block

BLOCK = dict(d_model=2048, d_ff=8192)
TINY_CHUNKS = {"head_dim": 0, "chunk_size": 8}  # the tiny variant: heads of d_model / n_heads, chunks of 8
GATED_DELTANET = {"name": "gated_deltanet", "head_dim": 192, "expand_v": 2.0, "use_gate": True, "conv_size": 4}


@register_preset(
    "deltanet_lm",
    "DeltaNet LM: the delta rule trained chunkwise, 1.3B width and depth, Transformer++ block (Yang et al. 2024)",
    tiny=dict(attention=TINY_CHUNKS),
    paper="Yang et al. 2024, Parallelizing Linear Transformers with the Delta Rule over Sequence Length, "
    "arXiv:2406.06484",
)
def _deltanet_lm() -> dict[str, Any]:
    attention = {"name": "deltanet", "head_dim": 128, "conv_size": 4}
    return recurrent_block(**BLOCK, n_layers=24, n_heads=16, attention=attention)


@register_preset(
    "gated_deltanet_lm",
    "Gated DeltaNet LM: the delta rule with a scalar decay and output gate, 1.3B width and depth, Transformer++ block "
    "(Yang, Kautz, Hatamizadeh 2024)",
    tiny=dict(attention=TINY_CHUNKS),
    paper="Yang, Kautz, Hatamizadeh 2024, Gated Delta Networks: Improving Mamba2 with Delta Rule, arXiv:2412.06464",
)
def _gated_deltanet_lm() -> dict[str, Any]:
    return recurrent_block(**BLOCK, n_layers=21, n_heads=8, attention=GATED_DELTANET)


@register_preset(
    "mamba2_lm",
    "Mamba-2 LM: the SSD layer as each block's mixer, 1.3B width, 21 Transformer++ blocks with MLPs (Dao & Gu 2024)",
    tiny=dict(attention={"d_state": 8, "chunk_size": 8}),
    paper="Dao & Gu 2024, Transformers are SSMs: Generalized Models and Efficient Algorithms Through Structured "
    "State Space Duality, arXiv:2405.21060",
)
def _mamba2_lm() -> dict[str, Any]:
    attention = {"name": "mamba2", "d_state": 128, "expand": 2, "n_groups": 1, "chunk_size": 256, "conv_size": 4}
    return recurrent_block(**BLOCK, n_layers=21, n_heads=64, attention=attention)


@register_preset(
    "gated_deltanet_h1_lm",
    "Gated DeltaNet-H1: gated delta-rule layers interleaved with 2,048-key sliding-window attention layers, "
    "Transformer++ block (Yang, Kautz, Hatamizadeh 2024)",
    tiny=dict(
        attention=[{**GATED_DELTANET, **TINY_CHUNKS}, {"name": "local_1d", "block": 8, "memory": 8, "bias": False}],
    ),
    paper="Yang, Kautz, Hatamizadeh 2024, Gated Delta Networks: Improving Mamba2 with Delta Rule, arXiv:2412.06464",
)
def _gated_deltanet_h1_lm() -> dict[str, Any]:
    window = {"name": "local_1d", "block": 128, "memory": 1920, "bias": False}
    return recurrent_block(**BLOCK, n_layers=22, n_heads=8, attention=[GATED_DELTANET, window])
