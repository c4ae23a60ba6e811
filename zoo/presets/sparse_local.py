"""Presets of the Sparse Transformer (Child et al. 2019, arXiv:1904.10509) and the Image
Transformer (Parmar et al. 2018, arXiv:1802.05751), both causal LMs.

From the papers: the Sparse Transformer's best enwik8 model uses the fixed pattern with stride
l = 128, c = 32 and merged heads ("union"), 30 layers and a context of 12,288 bytes, with
pre-activation residual blocks (our ``pre_norm``), and factorised learned positions (``factorized``:
one table for the position inside a stride-l block, one for the block's index). The Image Transformer
models an image as a
raster of intensities with the channels side by side (a 32 x 32 RGB image is a 32 x 96 raster,
3,072 positions, 256 intensity values). Widths, heads and the 2D block shapes are our choices.
"""

from __future__ import annotations

from typing import Any

from zoo.presets.factory import register_preset


@register_preset(
    "sparse_transformer",
    "Sparse Transformer LM: fixed factorised pattern, stride 128, c = 32, merged heads, pre-norm (Child et al. 2019)",
    tiny=dict(attention={"stride": 4, "c": 2}, position={"stride": 4}, max_len=512),
    example_length=24,
    paper="Child et al. 2019, Generating Long Sequences with Sparse Transformers, arXiv:1904.10509",
)
def _sparse_transformer() -> dict[str, Any]:
    return dict(
        kind="lm",
        n_layers=30,
        d_model=512,
        n_heads=8,
        d_ff=2048,
        max_len=12288,
        residual={"name": "pre_norm"},
        position={"name": "factorized", "stride": 128},  # one table per pattern dimension (Child et al. 2019)
        attention={"name": "sparse_fixed", "stride": 128, "c": 32, "combine": "union"},
    )


@register_preset(
    "image_transformer",
    "Image Transformer LM over a 32 x 32 RGB raster (width 96) with local 2D attention (Parmar et al. 2018)",
    # any number of 8-wide rows, so the tiny variant takes the demo's and the tests' lengths
    tiny=dict(
        attention={"height": 0, "width": 8, "query_height": 2, "query_width": 4, "flange_height": 1, "flange_width": 2}
    ),
    example_length=24,
    paper="Parmar et al. 2018, Image Transformer, arXiv:1802.05751",
)
def _image_transformer() -> dict[str, Any]:
    return dict(
        kind="lm",
        vocab_size=256,
        n_layers=12,
        d_model=512,
        n_heads=8,
        d_ff=2048,
        max_len=3072,
        attention={
            "name": "local_2d",
            "height": 32,
            "width": 96,
            "query_height": 8,
            "query_width": 32,
            "flange_height": 8,
            "flange_width": 32,
        },
    )
