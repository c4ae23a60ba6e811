"""Attention mechanisms: which keys each query sees and how scores are computed.

``base.py`` holds the contract (:class:`Attention`, :class:`AttnOutput`) and the ``ATTENTION`` registry;
the helpers a mechanism may use sit beside it by concern (``helpers.py``: projections, head reshapes,
positions, input checks; ``masks.py``; ``costs.py``; ``state.py``). Every other module is one mechanism
(or a helper several share) and is imported, so registered, when this package is.
"""

from zoo.attention.base import ATTENTION, Attention, AttnOutput, create_attention
from zoo.registry import import_submodules

import_submodules(__name__)

__all__ = ["ATTENTION", "Attention", "AttnOutput", "create_attention"]
