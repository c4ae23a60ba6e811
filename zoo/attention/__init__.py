"""Attention mechanisms. Importing this package registers every mechanism in ``ATTENTION``."""

# imported for their registration side effects
from zoo.attention import adaptive_span, additive, local, lsh, sparse, vanilla, xl_rel  # noqa: F401
from zoo.attention.base import Attention, AttnOutput

__all__ = ["Attention", "AttnOutput"]
