"""Identity-map reordering and GRU gating of the residual stream (GTrXL).

Paper: "Stabilizing Transformers for Reinforcement Learning", Parisotto et al. 2019,
arXiv:1910.06764, Section 3 (eqs. for the "Identity Map Reordering" and the GRU-type gate).

Both policies wrap one sub-layer (attention or feed-forward) of a block:

- ``identity_map`` (TrXL-I): y = x + ReLU(Sublayer(LayerNorm(x))). LayerNorm only on the
  sub-layer's input, so the stream from the embedding to the output is an identity path; the
  ReLU on the sub-layer output is the paper's (it keeps the reordered model stable).
- ``gru_gate`` (GTrXL): the add is replaced by a GRU-type gate g(x, y) with y = ReLU(Sublayer(LN(x))):

      r = sigmoid(W_r y + U_r x)
      z = sigmoid(W_z y + U_z x - b_g)
      h = tanh(W_g y + U_g (r * x))
      g = (1 - z) * x + z * h

  b_g is learned and initialised to ``gate_bias`` (2, the paper's value for the GRU gate), so at
  initialisation z is about sigmoid(-2) = 0.12 and every block is close to the identity map.

Memory: both policies normalise the sub-layer's input, and with Transformer-XL memory the
LayerNorm applies to [StopGrad(M), E] on every call (the paper's block): memory holds the raw
stream and is normalised with the current weights inside the graph (``sublayer_input``, passed to
the attention by ``blocks.Block``).

LayerNorm here is the model's norm axis (``norm=``, :mod:`zoo.norm`), LayerNorm unless set.

Deviations: the stream ends in a final LayerNorm before the LM head (``final_norm``), as in the
pre-norm stack; the paper feeds the last layer's output to a policy network instead. Dropout, when
configured, acts on y (the sub-layer output) before the join.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from zoo.config import require
from zoo.residual.base import RESIDUAL, Residual
from zoo.residual.norms import PreNorm


@RESIDUAL.register("identity_map")
class IdentityMapReordered(PreNorm):
    """TrXL-I: x + ReLU(Sublayer(LayerNorm(x))): pre-norm with a ReLU on the sub-layer output."""

    def update(self, y: Tensor) -> Tensor:
        return self.drop(F.relu(y))


@RESIDUAL.register("gru_gate")
class GRUGate(Residual):
    """GTrXL: g(x, ReLU(Sublayer(LayerNorm(x)))) with the GRU-type gate above."""

    final_norm = True

    @dataclass
    class Options:
        gate_bias: float = 2.0  # b_g at initialisation: larger = closer to the identity map

        def __post_init__(self) -> None:
            require(
                isinstance(self.gate_bias, (int, float)) and not isinstance(self.gate_bias, bool),
                f"gate_bias must be a number (the paper uses 2; 0 is its ablation), got {self.gate_bias!r}",
            )

    def __init__(self, d_model: int, dropout: float = 0.0, **options):
        super().__init__(d_model, dropout, **options)
        self.norm = self.make_norm()
        self.from_y = nn.Linear(d_model, 3 * d_model, bias=False)  # W_r, W_z, W_g
        self.from_x = nn.Linear(d_model, 2 * d_model, bias=False)  # U_r, U_z
        self.from_rx = nn.Linear(d_model, d_model, bias=False)  # U_g, applied to r * x
        self.gate_bias = nn.Parameter(torch.full((d_model,), float(self.options.gate_bias)))

    def sublayer_input(self, x: Tensor) -> Tensor:
        return self.norm(x)

    def gate(self, x: Tensor, y: Tensor) -> Tensor:
        """g(x, y): x the residual stream, y the (ReLU'd) sub-layer output; both [b, t, d]."""
        wr, wz, wg = self.from_y(y).chunk(3, dim=-1)
        ur, uz = self.from_x(x).chunk(2, dim=-1)
        r = torch.sigmoid(wr + ur)
        z = torch.sigmoid(wz + uz - self.gate_bias)
        h = torch.tanh(wg + self.from_rx(r * x))
        return (1 - z) * x + z * h

    def join(self, x: Tensor, y: Tensor) -> Tensor:
        return self.gate(x, self.drop(F.relu(y)))
