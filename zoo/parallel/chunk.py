"""Where this rank's tokens sit in a sequence split over a context group, and what a mechanism may ask
of the other ranks while the split is active.

:class:`Layout` cuts a sequence of ``length`` positions over ``size`` ranks:

- ``contiguous``: rank r holds [r L, (r + 1) L), L = length / size. What a bounded pattern needs: its
  keys from earlier chunks are a halo at the left edge.
- ``zigzag``: the sequence is cut into 2 x size pieces and rank r holds pieces r and 2 size - 1 - r, so
  causal dense attention costs every rank the same (the early piece's queries see few keys, the late
  piece's many): ring-flash-attention's zigzag, torch's head-tail load balancer.

:class:`Chunk` is this rank's part while a forward runs under :func:`splitting` (the model wrapper in
``context.py`` enters it; blocks and position signals read it through :func:`active_chunk`). A
mechanism's ``attend_chunk`` asks it for exactly what its pattern reads:

- :meth:`Chunk.earlier`: the rows of earlier chunks its queries may see (a halo, the summary columns,
  every earlier key), chosen by the mechanism's own rule over absolute positions, with gradients
  returned to the ranks that sent them;
- :meth:`Chunk.tail`: the last positions of the whole sequence on every rank (the memory a segment
  hands to the next: XL memory, the adaptive-span cache), without gradient;
- :meth:`Chunk.ring_attention`: dense causal attention by ring (``ring.py``);
- :meth:`Chunk.maximum`: one number agreed over the group (a data-dependent reach).

Shapes: positions are long [t] (t = this rank's tokens, in the order the local tensors hold them).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor

from zoo.parallel.exchange import Route, exchange_rows, gather_earlier
from zoo.parallel.ring import ring_attention

LAYOUTS = ("contiguous", "zigzag")

# select(j, next_position) -> bool like j: does a query at a position >= next_position read key j?
Select = Callable[[Tensor, int], Tensor]


@dataclass(frozen=True)
class Layout:
    """A sequence of ``length`` positions split over ``size`` ranks (``kind``: contiguous | zigzag)."""

    kind: str
    size: int
    length: int

    def __post_init__(self) -> None:
        if self.kind not in LAYOUTS:
            raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}; got {self.kind!r}")
        if self.size < 1 or self.length % self.n_pieces:
            raise ValueError(
                f"a sequence of {self.length} positions cannot be split into {self.n_pieces} equal pieces "
                f"({self.kind} layout over {self.size} ranks): use a length that is a multiple of {self.n_pieces}"
            )

    @property
    def n_pieces(self) -> int:
        return 2 * self.size if self.kind == "zigzag" else self.size

    @property
    def piece_length(self) -> int:
        return self.length // self.n_pieces

    def pieces(self, rank: int) -> tuple[tuple[int, int], ...]:
        """The [start, end) ranges rank ``rank`` holds, in the order its local tensors hold them."""
        size, n = self.piece_length, self.n_pieces
        index = (rank,) if self.kind == "contiguous" else (rank, n - 1 - rank)
        return tuple((i * size, (i + 1) * size) for i in index)

    def positions(self, rank: int, device: torch.device | str | None = None) -> Tensor:
        """Absolute positions [t] of rank ``rank``'s tokens."""
        return torch.cat([torch.arange(a, b, device=device) for a, b in self.pieces(rank)])

    def shard(self, x: Tensor, rank: int, dim: int = 1) -> Tensor:
        """Rank ``rank``'s part of a whole-sequence tensor (time axis at ``dim``)."""
        parts = [x.narrow(dim, a, b - a) for a, b in self.pieces(rank)]
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=dim)

    def unshard(self, parts: list[Tensor], dim: int = 1) -> Tensor:
        """The whole-sequence tensor from every rank's part (``parts[r]`` = rank r's), for tests and tools."""
        order = torch.cat([self.positions(r) for r in range(self.size)]).argsort()
        return torch.cat(parts, dim=dim).index_select(dim, order.to(parts[0].device))


@dataclass(frozen=True)
class Chunk:
    """This rank's part of the sequences of one forward: ``layout``, its ``rank`` in the context
    ``group`` and the global rank of every member (``peers``, by group rank)."""

    layout: Layout
    rank: int
    group: dist.ProcessGroup | None
    peers: tuple[int, ...]

    @property
    def size(self) -> int:
        return self.layout.size

    @property
    def length(self) -> int:
        """Positions in the whole sequence."""
        return self.layout.length

    @property
    def pieces(self) -> tuple[tuple[int, int], ...]:
        return self.layout.pieces(self.rank)

    def positions(self, device: torch.device | str | None = None) -> Tensor:
        return self.layout.positions(self.rank, device)

    @property
    def start(self) -> int:
        """The first position of this rank's tokens (a contiguous layout: they follow it in order)."""
        if self.layout.kind != "contiguous":
            raise ValueError(f"this rank holds {len(self.pieces)} pieces ({self.layout.kind} layout), not one run")
        return self.pieces[0][0]

    # -- what a mechanism asks of the others ------------------------------------------------------------
    def earlier(
        self, tensors: list[Tensor], *, dim: int, select: Select, valid: Tensor | None = None
    ) -> tuple[list[Tensor], Tensor, Tensor | None]:
        """The rows of earlier chunks this chunk's queries read, before this rank's own (contiguous layout).

        ``tensors`` share their time axis ``dim`` (this rank's t rows); ``select(j, start)`` names the
        keys j < start that a query at a position >= start may see (the mechanism's rule). Every rank
        sends each later rank the rows it selects; what this rank reads comes back as, per tensor,
        [received rows in position order ; the tensor] (use that own part downstream: see exchange.py),
        with their positions [n + t] and, given this rank's key validity ``valid`` [b, t], the joined
        validity [b, n + t] (every rank passes one or none)."""
        device = tensors[0].device
        start = self.start
        mine = self.positions(device)
        sends = []
        for rank in range(self.rank + 1, self.size):
            later = self.layout.pieces(rank)[0][0]
            index = (select(mine, later) & (mine < later)).nonzero().squeeze(1)
            if index.numel():
                sends.append((self.peers[rank], index))
        receives, positions = [], []
        for rank in range(self.rank):
            theirs = self.layout.positions(rank, device)
            kept = theirs[select(theirs, start) & (theirs < start)]
            if kept.numel():
                receives.append((self.peers[rank], kept.numel()))
                positions.append(kept)
        routes = {d: Route(self.group, tuple(sends), tuple(receives), d) for d in {dim, 1}}
        out = [gather_earlier(routes[dim], x) for x in tensors]
        joined = None if valid is None else gather_earlier(routes[1], valid)
        return out, torch.cat([*positions, mine]), joined

    def sum_before(self, x: Tensor) -> Tensor:
        """The sum of ``x`` (this rank's contribution: the running sums of its chunk, [...]) over the earlier
        ranks, with the gradient returned to them: an exclusive prefix sum over the group (contiguous
        layout). Every rank sends its ``x`` to every later rank; zeros on the first rank."""
        return self.rows_before(x).sum(-2)

    def rows_before(self, x: Tensor) -> Tensor:
        """``x`` [..., F] of every earlier rank, in rank order, with the gradient returned to them, then
        this rank's own row as zeros: [..., rank + 1, F] (contiguous layout), for a scan that is not a
        plain sum (a decayed state: each rank's contribution passes through the later ranks' decay).
        Every rank sends its ``x`` to every later rank."""
        rows = x.unsqueeze(-2)  # [..., 1, F]: one row per rank
        dim, first = rows.dim() - 2, torch.zeros(1, dtype=torch.long, device=x.device)
        sends = tuple((self.peers[r], first) for r in range(self.rank + 1, self.size))
        receives = tuple((self.peers[r], 1) for r in range(self.rank))
        gathered = gather_earlier(Route(self.group, sends, receives, dim), rows)
        own = gathered.narrow(dim, self.rank, 1)
        # the own row joins the result as zeros (masked, so exact whatever it holds): its node then runs
        # backward on every rank, also on the first, where the later ranks' gradients of what it sent arrive
        nothing = own.masked_fill(own.new_ones((), dtype=torch.bool), 0.0)
        return torch.cat([gathered.narrow(dim, 0, self.rank), nothing], dim=dim)

    def tail(self, x: Tensor, keep: int, *, dim: int = 1) -> Tensor:
        """The last ``keep`` positions of the whole sequence of ``x`` (this rank's rows along ``dim``),
        on every rank, in position order, detached: a segment's memory for the next one."""
        first = self.length - keep
        device = x.device
        mine = self.positions(device)
        wanted = (mine >= first).nonzero().squeeze(1)
        sends = tuple((self.peers[r], wanted) for r in range(self.size) if r != self.rank and wanted.numel())
        receives, positions = [], []
        for rank in range(self.size):
            theirs = self.layout.positions(rank, device)
            theirs = theirs[theirs >= first]
            if rank != self.rank and theirs.numel():
                receives.append((self.peers[rank], theirs.numel()))
                positions.append(theirs)
        parts = exchange_rows(Route(self.group, sends, tuple(receives), dim), x)
        parts.append(x.detach().index_select(dim, wanted))
        order = torch.cat([*positions, mine[wanted]]).argsort()
        return torch.cat(parts, dim=dim).index_select(dim, order)

    def carry(
        self,
        x: Tensor,
        valid: Tensor | None,
        keep: int,
        before: Tensor | None = None,
        before_valid: Tensor | None = None,
    ) -> tuple[Tensor | None, Tensor | None]:
        """What a memory of ``keep`` positions holds after this sequence, on every rank, detached: the last
        ``keep`` of [before ; the whole sequence] for x [b, t, d] (this rank's rows) and ``before``
        [b, m, d] (the memory carried in, the same on every rank, or None), with their validity
        ([b, t] / [b, m] or None; None out when every kept position is real). (None, None) when keep is 0."""
        if keep == 0:
            return None, None
        own = min(keep, self.length)
        older = 0 if before is None else min(before.shape[1], keep - own)
        states = self.tail(x, own)
        if older:
            states = torch.cat([before[:, before.shape[1] - older :].detach(), states], dim=1)
        if valid is None and (before_valid is None or not older):
            return states, None
        b = x.shape[0]
        if valid is None:
            valid = torch.ones(b, x.shape[1], dtype=torch.bool, device=x.device)
        kept = self.tail(valid, own)
        if older:
            old = before_valid if before_valid is not None else torch.ones_like(kept[:, :1]).expand(b, before.shape[1])
            kept = torch.cat([old[:, old.shape[1] - older :], kept], dim=1)
        return states, kept

    def maximum(self, value: float, device: torch.device | str = "cpu") -> float:
        """The largest ``value`` over the group (every rank calls it; ``device``: where the backend reduces)."""
        t = torch.tensor([float(value)], dtype=torch.float64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        return float(t.item())

    def ring_attention(
        self, q: Tensor, k: Tensor, v: Tensor, *, key_valid: Tensor | None = None, scale: float | None = None
    ) -> Tensor:
        """Causal attention of this rank's queries q [b, h, t, k] over every key of the sequence up to each
        (k, v [b, h, t, k] this rank's; key_valid [b, t] or None), by ring (``ring.py``)."""
        return ring_attention(q, k, v, self, key_valid=key_valid, scale=scale)


_ACTIVE: ContextVar[Chunk | None] = ContextVar("zoo_context_parallel_chunk", default=None)


def active_chunk() -> Chunk | None:
    """This rank's chunk while a forward runs over a split sequence, else None."""
    return _ACTIVE.get()


@contextmanager
def splitting(chunk: Chunk | None) -> Iterator[Chunk | None]:
    """Run what the ``with`` block holds over ``chunk`` (None: over whole sequences)."""
    token = _ACTIVE.set(chunk)
    try:
        yield chunk
    finally:
        _ACTIVE.reset(token)
