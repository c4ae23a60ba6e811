"""The preset registry and the factory: a preset is a named function returning the config values
that differ from :class:`~zoo.config.ModelConfig`'s defaults; ``create_model(name, **overrides)``
resolves preset + overrides (:func:`preset_config`) and builds the head its ``kind`` names.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from zoo.config import ModelConfig, merge_config
from zoo.models.base import HEAD, ZooModel
from zoo.registry import Registry

TINY = dict(vocab_size=32, d_model=32, n_layers=2, n_heads=4, d_ff=64, dropout=0.0)


@dataclass
class Preset:
    name: str
    build_config: Callable[[], dict[str, Any]]
    description: str
    tiny: dict[str, Any]  # overrides giving a CPU-second-sized version (tests, demo)
    example_length: int  # a sequence length the tiny version accepts


MODEL: Registry[Preset] = Registry("model", Preset)


def register_preset(
    name: str, description: str, *, tiny: dict[str, Any] | None = None, example_length: int = 24
) -> Callable[[Callable[[], dict]], Callable[[], dict]]:
    """Register a preset: a function returning the config values that differ from ModelConfig's.

    ``tiny`` is merged over the generic tiny size (:data:`TINY`) for tests and the demo."""

    def add(fn: Callable[[], dict[str, Any]]) -> Callable[[], dict[str, Any]]:
        MODEL.register(name, Preset(name, fn, description, {**TINY, **(tiny or {})}, example_length))
        return fn

    return add


def get_preset(name: str) -> Preset:
    return MODEL.get(name)


def preset_config(name: str, **overrides: Any) -> ModelConfig:
    """The resolved config of preset ``name`` with ``overrides`` merged in (nothing built)."""
    preset: Preset = MODEL.get(name)
    base = ModelConfig(name=name).to_dict()
    base = merge_config(base, preset.build_config())
    base["name"] = name
    overrides.pop("name", None)
    config = ModelConfig(**merge_config(base, overrides))
    HEAD.get(config.kind)  # kind names a registered head (a plugin's too): an unknown one fails here, listing them
    return config


def create_model(name: str, **overrides: Any) -> ZooModel:
    """Build preset ``name`` with ``overrides`` merged over its config.

    ``zoo.create_model("vanilla_lm", vocab_size=256, d_model=64, n_layers=2, n_heads=4)``;
    ``attention="lsh"`` swaps the mechanism, ``attention={"n_hashes": 8}`` tweaks it;
    ``zoo.create_model(**model.config.to_dict())`` rebuilds the exact model."""
    config = preset_config(name, **overrides)
    return HEAD.get(config.kind)(config)


def list_models(pattern: str = "*") -> list[str]:
    return MODEL.list(pattern)
