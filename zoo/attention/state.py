"""Helpers for the state a mechanism keeps between calls: a state field shared by every row (beam search
leaves it as it is), and the layer inputs a mechanism with ``remembers_inputs`` stores and re-normalises.
What a state must promise is the contract's (``StateContract``, ``init_state``, ``stream_refusal`` in
``base.py``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import Tensor

# a state's dataclass field holding one tensor for every row (positions of the kept keys, a pinned feature
# map): ``field(default=None, metadata=NOT_PER_ROW)``, so beam search's reorder_state leaves it as it is
NOT_PER_ROW = {"batch": False}


@dataclass
class LayerInput:
    """Where a pre-normalised ``x`` came from, for mechanisms that remember their layer's inputs
    (``remembers_inputs``): ``x = prepare(raw)`` position by position, ``raw`` [b, t, d] being the
    residual stream entering the block. Such a mechanism stores ``raw`` and applies the current
    ``prepare`` to what it remembers on every call, so a pre-norm layer attends over
    LayerNorm([StopGrad(M), E]) (Parisotto et al. 2019, Section 3): the LayerNorm gets gradient
    through memory positions, and memory made before an optimiser step is normalised with today's
    weights. The block passes it (``prepare`` = its residual's ``sublayer_input``); ``version``
    changes whenever ``prepare``'s weights do, for mechanisms that cache projections of it."""

    raw: Tensor
    prepare: Callable[[Tensor], Tensor]
    version: tuple = ()


def remembered(states: Tensor, layer_input: LayerInput | None) -> Tensor:
    """Stored raw layer inputs [b, m, d] as this call's sub-layer sees them."""
    return states if layer_input is None else layer_input.prepare(states)


def to_remember(x: Tensor, layer_input: LayerInput | None) -> Tensor:
    """What to store of this call's input x [b, t, d]: the raw stream when the block gave it."""
    return x if layer_input is None else layer_input.raw
