"""Synthesizer: attention weights synthesized from each token alone (dense) or learned outright (random).

Paper: "Synthesizer: Rethinking Self-Attention in Transformer Models", Tay, Bahri, Metzler, Juan, Zhao,
Zheng 2020, arXiv:2005.00743, Section 3 (eqs. 1-6).

Per head, with l = ``max_len`` and the values G(X) = X W_v:

- ``dense``: B_i = W_2 relu(W_1 x_i + b_1) + b_2 in R^l, the row of scores of token i (eq. 1);
- ``random``: B = R, a learned l x l matrix, the same for every input (eq. 3); ``fixed_random`` keeps
  it at its initial draw (the paper's "fixed random");
- ``factorized_dense``: a = ``factors``, b = l / a; A_i = F_A(x_i) in R^a, B_i = F_B(x_i) in R^b and the
  row C_i = H_A(A_i) * H_B(B_i) (eq. 5), H_A tiling A b times and H_B repeating each entry of B a times;
- ``factorized_random``: R = R_1 R_2^T with R_1, R_2 in R^{l x k}, k = ``factors`` (eq. 6);

then Y = softmax(B[:t, :t]) G(X) (``max_len`` left 0 is the model's max_len). ``mix="dot"`` mixes in
dot-product attention (the paper's mixture of synthesizers, Section 3.3): Y = softmax(a_1 B + a_2 Q K^T /
sqrt(k)) G(X) with learned (a_1, a_2) = softmax of two logits per head, so they sum to one.

Cost: the scores are t x t, as in the paper (the synthesizer removes the query-key products, not the
t x t map; only the factorized forms store fewer parameters). A sequence longer than l is refused.

Causal (the paper's LM and MT decoders): scores above the diagonal are masked before the softmax.
Padding: padded keys are masked.

Positions inside attention: a pair bias b_h(i - j) is added to every score (synthesized, learned or
mixed); rope rotates the queries and keys of the ``mix="dot"`` term, the only query-key product here
(without it there is nothing to rotate: refused, saying so).

Streaming (causal): row i of the scores needs only token i (dense forms) or nothing (random forms) and
the columns j <= i, so a stream continues exactly from a cache of every earlier value (and key, with
``mix="dot"``) and where it stands (:class:`SynthesizerCache`); the row width l caps the stream at l tokens.

Shapes: x [b, t, d] -> v [b, h, t, k]; scores [b or 1, h, t, s] (s = keys: cached + t) -> out [b, t, d].

Deviations: W_1 (d -> d) is shared by the heads and W_2 maps to h x l (one score row per head); the
paper's equations are per head. The exact tiling order of eq. 5 is not spelled out; ours is the one
above.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from einops import rearrange, repeat
from torch import Tensor, nn

from zoo.attention.base import (
    ATTENTION,
    Attention,
    AttnOutput,
    KeysPerQuery,
    StateContract,
    dense_keys,
    guard_empty_rows,
    require_length,
)
from zoo.config import require

SYNTHESES = ("dense", "random", "factorized_dense", "factorized_random")
MIXES = ("none", "dot")


@dataclass
class SynthesizerCache:
    """A causal stream's past: values v [b, h, s, k], keys k (``mix="dot"``, rotated) or None, which of
    them are real (valid [b, s] or None: all), and ``next``, the position of the next token."""

    v: Tensor | None = None
    k: Tensor | None = None
    valid: Tensor | None = None
    next: int = 0

    @property
    def length(self) -> int:
        return 0 if self.v is None else self.v.shape[2]


def joined(old: Tensor | None, new: Tensor) -> Tensor:
    return new if old is None else torch.cat([old, new], dim=2)


@ATTENTION.register("synthesizer")
class SynthesizerAttention(Attention):
    no_packing_reason = "synthesises score rows over the row's absolute positions, not each document's"
    no_projection_reason = (
        "its scores are synthesized per position from a network (Tay et al. 2020), with no keys to group or normalise"
    )
    position_kinds = ("rotary", "pair_bias")  # rope: the mix="dot" term's q and k; a bias: every score
    supports_memory = True  # causal: every earlier value (and key), at most max_len of them
    length_option = "max_len"
    lra_row = "Synthesizer"

    def context_refusal(self) -> str:
        return (
            "attention 'synthesizer' gives each query a score row over every position (synthesized or learned), "
            "dense over the values: a chunk would read every earlier value, which is not written"
        )

    @dataclass
    class Options:
        synthesis: str = "dense"  # dense | random | factorized_dense | factorized_random
        mix: str = "none"  # none | dot (mixed with dot-product attention)
        max_len: int = 0  # l, the longest sequence (the width of a score row); 0 = the model's max_len
        factors: int = 8  # factorized_dense: a (l divisible by it); factorized_random: the rank k
        fixed_random: bool = False  # random forms: keep R at its initial draw (not trained)
        bias: bool = True  # bias in the projections

        def __post_init__(self) -> None:
            require(
                self.synthesis in SYNTHESES, f"synthesis must be one of {', '.join(SYNTHESES)}; got {self.synthesis!r}"
            )
            require(self.mix in MIXES, f"mix must be one of {', '.join(MIXES)}; got {self.mix!r}")
            require(self.max_len >= 0, f"max_len must be >= 0 (0 = the model's max_len), got {self.max_len}")
            require(self.factors >= 1, f"factors must be >= 1, got {self.factors}")
            require(
                self.synthesis != "factorized_dense" or self.max_len % self.factors == 0,
                "factorized_dense needs max_len divisible by factors (a x b = l); "
                f"got {self.max_len} and {self.factors}",
            )
            require(
                not self.fixed_random or "random" in self.synthesis,
                f"fixed_random applies to the random syntheses; synthesis is {self.synthesis!r}",
            )

    @classmethod
    def contract_options(cls) -> dict:
        return {"max_len": 96, "mix": "dot"}

    @classmethod
    def contract_state(cls) -> StateContract:
        return StateContract(bound=None)  # every earlier value: the receptive field is the whole (<= l) stream

    def position_refusal(self, position) -> str | None:
        if position.rotary and self.options.mix != "dot":
            return (
                f"synthesis={self.options.synthesis!r} with mix='none' forms no query-key dot product: each row of "
                "scores is synthesized from its token alone (dense) or learned outright (random), so there is no q "
                "and k to rotate; mix='dot' adds Q K^T, which rope then rotates"
            )
        return super().position_refusal(position)

    def init_state(self, batch_size: int) -> SynthesizerCache:
        super().init_state(batch_size)  # a bidirectional layer refuses, saying why
        return SynthesizerCache()

    def __init__(self, d_model: int, n_heads: int, **kwargs):
        super().__init__(d_model, n_heads, **kwargs)
        o, h, d, width = self.options, n_heads, d_model, self.options.max_len
        require_length(width, "synthesizer")
        self.to_v = nn.Linear(d, d, bias=o.bias)
        self.to_out = nn.Linear(d, d, bias=o.bias)
        if o.synthesis == "dense":
            self.hidden = nn.Linear(d, d, bias=o.bias)
            self.rows = nn.Linear(d, h * width, bias=o.bias)
        elif o.synthesis == "factorized_dense":
            self.hidden = nn.Linear(d, d, bias=o.bias)
            self.rows_a = nn.Linear(d, h * o.factors, bias=o.bias)
            self.rows_b = nn.Linear(d, h * (width // o.factors), bias=o.bias)
        elif o.synthesis == "random":
            self.random = nn.Parameter(torch.randn(h, width, width), requires_grad=not o.fixed_random)
        else:
            scale = o.factors**-0.25  # R_1 R_2^T entries of unit variance
            self.random_1 = nn.Parameter(torch.randn(h, width, o.factors) * scale, requires_grad=not o.fixed_random)
            self.random_2 = nn.Parameter(torch.randn(h, width, o.factors) * scale, requires_grad=not o.fixed_random)
        if o.mix == "dot":
            self.to_q = nn.Linear(d, d, bias=o.bias)
            self.to_k = nn.Linear(d, d, bias=o.bias)
            self.mix_logits = nn.Parameter(torch.zeros(h, 2))  # (a_1, a_2) = softmax: an even mixture at first
        self.score_terms = 2 if o.mix == "dot" else 1  # score products per key: (Q K^T) and A V, or A V alone

    def keys_per_query(self, t: int) -> KeysPerQuery:
        return dense_keys(t, self.causal)

    def synthesized(self, x: Tensor, start: int = 0) -> Tensor:
        """The synthesized scores B[start:end, :end] of the tokens x [b, t, d] at positions start ... end - 1:
        [b, h, t, end] (dense forms) or [1, h, t, end] (random forms)."""
        o, end, h = self.options, start + x.shape[1], self.n_heads
        if o.synthesis == "dense":
            rows = self.rows(F.relu(self.hidden(x)))
            return rearrange(rows, "b t (h l) -> b h t l", h=h)[..., :end]
        if o.synthesis == "factorized_dense":
            hidden = F.relu(self.hidden(x))
            a = rearrange(self.rows_a(hidden), "b t (h a) -> b h t a", h=h)
            b = rearrange(self.rows_b(hidden), "b t (h c) -> b h t c", h=h)
            tiled = repeat(a, "b h t a -> b h t (c a)", c=b.shape[-1])  # H_A: A tiled b times
            spread = repeat(b, "b h t c -> b h t (c a)", a=a.shape[-1])  # H_B: each entry of B a times
            return (tiled * spread)[..., :end]
        if o.synthesis == "random":
            return self.random[None, :, start:end, :end]
        return torch.einsum("hik,hjk->hij", self.random_1[:, start:end], self.random_2[:, :end])[None]

    def forward(
        self, x: Tensor, *, context: Tensor | None = None, pad_mask: Tensor | None = None, state=None
    ) -> AttnOutput:
        self.check_inputs(x, context, pad_mask, state)
        start = state.next if state is not None else 0
        t, width = x.shape[1], self.options.max_len
        end = start + t
        require(
            end <= width, f"synthesizer: sequence length {end} is longer than max_len={width}, the width of its rows"
        )
        positions = torch.arange(start, end, device=x.device)
        v = self.split_heads(self.to_v(x))
        scores = self.synthesized(x, start)
        k = None
        if self.options.mix == "dot":
            q, k = (self.rotate(self.split_heads(p(x)), positions) for p in (self.to_q, self.to_k))  # rope, if any
            keys = joined(state.k if state is not None else None, k)
            weights = torch.softmax(self.mix_logits, dim=-1)[None, :, :, None, None]  # [1, h, 2, 1, 1]
            dot = q @ keys.transpose(-1, -2) * self.head_dim**-0.5
            scores = weights[:, :, 0] * scores + weights[:, :, 1] * dot
        distance = positions[:, None] - torch.arange(end, device=x.device)[None, :]  # [t, s]
        bias = self.pair_bias(distance, scores.dtype)
        if bias is not None:
            scores = scores + bias
        allowed = (distance >= 0)[None, None] if self.causal else torch.ones(1, 1, t, end, dtype=torch.bool)
        allowed = allowed.to(x.device)
        valid = pad_mask
        if state is not None and (state.valid is not None or pad_mask is not None):
            old = (
                torch.ones(x.shape[0], start, dtype=torch.bool, device=x.device) if state.valid is None else state.valid
            )
            valid = torch.cat([old, torch.ones_like(x[..., 0], dtype=torch.bool) if pad_mask is None else pad_mask], 1)
        if valid is not None:
            allowed = allowed & valid[:, None, None, :]
        has_key = allowed.any(-1, keepdim=True)  # a row with no real key outputs 0, never NaN
        probs = torch.softmax(scores.masked_fill(~guard_empty_rows(allowed), float("-inf")), dim=-1) * has_key
        if self.training and self.dropout:
            probs = F.dropout(probs, self.dropout)
        values = joined(state.v if state is not None else None, v)
        new_state = None
        if state is not None:
            cached_keys = None if k is None else keys.detach()
            new_state = SynthesizerCache(values.detach(), cached_keys, None if valid is None else valid.detach(), end)
        return AttnOutput(self.to_out(self.merge_heads(probs @ values)), state=new_state)
