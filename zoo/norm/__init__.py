"""The norm axis: the normalisation every residual policy, the final norm and a mechanism's own norms
(per-head output norm, QK-norm) build (``base.py`` holds the contract, the ``NORM`` registry and
:func:`create_norm`; every other module registers its part when this package is imported)."""

from zoo.norm.base import NORM, Norm, create_norm
from zoo.registry import import_submodules

import_submodules(__name__)

__all__ = ["NORM", "Norm", "create_norm"]
