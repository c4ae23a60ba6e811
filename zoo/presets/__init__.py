"""Named presets: one module per family, each registering with ``register_preset``."""

from zoo.presets import adaptive_span, al_rfou, lra, reformer, sparse_local, universal, vanilla, xl  # noqa: F401
