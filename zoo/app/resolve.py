"""From a composed app config to the model it asks for: the preset and the overrides the user set
(``model.*`` keys and the part groups), null meaning unset.
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

from zoo.app.schema import PART_GROUPS, to_options
from zoo.config import merge_config
from zoo.presets import get_preset, preset_config


def as_dict(cfg: DictConfig | dict) -> dict[str, Any]:
    return OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else dict(cfg)


def part_override(axis: str, node: dict[str, Any] | None) -> dict[str, Any] | None:
    """A part group's node -> a model override: its ``name`` and the options that were set.

    Options are null unless set (the generated ``conf/<axis>/*.yaml`` leave them null), so every
    option that is not null was asked for and is passed on, even one equal to the ``Options``
    default; a null one keeps the preset's value when the preset uses that part (``attention=lsh
    attention.n_hashes=8`` on ``reformer`` changes n_hashes only) and the part's default otherwise."""
    if not node:
        return None
    options = dict(node)
    name = options.pop("name")
    cls = PART_GROUPS[axis].get(name)
    return {"name": name, **to_options(cls.Options, {k: v for k, v in options.items() if v is not None})}


def model_overrides(cfg: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """(preset, overrides) from the ``model`` node and the part groups; null = the preset's value.

    ``model.tiny=true`` starts from the preset's registered tiny variant (its vocabulary excepted:
    the task sets it); the user's ``model.*`` keys and then the part groups (``attention``,
    ``residual``, ``stack``, ``position``) go on top, so a key the user set always wins."""

    model = dict(cfg["model"])
    preset = model.pop("preset")
    tiny = model.pop("tiny", False)
    overrides = {k: v for k, v in model.items() if v is not None}
    if tiny:
        base = {k: v for k, v in get_preset(preset).tiny.items() if k != "vocab_size"}
        overrides = merge_config(base, overrides)
    for axis in PART_GROUPS:
        part = part_override(axis, cfg.get(axis))
        if part is None:
            continue
        current = overrides.get(axis)
        if isinstance(current, dict) and "name" not in current:  # tweaks of the preset's own part
            overrides[axis] = {"name": getattr(preset_config(preset), axis)["name"], **current}
        overrides = merge_config(overrides, {axis: part})
    return preset, overrides
