"""Named presets: one module per family, each registering with ``register_preset``."""

from zoo.presets import vanilla, xl  # noqa: F401
