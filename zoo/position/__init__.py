"""The position axis: where a token's position enters the model (``base.py`` holds the contract and
the ``POSITION`` registry; every other module registers its schemes when this package is imported)."""

from zoo.position.base import POSITION, Position
from zoo.registry import import_submodules

import_submodules(__name__)

__all__ = ["POSITION", "Position"]
