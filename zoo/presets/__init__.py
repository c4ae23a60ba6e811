"""Named presets, one module per family, and the factory (``create_model``, ``list_models``,
``preset_config``) in ``factory.py``; every module registers its presets when this package is imported."""

from zoo.presets.factory import MODEL, create_model, get_preset, list_models, preset_config
from zoo.registry import import_submodules

import_submodules(__name__)

__all__ = ["MODEL", "create_model", "get_preset", "list_models", "preset_config"]
