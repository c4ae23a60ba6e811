"""Based: linear attention with a 2nd-order Taylor feature map beside a small exact sliding window.

Paper: "Simple linear attention language models balance the recall-throughput tradeoff", Arora, Eyuboglu,
Zhang, Timalsina, Alberti, Zinsley, Zou, Rudra, Ré 2024, arXiv:2402.18668, Section 4 (the Taylor map,
eq. 2, and the sliding window); the authors' code is HazyResearch/zoology (``zoology/mixers/based.py``,
``feature_maps/taylor.py``).

    phi(x) = [1, x / f^{1/4}, vec(x x^T) / (sqrt(2) sqrt(f))],   phi(q) . phi(k) = 1 + s + s^2 / 2,  s = q.k / sqrt(f)
    linear_i = sum_{j <= i} phi(q_i).phi(k_j) v_j / (sum_{j <= i} phi(q_i).phi(k_j) + eps)        (all keys)
    window_i = softmax_{i - w < j <= i}(q'_i . k'_j / sqrt(k)) v_j                              (last w keys)
    out = (linear + window) W_O

q, k are projected to ``feature_dim`` (16 in the paper) per head, so the feature map has 1 + f + f^2
(273) features and the linear state per head is [1 + f + f^2, k] + [1 + f + f^2].

Forms: the linear part runs the chunked causal prefix sums of ``kernelized.py`` (C x C inside a chunk of
``chunk_size``, the running sums across; no t x t tensor); the window runs banded over blocks of w
(``blocked.banded_attention``: each block of w queries sees its block and the one before, O(t w)).
Streaming: the running sums (constant size) and the last w - 1 keys and values of the window; the state
remembers at most w - 1 tokens (``state_bound``), however long the stream.

Shapes: x [b, t, d] -> q, k [b, h, t, f] -> phi [b, h, t, 1 + f + f^2]; v [b, h, t, k] (k = d / h);
window q', k' [b, h, t, k] -> out [b, t, d].

Deviations:
- The paper builds a Based model from separate layers (Taylor linear attention, sliding-window attention
  with w of 64-128, gated convolutions), interleaved (zoology's ``Hybrid`` picks a mixer by layer index).
  Here one layer holds both attentions, summed before the shared output projection, with the values
  shared; ``window_size=0`` gives the pure Taylor layer (zoology's ``Based`` mixer). No gated convolution.
- eps = 1e-6 in the denominator (flash-linear-attention's naive; zoology uses 1e-12).
- Positions: none inside (zoology's ``apply_rotary`` defaults off); rope, alibi and t5_bias are refused.

References found to differ: fla's ``naive_parallel_based`` (``fla/ops/based/naive.py``, bc3b101d) is the
Taylor part alone with the t x t matrix of 1 + s + s^2/2 (no feature map); ``naive_chunk_based`` needs the
length to be a multiple of its chunk and forms the [f, f, e] second-order state per chunk. Both run in the
input's dtype, so they are checked in float64. zoology's ``Based`` has no sliding window and no eps > 1e-12.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from zoo.attention.base import (
    ATTENTION,
    Attention,
    AttnOutput,
    KeysPerQuery,
    StateContract,
    dense_keys,
    join_key_padding,
)
from zoo.attention.blocked import banded_attention, key_validity, padded_length
from zoo.attention.kernelized import KernelState, causal_kernel_attention, mask_keys
from zoo.config import require


def taylor_features(x: Tensor) -> Tensor:
    """phi(x) [..., 1 + f + f^2] of x [..., f]: phi(q) . phi(k) = 1 + q.k / sqrt(f) + (q.k)^2 / (2 f)."""
    f = x.shape[-1]
    square = (x[..., :, None] * x[..., None, :]).flatten(-2) / (2**0.5 * f**0.5)
    return torch.cat([torch.ones_like(x[..., :1]), x / f**0.25, square], dim=-1)


def sliding_window(q: Tensor, k: Tensor, v: Tensor, valid: Tensor | None, window: int) -> Tensor:
    """Causal softmax attention of q [b, h, t, k] over the last ``window`` keys of k, v [b, h, m + t, k] (m earlier
    keys first, m < window), valid [b, m + t] or None -> [b, h, t, k]. The m earlier positions get zero queries
    whose rows are dropped (at most window - 1 of them)."""
    t, total = q.shape[2], k.shape[2]
    earlier = total - t
    length = padded_length(total, window)
    out = banded_attention(
        F.pad(q, (0, 0, earlier, 0)),
        k,
        v,
        key_validity(valid, total, length, q.device),
        block=window,
        before=1,
        after=0,
        allowed=lambda qi, d: (d <= qi) & (d > qi - window),
    )
    return out[:, :, earlier:total]


@dataclass
class BasedState:
    """What a Based layer carries between calls (detached): the Taylor sums, and the window's last keys and
    values [b, h, m, k] (m <= window - 1) with their validity [b, m] (None: all real)."""

    sums: KernelState
    keys: Tensor | None = None
    values: Tensor | None = None
    valid: Tensor | None = None

    @property
    def length(self) -> int:
        return 0 if self.keys is None else self.keys.shape[2]


@ATTENTION.register("based")
class Based(Attention):
    no_packing_reason = (
        "its Taylor-feature prefix sums and sliding window (blocked.py) do not restart at a document boundary yet"
    )
    causal_only = True
    supports_memory = True
    # read by the projection options of the modern block (n_kv_heads, qk_norm, softcap) where they exist
    no_projection_reason = (
        "its q/k are feature_dim wide for the Taylor map, which QK-norm or a grouped key would change; not implemented"
    )
    no_position_reason = (
        "Based's Taylor attention sums feature maps over keys (no score per pair to bias or rotate past the window), "
        "and the paper's layers use no position inside attention"
    )

    @dataclass
    class Options:
        feature_dim: int = 16  # f: q/k width per head before the Taylor map (1 + f + f^2 features)
        window_size: int = 64  # w: keys of the exact sliding window (0 = no window: the Taylor layer alone)
        chunk_size: int = 64  # C of the chunked causal prefix sums
        eps: float = 1e-6  # added to the Taylor attention's denominator

        def __post_init__(self) -> None:
            require(isinstance(self.feature_dim, int) and self.feature_dim >= 1, "feature_dim must be an int >= 1")
            require(isinstance(self.window_size, int) and self.window_size >= 0, "window_size must be an int >= 0")
            require(isinstance(self.chunk_size, int) and self.chunk_size >= 1, "chunk_size must be an int >= 1")
            require(self.eps >= 0, f"eps must be >= 0, got {self.eps}")

    @classmethod
    def contract_options(cls) -> dict:
        return {"feature_dim": 4, "window_size": 5, "chunk_size": 4}

    @classmethod
    def contract_state(cls) -> StateContract:
        return StateContract(bound=5 - 1)  # the window's last w - 1 keys under contract_options(); exact

    def __init__(self, d_model: int, n_heads: int, **kwargs):
        super().__init__(d_model, n_heads, **kwargs)
        features = n_heads * self.options.feature_dim
        self.to_q = nn.Linear(d_model, features, bias=False)
        self.to_k = nn.Linear(d_model, features, bias=False)
        self.to_v = nn.Linear(d_model, d_model, bias=False)
        self.to_out = nn.Linear(d_model, d_model, bias=False)
        if self.options.window_size:
            self.to_q_window = nn.Linear(d_model, d_model, bias=False)
            self.to_k_window = nn.Linear(d_model, d_model, bias=False)

    def init_state(self, batch_size: int) -> BasedState:
        super().init_state(batch_size)
        return BasedState(KernelState())

    def state_bound(self) -> int:
        return max(self.options.window_size - 1, 0)

    def keys_per_query(self, t: int) -> KeysPerQuery:
        keys = dense_keys(t, True)
        return KeysPerQuery(keys.keys, "dense causal through the Taylor sums, the last window_size keys exactly")

    def taylor_inputs(self, x: Tensor, pad_mask: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
        """phi(q), phi(k) (padded keys zeroed) [b, h, t, 1 + f + f^2] and v (padded zeroed) [b, h, t, k]."""
        q, k, v = (self.split_heads(proj(x)) for proj in (self.to_q, self.to_k, self.to_v))
        phi_k, v = mask_keys(taylor_features(k), v, pad_mask)
        return taylor_features(q), phi_k, v

    def window_inputs(self, x: Tensor) -> tuple[Tensor, Tensor]:
        return self.split_heads(self.to_q_window(x)), self.split_heads(self.to_k_window(x))

    def forward(
        self, x: Tensor, *, context: Tensor | None = None, pad_mask: Tensor | None = None, state=None
    ) -> AttnOutput:
        self.check_inputs(x, context, pad_mask, state)
        if state is not None and state.sums.kv is not None and state.sums.kv.shape[0] != x.shape[0]:
            raise ValueError(f"based: the state holds batch size {state.sums.kv.shape[0]}, the input {x.shape[0]}")
        phi_q, phi_k, v = self.taylor_inputs(x, pad_mask)
        o = self.options
        sums = None if state is None else state.sums
        out, kv, z = causal_kernel_attention(phi_q, phi_k, v, o.eps, sums, chunk_size=o.chunk_size)
        new_state = (
            None if state is None else BasedState(KernelState(kv.detach(), z.detach(), seen=sums.seen + x.shape[1]))
        )
        if o.window_size:
            q, k = self.window_inputs(x)
            keys, values, valid = k, v, pad_mask
            if state is not None and state.keys is not None:
                keys, values = torch.cat([state.keys, k], 2), torch.cat([state.values, v], 2)
                valid = join_key_padding(state.valid, state.keys.shape[2], pad_mask, x)
            out = out + sliding_window(q, keys, values, valid, o.window_size)
            if state is not None:
                keep = min(o.window_size - 1, keys.shape[2])
                kept = None if valid is None else valid[:, valid.shape[1] - keep :]
                new_state.keys, new_state.values = (
                    keys[:, :, keys.shape[2] - keep :].detach(),
                    values[:, :, keys.shape[2] - keep :].detach(),
                )
                new_state.valid = kept
        return AttnOutput(self.to_out(self.merge_heads(out)), state=new_state)

    # -- context parallelism: the earlier ranks' Taylor sums and the window's halo ----------------------
    def context_refusal(self) -> str | None:
        return None

    def attend_chunk(self, x: Tensor, chunk, *, pad_mask: Tensor | None = None, state=None, **kwargs) -> AttnOutput:
        """The Taylor part reads the earlier ranks' running sums (an exclusive prefix sum over the ranks, as
        ``linear``); the window reads the last w - 1 keys and values before this rank's first position."""
        self.check_inputs(x, None, pad_mask, None)
        self.refuse_chunk_state(state)
        phi_q, phi_k, v = self.taylor_inputs(x, pad_mask)
        f, e = phi_k.shape[-1], v.shape[-1]
        sums = torch.cat([torch.einsum("bhtf,bhte->bhfe", phi_k, v).flatten(2), phi_k.sum(2)], dim=-1)
        before = chunk.sum_before(sums)
        carried = KernelState(before[..., : f * e].unflatten(-1, (f, e)), before[..., f * e :])
        o = self.options
        out, _, _ = causal_kernel_attention(phi_q, phi_k, v, o.eps, carried, chunk_size=o.chunk_size)
        if o.window_size:
            q, k = self.window_inputs(x)
            reach = o.window_size - 1
            (keys, values), _, valid = chunk.earlier(
                [k, v], dim=2, select=lambda j, start: j >= start - reach, valid=pad_mask
            )
            out = out + sliding_window(q, keys, values, valid, o.window_size)
        return AttnOutput(self.to_out(self.merge_heads(out)))
