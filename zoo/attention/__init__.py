"""Attention mechanisms. Importing this package registers every mechanism in ``ATTENTION``."""

from zoo.attention import adaptive_span, additive, local, lsh, sparse, vanilla, xl_rel  # noqa: F401  (registration side effects)
from zoo.attention.base import Attention, AttnOutput

__all__ = ["Attention", "AttnOutput"]
