"""Local self-attention in 1D and 2D query blocks.

Paper: "Image Transformer", Parmar, Vaswani, Uszkoreit, Kaiser, Shazeer, Ku, Tran 2018,
arXiv:1802.05751, Section 3.2 (local self-attention) and Figure 2.

- ``local_1d``: the sequence (an image in raster order) is cut into non-overlapping query blocks
  of length ``block`` (l_q). Each block attends to a memory block made of its own positions and
  the ``memory`` (l_m) positions before it. Query i in block q = floor(i / l_q) sees
  A(i) = {j : q * l_q - l_m <= j <= i} when causal, {j : q * l_q - l_m <= j < (q + 1) * l_q}
  when not (the paper's memory block without the causal mask).
- ``local_2d``: the sequence is a raster of ``width`` columns (and ``height`` rows, when given).
  It is cut into rectangular query blocks of ``query_height`` x ``query_width``; each block's
  memory extends ``flange_height`` rows up and ``flange_width`` columns left and right of it:
  rows [R * q_h - f_h, (R + 1) * q_h), columns [C * q_w - f_w, (C + 1) * q_w + f_w). Causal
  masking keeps the memory positions that precede the query in the sequence (raster) order.

Computation is blocked: a block's memory is gathered once (neighbouring 1D blocks; an unfolded
2D window), and one fused SDPA runs over all blocks with a mask that is static except at the
image's borders, so time and memory grow linearly with the length; no t x t tensor is formed.
A length that does not fill the last block is padded and the pad masked.

Deviations: the paper generates an image in the order of its query blocks (raster order inside
each block); our sequences stay in plain raster order, so the causal mask is "precedes in raster
order", which keeps a causal LM over the raster exact. Memory positions to the right of the query
block in the rows above it are therefore visible, those on the query's own row and below are
not. Channels are not special: an RGB image enters as a raster of width 3 * W, as in the paper.
With ``height`` = 0 any number of rows is accepted (the last one may be partial). When
``height`` is set, a bidirectional layer needs exactly height * width positions and a causal one
accepts a raster prefix (for generation, or text fed to an image preset: said once in the log) and
computes only the rows the prefix covers, padded to whole query-block rows; anything longer is
refused.
"""

from __future__ import annotations

import functools
import logging
import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor

from zoo.attention.base import ATTENTION, KeysPerQuery, StateContract, at_most_segment
from zoo.attention.blocked import (
    PatternAttention,
    attend_groups,
    banded_attention,
    key_validity,
    pad_time,
    padded_length,
)
from zoo.attention.flex import check_backend
from zoo.config import build_options, require

log = logging.getLogger(__name__)


@ATTENTION.register("local_1d")
class Local1DAttention(PatternAttention):
    """Local 1D attention, optionally with attention sinks: ``sinks`` = k makes the first k positions
    visible to every query besides its window (Xiao et al. 2023, "Efficient Streaming Language Models
    with Attention Sinks", arXiv:2309.17453: a window model keeps its perplexity over long streams when
    the first tokens, where softmax parks its surplus attention, stay visible). Sinks add no weights:
    a model trained with them streams exactly as it was trained; set on a model trained without them
    they change what it sees (the paper's "added at inference" use). The stream keeps the sinks and
    the window's most recent keys: at most k + l_m + l_q - 1 keys, however long the stream."""

    no_left_padding_reason = (
        "lays its query blocks out by absolute position in the stream, so left padding moves a row's block "
        "boundaries and the keys each query sees"
    )

    lra_row = "Local Attention"

    @dataclass
    class Options:
        block: int = 128  # l_q, query block length
        memory: int = 128  # l_m, positions before the query block that it also attends to
        sinks: int = 0  # the first positions every query also sees (attention sinks); 0 = none
        bias: bool = True  # bias in the q/k/v/output projections
        backend: str = (
            "auto"  # auto (FlexAttention on CUDA) | native (blocked SDPA) | flex (FlexAttention; CPU: forward only)
        )

        def __post_init__(self) -> None:
            check_backend(self.backend, "backend")
            require(isinstance(self.block, int) and self.block >= 1, f"block must be an int >= 1, got {self.block!r}")
            require(
                isinstance(self.memory, int) and self.memory >= 0, f"memory must be an int >= 0, got {self.memory!r}"
            )
            require(isinstance(self.sinks, int) and self.sinks >= 0, f"sinks must be an int >= 0, got {self.sinks!r}")

    @classmethod
    def contract_options(cls) -> dict:
        return {"block": 4, "memory": 6}

    @classmethod
    def contract_state(cls) -> StateContract:
        return StateContract(bound=6 + 4 - 1)  # l_m + l_q - 1 under contract_options(); exact at any length

    def keys_per_query(self, t: int) -> KeysPerQuery:
        block, memory = self.options.block, self.options.memory
        keys = block / 2 + memory if self.causal else float(block + memory)
        rule = "query block + memory block" + (f" + {self.sinks} sinks" if self.sinks else "")
        return KeysPerQuery(at_most_segment(keys + self.sinks, t, self.causal), rule, upper_bound=bool(self.sinks))

    @property
    def sinks(self) -> int:
        return self.options.sinks

    def state_bound(self) -> int:
        """A query at i >= o sees keys from (o // l_q) l_q - l_m on: at most l_m + l_q - 1 earlier keys."""
        return self.options.sinks + self.options.memory + self.options.block - 1

    def shift_period(self) -> int | None:
        return None if self.sinks else self.options.block  # windows are block-aligned; sinks are absolute

    def allowed(self, i: Tensor, j: Tensor) -> Tensor:
        """The query's memory block and its own block (up to itself when causal), and the sinks."""
        block = i // self.options.block
        window = j >= block * self.options.block - self.options.memory
        window = window & (j <= i if self.causal else j < (block + 1) * self.options.block)
        sinks = j < self.options.sinks
        return window | (sinks & (j <= i) if self.causal else sinks)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, pad_mask: Tensor | None = None) -> Tensor:
        """q, k, v [b, h, t, k] -> [b, h, t, k]."""
        t = q.shape[2]
        block, memory = self.options.block, self.options.memory
        length = padded_length(t, block)
        valid = key_validity(pad_mask, t, length, q.device)
        causal = self.causal

        def allowed(qi: Tensor, d: Tensor) -> Tensor:  # d: key position - block start
            inside = d >= -memory
            return inside & (d <= qi) if causal else inside

        out = banded_attention(
            q,
            k,
            v,
            valid,
            block=block,
            before=math.ceil(memory / block),
            after=0,
            allowed=allowed,
            dropout=self.attn_dropout,
            shared=self.sink_keys(k, v, valid) if self.sinks else None,
            bias=(lambda distance: self.distance_bias(distance, q.dtype)) if self.has_pair_bias else None,
        )
        return out[:, :, :t]

    def sink_keys(self, k: Tensor, v: Tensor, valid: Tensor) -> tuple[Tensor, ...]:
        """The first ``sinks`` keys for every block, each allowed only to blocks whose window starts
        after it (inside the window it is already seen once): (k_s, v_s [b, h, e, k], allowed [b, n, e]),
        and with a pair bias their bias [h, n, s, e] (query n l_q + i minus sink j)."""
        e, block = min(self.sinks, k.shape[2]), self.options.block
        n = valid.shape[1] // block
        window_start = torch.arange(n, device=k.device) * block - self.options.memory  # [n]
        before_window = torch.arange(e, device=k.device)[None, :] < window_start[:, None]  # [n, e]
        sinks = (k[:, :, :e], v[:, :, :e], before_window[None] & valid[:, None, :e])
        if not self.has_pair_bias:
            return sinks
        query = torch.arange(n * block, device=k.device).view(n, block, 1)
        return (*sinks, self.distance_bias(query - torch.arange(e, device=k.device), k.dtype))


@functools.lru_cache(maxsize=64)
def window_keys(t: int, width: int, qh: int, qw: int, fh: int, fw: int, causal: bool) -> float:
    """The keys local_2d lets each of t raster positions see, averaged over them (see ``attend``):
    rows [R q_h - f_h, (R + 1) q_h) and columns [C q_w - f_w, (C + 1) q_w + f_w) of its block (R, C),
    inside the image and the segment; causal: the keys before it in raster order, and itself."""
    i = torch.arange(t)
    r, c = i // width, i % width
    top = (r // qh) * qh - fh
    left = ((c // qw) * qw - fw).clamp(min=0)
    right = ((c // qw) * qw + qw + fw).clamp(max=width)  # exclusive
    total = torch.zeros(t, dtype=torch.long)
    for dr in range(fh + qh):
        row = top + dr
        end = torch.minimum(right, t - row * width)  # the segment ends inside its last row
        if causal:
            end = torch.where(row < r, end, torch.where(row == r, torch.minimum(end, c + 1), left))
        total += ((end - left).clamp(min=0)) * (row >= 0)
    return float(total.double().mean())


_noted_shapes: set[tuple[int, int]] = set()


def note_not_an_image(t: int, height: int, width: int) -> None:
    """Say once per image shape (not once per layer or step) that a sequence is read as a raster prefix."""
    if (height, width) in _noted_shapes:
        return
    _noted_shapes.add((height, width))
    log.warning(
        "local_2d expects images of height x width = %d x %d = %d positions in raster order (an RGB image as a "
        "raster of width 3 x its width); a sequence of %d positions is read as the first %d rows of one. Set "
        "attention.height=0 and attention.width=... for sequences that are not images.",
        height,
        width,
        height * width,
        t,
        -(-t // width),
    )


@ATTENTION.register("local_2d")
class Local2DAttention(PatternAttention):
    no_left_padding_reason = (
        "lays its query blocks out by absolute position in the stream, so left padding moves a row's block "
        "boundaries and the keys each query sees"
    )

    @dataclass
    class Options:
        width: int = 32  # columns of the raster (for RGB: 3 x image width)
        height: int = 0  # rows; 0 = any number (the last row may be partial)
        query_height: int = 8  # query block rows
        query_width: int = 16  # query block columns
        flange_height: int = 8  # memory rows above the query block
        flange_width: int = 16  # memory columns left and right of the query block
        bias: bool = True
        backend: str = (
            "auto"  # auto (FlexAttention on CUDA) | native (blocked SDPA) | flex (FlexAttention; CPU: forward only)
        )

        def __post_init__(self) -> None:
            check_backend(self.backend, "backend")
            for key in ("width", "query_height", "query_width"):
                require(
                    isinstance(getattr(self, key), int) and getattr(self, key) >= 1,
                    f"{key} must be an int >= 1, got {getattr(self, key)!r}",
                )
            for key in ("height", "flange_height", "flange_width"):
                require(
                    isinstance(getattr(self, key), int) and getattr(self, key) >= 0,
                    f"{key} must be an int >= 0, got {getattr(self, key)!r}",
                )

    @classmethod
    def contract_options(cls) -> dict:
        return {"width": 5, "query_height": 2, "query_width": 2, "flange_height": 1, "flange_width": 1}

    @classmethod
    def contract_state(cls) -> StateContract:
        return StateContract(bound=(2 + 1) * 5)  # (q_h + f_h) rows of width 5 under contract_options()

    @classmethod
    def check_layout(cls, options: dict[str, Any], *, rows: int, width: int, data: str) -> None:
        """The raster this layer reads must be the data's: ``width`` columns, and ``height`` rows when set."""
        o = build_options(cls.Options, options, "attention 'local_2d'")
        require(
            o.width == width,
            f"attention local_2d has width={o.width} but data {data!r} is a raster {width} wide ({rows} rows); "
            f"set attention.width={width}",
        )
        require(
            o.height in (0, rows),
            f"attention local_2d has height={o.height} but data {data!r} has {rows} raster rows; set "
            f"attention.height={rows} (or 0)",
        )

    def state_bound(self) -> int:
        """A query in raster row r >= row(o) sees rows from (row(o) // q_h) q_h - f_h on: fewer than
        (q_h + f_h) rows of keys before the next position o."""
        o = self.options
        return (o.query_height + o.flange_height) * o.width

    def shift_period(self) -> int:
        return self.options.query_height * self.options.width  # whole rows of query blocks

    def allowed(self, i: Tensor, j: Tensor) -> Tensor:
        """Key (row, column) inside the query's block window (rows from R q_h - f_h through the block,
        columns C q_w - f_w ... (C + 1) q_w + f_w - 1), and when causal not after the query in raster order."""
        o = self.options
        qr, qc, kr, kc = i // o.width, i % o.width, j // o.width, j % o.width
        top = (qr // o.query_height) * o.query_height - o.flange_height
        left = (qc // o.query_width) * o.query_width - o.flange_width
        rows = (kr >= top) & (kr < top + o.flange_height + o.query_height)
        window = rows & (kc >= left) & (kc < left + o.query_width + 2 * o.flange_width)
        return window & (j <= i) if self.causal else window

    def check_stream_position(self, end: int) -> None:
        o = self.options
        require(
            not o.height or end <= o.height * o.width,
            f"local_2d: a stream of {end} positions runs past the image height x width = {o.height} x {o.width} = "
            f"{o.height * o.width}",
        )

    def keys_per_query(self, t: int) -> KeysPerQuery:
        """Counted exactly over the raster: each query's window (f_h rows above its block and the block's
        rows, q_w + 2 f_w columns) cut at the image's edges and at the segment's end, and when causal
        to the keys before the query in raster order."""
        o = self.options
        keys = window_keys(t, o.width, o.query_height, o.query_width, o.flange_height, o.flange_width, self.causal)
        return KeysPerQuery(keys, "2D memory window, counted over the raster")

    def rows_for(self, t: int) -> int:
        """Raster rows of a length-t sequence; refuses lengths the configured image cannot hold.

        A causal prefix of the image keeps only the rows it covers (the caller pads them to whole
        query-block rows), never the whole image: 256 tokens of a 32 x 96 preset cost 8 rows, not 32."""
        width, height = self.options.width, self.options.height
        if height:
            size = height * width
            if self.causal:
                require(
                    1 <= t <= size,
                    f"local_2d: sequence length {t} does not fit the image height x width = {height} x {width} = "
                    f"{size} (a causal layer accepts up to {size} positions, a raster prefix)",
                )
            else:
                require(
                    t == size,
                    f"local_2d: sequence length {t} is not height x width = {height} x {width} = {size}; a "
                    "bidirectional 2D layer needs the whole image",
                )
            if t != size:
                note_not_an_image(t, height, width)
        return -(-t // width)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, pad_mask: Tensor | None = None) -> Tensor:
        """q, k, v [b, h, t, k] -> [b, h, t, k]."""
        o = self.options
        t = q.shape[2]
        rows, width = self.rows_for(t), o.width
        qh, qw, fh, fw = o.query_height, o.query_width, o.flange_height, o.flange_width
        grid_h, grid_w = padded_length(rows, qh), padded_length(width, qw)
        valid = key_validity(pad_mask, t, rows * width, q.device)
        valid = F.pad(rearrange(valid, "b (r c) -> b r c", c=width), (0, grid_w - width, 0, grid_h - rows), value=False)

        def grid(x: Tensor) -> Tensor:  # [b, h, t, k] -> [b, h, grid_h, grid_w, k], zero padded
            x = rearrange(pad_time(x, rows * width), "b h (r c) k -> b h r c k", c=width)
            return F.pad(x, (0, 0, 0, grid_w - width, 0, grid_h - rows))

        qb = rearrange(grid(q), "b h (n i) (m j) k -> b h (n m) (i j) k", i=qh, j=qw)

        def memory(x: Tensor, dims: tuple[int, int]) -> Tensor:
            """Each query block's memory window: pad f_h rows on top and f_w columns on both
            sides, then unfold windows of (f_h + q_h) x (q_w + 2 f_w) with steps q_h, q_w."""
            pad = [0, 0] * (x.dim() - 1 - dims[1]) + [fw, fw, fh, 0]
            x = F.pad(x, pad)
            return x.unfold(dims[0], fh + qh, qh).unfold(dims[1], qw + 2 * fw, qw)

        kw, vw = (rearrange(memory(grid(x), (2, 3)), "b h n m k i j -> b h (n m) (i j) k") for x in (k, v))
        valid_w = rearrange(memory(valid, (1, 2)), "b n m i j -> b (n m) (i j)")
        device = q.device  # query (qr, qc) of a block, key (kr, kc) of its window, relative to the block's corner
        qr = torch.arange(qh, device=device).repeat_interleave(qw)[:, None]
        qc = torch.arange(qw, device=device).repeat(qh)[:, None]
        kr = torch.arange(fh + qh, device=device).repeat_interleave(qw + 2 * fw)[None, :] - fh
        kc = torch.arange(qw + 2 * fw, device=device).repeat(fh + qh)[None, :] - fw
        if self.causal:  # key (i, j) of the window precedes query (qr, qc) of the block in raster order
            static = (kr < qr) | ((kr == qr) & (kc <= qc))  # [q_h q_w, window]
            mask = static[None, None] & valid_w[:, :, None, :]
        else:
            mask = valid_w[:, :, None, :]
        # a pair bias on the raster distance, the same in every block: one template [h, q_h q_w, window]
        bias = self.distance_bias((qr - kr) * width + (qc - kc), q.dtype)
        out = attend_groups(qb, kw, vw, mask, dropout=self.attn_dropout, bias=None if bias is None else bias[:, None])
        out = rearrange(out, "b h (n m) (i j) k -> b h (n i) (m j) k", n=grid_h // qh, i=qh, j=qw)
        return rearrange(out[:, :, :rows, :width], "b h r c k -> b h (r c) k")[:, :, :t]
