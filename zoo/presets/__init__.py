"""Named presets, one module per family, and the factory (``create_model``, ``list_models``,
``preset_config``, ``model_config_for_task``) in ``factory.py``; every module registers its presets
when this package is imported."""

from zoo.presets.factory import (
    MODEL,
    build_model,
    build_model_for_task,
    create_model,
    get_preset,
    list_models,
    model_config_for_task,
    preset_config,
    resolve_preset,
)
from zoo.registry import import_submodules

import_submodules(__name__)

__all__ = [
    "MODEL",
    "build_model",
    "build_model_for_task",
    "create_model",
    "get_preset",
    "list_models",
    "model_config_for_task",
    "preset_config",
    "resolve_preset",
]
