"""Residual policies: how a sub-layer's output joins the residual stream.

A policy wraps one sub-layer (attention, cross-attention or feed-forward) of a block and is called
as ``policy(x, sublayer) -> y`` where ``sublayer`` maps [b, t, d] -> [b, t, d]. Every policy is two
steps, so the block (and the mechanisms that remember their layer's inputs) can see both:

- ``sublayer_input(x)``: what the sub-layer sees of the stream, a map acting on each position alone
  (the model's norm in the pre-norm family, the identity otherwise). A mechanism with memory stores the
  raw stream and applies this map to what it remembers on every call (see ``blocks.Block``);
- ``join(x, y)``: how the sub-layer's output y = sublayer(sublayer_input(x)) rejoins x.

Policies whose join is ``x + update(y)`` are *additive* (``AdditiveResidual``) and also expose
``branch(x, sublayer) = update(sublayer(sublayer_input(x)))``; only those fit inside the reversible
stack, which subtracts the branch to recover its inputs.

The policies: ``post_norm``, ``pre_norm``, ``rezero`` (:mod:`zoo.residual.norms`); GTrXL's
``identity_map`` and ``gru_gate`` (:mod:`zoo.residual.gtrxl`).

Norms: a policy that normalises builds its norm with ``self.make_norm()``, from the model's ``norm``
spec (the norm axis, :mod:`zoo.norm`: ``layernorm`` unless the config says otherwise), never a
hard-wired ``nn.LayerNorm``.

Adding a policy: subclass ``Residual`` (or ``AdditiveResidual``) in a module of this package (or
your own, imported with ``imports=``) and register it with ``@RESIDUAL.register("name")``; the
residual contract suite then runs over it (by its flags).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from torch import Tensor, nn

from zoo.config import NoOptions, build_options
from zoo.norm.base import Norm, create_norm
from zoo.registry import Registry

Sublayer = Callable[[Tensor], Tensor]


class Residual(nn.Module):
    additive: ClassVar[bool] = False  # join(x, y) = x + update(y): usable in the reversible stack
    final_norm: ClassVar[bool] = False  # the stack output needs a final norm (the model's norm axis)
    Options: ClassVar[type] = NoOptions
    registry_name: ClassVar[str | None] = None

    def __init__(
        self, d_model: int, dropout: float = 0.0, *, norm: str | Mapping[str, Any] | None = None, **options: Any
    ):
        """``norm``: the model's norm spec (``config.norm``; None = layernorm), what ``make_norm`` builds."""
        super().__init__()
        self.options = build_options(self.Options, options, f"residual {self.registry_name!r}")
        self.drop = nn.Dropout(dropout)
        self.d_model, self.norm_spec = d_model, norm

    def make_norm(self) -> Norm:
        """A norm over d_model of the model's norm axis (``layernorm`` unless the config names another)."""
        return create_norm(self.norm_spec, self.d_model)

    @classmethod
    def contract_options(cls) -> dict[str, Any]:
        """Options under which the residual contract suite exercises this policy (d_model 16)."""
        return {}

    def sublayer_input(self, x: Tensor) -> Tensor:
        """[b, t, d] -> [b, t, d]: what the sub-layer sees; must act on each position alone."""
        return x

    def join(self, x: Tensor, y: Tensor) -> Tensor:
        """The new stream from the old one x and the sub-layer's output y (both [b, t, d])."""
        raise NotImplementedError

    def branch(self, x: Tensor, sublayer: Sublayer) -> Tensor:
        raise TypeError(
            f"residual {self.registry_name!r} is not additive (y != x + branch(x)); the reversible stack "
            "needs an additive residual such as pre_norm or rezero"
        )

    def forward(self, x: Tensor, sublayer: Sublayer) -> Tensor:
        return self.join(x, sublayer(self.sublayer_input(x)))


class AdditiveResidual(Residual):
    """join(x, y) = x + update(y): the sub-layer's contribution can be subtracted again."""

    additive = True

    def update(self, y: Tensor) -> Tensor:
        raise NotImplementedError

    def join(self, x: Tensor, y: Tensor) -> Tensor:
        return x + self.update(y)

    def branch(self, x: Tensor, sublayer: Sublayer) -> Tensor:
        """F(x) with x + F(x) = forward(x, sublayer)."""
        return self.update(sublayer(self.sublayer_input(x)))


RESIDUAL: Registry[type[Residual]] = Registry("residual", Residual)
