"""Named presets: one module per family, each registering with ``register_preset``."""

from zoo.presets import universal, vanilla, xl  # noqa: F401
