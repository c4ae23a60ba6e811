"""Adaptive attention span: every head learns how far back it looks.

Paper: "Adaptive Attention Span in Transformers", Sukhbaatar, Grave, Bojanowski and Joulin 2019,
arXiv:1905.07799 (Section 2 the window, Section 3.1 adaptive span, Section 3.2 dynamic span).

As in the paper, the query at position t attends to the S keys before it, r = t - S ... t - 1
(S = ``max_span``), not to itself (the residual stream carries the token), with the weights of
eq. (4):

    a_tr = m_z(t - r) exp(s_tr) / sum_{q = t - S}^{t - 1} m_z(t - q) exp(s_tq),
    m_z(x) = clamp((R + z - x) / R, 0, 1)                       (the soft mask, x = distance >= 1)

so a head sees distances x <= z fully, a linear ramp of width R past z, and nothing from z + R
or past S on. Each head h learns its span z_h in [0, S]; an L1 penalty (lambda / M) sum_h z_h per
layer (``l1``) keeps spans short unless they pay for themselves, and is returned as the aux loss
``span_l1``. The dynamic variant computes the span from the current token instead,
z_t = S sigmoid(v . x_t + b), with b initialised to -4 (short spans first).

A query with no key to see (the first position of a stream, padding, or every key masked) has an
empty sum in eq. (4): its attention result is the zero vector (the layer's output there is the
output projection's bias), never NaN.

How the saving is made real: only the distances 1 ... ``reach`` = min(S, ceil(max_h z_h + R) - 1)
can carry weight. The queries are cut into blocks of ``a`` positions; block n attends to the
``a + reach`` keys that end at its last query, gathered with ``unfold`` from the (cache + segment)
keys, and the soft mask enters as log m_z added to the scores (softmax(s + log m) is exactly
eq. (4)), so the fused SDPA kernel does the work. Time and memory are O(t (a + reach)), falling as
the spans shrink; no t x s matrix exists (a dense masked version lives in the tests only). The
span gradient keeps SDPA off its fused backward (the mask is a float tensor with a gradient), so
the layer keeps only q, k, v and the spans and recomputes the band in backward
(``recompute.py``): saved activations are no larger than fused dense attention's.

State: like Transformer-XL and the paper's code, a cache of the last ``cache_size`` *inputs* of
this layer (detached) carries context across segments; keys and values of the cropped cache are
projected again with the current weights each call (in a pre-norm block the cache holds the raw
stream and the block's current LayerNorm is applied to it, see ``LayerInput``). The cache must
hold at least S past inputs, else a head could learn a span it can never see (refused at build
time). The cache and its handling live in ``span_cache.py``.

Positions: with ``relative_keys`` (the ``adaptive_span_lm`` preset sets it, with no absolute signal)
the model learns the paper's relative key embeddings p_x, one d_head vector per distance x = 1 ... S
shared by the heads, and the score becomes s_tr = (q_t . k_r + q_t . p_{t-r}) / sqrt(d_head), as in
the authors' code. With ``share_relative_keys`` (the preset's choice) one table serves every layer, as
the authors' ``TransformerSeq.key_pe``: the stack builder ties each later layer's table to the first
layer's (``share_with``), so the model holds it once (the paper configurations' parameter counts equal
the authors' model, ``tests/app/test_paper.py``), a checkpoint stores it once and ``zoo.save`` writes
it once. Without it each layer learns its own (what this module did before; older checkpoints stored
no such option and rebuild that way). The q . p term is computed over the same band as q . k and added
with log m, so it costs what q . k costs. Without relative keys the model's absolute signal is used; on
a copy from 200 characters back that made ours miss what the authors' code learns in a few hundred
steps (results/adaptive_span_range).

Positions inside attention (``zoo/position``): without ``relative_keys`` the layer takes rope (q and k
rotated at their absolute positions; the span cache knows where the stream stands) and a pair bias
(ALiBi, T5: b_h(x) for the distances x = 1 ... reach of the band, added with log m). With
``relative_keys`` it refuses them: the score already has a learned term per distance.

Deviations: (1) a table per layer unless ``share_relative_keys`` (the authors share one). (2) The
span is parameterised as in the authors' code, z = S z' with z' in [0, 1] (clamped after each
optimiser step), so Adam moves it at a useful rate; the paper writes the penalty on z.
(3) ``mode="fixed"`` (z = S for every head, no penalty) is the fixed-span baseline the paper
compares with: plain attention over the S keys before the query. (4) Causal only: the paper
defines the span for language modelling.
Notes: the authors' code applies the mask one distance later, m_z(t - r - 1) (the previous token
is always fully visible); we follow the paper's formula. Earlier versions of this module also let the
query attend to itself and the ramp run past S; that option was dropped rather than kept: the
residual stream already carries the token, and a second window shape would double the test matrix
for no paper behind it.

Shapes (legend in zoo/attention/base.py): x [b, t, d]; cache [b, m, d]; q [b, h, t, k];
keys [b, h, m' + t, k] with m' = min(m, reach); blocks: q [b, h, n, a, k], keys [b, h, n, a + r, k]
with r = reach, n = ceil(t / a); spans [h] (learned/fixed) or [b, h, t] (dynamic).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from zoo.attention.base import (
    ATTENTION,
    Attention,
    AttnOutput,
    KeysPerQuery,
    LayerInput,
    StateContract,
    join_key_padding,
    remembered,
    to_remember,
)
from zoo.attention.recompute import recompute_in_backward
from zoo.attention.span_band import (  # noqa: F401  (re-exported: the kernel's public names)
    auto_block_size,
    blocked_span_attention,
    soft_mask,
    span_reach,
)
from zoo.attention.span_cache import SpanCache, check_span_cache, next_span_cache
from zoo.config import require
from zoo.precision import float32

MODES = ("learned", "dynamic", "fixed")


@ATTENTION.register("adaptive_span")
class AdaptiveSpanAttention(Attention):
    no_packing_reason = (
        "crops keys by a learned span along the row and caches them; its span blocks are not masked by document yet"
    )
    takes_left_padding = True  # left-padded rows decode as alone (tests/contracts/test_generate.py)
    projection_features = ("qk_norm",)
    no_projection_reason = (
        "its state keeps the layer's inputs [b, m, d] and recomputes keys from them (grouping keys shrinks no "
        "cache), and its scores go through a soft span mask it never caps"
    )
    supports_memory = True  # cache of past inputs, like Transformer-XL's memory
    supports_cross = False
    causal_only = True
    remembers_inputs = True  # the cache holds past layer inputs, normalised by the block on every call
    position_kinds = ("rotary", "pair_bias")  # refused with relative_keys (position_refusal)
    memory_option = "cache_size"

    @dataclass
    class Options:
        max_span: int = 1024  # S: the longest span a head can learn (paper: 8192 for its main models)
        ramp: int = 32  # R: width of the soft mask's linear ramp (paper: 32)
        mode: str = "learned"  # learned (z per head), dynamic (z_t = S sigmoid(v.x_t + b)), fixed (z = S)
        span_init: float = 0.0  # initial z in tokens, learned mode (paper: 0)
        l1: float = 2e-6  # lambda of the span penalty (paper: 2e-6; 0.5e-6 at S = 8192)
        dynamic_bias_init: float = -4.0  # b of the dynamic span (paper: -4)
        cache_size: int = 0  # past inputs kept across calls; 0 = S (every key the window can reach)
        block_size: int = 0  # queries per block; 0 = auto (see auto_block_size)
        bias: bool = True  # bias in the q/k/v/output projections
        relative_keys: bool = False  # the paper's learned relative key embeddings p_x, x = 1 ... S (see notes)
        share_relative_keys: bool = False  # one table for every layer, as the authors' code (needs relative_keys)

        def __post_init__(self) -> None:
            require(
                isinstance(self.max_span, int) and self.max_span >= 1,
                f"max_span must be a positive int, got {self.max_span!r}",
            )
            require(isinstance(self.ramp, int) and self.ramp >= 1, f"ramp must be a positive int, got {self.ramp!r}")
            require(self.mode in MODES, f"mode must be one of {', '.join(MODES)}; got {self.mode!r}")
            require(
                0.0 <= self.span_init <= self.max_span,
                f"span_init must lie in [0, max_span={self.max_span}], got {self.span_init}",
            )
            require(self.l1 >= 0.0, f"l1 must be >= 0, got {self.l1}")
            require(self.block_size >= 0, f"block_size must be >= 0 (0 = auto), got {self.block_size}")
            require(self.cache_size >= 0, f"cache_size must be >= 0 (0 = max_span), got {self.cache_size}")
            require(
                self.relative_keys or not self.share_relative_keys,
                "share_relative_keys=true shares the relative key table, which relative_keys=false does not build",
            )
            if self.cache_size == 0:
                self.cache_size = self.max_span
            require(
                self.cache_size >= self.max_span,
                f"max_span={self.max_span} is larger than the cache (cache_size={self.cache_size}): a head could "
                "learn a span whose keys are never kept; raise cache_size to >= max_span (or 0 = max_span) or lower "
                "max_span",
            )

    @classmethod
    def contract_options(cls) -> dict:
        # spans short enough that cropping is active at every contract length, and blocks that do
        # not divide them
        return {"max_span": 16, "ramp": 4, "span_init": 3.0, "block_size": 5}

    @classmethod
    def contract_state(cls) -> StateContract:
        # the cache keeps every key the window can reach, so segments stay exact past the bound
        return StateContract(bound=16, exact_for=60)

    def __init__(self, d_model: int, n_heads: int, **kwargs):
        super().__init__(d_model, n_heads, **kwargs)
        o = self.options
        self.add_projections(bias=o.bias)
        if o.relative_keys:  # a [d_head, S] table shared by the heads, N(0, 1) as the authors' code
            self.key_position = nn.Parameter(torch.randn(self.head_dim, o.max_span))
        if o.mode == "learned":
            # z = S * z', z' in [0, 1] (the authors' parameterisation)
            self.span_param = nn.Parameter(torch.full((n_heads,), o.span_init / o.max_span))
        elif o.mode == "dynamic":
            self.span_proj = nn.Linear(d_model, n_heads)  # v and b of z_t = S sigmoid(v . x_t + b)
            nn.init.constant_(self.span_proj.bias, o.dynamic_bias_init)

    def share_with(self, first: Attention) -> None:
        """With ``share_relative_keys``, use the first layer's relative key table (one Parameter)."""
        if self.options.share_relative_keys and isinstance(first, AdaptiveSpanAttention):
            require(
                first.options.share_relative_keys and first.key_position.shape == self.key_position.shape,
                "share_relative_keys: every layer must share a table of the same shape (same max_span and heads)",
            )
            self.key_position = first.key_position

    # -- spans ---------------------------------------------------------------------------------
    def spans(self, x: Tensor) -> Tensor:
        """Spans in tokens: [h] (learned, fixed) or [b, h, t] (dynamic)."""
        return self.span_fractions(x) * self.options.max_span

    def span_fractions(self, x: Tensor) -> Tensor:
        """z / S in [0, 1]: [h] (learned, fixed) or [b, h, t] (dynamic, a view of the sigmoid's
        output, which autograd keeps anyway: the attention's recomputation keeps the same storage)."""
        o = self.options
        if o.mode == "learned":
            return self.span_param.clamp(0.0, 1.0)
        if o.mode == "fixed":
            return torch.ones(self.n_heads, device=x.device, dtype=x.dtype)
        # float32: z_t = S sigmoid(.) in tokens; a bf16 sigmoid (8 bits) would move z by up to S / 512
        with float32(x, self.span_proj.weight, self.span_proj.bias) as (x, w, b):
            return rearrange(torch.sigmoid(F.linear(x, w, b)), "b t h -> b h t")

    @torch.no_grad()
    def after_optimizer_step(self) -> None:
        """Keep z in [0, S] (the paper clamps after each update)."""
        if self.options.mode == "learned":
            self.span_param.clamp_(0.0, 1.0)

    def init_state(self, batch_size: int) -> SpanCache:
        return SpanCache()

    def position_refusal(self, position) -> str | None:
        if self.options.relative_keys:
            return (
                "relative_keys=True already scores each distance with learned relative key embeddings (q . p_x); a "
                "second relative scheme would add another term per distance. Set attention.relative_keys=false to use "
                "the position part instead"
            )
        return super().position_refusal(position)

    # -- what it sees and costs ----------------------------------------------------------------------
    def keys_per_query(self, t: int) -> KeysPerQuery:
        """At most the S keys before the query (the window; learned spans start at 0 and stay shorter)."""
        return KeysPerQuery(float(self.options.max_span), "max span (upper bound)", upper_bound=True)

    def state_bound(self) -> int:
        return self.options.cache_size  # past inputs the span cache keeps

    def carries_segment_memory(self) -> bool:
        return True  # the span cache is carried from segment to segment in training, like XL memory

    def memory_keys(self) -> int:
        """The cache keeps ``cache_size`` inputs, but only the last S can be seen: at most S keys of the
        cache are projected and kept for backward."""
        return self.options.max_span

    @property
    def score_terms(self) -> int:
        return 3 if self.options.relative_keys else 2  # q . p over the same band as q . k

    # -- forward -------------------------------------------------------------------------------
    def forward(
        self,
        x: Tensor,
        *,
        context: Tensor | None = None,
        pad_mask: Tensor | None = None,
        state: SpanCache | None = None,
        layer_input: LayerInput | None = None,
    ) -> AttnOutput:
        self.check_inputs(x, context, pad_mask, state)
        o = self.options
        b, t, _ = x.shape
        if state is not None:
            check_span_cache(state, b, self.d_model)
        fractions = self.span_fractions(x)
        spans = fractions * o.max_span
        real = pad_mask
        if spans.dim() == 3 and real is not None:  # padded tokens' spans neither crop nor pay
            spans_real = spans.detach().masked_fill(~real[:, None, :], 0.0)
        else:
            spans_real = spans.detach()
        reach = min(span_reach(float(spans_real.detach().max()), o.ramp), o.max_span)  # the paper's window is S

        # keys: the cropped cache (only the last `reach` inputs can be seen) + this segment
        past = state.x if state is not None and state.x is not None else None
        kept = 0 if past is None else min(past.shape[1], reach)
        inputs = x if kept == 0 else torch.cat([remembered(past[:, past.shape[1] - kept :], layer_input), x], dim=1)
        cached_pad = state.pad_mask if state is not None else None
        kept_pad = None if cached_pad is None else cached_pad[:, cached_pad.shape[1] - kept :]
        key_valid = join_key_padding(kept_pad, kept, pad_mask, x)
        q = self.split_heads(self.to_q(x))
        k, v = self.split_heads(self.to_k(inputs)), self.split_heads(self.to_v(inputs))
        start = state.next if state is not None else 0  # absolute position of x[:, 0]
        q = self.rotate(q, torch.arange(start, start + t, device=x.device))
        k = self.rotate(k, torch.arange(start - kept, start + t, device=x.device))
        position_bias = self.pair_bias(torch.arange(1, max(reach, 1) + 1, device=x.device), q.dtype)  # [h, reach]
        dropout = self.dropout if self.training else 0.0

        def attend(
            q: Tensor,
            k: Tensor,
            v: Tensor,
            fractions: Tensor,
            key_valid: Tensor | None,
            table: Tensor | None,
            position_bias: Tensor | None,
        ) -> Tensor:
            spans = fractions * o.max_span
            return blocked_span_attention(
                q,
                k,
                v,
                spans=spans,
                ramp=o.ramp,
                reach=reach,
                key_valid=key_valid,
                block_size=o.block_size,
                dropout=dropout,
                key_position=table,
                distance_bias=position_bias,
            )

        # the band's weights (and its blocked key copies) are recomputed in backward, not kept
        table = self.key_position if o.relative_keys else None
        out = recompute_in_backward(attend, q, k, v, fractions, key_valid, table, position_bias, stochastic=dropout > 0)
        out = self.to_out(self.merge_heads(out))

        aux, stats = {}, {}
        if o.mode != "fixed" and o.l1 > 0:
            if spans.dim() == 1:
                penalty = spans.mean()
            elif pad_mask is not None:
                weight = pad_mask[:, None, :].to(spans.dtype)
                # on the fractions, whose storage autograd keeps already (spans * weight would keep spans)
                penalty = o.max_span * (fractions * weight).sum() / (weight.sum() * self.n_heads).clamp_min(1.0)
            else:
                penalty = spans.mean()
            aux["span_l1"] = o.l1 * penalty  # (lambda / M) sum_h z_h for this layer
        with torch.no_grad():
            per_head = (
                spans
                if spans.dim() == 1
                else spans_real.sum((0, 2)) / (pad_mask.sum() if pad_mask is not None else b * t)
            )
            stats = {
                "span": per_head.detach().clone(),
                "span_mean": per_head.mean(),
                "span_max": spans_real.max().detach(),
                "span_reach": torch.tensor(float(reach)),
            }
        cache = None
        if state is not None:
            remember = to_remember(x, layer_input)
            cache = next_span_cache(past, state.pad_mask, remember, pad_mask, start + t, o.cache_size, state.store)
        return AttnOutput(out, state=cache, aux=aux, stats=stats)

    # -- context parallelism (zoo/parallel) ----------------------------------------------------------
    def context_refusal(self) -> None:
        return None  # causal only: a query reads at most ``reach`` positions back

    def current_reach(self, x: Tensor, pad_mask: Tensor | None = None) -> int:
        """The distances this call's spans can weigh (as ``forward`` crops): min(S, ceil(max z + R) - 1),
        the largest span over the real tokens for dynamic spans."""
        with torch.no_grad():
            spans = self.span_fractions(x) * self.options.max_span
            if spans.dim() == 3 and pad_mask is not None:
                spans = spans.masked_fill(~pad_mask[:, None, :], 0.0)
            return min(span_reach(float(spans.max()), self.options.ramp), self.options.max_span)

    def attend_chunk(
        self,
        x: Tensor,
        chunk,
        *,
        pad_mask: Tensor | None = None,
        state: SpanCache | None = None,
        layer_input: LayerInput | None = None,
    ) -> AttnOutput:
        """A halo of the current maximum span: this rank's queries read the sub-layer inputs of the
        ``reach`` positions before the chunk (the largest reach over the group, so every rank agrees on
        what is sent), from the earlier ranks and, where the halo runs past the sequence's start, from the
        cache of earlier segments. The cache handed on is the last ``cache_size`` inputs of [cache ; the
        whole sequence], gathered from the ranks that hold them."""
        reach = int(chunk.maximum(self.current_reach(x, pad_mask), x.device))
        start, cache = chunk.start, state if state is not None else SpanCache()

        def halo(j: Tensor, start: int) -> Tensor:
            return j >= start - reach

        (inputs,), _, valid = chunk.earlier([x], dim=1, select=halo, valid=pad_mask)
        n = inputs.shape[1] - x.shape[1]
        earlier, own = inputs[:, :n], inputs[:, n:]  # use the own part: its gradient returns what was sent
        older = min(cache.length, max(0, reach - start))  # the halo's part before the sequence
        past = earlier
        if older:
            past = torch.cat([remembered(cache.x[:, cache.length - older :], layer_input), earlier], dim=1)
        older_pad = None if cache.pad_mask is None or not older else cache.pad_mask[:, cache.length - older :]
        past_pad = join_key_padding(older_pad, older, None if valid is None else valid[:, :n], earlier)
        # next: the absolute position of this chunk's first token (a rotation counts from the stream's start)
        out = self.forward(own, pad_mask=pad_mask, state=SpanCache(past, past_pad, next=cache.next + start))
        carried = chunk.carry(to_remember(x, layer_input), pad_mask, self.options.cache_size, cache.x, cache.pad_mask)
        out.state = None if state is None else SpanCache(*carried, next=cache.next + chunk.layout.length)
        return out
