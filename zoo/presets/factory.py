"""The preset registry and the factory: a preset is a named function returning the config values
that differ from :class:`~zoo.config.ModelConfig`'s defaults; ``create_model(name, **overrides)``
resolves preset + overrides (:func:`zoo.config.resolve_model_config`, once) and builds the head its
``kind`` names. ``model_config_for_task`` binds a preset to the task it will train on (vocabulary
and classes from the task, a position table as long as its sequences, a head the task can train).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from zoo.config import ModelConfig, resolve_model_config
from zoo.data.base import Task
from zoo.init import initialise
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
    paper: str = ""  # the paper it follows: "Authors year, Title, arXiv:NNNN.NNNNN" (the model card cites it)


MODEL: Registry[Preset] = Registry("model", Preset)


def register_preset(
    name: str,
    description: str,
    *,
    tiny: dict[str, Any] | None = None,
    example_length: int = 24,
    paper: str = "",
) -> Callable[[Callable[[], dict]], Callable[[], dict]]:
    """Register a preset: a function returning the config values that differ from ModelConfig's.

    ``tiny`` is merged over the generic tiny size (:data:`TINY`) for tests and the demo; ``paper``
    cites what it follows ("Authors year, Title, arXiv:NNNN.NNNNN"), for the model card."""

    def add(fn: Callable[[], dict[str, Any]]) -> Callable[[], dict[str, Any]]:
        MODEL.register(name, Preset(name, fn, description, {**TINY, **(tiny or {})}, example_length, paper))
        return fn

    return add


def get_preset(name: str) -> Preset:
    return MODEL.get(name)


def resolve_preset(name: str, *layers: dict[str, Any], min_len: int = 0) -> ModelConfig:
    """Preset ``name``'s values with ``layers`` merged on top in order (see
    :func:`zoo.config.resolve_model_config`); nothing built."""
    config = resolve_model_config(name, MODEL.get(name).build_config(), layers, min_len=min_len)
    head = HEAD.get(config.kind)  # a registered head (a plugin's too): an unknown one fails here, listing them
    offered = getattr(head, "output_heads", ("linear", "none"))  # the head class says which outputs it builds
    if config.head not in offered:
        raise ValueError(f"head={config.head!r}: kind={config.kind!r} builds one of {', '.join(offered)}")
    return config


def preset_config(name: str, **overrides: Any) -> ModelConfig:
    """The resolved config of preset ``name`` with ``overrides`` merged in (nothing built)."""
    return resolve_preset(name, overrides)


def build_model(config: ModelConfig) -> ZooModel:
    """The model a resolved config describes (the head its ``kind`` names), initialised by its
    ``init`` scheme (zoo/init)."""
    return initialise(HEAD.get(config.kind)(config), config.init)


def create_model(name: str, **overrides: Any) -> ZooModel:
    """Build preset ``name`` with ``overrides`` merged over its config.

    ``zoo.create_model("vanilla_lm", vocab_size=256, d_model=64, n_layers=2, n_heads=4)``;
    ``attention="lsh"`` swaps the mechanism, ``attention={"n_hashes": 8}`` tweaks it;
    ``zoo.create_model(**model.config.to_dict())`` rebuilds the exact model."""
    return build_model(preset_config(name, **overrides))


def model_config_for_task(preset: str, task: Task, *layers: dict[str, Any]) -> ModelConfig:
    """Preset ``preset`` bound to ``task``: the task's vocabulary and classes under ``layers`` (a
    key a layer sets wins), a position table at least ``task.seq_len`` long unless a layer sets
    ``max_len``; a head the task cannot train, or a config the task cannot feed
    (``task.check_model``), is refused with the reason."""
    config = resolve_preset(preset, task.model_overrides(), *layers, min_len=task.seq_len)
    if config.kind != task.kind:
        if task.kind != "lm":
            raise ValueError(
                f"model {preset!r} is a {config.kind} model but data {task.registry_name!r} trains a "
                f"{task.kind}; pick a *_{task.kind} preset"
            )
        raise ValueError(
            f"model {preset!r} is a {config.kind} model but data {task.registry_name!r} is a "
            "language-modelling task; pick an LM preset"
        )
    task.check_model(config)
    return config


def build_model_for_task(preset: str, task: Task, **overrides: Any) -> ZooModel:
    """``zoo.create_model(preset, **overrides)`` bound to ``task`` (:func:`model_config_for_task`); a task that
    packs documents (``data.pack``) refuses, with the reason, a model that cannot keep them apart."""
    return refuse_unpackable(build_model(model_config_for_task(preset, task, overrides)), task)


def refuse_unpackable(model: ZooModel, task: Task) -> ZooModel:
    """``model`` itself, once it is known to keep the documents of a packing task (``data.pack=true``) apart;
    else a refusal with the reason (``ZooModel.packing_refusal``) before any step runs."""
    if getattr(task.options, "pack", False):
        reason = model.packing_refusal()
        if reason is not None:
            raise ValueError(f"data.pack=true: model {model.config.name!r} cannot take packed documents: {reason}")
    return model


def list_models(pattern: str = "*") -> list[str]:
    return MODEL.list(pattern)
