"""The initialisation axis: how a built model's weights are drawn (``base.py`` holds the contract and
the ``INIT`` registry; every other module registers its scheme when this package is imported)."""

from zoo.init.base import INIT, Init, initialise
from zoo.registry import import_submodules

import_submodules(__name__)

__all__ = ["INIT", "Init", "initialise"]
