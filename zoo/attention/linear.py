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

from zoo.attention.base import ATTENTION, Attention, AttnOutput, FlopCount, KeysPerQuery, StateContract
from zoo.attention.kernelized import (
    KernelState,
    causal_kernel_attention,
    kernel_attention,
    kernel_flops,
    kernel_keys,
    mask_keys,
)
from zoo.config import require


@ATTENTION.register("linear")
class LinearAttention(Attention):
    supports_memory = True  # causal: the recurrence's sums, constant size
    lra_row = "Linear Trans."

    @dataclass
    class Options:
        eps: float = 1e-6  # added to the denominator phi(q)^T z
        bias: bool = True  # bias in the q/k/v/output projections

        def __post_init__(self) -> None:
            require(self.eps >= 0, f"eps must be >= 0, got {self.eps}")

    @classmethod
    def contract_state(cls) -> StateContract:
        return StateContract(bound=0)  # sums only: no token kept, exact at any length

    def __init__(self, d_model: int, n_heads: int, **kwargs):
        super().__init__(d_model, n_heads, **kwargs)
        self.add_projections(bias=self.options.bias)

    @staticmethod
    def feature_map(x: Tensor) -> Tensor:
        """phi(x) = elu(x) + 1 > 0 (eq. 7)."""
        return F.elu(x) + 1.0

    def init_state(self, batch_size: int) -> KernelState:
        super().init_state(batch_size)  # a bidirectional layer refuses, saying why
        return KernelState()

    def state_bound(self) -> int:
        return 0

    def keys_per_query(self, t: int) -> KeysPerQuery:
        return kernel_keys(t, self.causal)

    def forward_flops(self, t: int) -> FlopCount:
        k = self.head_dim
        return FlopCount(
            {"projections": t * self.projection_flops(), **kernel_flops(t, k, k, self.n_heads, self.causal)}
        )

    def forward(
        self, x: Tensor, *, context: Tensor | None = None, pad_mask: Tensor | None = None, state=None
    ) -> AttnOutput:
        self.check_inputs(x, context, pad_mask, state)
        q, k, v = (self.split_heads(proj(x)) for proj in (self.to_q, self.to_k, self.to_v))
        phi_q = self.feature_map(q)
        phi_k, v = mask_keys(self.feature_map(k), v, pad_mask)
        new_state = None
        if not self.causal:
            out = kernel_attention(phi_q, phi_k, v, self.options.eps)
        else:
            if state is not None and state.kv is not None and state.kv.shape[0] != x.shape[0]:
                raise ValueError(f"linear: the state holds batch size {state.kv.shape[0]}, the input has {x.shape[0]}")
            out, kv, z = causal_kernel_attention(phi_q, phi_k, v, self.options.eps, state)
            if state is not None:
                new_state = KernelState(kv.detach(), z.detach(), None, state.seen + x.shape[1])
        return AttnOutput(self.to_out(self.merge_heads(out)), state=new_state)
