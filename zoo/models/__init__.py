"""Heads that turn a stack into a model (LM, classifier, encoder-decoder, two-tower), their losses and
the state they carry between calls. ``base.py`` holds what every head shares and the ``HEAD``
registry (keyed by ``ModelConfig.kind``); each head module registers itself when this package is
imported."""

from zoo.models.base import HEAD, ModelOutput, ModelState, ZooModel
from zoo.registry import import_submodules

import_submodules(__name__)

__all__ = ["HEAD", "ModelOutput", "ModelState", "ZooModel"]
