"""The norm axis: which normalisation the stream (and any part that needs one) uses.

A model's ``norm`` (``{"name": "layernorm"}`` by default, today's ``nn.LayerNorm``) is the one spec
every norm of the model is built from: each residual policy that normalises (``post_norm``,
``pre_norm``, GTrXL's ``identity_map`` and ``gru_gate``), the final norm of a pre-norm stack, and a
mechanism's own norms (a per-head output norm, QK-norm), which build theirs over the head dimension.

Building one, from a spec (a registry name, or ``{"name": ..., **options}`` as in a model config)::

    from zoo.norm import create_norm
    norm = create_norm(model_config.norm, head_dim)      # e.g. {"name": "rmsnorm", "eps": 1e-6}
    y = norm(x)                                          # [..., head_dim] -> [..., head_dim]

A norm acts on the last dimension of each position alone (any leading shape: [b, t, d], or
[b, h, t, k] for a per-head norm), keeps the shape, and returns the input's dtype unless its own
weight is wider (then the usual type promotion, as ``nn.LayerNorm`` and HF's norms do).

Adding a part: subclass :class:`Norm` in a module of this package (or your own, imported with
``imports=``), give it an ``Options`` dataclass, and register it with ``@NORM.register("name")``;
the norm contract suite (tests/contracts/test_norm_contract.py) then runs over it, and the Hydra
group ``conf/norm`` gets its file from ``experiments/sync_configs.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from torch import Tensor, nn

from zoo.config import NoOptions, build_options, split_part
from zoo.registry import Registry

DEFAULT_NORM = "layernorm"  # a config without a norm key (every checkpoint written before the axis) means this


class Norm(nn.Module):
    """[..., dim] -> [..., dim], normalising the last dimension of each position alone."""

    Options: ClassVar[type] = NoOptions
    registry_name: ClassVar[str | None] = None

    def __init__(self, dim: int, **options: Any):
        super().__init__()
        self.dim = dim
        self.options = build_options(self.Options, options, f"norm {self.registry_name!r}")

    @classmethod
    def contract_options(cls) -> dict[str, Any]:
        """Options under which the norm contract suite exercises this part (its defaults unless it says)."""
        return {}

    def forward(self, x: Tensor) -> Tensor:
        raise NotImplementedError


NORM: Registry[type[Norm]] = Registry("norm", Norm)


def create_norm(spec: str | Mapping[str, Any] | None, dim: int) -> Norm:
    """The norm ``spec`` names (a registry name, or ``{"name": ..., **options}``; None = ``layernorm``)
    over a last dimension of ``dim``: a model's ``config.norm`` for the stream (``dim = d_model``) or a
    mechanism's per-head norm (``dim = head_dim``). Unknown names and options are refused with the
    valid ones listed."""
    name, options = split_part(DEFAULT_NORM if spec is None else dict(spec) if isinstance(spec, Mapping) else spec)
    return NORM.get(name)(dim, **options)


__all__ = ["DEFAULT_NORM", "NORM", "Norm", "create_norm"]
