"""Linear attention: softmax replaced by a positive feature map, computed right to left.

Paper: "Transformers are RNNs: Fast Autoregressive Transformers with Linear Attention", Katharopoulos,
Vyas, Pappas, Fleuret 2020, arXiv:2006.16236, Sections 3.2-3.4.

    phi(x) = elu(x) + 1                                                    (eq. 7)
    out_i = phi(q_i)^T sum_j phi(k_j) v_j^T / (phi(q_i)^T sum_j phi(k_j))  (eq. 6)

over every key (bidirectional) or the keys j <= i (causal, eqs. 8-10: S_i = S_{i-1} + phi(k_i) v_i^T,
z_i = z_{i-1} + phi(k_i)). Cost O(t k^2) per head, never a t x t tensor (``kernelized.py``: causal
prefix sums run chunk by chunk, so no [t, k, k] tensor of outer products is kept either).

Streaming (causal): the recurrence is the state. S [b, h, k, k] and z [b, h, k] are carried between
calls, so a stream fed in segments or token by token equals one call, with a state of constant size
(it remembers no token: ``state_bound`` is 0) however long the stream.

Shapes: x [b, t, d] -> q, k, v [b, h, t, k] -> phi(q), phi(k) [b, h, t, k] -> out [b, t, d].

Deviations: ``eps`` (1e-6, as in the authors' fast-transformers code) is added to the denominator so a
query with no real key (an all-padding row) outputs 0, not NaN. There are no attention weights, so the
layer's attention dropout has nothing to drop and is not applied. The LRA re-implementation in
mlpen/Nystromformer (LRA/code/attention_linear.py) leaves the denominator out (it divides phi(q) and
phi(k) by t^(1/4) each instead); ours follows the paper, and the reference test computes the paper's
ratio from two calls of theirs (with v and with ones).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn.functional as F
from torch import Tensor

from zoo.attention.base import ATTENTION, FlopCount
from zoo.attention.kernelized import KernelizedAttention, KernelState, kernel_flops
from zoo.config import require


@ATTENTION.register("linear")
class LinearAttention(KernelizedAttention):
    lra_row = "Linear Trans."

    @dataclass
    class Options:
        eps: float = 1e-6  # added to the denominator phi(q)^T z
        bias: bool = True  # bias in the q/k/v/output projections

        def __post_init__(self) -> None:
            require(self.eps >= 0, f"eps must be >= 0, got {self.eps}")

    @staticmethod
    def feature_map(x: Tensor) -> Tensor:
        """phi(x) = elu(x) + 1 > 0 (eq. 7)."""
        return F.elu(x) + 1.0

    def forward_flops(self, t: int) -> FlopCount:
        k = self.head_dim
        return FlopCount(
            {"projections": t * self.projection_flops(), **kernel_flops(t, k, k, self.n_heads, self.causal)}
        )

    def feature_maps(
        self, q: Tensor, k: Tensor, pad_mask: Tensor | None, state: KernelState | None
    ) -> tuple[Tensor, Tensor, None]:
        return self.feature_map(q), self.feature_map(k), None
