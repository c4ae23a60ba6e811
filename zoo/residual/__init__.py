"""The residual axis: how a sub-layer's output joins the stream (``base.py`` holds the contract and
the ``RESIDUAL`` registry; every other module registers its policies when this package is imported)."""

from zoo.registry import import_submodules
from zoo.residual.base import RESIDUAL, AdditiveResidual, Residual

import_submodules(__name__)

__all__ = ["RESIDUAL", "AdditiveResidual", "Residual"]
