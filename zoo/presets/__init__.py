"""Named presets: one module per family, each registering with ``register_preset``."""

from zoo.presets import reformer, universal, vanilla  # noqa: F401
