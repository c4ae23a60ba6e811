"""Point-to-point exchanges between the ranks of a context group, with autograd across them.

A rank's queries read keys computed on other ranks; the gradient of those keys belongs to the rank
that computed them. :func:`gather_earlier` sends each later rank the rows it reads of this rank's
tensor and returns [rows received from earlier ranks ; this rank's own tensor]; its backward sends
the gradient of every received row back to its sender and adds what comes back into the gradient of
the rows this rank sent. The own tensor passes through the same autograd node on purpose: every rank
uses it downstream (its own keys), so every rank runs the backward, also the first rank, which
receives nothing but must collect the gradients of what it sent (a node whose output went unused
would never run and leave its peers waiting).

Sends are ``isend``/``irecv`` (gloo on CPU, NCCL on GPU), all posted before any is waited on, so a
rank never blocks its neighbour; rows a peer does not read are never sent (an empty route is
skipped on both sides, which compute the same route from the chunk layout and the pattern).

Shapes: ``x`` has its time axis at ``dim`` (keys [b, h, t, k]: dim 2; layer inputs [b, t, d]: dim 1).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor


@dataclass(frozen=True)
class Route:
    """Which rows go where in one exchange, as this rank sees it.

    ``sends``: (global rank of a receiver, index [n] of the local rows it reads); ``receives``:
    (global rank of a sender, rows it sends), in the order the result lays them out (by position)."""

    group: dist.ProcessGroup | None
    sends: tuple[tuple[int, Tensor], ...]
    receives: tuple[tuple[int, int], ...]
    dim: int

    @property
    def received(self) -> int:
        return sum(count for _, count in self.receives)


class Posted:
    """Sends and receives in flight (:func:`post`); ``wait()`` completes them."""

    def __init__(self, works: list, keep: list[Tensor]):
        self.works, self.keep = works, keep  # ``keep``: outgoing tensors alive until their sends complete

    def wait(self) -> None:
        for work in self.works:
            work.wait()
        self.works, self.keep = [], []


def post(
    group: dist.ProcessGroup | None, sends: list[tuple[int, Tensor]], receives: list[tuple[int, Tensor]]
) -> Posted:
    """Start sending each (peer, tensor) of ``sends`` and filling each (peer, buffer) of ``receives``
    (peers are global ranks). The i-th message between two ranks carries tag i, so several tensors
    to one peer pair up in the order both sides list them."""
    outgoing = [tensor.contiguous() for _, tensor in sends]
    works = [dist.irecv(buffer, src=peer, group=group, tag=tag) for peer, buffer, tag in _tagged(receives)]
    works += [
        dist.isend(tensor, dst=peer, group=group, tag=tag) for (peer, _, tag), tensor in zip(_tagged(sends), outgoing)
    ]
    return Posted(works, outgoing)


def p2p(group: dist.ProcessGroup | None, sends: list[tuple[int, Tensor]], receives: list[tuple[int, Tensor]]) -> None:
    """:func:`post`, then wait for every request (all are posted before any is waited on)."""
    post(group, sends, receives).wait()


def _tagged(pairs: list[tuple[int, Tensor]]) -> list[tuple[int, Tensor, int]]:
    seen: dict[int, int] = {}
    out = []
    for peer, tensor in pairs:
        out.append((peer, tensor, seen.get(peer, 0)))
        seen[peer] = seen.get(peer, 0) + 1
    return out


def _resized(x: Tensor, dim: int, rows: int) -> list[int]:
    shape = list(x.shape)
    shape[dim] = rows
    return shape


def _exchange_rows(route: Route, x: Tensor) -> list[Tensor]:
    """The rows this rank receives, one tensor per sender (in ``route.receives`` order)."""
    buffers = [x.new_empty(_resized(x, route.dim, count)) for _, count in route.receives]
    sends = [(peer, x.index_select(route.dim, index)) for peer, index in route.sends]
    p2p(route.group, sends, [(peer, buffer) for (peer, _), buffer in zip(route.receives, buffers)])
    return buffers


class _GatherEarlier(torch.autograd.Function):
    @staticmethod
    def forward(ctx, route: Route, x: Tensor) -> Tensor:
        ctx.route = route
        return torch.cat([*_exchange_rows(route, x), x], dim=route.dim)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[None, Tensor]:
        route: Route = ctx.route
        dim = route.dim
        counts = [count for _, count in route.receives]
        *received, own = grad.split([*counts, grad.shape[dim] - sum(counts)], dim=dim)
        back = [grad.new_empty(_resized(grad, dim, index.numel())) for _, index in route.sends]
        # the gradient of every received row returns to its sender; what the readers of this rank's
        # rows computed comes back here
        p2p(
            route.group,
            [(peer, part) for (peer, _), part in zip(route.receives, received)],
            [(peer, buffer) for (peer, _), buffer in zip(route.sends, back)],
        )
        grad_x = own.contiguous()
        for (_, index), part in zip(route.sends, back):
            grad_x = grad_x.index_add(dim, index, part)
        return None, grad_x


def gather_earlier(route: Route, x: Tensor) -> Tensor:
    """[rows of the senders in ``route`` ; x] along ``route.dim``, differentiable on every rank: the
    received rows' gradients go back to their senders."""
    if x.dtype == torch.bool:  # padding masks: no gradient; gloo sends bytes
        return _GatherEarlier.apply(route, x.to(torch.uint8)).bool()
    return _GatherEarlier.apply(route, x)


def exchange_rows(route: Route, x: Tensor) -> list[Tensor]:
    """The received rows only, one tensor per sender, without autograd (memory for the next segment)."""
    with torch.no_grad():
        if x.dtype == torch.bool:
            return [part.bool() for part in _exchange_rows(route, x.to(torch.uint8))]
        return _exchange_rows(route, x.detach())
