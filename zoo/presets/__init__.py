"""Named presets: one module per family, each registering with ``register_preset``."""

from zoo.presets import adaptive_span, universal, vanilla  # noqa: F401
