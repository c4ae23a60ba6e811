"""The feed-forward axis: the block's position-wise (or, for the Universal Transformer's separable
convolution, local) sub-layer (``base.py`` holds the contract, the ``FEED_FORWARD`` registry and
:func:`create_feed_forward`; every other module registers its parts when this package is imported)."""

from zoo.feed_forward.base import FEED_FORWARD, FeedForward, create_feed_forward
from zoo.registry import import_submodules

import_submodules(__name__)

__all__ = ["FEED_FORWARD", "FeedForward", "create_feed_forward"]
