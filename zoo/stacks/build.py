"""Builders that turn config dicts (``{"name": ..., **options}``) into parts.

These are the only places that look names up in the registries, so every error about an unknown
part or an impossible combination (cross-attention from a mechanism that cannot do it, a causal-only
mechanism in an encoder) is raised here, at build time, with the reason.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from zoo.attention.base import ATTENTION, Attention
from zoo.blocks import Block
from zoo.config import ModelConfig, layer_parts, part_label, split_part
from zoo.feed_forward.base import FeedForward, create_feed_forward
from zoo.position.base import POSITION, Position
from zoo.residual.base import RESIDUAL, Residual
from zoo.stacks.base import STACK, Stack


def create_attention(name: str, *, d_model: int, n_heads: int, causal: bool = False, **options: Any) -> Attention:
    """Build one registered attention mechanism on its own.

    ``options`` are the mechanism's own (see its ``Options``) plus ``dropout`` and ``layer_index``.
    Called as ``attn(x, *, context=None, pad_mask=None, state=None) -> AttnOutput``."""
    return ATTENTION.get(name)(d_model, n_heads, causal=causal, **options)


def attention_class(part: dict[str, Any] | str | list) -> type[Attention]:
    """The class of a part; of a per-layer list's first part."""
    return ATTENTION.get(split_part(part[0] if isinstance(part, list) else part)[0])


def residual_factory(config: ModelConfig) -> Callable[[], Residual]:
    name, options = split_part(config.residual)
    cls = RESIDUAL.get(name)
    cls(config.d_model, config.dropout, norm=config.norm, **options)  # validate options now, not on first block
    return lambda: cls(config.d_model, config.dropout, norm=config.norm, **options)


def create_position(config: ModelConfig) -> Position:
    name, options = split_part(config.position)
    return POSITION.get(name)(config.d_model, config.max_len, n_heads=config.n_heads, **options)


def build_stack(
    config: ModelConfig, *, causal: bool, cross: bool, n_layers: int, position: Position | None = None
) -> Stack:
    """A stack of ``n_layers`` blocks of the configured attention/residual/feed-forward. ``position``: the
    model's position part; one acting inside attention (rope, alibi, t5_bias) is handed to every
    self-attention layer (one part for all, so a learned table is shared by the layers), which applies
    it or refuses it, with the reason, here. Cross-attention relates two timelines: it gets none.
    ``config.attention`` as a per-layer list (a hybrid) gives layer i the part ``i mod len(list)``."""
    layers = [attention_part(part, config, causal=causal) for part in layer_parts(config.attention, n_layers)]
    cross_name, cross_options = split_part(config.cross_attention)
    if cross and not ATTENTION.get(cross_name).supports_cross:
        capable = [n for n in ATTENTION.list() if ATTENTION.get(n).supports_cross]
        reason = ATTENTION.get(cross_name).no_cross_reason
        raise ValueError(
            f"cross_attention {cross_name!r} cannot attend to another sequence "
            f"(supports_cross=False{': ' + reason if reason else ''}); choose one of: {', '.join(capable)}"
        )
    make_residual = residual_factory(config)

    def make_block(layer_index: int) -> Block:
        attn_name, attn_options = layers[layer_index]
        try:
            attention = create_attention(
                attn_name,
                d_model=config.d_model,
                n_heads=config.n_heads,
                causal=causal,
                dropout=config.attention_dropout,
                layer_index=layer_index,
                position=position,
                **attn_options,
            )
        except ValueError as error:
            if not isinstance(config.attention, list):
                raise
            raise type(error)(f"layer {layer_index} ({attn_name}): {error}") from error
        cross_attention = None
        if cross:
            cross_attention = create_attention(
                cross_name,
                d_model=config.d_model,
                n_heads=config.n_heads,
                causal=False,
                dropout=config.attention_dropout,
                layer_index=layer_index,
                **cross_options,
            )
        return Block(attention, make_feed_forward(), make_residual, cross_attention)

    def make_feed_forward() -> FeedForward:
        return create_feed_forward(
            config.feed_forward,
            config.d_model,
            config.d_ff,
            dropout=config.dropout,
            chunk_size=config.ff_chunk_size,
            causal=causal,
            activation=config.activation,
        )

    with torch.device("meta"):  # refuse bad options now, before any block, drawing nothing from the RNG
        make_feed_forward()

    stack_name, stack_options = split_part(config.stack)
    stack_cls = STACK.get(stack_name)
    position_name = split_part(config.position)[0]
    if stack_cls.adds_position_signal(stack_options) and POSITION.get(position_name).encodes_position():
        raise ValueError(
            f"stack {stack_name!r} adds its own position signal (before every step) and "
            f"position={position_name!r} adds one at the embedding: positions would be added twice; "
            "set position=none (the universal presets do) "
            "or turn the stack's signal off (stack.position_signal=false)"
        )
    stack = stack_cls(make_block, n_layers, config.d_model, **stack_options)
    blocks = stack.block_applications()
    built = {id(block.attention) for block in blocks} if blocks is not None else set()
    if len({repr(part) for part in layers}) > 1 and len(built) < n_layers:
        raise ValueError(
            f"stack {stack_name!r} does not build one block per layer (it re-applies a block), so the per-layer "
            f"attention list {part_label(config.attention)} cannot be given to its layers; use stack=sequential "
            "or one attention for every layer"
        )
    first: dict[type, Attention] = {}  # what a mechanism shares across layers, it says (share_with): a
    for attention in (m for m in stack.modules() if isinstance(m, Attention)):  # hybrid's layers per mechanism
        if type(attention) in first:
            attention.share_with(first[type(attention)])
        else:
            first[type(attention)] = attention
    return stack


def attention_part(part: dict[str, Any], config: ModelConfig, *, causal: bool) -> tuple[str, dict[str, Any]]:
    """One layer's (attention name, options): refused when causal-only in an encoder; a length-sized
    option left 0 is set to the model's max_len."""
    attn_name, attn_options = split_part(part)
    attn_cls = ATTENTION.get(attn_name)
    if attn_cls.causal_only and not causal:
        raise ValueError(
            f"attention {attn_name!r} is causal-only and cannot serve a bidirectional encoder; choose another "
            f"attention for kind={config.kind!r}"
        )
    length = attn_cls.length_option
    if length and attn_options.get(length, 0) == 0:  # 0 / unset: sized by the model's longest sequence
        attn_options = {**attn_options, length: config.max_len}
    return attn_name, attn_options
