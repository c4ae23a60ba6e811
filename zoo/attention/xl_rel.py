"""Transformer-XL: relative positional attention over a segment-level memory.

Paper: "Transformer-XL: Attentive Language Models Beyond a Fixed-Length Context", Dai et al. 2019,
arXiv:1901.02860, Section 3.2 (segment-level recurrence) and 3.3 (relative positional encodings).

For a segment x of t tokens and the memory M of the m hidden states that entered this layer in
earlier segments (stop-gradient), queries come from x and keys/values from [M ; x] (s = m + t
keys). With i the absolute index of a query in [M ; x] (i = m + row), j a key index and r the
sinusoidal encoding of the distance i - j, the score is the paper's four terms

    a_ij = (q_i + u) . k_j  +  (q_i + v) . W_R r_{i-j}      (a) + (c)    (b) + (d)

with q = W_q x, k = W_k [M ; x], per-head learned biases u, v and a positional key projection W_R.

Efficient relative shift (Appendix B): (q_i + v) . W_R r is computed against the distances in
descending order (one matmul), then a pad-and-reshape turns row i's "distance order" into "key
order" in O(t * s) copies: no loop over rows, no gather of a [t, s] index. ``rel_shift`` is
also correct for negative distances (the bidirectional use) when given the t - 1 extra columns.

How it is run (speed on CPU): queries go in blocks of ``block_size``. Each block's positional
term (b)+(d) is one matmul against the distances it needs, shifted, and joined to the content
term: without gradients it is passed as an additive float mask (with the causal/padding -inf)
to ``scaled_dot_product_attention(q + u, k, v)``, whose fused kernel then runs; with gradients
SDPA would fall back to its unfused path (it cannot differentiate a float mask), so the block's
scores are written out and the shifted term is added in place. Blocks keep each [c, n] tile in
cache and let causal blocks skip the keys after their last query (a quarter of the work when
m = t). Measured here at t = m = 1,024, 4 heads x 64, forward + backward, 2 threads: one unblocked
bias through SDPA 220 ms, blocks of 256 105 ms, plain causal SDPA without the positional term 72 ms.

Memory (``XLMemory``): the layer's input hidden states of the last ``mem_len`` positions,
detached, plus their padding mask. In a pre-norm block (TrXL-I, GTrXL) the memory holds the raw
residual stream and the block's current LayerNorm is applied to it on every call, the paper's
LayerNorm([StopGrad(M), E]) (Parisotto et al. 2019): the norm gets gradient through memory
positions and never normalises with stale weights (``LayerInput`` in attention/state.py).
``eval_mem_len`` (> 0) keeps a longer memory in eval mode: the paper trains with attention length
784 and evaluates with 3,800 on enwik8. Every call returns the memory (bounded by mem_len), so
``model(tokens, state=out.state)`` continues a stream segment by segment or token by token. The memory
and its handling live in ``xl_memory.py``.

Reference-code options: ``same_length`` (every released eval script) gives each query the last L =
memory-length keys up to and including itself (i - L < j <= i), the same number for every query;
``clamp_len`` (> 0) makes every distance past it use r_{clamp_len}; ``share_biases`` ties one (u, v)
pair across layers (the paper's and ``MemTransformerLM.r_w_bias / r_r_bias``; the stack builder ties them
through ``share_with``), else each layer has its own. W_R belongs to each layer, as in both. No bias in
the projections (as the reference code). Projected positional keys are cached while gradients are off
and the weights are unchanged (generation and evaluation re-use them every step).

Shapes: x [b, t, d]; memory [b, m, d]; pad_mask [b, t] (True = real); heads h of size k = d / h.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
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
    causal_allowed,
    guard_empty_rows,
    join_key_padding,
    remembered,
    to_remember,
)
from zoo.attention.xl_memory import XLMemory, XLMemoryKeeper
from zoo.config import require
from zoo.position.base import sinusoid_table


def rel_shift(scores: Tensor, n_keys: int) -> Tensor:
    """Turn distance-ordered positional scores into key-ordered ones.

    ``scores`` [..., c, L]: row r (a query) against distances D, D - 1, ..., D - L + 1 (column p is
    distance D - p), where D is the distance from the LAST row to key 0. Returns [..., c, n_keys]
    whose (r, j) entry is the score of row r at distance (D - (c - 1 - r)) - j, i.e. row r sits
    c - 1 - r positions before the last row. Requires L >= n_keys + c - 1 for every entry to be
    exact; with L = n_keys (causal use) the entries with j beyond row r's own position wrap
    around and must be masked (they are the future).

    The trick (Dai et al. 2019, Appendix B): left-pad one zero column, read the [c, L + 1] buffer
    as a flat array, drop its first c entries and read it back as [c, L]: row r moves left by
    c - 1 - r columns."""
    *lead, c, width = scores.shape
    flat = F.pad(scores, (1, 0)).flatten(-2)  # [..., c * (L + 1)]
    shifted = flat[..., c:].view(*lead, c, width)
    return shifted[..., :n_keys]


@ATTENTION.register("xl_rel")
class XLRelativeAttention(XLMemoryKeeper, Attention):
    no_packing_reason = "carries segment memory and its relative-shift scores are not masked by document yet"
    takes_left_padding = True  # relative distances; the memory keeps its padding mask
    no_projection_reason = (
        "its keys and values come from one fused projection of remembered layer inputs, scored with relative "
        "terms (Dai et al. 2019); the shared projection options are not wired into it"
    )
    supports_memory = True  # segment-level recurrence
    supports_cross = False  # keys come from [memory ; x]; relative positions need one timeline
    remembers_inputs = True  # memory = past layer inputs, normalised by the block on every call
    score_terms = 3  # (a) + (c) against the keys, (b) + (d) against W_R r, and the weighted values
    no_position_reason = "it scores distances itself (Dai et al.'s terms (b) + (d) over r_{i-j}); use position=none"
    memory_option = "mem_len"

    @dataclass
    class Options:
        mem_len: int = 512  # hidden states kept per layer for the next segment (0 = no memory)
        eval_mem_len: int = 0  # memory kept in eval mode (0 = mem_len); longer evaluation context
        clamp_len: int = 0  # distances beyond this share r_{clamp_len} (0 = no clamping)
        block_size: int = 128  # queries per block of the computation (speed only, not maths)
        same_length: bool = False  # every query sees the last memory-length keys up to itself (reference's eval)
        share_biases: bool = False  # one u, v pair for every layer, as the paper and the reference code

        def __post_init__(self) -> None:
            require(
                isinstance(self.mem_len, int) and self.mem_len >= 0,
                f"mem_len must be an int >= 0 (0 = no memory), got {self.mem_len!r}",
            )
            require(
                isinstance(self.eval_mem_len, int) and self.eval_mem_len >= 0,
                f"eval_mem_len must be an int >= 0 (0 = same as mem_len), got {self.eval_mem_len!r}",
            )
            require(
                isinstance(self.clamp_len, int) and self.clamp_len >= 0,
                f"clamp_len must be an int >= 0 (0 = no clamping), got {self.clamp_len!r}",
            )
            require(
                isinstance(self.block_size, int) and self.block_size > 0,
                f"block_size must be a positive int, got {self.block_size!r}",
            )

    @classmethod
    def contract_options(cls) -> dict:
        return {"mem_len": 40, "block_size": 8}  # blocks smaller than the test lengths

    @classmethod
    def contract_state(cls) -> StateContract:
        # exact while every earlier token is still in the memory when a segment starts
        return StateContract(bound=40, exact_for=40)

    def __init__(self, d_model: int, n_heads: int, **kwargs):
        super().__init__(d_model, n_heads, **kwargs)
        self.to_qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.to_r = nn.Linear(d_model, d_model, bias=False)  # W_R: positional keys
        self.to_out = nn.Linear(d_model, d_model, bias=False)
        self.u = nn.Parameter(torch.randn(n_heads, self.head_dim) * 0.02)  # global content bias
        self.v = nn.Parameter(torch.randn(n_heads, self.head_dim) * 0.02)  # global position bias
        self._r_cache: tuple | None = None

    def share_with(self, first: Attention) -> None:
        """With ``share_biases``, use the first layer's u and v (one pair of Parameters for the model)."""
        if self.options.share_biases and isinstance(first, XLRelativeAttention) and first.options.share_biases:
            self.u, self.v = first.u, first.v

    # -- memory ------------------------------------------------------------------------------
    def init_state(self, batch_size: int) -> XLMemory:
        return XLMemory()

    def state_bound(self) -> int:
        """Past inputs the memory keeps: mem_len in training, eval_mem_len (when set) in eval mode."""
        return self.options.eval_mem_len if not self.training and self.options.eval_mem_len else self.options.mem_len

    def carries_segment_memory(self) -> bool:
        return True  # segment-level recurrence: training carries the memory from segment to segment

    def memory_keys(self) -> int:
        return self.options.mem_len  # training keeps mem_len states; eval_mem_len is evaluation's

    def keys_per_query(self, t: int) -> KeysPerQuery:
        mem = self.memory_keys()
        own = (t + 1) / 2 if self.causal else float(t)
        return KeysPerQuery(mem + own, f"memory {mem} + {'causal ' if self.causal else ''}segment")

    @contextlib.contextmanager
    def evaluation_memory(self, mem_len: int = 0, clamp_len: int = 0, same_length: bool = False) -> Iterator[bool]:
        """The paper's evaluation settings for a ``with`` block: ``eval_mem_len``, ``clamp_len`` and
        ``same_length`` (0 / False leaves one alone), restored afterwards; the positional-key table is rebuilt
        for the clamp."""
        for key, value in (("mem_len", mem_len), ("clamp_len", clamp_len)):
            require(isinstance(value, int) and value >= 0, f"xl_rel: evaluation {key} must be an int >= 0, got {value}")
        saved = (self.options.eval_mem_len, self.options.clamp_len, self.options.same_length)
        try:
            if mem_len:
                self.options.eval_mem_len = mem_len
            if clamp_len:
                self.options.clamp_len = clamp_len
            if same_length:
                self.options.same_length = True
            self._r_cache = None  # relative embeddings depend on clamp_len
            yield bool(mem_len or clamp_len or same_length)
        finally:
            self.options.eval_mem_len, self.options.clamp_len, self.options.same_length = saved
            self._r_cache = None

    # -- positional keys ---------------------------------------------------------------------
    def _positional_keys(self, top: int, width: int, device: torch.device, dtype: torch.dtype) -> Tensor:
        """W_R r for the distances top, top - 1, ..., top - width + 1 -> [h, width, k]."""
        if torch.is_grad_enabled() and self.to_r.weight.requires_grad:
            return self._project_r(torch.arange(top, top - width, -1, device=device), dtype)
        # no graph needed: reuse the table while the weights are unchanged (decoding, evaluation)
        w = self.to_r.weight
        key = (device, dtype, w.data_ptr(), w._version)
        cached = self._r_cache
        if (
            cached is None
            or cached[0] != key
            or cached[1] < top
            or cached[1] - cached[2].shape[1] + 1 > top - width + 1
        ):
            hi, lo = max(top, 2 * top), min(top - width + 1, 0)  # room to grow: a stream's distances rise
            self._r_cache = cached = (key, hi, self._project_r(torch.arange(hi, lo - 1, -1, device=device), dtype))
        start = cached[1] - top
        return cached[2][:, start : start + width]

    def _project_r(self, distances: Tensor, dtype: torch.dtype) -> Tensor:
        if self.options.clamp_len:
            distances = distances.clamp(-self.options.clamp_len, self.options.clamp_len)
        r = sinusoid_table(distances, self.d_model, dtype=dtype)  # [width, d], computed in float64
        return rearrange(self.to_r(r), "w (h k) -> h w k", h=self.n_heads)

    # -- forward -----------------------------------------------------------------------------
    def forward(
        self,
        x: Tensor,
        *,
        context: Tensor | None = None,
        pad_mask: Tensor | None = None,
        state: XLMemory | None = None,
        layer_input: LayerInput | None = None,
    ) -> AttnOutput:
        self.check_inputs(x, context, pad_mask, state)
        b, t, _ = x.shape
        memory = state if state is not None else XLMemory()
        self._check_memory(memory, x)
        m = memory.length
        keys_in = x if m == 0 else torch.cat([remembered(memory.states, layer_input), x], dim=1)  # [b, s, d]
        stored = keys_in  # what the next memory keeps: the raw stream when the block gave it
        if layer_input is not None:
            raw_in = to_remember(x, layer_input)
            stored = raw_in if m == 0 else torch.cat([memory.states, raw_in], dim=1)
        key_pad = join_key_padding(memory.pad_mask, m, pad_mask, x)  # [b, s] or None
        s = m + t

        q = self.split_heads(self.to_q(x))  # [b, h, t, k]
        norm_version = layer_input.version if layer_input is not None else ()
        k, v, cache = self._keys_values(x, keys_in, memory, norm_version)  # [b, h, s, k]
        scale = self.head_dim**-0.5
        q_content = q + self.u[:, None, :]  # (a) + (c): one dot product with k
        q_position = (q + self.v[:, None, :]) * scale  # (b) + (d): against W_R r; SDPA scales only (a)+(c)
        # distances: query row i sits at m + i, so the largest is m + t - 1 (last query, key 0);
        # the smallest is 0 (causal) or -(t - 1) (first query, last key: bidirectional)
        width_all = s if self.causal else s + t - 1
        r_keys = self._positional_keys(s - 1, width_all, x.device, q.dtype)  # [h, width_all, k]

        with_grad = torch.is_grad_enabled()
        window = m if self.options.same_length and self.memory_length else None  # key index of the first query
        outs = []
        for i0 in range(0, t, self.options.block_size):
            i1 = min(t, i0 + self.options.block_size)
            c = i1 - i0
            n = m + i1 if self.causal else s  # causal: keys after the block's last query are never seen
            width = n if self.causal else n + c - 1
            first = t - i1  # the block's largest distance, m + i1 - 1, sits at this column of r_keys
            position = q_position[:, :, i0:i1] @ r_keys[:, first : first + width].transpose(-1, -2)  # [b, h, c, width]
            bias = rel_shift(position, n)  # [b, h, c, n], a view into a fresh buffer
            allowed = self._allowed(c, n, key_pad, x.device, window=None if window is None else window + i0)
            if with_grad:
                # SDPA cannot return the gradient of a float mask, so it would fall back to its
                # unfused path anyway; written out, the positional scores are added in place
                scores = (q_content[:, :, i0:i1] * scale) @ k[:, :, :n].transpose(-1, -2)
                scores = scores.add_(bias)
                if allowed is not None:
                    scores = scores.masked_fill_(~allowed, float("-inf"))
                weights = F.dropout(torch.softmax(scores, dim=-1), self.dropout, self.training)
                outs.append(weights @ v[:, :, :n])
            else:  # no graph: the fused kernel takes the additive float mask
                if allowed is not None:  # in place: the buffer is ours
                    bias = bias.masked_fill_(~allowed, float("-inf"))
                outs.append(
                    F.scaled_dot_product_attention(
                        q_content[:, :, i0:i1],
                        k[:, :, :n],
                        v[:, :, :n],
                        attn_mask=bias,
                        dropout_p=self.dropout if self.training else 0.0,
                    )
                )
        out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)
        return AttnOutput(self.to_out(self.merge_heads(out)), state=self._next_memory(stored, key_pad, cache))

    # -- context parallelism (zoo/parallel) ----------------------------------------------------------
    def context_refusal(self) -> str | None:
        if not self.causal:
            return "attention 'xl_rel' is bidirectional here: its queries read later chunks"
        return None

    def attend_chunk(
        self,
        x: Tensor,
        chunk,
        *,
        pad_mask: Tensor | None = None,
        state: XLMemory | None = None,
        layer_input: LayerInput | None = None,
    ) -> AttnOutput:
        """Within a segment XL is dense: this rank's queries read every earlier position of the segment
        and the memory of earlier segments. The earlier ranks' sub-layer inputs (with their gradient) join
        the memory, normalised with today's weights as ``forward`` does, and ``forward`` runs this rank's
        queries over [memory ; earlier ranks ; own] with the relative distances of that one timeline. The
        next segment's memory is the last ``mem_len`` inputs of [memory ; the whole segment], gathered
        from the ranks that hold them. Keys kept grow with the position in the segment (dense attention):
        the last rank holds the whole segment's inputs."""
        memory = state if state is not None else XLMemory()
        self._check_memory(memory, x)

        def every(j: Tensor, start: int) -> Tensor:
            return torch.ones_like(j, dtype=torch.bool)

        (inputs,), _, valid = chunk.earlier([x], dim=1, select=every, valid=pad_mask)
        n = inputs.shape[1] - x.shape[1]
        earlier, own = inputs[:, :n], inputs[:, n:]  # use the own part: its gradient returns what was sent
        states = earlier if memory.length == 0 else torch.cat([remembered(memory.states, layer_input), earlier], 1)
        pads = join_key_padding(memory.pad_mask, memory.length, None if valid is None else valid[:, :n], earlier)
        out = self.forward(own, pad_mask=pad_mask, state=XLMemory(states, pads))
        states, pads = chunk.carry(
            to_remember(x, layer_input), pad_mask, self.memory_length, memory.states, memory.pad_mask
        )
        out.state = XLMemory(states, pads)
        return out

    def to_q(self, x: Tensor) -> Tensor:
        return F.linear(x, self.to_qkv.weight[: self.d_model])

    def to_kv(self, keys_in: Tensor) -> tuple[Tensor, Tensor]:
        return F.linear(keys_in, self.to_qkv.weight[self.d_model :]).chunk(2, dim=-1)

    def _allowed(
        self, c: int, n: int, key_pad: Tensor | None, device: torch.device, window: int | None = None
    ) -> Tensor | None:
        """bool [b or 1, 1, c, n]: the block's last query is the last of the n keys when causal. ``window``
        (same_length): the block's first query sits at key index ``window``; each query keeps only the
        last memory-length keys up to itself."""
        allowed = causal_allowed(c, n, device)[None, None] if self.causal else None
        if window is not None:
            length = self.memory_length
            query = torch.arange(window, window + c, device=device)[:, None]
            recent = torch.arange(n, device=device)[None, :] > query - length  # key j > i - L
            allowed = recent[None, None] if allowed is None else allowed & recent
        if key_pad is not None:
            pad = key_pad[:, None, None, :n]
            allowed = pad if allowed is None else allowed & pad
            allowed = guard_empty_rows(allowed)
        return allowed


def set_eval_memory(model: nn.Module, eval_mem_len: int) -> int:
    """Set ``eval_mem_len`` of every xl_rel attention in ``model`` (a longer evaluation context
    than training, Dai et al. 2019, Section 4.1); returns how many layers were changed."""
    require(
        isinstance(eval_mem_len, int) and eval_mem_len >= 0, f"eval_mem_len must be an int >= 0, got {eval_mem_len!r}"
    )
    layers = [module for module in model.modules() if isinstance(module, XLRelativeAttention)]
    for module in layers:
        module.options.eval_mem_len = eval_mem_len
    return len(layers)
