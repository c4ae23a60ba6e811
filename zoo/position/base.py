"""The position axis: where a token's position enters the model.

A position part says what it is, through three class flags the builder and the mechanisms read
(never its registry name):

- ``adds_signal``: ``pos(x, offset=0) -> x + signal`` adds an absolute signal to the token vectors
  [b, t, d] at the input, ``offset`` being the absolute position of ``x[:, 0]`` (``absolute.py``).
- ``rotary``: it acts inside attention by rotating every query and key by its absolute position
  (:meth:`Position.rotate`; ``rotary.py``), so that q_i . k_j depends on i - j only.
- ``pair_bias``: it acts inside attention by adding b_h(i - j) to the score of query position i and
  key position j in head h (:meth:`Position.bias`, a function of the distance only; ``alibi.py``,
  ``t5_bias.py``).

A part acting inside attention is handed to every self-attention layer of the model when it is
built (``Attention(position=...)``, one part shared by the layers, so T5's table is shared as in
T5); each mechanism applies it to exactly the (query, key) pairs it computes, or refuses it by its
capability flag ``Attention.position_kinds`` with the reason. Its ``forward`` adds nothing.
Mechanism-specific relative schemes (Transformer-XL's r_{i-j}, adaptive span's relative keys) live
inside their attention; the Universal Transformer adds its own timestep signal. The sinusoids are
shared through :func:`sinusoid_table`.
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
from torch import Tensor, nn

from zoo.config import NoOptions, build_options, require
from zoo.parallel.chunk import active_chunk
from zoo.registry import Registry


def sinusoid_table(
    positions: Tensor, d_model: int, base: float = 10000.0, dtype: torch.dtype = torch.float32
) -> Tensor:
    """The paper's signal (Vaswani et al. 2017, Section 3.5), computed in log space:

        PE(pos, 2i) = sin(pos / base^(2i/d)),  PE(pos, 2i+1) = cos(pos / base^(2i/d))

    base^(-2i/d) is exp(-2i * ln(base) / d): no large powers, so no overflow for long sequences.
    Always computed in float64, then cast to ``dtype``: pass the model's. In float32 the angle
    pos * freq is rounded before the sine, an error of ~1e-4 by position 4K that a float64 model
    would otherwise inherit.
    positions: [n] (any real values, e.g. XL's relative distances) -> [n, d] in ``dtype``.
    Odd d_model: the last cosine column is dropped."""
    half = (d_model + 1) // 2
    device = positions.device if positions.device.type != "mps" else torch.device("cpu")  # MPS has no float64
    inv_freq = torch.exp(torch.arange(half, dtype=torch.float64, device=device) * (-2.0 * math.log(base) / d_model))
    angles = positions.to(device=device, dtype=torch.float64)[:, None] * inv_freq[None, :]  # [n, half]
    table = torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(1)  # interleave sin, cos
    return table[:, :d_model].to(device=positions.device, dtype=dtype)


class Position(nn.Module):
    Options: ClassVar[type] = NoOptions
    registry_name: ClassVar[str | None] = None
    # what the part is: the builder and every mechanism ask these, never the registry name
    adds_signal: ClassVar[bool] = True  # forward adds an absolute signal to the token vectors
    rotary: ClassVar[bool] = False  # rotates queries and keys by their absolute positions inside attention
    pair_bias: ClassVar[bool] = False  # adds b_h(i - j) to every score inside attention

    def __init__(self, d_model: int, max_len: int, *, n_heads: int = 1, **options):
        super().__init__()
        name = self.registry_name or type(self).__name__
        require(isinstance(n_heads, int) and n_heads >= 1, f"position {name!r}: n_heads must be an int >= 1")
        self.d_model, self.max_len, self.n_heads = d_model, max_len, n_heads
        self.options = build_options(self.Options, options, f"position {name!r}")

    @classmethod
    def kinds(cls) -> tuple[str, ...]:
        """How the part acts inside attention: a subset of ("rotary", "pair_bias"); () for a signal
        added at the input (or none)."""
        return tuple(kind for kind in ("rotary", "pair_bias") if getattr(cls, kind))

    @classmethod
    def encodes_position(cls) -> bool:
        """False only for the part that encodes no position at all (``none``)."""
        return cls.adds_signal or bool(cls.kinds())

    @property
    def cache_positions(self) -> bool:
        """Number the keys of a decoding cache by their place in it rather than in the stream
        (StreamingLLM's rule, Xiao et al. 2023, Section 3.2); a part's option, False by default."""
        return bool(getattr(self.options, "cache_positions", False))

    def forward(self, x: Tensor, offset: int | Tensor = 0) -> Tensor:
        """x [b, t, d] (x[:, 0] at absolute position ``offset``, an int or long [b] per row) plus the part's
        signal: a part that adds one overrides this; one that acts inside attention (or none) leaves x as it is."""
        if self.adds_signal:
            raise NotImplementedError(f"position {self.registry_name!r} sets adds_signal: define forward")
        return x

    def rotate(self, x: Tensor, positions: Tensor) -> Tensor:
        """Queries or keys x [..., n, k] at absolute positions ``positions`` (long [n]) -> rotated,
        same shape and dtype. Only for a part with ``rotary``."""
        raise NotImplementedError(f"position {self.registry_name!r} does not rotate queries and keys")

    def bias(self, distance: Tensor, *, causal: bool) -> Tensor:
        """b_h(i - j) for distances i - j (query position minus key position, long [...]) -> float
        [h, ...] (in the part's dtype). ``causal``: the layer sees no later key (T5's causal bucket
        rule). Only for a part with ``pair_bias``."""
        raise NotImplementedError(f"position {self.registry_name!r} adds no pair bias")

    def distance_bias(
        self, distance: Tensor, *, causal: bool, dtype: torch.dtype, head: Tensor | None = None
    ) -> Tensor:
        """:meth:`bias` for many pairs at the cost of their distinct distances: the bias is computed
        once per distance in [min, max] and gathered. distance long [...] -> [h, ...] in ``dtype``;
        with ``head`` (long, broadcastable to ``distance``: the head of each entry, for layouts that
        fold the heads into another axis, LSH's sorted chunks) -> [...] with each entry's own head."""
        if distance.numel() == 0:  # no pair (a query that sees no key): an empty bias of the right shape
            shape = distance.shape if head is not None else (self.n_heads, *distance.shape)
            return torch.zeros(shape, dtype=dtype, device=distance.device)
        low, high = int(distance.min()), int(distance.max())
        values = self.bias(torch.arange(low, high + 1, device=distance.device), causal=causal).to(dtype)  # [h, D]
        if head is None:
            return values[:, distance - low]
        return values.flatten()[head * values.shape[1] + (distance - low)]

    @classmethod
    def contract_options(cls) -> dict:
        """Options under which tests/contracts/test_position_contract.py exercises this signal (d_model 16)."""
        return {}

    def attach(self, stack: nn.Module) -> None:
        """Called by the model once its stack is built: a signal that enters every layer's input (not only
        the embedding's) hooks into the stack's blocks here. Default: nothing to attach."""

    def sequence_length(self, x: Tensor) -> int:
        """Positions in the sequence ``x`` [b, t, d] belongs to: t, or the whole sequence's length while it
        is split over ranks."""
        chunk = active_chunk()
        return x.shape[1] if chunk is None else chunk.length

    def packing_refusal(self) -> str | None:
        """Why this part cannot number each document of a packed row from 0 (``forward`` with per-token
        positions [b, t]), or None. Default: it can, unless training starts positions at random offsets."""
        if getattr(self.options, "random_offset_max", 0):
            return (
                f"position {self.registry_name!r} has random_offset_max={self.options.random_offset_max}: packed "
                "documents are numbered from 0 each; set it to 0 to pack"
            )
        return None

    def length_limit(self) -> int | None:
        """The most positions a sequence may reach in evaluation (a learned table's ``max_len``); None
        when the signal has no limit (sinusoids, no signal). Decoding asks before it starts."""
        return None

    def positions(self, x: Tensor, offset: int | Tensor) -> Tensor:
        """Absolute positions of ``x`` [b, t, d]: offset + index, [1, t] (broadcast over the batch); in
        training with random_offset_max > 0, [b, t] with a random start u_b in 0..R per sequence. While
        a sequence is split over ranks (``zoo.parallel``), index = this rank's positions in it.

        ``offset`` long [b] (a left-padded batch decoded row by row, zoo/models/generation.py): [b, t],
        row i from offset[i]; the pad positions before a row's start read position 0 (never attended).
        ``offset`` long [b, t] (packed rows, zoo/attention/documents.py): each token's own position, its place
        in its document, returned as it is."""
        b, t = x.shape[:2]
        if isinstance(offset, Tensor) and offset.dim() == 2:
            return offset.to(x.device)
        chunk = active_chunk()
        index = torch.arange(t, device=x.device) if chunk is None else chunk.positions(x.device)
        if isinstance(offset, Tensor):
            return (index[None] + offset.to(x.device)[:, None]).clamp_min(0)
        index = index + offset
        shift_max = getattr(self.options, "random_offset_max", 0)
        if not (self.training and shift_max):
            return index[None]
        shifts = torch.randint(0, shift_max + 1, (b, 1)).to(x.device)
        return index + shifts


def last_offset(offset: int | Tensor) -> int:
    """The furthest start among the rows of ``offset`` (an int, or long [b] per row)."""
    return offset if isinstance(offset, int) else int(offset.max())


def position_end(offset: int | Tensor, length: int) -> int:
    """One past the furthest position a call reaches: ``length`` positions from ``offset`` (an int or long
    [b] of starts), or the largest of per-token positions (long [b, t], packed rows) plus one."""
    if isinstance(offset, Tensor) and offset.dim() == 2:
        return int(offset.max()) + 1
    return last_offset(offset) + length


def check_random_offset_max(value: int) -> None:
    require(
        isinstance(value, int) and value >= 0,
        f"random_offset_max must be an int >= 0 (0 = positions start at 0 in training too), got {value!r}",
    )


POSITION: Registry[type[Position]] = Registry("position", Position)
