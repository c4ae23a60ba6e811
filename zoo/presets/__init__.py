"""Named presets: one module per family, each registering with ``register_preset``."""

from zoo.presets import vanilla  # noqa: F401
from zoo.presets import adaptive_span  # noqa: F401
