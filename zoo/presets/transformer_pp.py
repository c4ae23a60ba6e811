"""Transformer++: the decoder block current language models use, the baseline efficient attention is
compared against (Llama: Touvron et al. 2023, arXiv:2302.13971; the name from Gu & Dao 2023, Mamba).

Pre-norm residual with RMSNorm (Zhang & Sennrich 2019, arXiv:1910.07467), a SwiGLU feed-forward
(Shazeer 2020, arXiv:2002.05202), rotary positions in HF Llama's half-split layout (Su et al. 2021,
arXiv:2104.09864), no biases anywhere, no dropout, and token embeddings read as they are (a plain
N(0, 0.02) table, not the 2017 block's sqrt(d_model) scale: ``token_init_std``). Options: grouped-query
attention (``attention={"n_kv_heads": ...}``, Ainslie et al. 2023, arXiv:2305.13245), tied input/output
embeddings (``tie_embeddings``; Llama unties them), and any causal mechanism in place of dense attention
(``attention="local_1d"``, ``attention=[...]`` per layer): the rest of the block stays.

With weights copied, the preset equals Hugging Face's ``LlamaForCausalLM``: ``zoo.convert.from_llama`` /
``to_llama`` convert both ways (tests/parts/test_llama.py).
"""

from __future__ import annotations

from typing import Any

from zoo.presets.factory import register_preset

LLAMA = "Touvron et al. 2023, LLaMA: Open and Efficient Foundation Language Models, arXiv:2302.13971"


def transformer_pp_config(**values: Any) -> dict[str, Any]:
    """The Transformer++ block with ``values`` (sizes, or a part's options) over it: the parts that make it."""
    block = dict(
        kind="lm",
        dropout=0.0,
        residual={"name": "pre_norm"},
        norm={"name": "rmsnorm"},
        feed_forward={"name": "swiglu"},
        position={"name": "rope", "layout": "halves"},
        attention={"name": "vanilla", "bias": False},
        token_init_std=0.02,  # a plain table read unscaled, as Llama's
        tie_embeddings=False,
    )
    return {**block, **values}


def recurrent_block(**values: Any) -> dict[str, Any]:
    """The Transformer++ block around a mixer that orders tokens itself (the gated linear and state-space
    family: decays, short convolutions), as flash-linear-attention's models build it: no position signal,
    and SwiGLU at 2/3 of 4 d_model rounded up to a multiple of 256 (``two_thirds``, ``multiple_of``)."""
    block = transformer_pp_config(position={"name": "none"}, feed_forward={"name": "swiglu", "two_thirds": True,
                                                                           "multiple_of": 256})
    return {**block, **values}


@register_preset(
    "transformer_pp",
    "Transformer++ decoder (Llama's block): pre-RMSNorm, SwiGLU, rotary, no biases; GQA and tied embeddings as options",
    paper=LLAMA,
)
def _transformer_pp() -> dict[str, Any]:
    # the 2017 base size; SwiGLU's hidden width 1,376 (about 8/3 d_model, a multiple of 32) keeps the
    # feed-forward's parameters those of a two-matrix network of width 2,048
    return transformer_pp_config(n_layers=6, d_model=512, n_heads=8, d_ff=1376)
