"""Gated linear attention: linear attention with a data-dependent decay per key dimension.

Paper: "Gated Linear Attention Transformers with Hardware-Efficient Training", Yang, Wang, Shen, Panda,
Kim 2023, arXiv:2312.06635, Section 4.1-4.4 (eqs. 3 and the layer of Section 4.4); the authors' code is
flash-linear-attention (``fla/layers/gla.py``).

    α_t = sigmoid(x_t W_α1 W_α2 + b_α)^{1/τ}          W_α1 [d, gate_low_rank_dim], τ = gate_logit_normalizer
    S_t = diag(α_t) S_{t-1} + k_t^T v_t,  o_t = q_t S_t / sqrt(f)      per head, α_t in (0, 1)^f
    r_t = swish(x_t W_r),  y_t = (r_t ⊙ Norm(o_t)) W_O                  (output gate and per-head norm)

Forms: training runs the chunkwise form of Sections 4.2-4.3 (``decay_chunks.py``: the decays enter as
differences of cumulative log α, never as ratios, so every exponent is <= 0; inside a chunk, secondary
blocks of 16 form their [16, 16, f] exponents and the blocks meet through matmuls factored at each
block's start, as the paper's two-level chunking); decoding one token runs the recurrence.
The state is S per head [f, e]: constant size, ``state_bound`` 0.

Shapes: x [b, t, d] -> q, k, log α [b, h, t, f] (f = expand_k d / h), v, r [b, h, t, e]
(e = expand_v d / h) -> heads [b, h, t, e] -> out [b, t, d]. The paper's sizes: expand_k 0.5,
expand_v 1, 4 heads, gate_low_rank_dim 16, τ = 16, no biases but b_α.

Deviations and details:
- The per-head norm is fla's RMSNorm with a learned weight (``FusedRMSNormGated``, eps ``norm_eps``), one
  weight [e] shared by the heads, built by the norm axis (``zoo/norm``: ``rmsnorm`` over e); the paper
  writes LayerNorm. ``use_output_gate=False`` drops r (y = Norm(o) W_O).
- No short convolution (fla's ``use_short_conv`` defaults off, the paper has none) and no feature map.
- Positions: none; rope, alibi and t5_bias are refused: the decays are the model's only notion of order.

References found to differ: fla's ``naive_recurrent_gla`` (``fla/ops/gla/naive.py``, bc3b101d) takes
[b, t, h, f] and casts to float32 (checked to float32 tolerance), and scales q by f^{-1/2} inside (as here);
its ``initial_state`` is added to a float32 zero state.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from zoo.attention.base import ATTENTION
from zoo.attention.decay_layer import DecayAttention
from zoo.config import require
from zoo.norm import create_norm


@ATTENTION.register("gla")
class GatedLinearAttention(DecayAttention):
    no_position_reason = (
        "GLA orders tokens only by its data-dependent decay (arXiv:2312.06635 uses no position encoding) and forms "
        "no score per query-key pair past a chunk, so no distance bias or rotation is applied"
    )

    @dataclass
    class Options:
        expand_k: float = 0.5  # q/k width = expand_k * d_model (the paper: 0.5)
        expand_v: float = 1.0  # value and gate width = expand_v * d_model
        chunk_size: int = 64  # C of the chunkwise form
        gate_low_rank_dim: int = 16  # rank of W_α1 W_α2
        gate_logit_normalizer: float = 16.0  # τ: log α = logsigmoid(.) / τ
        use_output_gate: bool = True  # r_t = swish(x W_r) multiplies the normed output
        norm_eps: float = 1e-5  # eps of the per-head RMSNorm

        def __post_init__(self) -> None:
            require(self.expand_k > 0 and self.expand_v > 0, "expand_k and expand_v must be > 0")
            require(isinstance(self.chunk_size, int) and self.chunk_size >= 1, "chunk_size must be an int >= 1")
            require(self.gate_low_rank_dim >= 1, f"gate_low_rank_dim must be >= 1, got {self.gate_low_rank_dim}")
            require(self.gate_logit_normalizer > 0, "gate_logit_normalizer must be > 0")
            require(self.norm_eps > 0, f"norm_eps must be > 0, got {self.norm_eps}")

    @classmethod
    def contract_options(cls) -> dict:
        return {"chunk_size": 4, "gate_low_rank_dim": 4, "gate_logit_normalizer": 2.0}

    def __init__(self, d_model: int, n_heads: int, **kwargs):
        super().__init__(d_model, n_heads, **kwargs)
        o, h = self.options, n_heads
        self.key_dim, self.value_dim = self.expanded_head_dims()
        self.to_q = nn.Linear(d_model, h * self.key_dim, bias=False)
        self.to_k = nn.Linear(d_model, h * self.key_dim, bias=False)
        self.to_v = nn.Linear(d_model, h * self.value_dim, bias=False)
        self.to_gate_low = nn.Linear(d_model, o.gate_low_rank_dim, bias=False)  # W_α1
        self.to_decay = nn.Linear(o.gate_low_rank_dim, h * self.key_dim, bias=True)  # W_α2, b_α
        self.to_output_gate = nn.Linear(d_model, h * self.value_dim, bias=False) if o.use_output_gate else None
        # fla's per-head RMSNorm: one weight [e] shared by the heads (the norm acts on the last dim of [b, h, t, e])
        self.head_norm = create_norm({"name": "rmsnorm", "eps": o.norm_eps}, self.value_dim)
        self.register_load_state_dict_pre_hook(_renamed_norm_weight)
        self.to_out = nn.Linear(h * self.value_dim, d_model, bias=False)

    def project(self, x: Tensor, positions: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        q, k, v = (self.split_heads(proj(x)) for proj in (self.to_q, self.to_k, self.to_v))
        logits = self.split_heads(self.to_decay(self.to_gate_low(x)))
        # float32 at least: log α near 0 is where bfloat16 rounds a decay of 0.999 to 1
        log_decay = F.logsigmoid(logits.to(torch.promote_types(logits.dtype, torch.float32)))
        return q * self.key_dim**-0.5, k, v, log_decay / self.options.gate_logit_normalizer

    def finish(self, x: Tensor, out: Tensor) -> Tensor:
        normed = self.merge_heads(self.head_norm(out))
        if self.to_output_gate is not None:
            normed = F.silu(self.to_output_gate(x)) * normed.to(x.dtype)
        return self.to_out(normed)


def _renamed_norm_weight(module: nn.Module, state_dict: dict, prefix: str, *args) -> None:
    """Checkpoints written before the per-head norm came from the norm axis hold its weight as
    ``norm_weight``; it is ``head_norm.weight`` now."""
    if prefix + "norm_weight" in state_dict:
        state_dict[prefix + "head_norm.weight"] = state_dict.pop(prefix + "norm_weight")
