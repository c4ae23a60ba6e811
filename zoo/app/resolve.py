"""From a composed app config to the model it asks for: the preset and the layers of overrides the
user set (``model.*`` keys and the part groups), resolved by :func:`zoo.config.resolve_model_config`.

Null means unset here and only here (:func:`set_keys`): the generated ``conf/`` files leave every
model key and part option null until someone sets it, so a null keeps the preset's value and
anything else reaches the model, even a value equal to a default.
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

from zoo.app.schema import PART_GROUPS, to_options
from zoo.config import ModelConfig, PresetSize
from zoo.presets import get_preset, resolve_preset


def as_dict(cfg: DictConfig | dict) -> dict[str, Any]:
    return OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else dict(cfg)


def set_keys(node: dict[str, Any] | None) -> dict[str, Any]:
    """The keys of a config node that were set: null = unset (the preset's value)."""
    return {k: v for k, v in (node or {}).items() if v is not None}


def part_layer(axis: str, node: dict[str, Any] | None) -> dict[str, Any] | None:
    """A part group's node -> ``{axis: {"name": ..., **options that were set}}``.

    Every option that is not null was asked for and is passed on, even one equal to the ``Options``
    default; a null one keeps the preset's value when the preset uses that part (``attention=lsh
    attention.n_hashes=8`` on ``reformer`` changes n_hashes only) and the part's default otherwise."""
    if not node:
        return None
    options = set_keys(node)
    if "name" not in options:  # options alone (+attention.n_kv_heads=2): the preset's part(s), every layer's
        return {axis: options} if options else None
    name = options.pop("name")
    return {axis: {"name": name, **to_options(PART_GROUPS[axis].get(name).Options, options)}}


def model_layers(cfg: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    """(preset, layers) from the ``model`` node and the part groups, in the order they apply.

    ``model.tiny=true`` starts from the preset's registered tiny variant (its vocabulary excepted:
    the task sets it; its ``max_len`` is raised to the task's sequence); the user's ``model.*`` keys
    and then the part groups (``attention``, ``residual``, ``stack``, ``position``) go on top, so a key
    the user set always wins. A part
    group naming the preset's own part tweaks it; naming another swaps it (``merge_config``)."""
    model = set_keys(cfg["model"])
    preset = model.pop("preset")
    layers = []
    if model.pop("tiny", False):
        # its sizes, not the user's: its max_len is raised to the trainer's sequence like the preset's
        layers.append(PresetSize({k: v for k, v in get_preset(preset).tiny.items() if k != "vocab_size"}))
    layers.append(model)
    layers += [layer for axis in PART_GROUPS if (layer := part_layer(axis, cfg.get(axis))) is not None]
    return preset, layers


def model_config(cfg: dict[str, Any], *below: dict[str, Any], min_len: int = 0) -> ModelConfig:
    """The model config ``cfg`` asks for, without a task (``below``: layers under the user's, e.g. a
    nominal vocabulary); the app's runs bind it to their task (``zoo.presets.model_config_for_task``)."""
    preset, layers = model_layers(cfg)
    return resolve_preset(preset, *below, *layers, min_len=min_len)
