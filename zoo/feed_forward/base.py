"""The feed-forward axis: which sub-layer follows attention in every block.

A model's ``feed_forward`` (``{"name": "mlp"}`` by default, today's two-layer network) names a
registered part; the builder gives it the model's ``d_model``, ``d_ff``, ``dropout``,
``ff_chunk_size`` and causality, and the model's ``activation`` to a part whose ``Options`` has an
``activation`` field that the spec leaves unset (``mlp``, ``sepconv``). A part whose activation is
fixed by its name (``swiglu``, ``geglu``, ``reglu``) refuses an ``activation`` other than the
default ``relu`` rather than ignore it.

What the base does once for every part:

- Chunking (Reformer, Kitaev et al. 2020, Section 3): ``chunk_size`` > 0 runs the part on slices of
  that many positions, so its [b, t, d_ff] activation never exists for the whole sequence. A part
  whose outputs read neighbouring positions (a convolution) says how many (``halo``): each slice
  then reads that many inputs beyond its edges and keeps only its own outputs, so chunked equals
  unchunked for every part.
- The questions a consumer asks (``zoo.models.costs``, ``describe``, ``zoo.bench --flops``): each
  part answers its own ``parameter_count()`` (analytic, checked against its tensors),
  ``forward_flops(t)`` (matmul FLOPs of one call over t tokens), ``activation_bytes_per_token()``
  (its d_ff-wide tensors kept for backward, bf16) and ``flops_rule()``.
- Capabilities: ``position_wise`` (each output reads only its own position: the reversible stack
  may run it on slices without the padding mask, a sequence may be split over ranks and continued
  token by token); a part that is not says why in ``stream_refusal`` / ``context_refusal``.

Adding a part: subclass :class:`FeedForward` in a module of this package (or your own, imported with
``imports=``), implement ``transform`` and the three answers, register it with
``@FEED_FORWARD.register("name")``; the contract suite (tests/contracts/test_feed_forward_contract.py)
runs over it in every stack, and ``experiments/sync_configs.py`` writes its ``conf/feed_forward`` file.

Shapes: x [b, t, d_model]; pad_mask [b, t] bool (True = real).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from zoo.config import DEFAULT_ACTIVATION, NoOptions, build_options, require, split_part
from zoo.registry import Registry

BF16_BYTES = 2  # the activation model's precision (zoo/models/costs.py: Korthikanti et al. 2022, bf16)


class FeedForward(nn.Module):
    """[b, t, d_model] -> [b, t, d_model]; called as ``ff(x, pad_mask=None)``."""

    position_wise: ClassVar[bool] = True  # output i reads input i only
    Options: ClassVar[type] = NoOptions
    registry_name: ClassVar[str | None] = None

    def __init__(
        self,
        d_model: int,
        d_ff: int,
        *,
        dropout: float = 0.0,
        chunk_size: int = 0,
        causal: bool = False,
        **options: Any,
    ):
        super().__init__()
        require(chunk_size >= 0, f"chunk_size must be >= 0 (0 = unchunked), got {chunk_size}")
        self.options = build_options(self.Options, options, f"feed_forward {self.registry_name!r}")
        self.d_model, self.d_ff, self.causal, self.chunk_size = d_model, d_ff, causal, chunk_size
        self.drop = nn.Dropout(dropout)

    @classmethod
    def contract_options(cls) -> dict[str, Any]:
        """Options under which the contract suite exercises this part (its defaults unless it says)."""
        return {}

    # -- what a part implements ----------------------------------------------------------------------
    def transform(self, x: Tensor, pad_mask: Tensor | None) -> Tensor:
        """The sub-layer on x [b, t', d] (the whole sequence or one slice of it)."""
        raise NotImplementedError

    def parameter_count(self) -> int:
        """Its parameters, from its sizes (the contract checks it against its tensors)."""
        raise NotImplementedError

    def forward_flops(self, t: int) -> float:
        """Matmul FLOPs of one forward call over t tokens (2 per multiply-add)."""
        raise NotImplementedError

    def activation_bytes_per_token(self) -> float:
        """Bytes per token of its d_ff-wide tensors kept for backward, in bf16 (the d_model-wide input is
        in the cost model's 18 d_model): 4 d_ff for the two-layer network (Korthikanti et al. 2022)."""
        raise NotImplementedError

    def flops_rule(self) -> str:
        """How ``forward_flops`` counts, for describe's report."""
        raise NotImplementedError

    def output_projection(self) -> nn.Linear:
        """The map that writes into the residual stream (init schemes scale it by depth, zoo/init/gpt2.py)."""
        raise NotImplementedError

    def halo(self) -> tuple[int, int]:
        """(positions before, positions after) of the input that an output position reads beyond its
        own: (0, 0) for a position-wise part."""
        return (0, 0)

    def stream_refusal(self) -> str | None:
        """Why a model cannot continue a sequence from a state through this part (None: it can)."""
        return None

    def context_refusal(self) -> str | None:
        """Why this part cannot run on a chunk of a sequence split over ranks (None: it can)."""
        return None

    # -- chunking, once for every part -----------------------------------------------------------------
    def forward(self, x: Tensor, pad_mask: Tensor | None = None) -> Tensor:
        t = x.shape[1]
        if not self.chunk_size or t <= self.chunk_size:
            return self.transform(x, pad_mask)
        before, after = self.halo()
        pieces = []
        for start in range(0, t, self.chunk_size):
            end = min(start + self.chunk_size, t)
            lo, hi = max(0, start - before), min(t, end + after)  # the slice plus the inputs its edges read
            out = self.transform(x[:, lo:hi], None if pad_mask is None else pad_mask[:, lo:hi])
            pieces.append(out[:, start - lo : end - lo])
        return torch.cat(pieces, dim=1)

    def extra_repr(self) -> str:
        chunk = f", chunk_size={self.chunk_size}" if self.chunk_size else ""
        return f"d_model={self.d_model}, d_ff={self.d_ff}{chunk}"


FEED_FORWARD: Registry[type[FeedForward]] = Registry("feed_forward", FeedForward)


def takes_activation(cls: type[FeedForward]) -> bool:
    """Whether a part's activation is an option (the model's ``activation`` key fills it when unset)."""
    return dataclasses.is_dataclass(cls.Options) and "activation" in {f.name for f in dataclasses.fields(cls.Options)}


def create_feed_forward(
    spec: str | Mapping[str, Any] | None,
    d_model: int,
    d_ff: int,
    *,
    dropout: float = 0.0,
    chunk_size: int = 0,
    causal: bool = False,
    activation: str = DEFAULT_ACTIVATION,
) -> FeedForward:
    """The feed-forward part ``spec`` names (a registry name or ``{"name": ..., **options}``; None =
    ``mlp``). ``activation``: the model's ``activation`` key, the default of a part that takes one."""
    name, options = split_part("mlp" if spec is None else dict(spec) if isinstance(spec, Mapping) else spec)
    cls = FEED_FORWARD.get(name)
    if takes_activation(cls):
        options.setdefault("activation", activation)
    elif activation != DEFAULT_ACTIVATION:
        takers = [n for n in FEED_FORWARD.list() if takes_activation(FEED_FORWARD.get(n))]
        raise ValueError(
            f"activation={activation!r} sets the activation of the feed-forward parts that take one "
            f"({', '.join(takers)}); feed_forward {name!r} fixes its own by its name: leave activation at "
            f"{DEFAULT_ACTIVATION!r}, or pick the part with the activation you want (e.g. geglu for a GELU gate)"
        )
    return cls(d_model, d_ff, dropout=dropout, chunk_size=chunk_size, causal=causal, **options)


__all__ = ["FEED_FORWARD", "FeedForward", "create_feed_forward", "takes_activation"]
