"""Hugging Face ``LlamaForCausalLM`` <-> the zoo's ``transformer_pp``, both ways, weights copied.

    import zoo.convert
    model = zoo.convert.from_llama(hf_model)                 # config + weights -> a zoo CausalLM
    model = zoo.convert.from_llama(hf_model, attention="local_1d")   # the same weights, another mechanism
    hf_model = zoo.convert.to_llama(model)                   # back (needs ``transformers``)

``from_llama`` reads a ``LlamaConfig`` into the ``transformer_pp`` preset (sizes, grouped keys and
values, RMSNorm eps, rotary base, tied embeddings, biases) and copies every tensor; ``overrides`` go on
top as in ``zoo.create_model`` (a per-layer list, a window, ...), so a pretrained Llama-family model is
the starting point for studying a mechanism in its place. A Llama option the zoo does not model
(rope scaling, another activation, a head_dim other than hidden_size / heads) is refused, naming it.
``to_llama`` refuses a model that is not that block (another norm, feed-forward, mechanism, ...).

Parameter correspondence (layer i; the zoo's names on the right):

    model.embed_tokens                -> embed                     lm_head -> head (tied: embed)
    layers.i.input_layernorm          -> stack.blocks.i.attention_residual.norm
    layers.i.self_attn.{q,k,v,o}_proj -> stack.blocks.i.attention.{to_q,to_k,to_v,to_out}
    layers.i.post_attention_layernorm -> stack.blocks.i.feed_forward_residual.norm
    layers.i.mlp.{gate,up,down}_proj  -> stack.blocks.i.feed_forward.{gate_proj,up_proj,down_proj}
    model.norm                        -> norm

Rotary: HF Llama rotates the halves (x_i, x_{i + k/2}) of each head, the zoo's ``layout=halves``, so
W_q and W_k copy as they are (with ``layout=pairs`` their rows would be permuted).
"""

from __future__ import annotations

import re
from typing import Any

import torch
from torch import nn

from zoo.config import merge_config, split_part
from zoo.models.lm import CausalLM
from zoo.presets.factory import create_model
from zoo.presets.transformer_pp import transformer_pp_config

LAYER = r"layers\.(\d+)\."
# HF key (as a regex over the LlamaForCausalLM state dict) -> the zoo's key
KEYS = [
    (r"model\.embed_tokens\.weight", r"embed.weight"),
    (r"lm_head\.weight", r"head.weight"),
    (r"model\.norm\.weight", r"norm.weight"),
    (rf"model\.{LAYER}input_layernorm\.weight", r"stack.blocks.\1.attention_residual.norm.weight"),
    (rf"model\.{LAYER}post_attention_layernorm\.weight", r"stack.blocks.\1.feed_forward_residual.norm.weight"),
    (rf"model\.{LAYER}self_attn\.q_proj\.(weight|bias)", r"stack.blocks.\1.attention.to_q.\2"),
    (rf"model\.{LAYER}self_attn\.k_proj\.(weight|bias)", r"stack.blocks.\1.attention.to_k.\2"),
    (rf"model\.{LAYER}self_attn\.v_proj\.(weight|bias)", r"stack.blocks.\1.attention.to_v.\2"),
    (rf"model\.{LAYER}self_attn\.o_proj\.(weight|bias)", r"stack.blocks.\1.attention.to_out.\2"),
    (rf"model\.{LAYER}mlp\.(gate|up|down)_proj\.(weight|bias)", r"stack.blocks.\1.feed_forward.\2_proj.\3"),
]


def zoo_key(hf_key: str) -> str:
    for pattern, target in KEYS:
        if re.fullmatch(pattern, hf_key):
            return re.sub(pattern, target, hf_key)
    raise ValueError(f"no transformer_pp parameter corresponds to LlamaForCausalLM's {hf_key!r}")


def llama_overrides(config: Any) -> dict[str, Any]:
    """The ``transformer_pp`` config a ``LlamaConfig`` describes (refusing what the zoo does not model)."""
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    act = getattr(config, "hidden_act", "silu")
    rope = dict(getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {})
    kind = rope.get("rope_type", rope.get("type", "default"))
    own = config.hidden_size // heads
    refusals = {
        f"head_dim={head_dim} (the zoo's heads are hidden_size / num_attention_heads = {own})": head_dim != own,
        f"hidden_act={act!r} (SwiGLU's gate is SiLU)": act != "silu",
        f"rope scaling {kind!r} (the zoo's rope is the unscaled default)": kind != "default",
        f"pretraining_tp={getattr(config, 'pretraining_tp', 1)}": getattr(config, "pretraining_tp", 1) != 1,
    }
    asked = [what for what, refused in refusals.items() if refused]
    if asked:
        raise ValueError(f"LlamaForCausalLM with {'; '.join(asked)} has no transformer_pp equivalent")
    theta = rope.get("rope_theta", getattr(config, "rope_theta", 10000.0))
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    return transformer_pp_config(
        vocab_size=config.vocab_size,
        d_model=config.hidden_size,
        n_layers=config.num_hidden_layers,
        n_heads=heads,
        d_ff=config.intermediate_size,
        max_len=config.max_position_embeddings,
        attention_dropout=float(getattr(config, "attention_dropout", 0.0)),
        tie_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
        attention={
            "name": "vanilla",
            "bias": bool(getattr(config, "attention_bias", False)),
            **({"n_kv_heads": kv_heads} if kv_heads != heads else {}),
        },
        feed_forward={"name": "swiglu", "bias": bool(getattr(config, "mlp_bias", False))},
        norm={"name": "rmsnorm", "eps": float(config.rms_norm_eps)},
        position={"name": "rope", "layout": "halves", "base": float(theta)},
    )


def from_llama(hf_model: nn.Module, **overrides: Any) -> CausalLM:
    """A zoo ``transformer_pp`` holding ``hf_model``'s (a ``LlamaForCausalLM``) config and weights, in its
    dtype; ``overrides`` merge on top as in ``zoo.create_model`` (e.g. ``attention="local_1d"`` keeps every
    weight and swaps the mechanism: a mechanism's parameters of its own stay as built)."""
    llama = llama_overrides(hf_model.config)
    config = merge_config(llama, overrides)
    # a mechanism swapped in keeps Llama's projections (no bias, its key/value heads) unless told otherwise
    projection = {k: v for k, v in llama["attention"].items() if k != "name"}
    parts = config["attention"] if isinstance(config["attention"], list) else [config["attention"]]
    parts = [{"name": part["name"], **projection, **part} for part in parts]
    config["attention"] = parts if isinstance(config["attention"], list) else parts[0]
    model = create_model("transformer_pp", **config)
    weights = {zoo_key(key): value for key, value in hf_model.state_dict().items() if "rotary_emb" not in key}
    if model.config.tie_embeddings:
        weights.pop("head.weight", None)
    dtype = next(hf_model.parameters()).dtype
    model = model.to(dtype)
    missing, unexpected = model.load_state_dict(weights, strict=False)
    if unexpected:
        raise ValueError(f"transformer_pp built from this config has no parameter for {unexpected}")
    tied = {"head.weight"} if model.config.tie_embeddings else set()  # the embedding itself, loaded above
    own = [key for key in missing if key not in tied and not _a_mechanisms_own(key, overrides)]
    if own:
        raise ValueError(f"LlamaForCausalLM gave no weight for {own}")
    return model


def _a_mechanisms_own(key: str, overrides: dict[str, Any]) -> bool:
    """A parameter a swapped-in mechanism has and Llama's attention does not (left as built)."""
    return "attention" in overrides and ".attention." in key


def to_llama(model: CausalLM) -> nn.Module:
    """A Hugging Face ``LlamaForCausalLM`` equal to ``model`` (a zoo ``transformer_pp``-shaped causal LM),
    weights copied, in the model's dtype. Refuses, naming it, any part Llama's block does not have."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = model.config
    attention = config.attention
    checks = {
        "kind": (config.kind, "lm"),
        "residual": (split_part(config.residual)[0], "pre_norm"),
        "norm": (split_part(config.norm)[0], "rmsnorm"),
        "feed_forward": (split_part(config.feed_forward)[0], "swiglu"),
        "position": (split_part(config.position)[0], "rope"),
        "position.layout": (config.position.get("layout", "pairs"), "halves"),
        "position.fraction": (config.position.get("fraction", 1.0), 1.0),
        "attention": (attention.get("name") if isinstance(attention, dict) else "a per-layer list", "vanilla"),
        "token_init_std > 0 (embeddings read unscaled)": (config.token_init_std > 0, True),
        "adaptive": (bool(config.adaptive), False),
        "head": (config.head, "linear"),
    }
    wrong = [f"{key}={got!r} (Llama: {want!r})" for key, (got, want) in checks.items() if got != want]
    if not wrong:
        extra = {k: v for k, v in attention.items() if k not in ("name", "bias", "n_kv_heads") and v}
        wrong += [f"attention.{k}={v!r}" for k, v in extra.items() if not (k == "backend" and v != "flex")]
        ff = config.feed_forward
        wrong += [f"feed_forward.{k}={ff[k]!r}" for k in ("two_thirds",) if ff.get(k)]
    if wrong:
        raise ValueError(f"{config.name} is not Llama's block: {'; '.join(wrong)}")
    block = model.stack.blocks[0]
    hidden = block.feed_forward.up_proj.weight.shape[0]
    llama = LlamaConfig(
        vocab_size=config.vocab_size,
        hidden_size=config.d_model,
        intermediate_size=hidden,
        num_hidden_layers=config.n_layers,
        num_attention_heads=config.n_heads,
        num_key_value_heads=block.attention.n_kv_heads,
        max_position_embeddings=config.max_len,
        rms_norm_eps=block.attention_residual.norm.options.eps,
        rope_theta=model.position.options.base,
        tie_word_embeddings=config.tie_embeddings,
        attention_bias=block.attention.to_q.bias is not None,
        mlp_bias=block.feed_forward.up_proj.bias is not None,
        attention_dropout=config.attention_dropout,
        hidden_act="silu",
    )
    dtype = next(model.parameters()).dtype
    hf = LlamaForCausalLM(llama).to(dtype)
    ours = model.state_dict()
    with torch.no_grad():
        for key, tensor in hf.state_dict().items():
            if "rotary_emb" not in key:
                tensor.copy_(ours[zoo_key(key)])  # a tied lm_head is the embedding itself: copied twice, the same
    return hf.train(model.training)


__all__ = ["from_llama", "to_llama"]
