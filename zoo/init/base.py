"""The initialisation axis: a stated choice of how a model's weights start (``init=``).

A model's ``init`` (``{"name": "default"}``: every part's own initialisation, what every preset and
checkpoint before the axis used) names a registered scheme. It runs once, when ``zoo.create_model``
(``zoo.presets.factory.build_model``) has built the model, and redraws the weights it names; loading
a checkpoint afterwards replaces them as before. A scheme may also change how the token table is read
(``TokenEmbedding.reset``: a plain table read unscaled), which holds on every rebuild since the scheme
runs again.

Adding a scheme: subclass :class:`Init` with an ``Options`` dataclass and ``apply(model)``, register it
with ``@INIT.register("name")``; ``experiments/sync_configs.py`` writes ``conf/init/<name>.yaml``.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn

from zoo.config import NoOptions, build_options, split_part
from zoo.models.base import TokenEmbedding
from zoo.position.base import Position
from zoo.registry import Registry


class Init:
    """A scheme: ``apply(model)`` redraws the weights it names, in place, without gradient."""

    Options: ClassVar[type] = NoOptions
    registry_name: ClassVar[str | None] = None

    def __init__(self, **options: Any):
        self.options = build_options(self.Options, options, f"init {self.registry_name!r}")

    def check(self, config: Any) -> None:
        """Refuse, with the reason, a model config the scheme cannot initialise as it says."""

    def apply(self, model: nn.Module) -> None:
        raise NotImplementedError


INIT: Registry[type[Init]] = Registry("init", Init)


def reset_tables(model: nn.Module, std: float) -> None:
    """The embedding tables as plain N(0, std) tables: every token table read unscaled
    (``TokenEmbedding.reset``) and every parameter of a learned position table (a position part with
    an ``init_std`` option: ``learned``'s table and its per-layer tables)."""
    for module in model.modules():
        if isinstance(module, TokenEmbedding):
            module.reset(std)
        elif isinstance(module, Position) and hasattr(module.options, "init_std"):
            for p in module.parameters():
                nn.init.normal_(p, std=std)


def initialise(model: nn.Module, spec: Any) -> nn.Module:
    """Apply the scheme ``spec`` names (a name or ``{"name": ..., **options}``; None = default) to
    ``model`` in place and return it."""
    name, options = split_part("default" if spec is None else spec)
    scheme = INIT.get(name)(**options)
    scheme.check(model.config)
    with torch.no_grad():
        scheme.apply(model)
    return model


__all__ = ["INIT", "Init", "initialise", "reset_tables"]
