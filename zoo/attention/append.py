"""Storage that a decoding cache appends to in place, and the one copy-on-write rule that keeps states
values.

Not a mechanism (nothing registers here). A cache that grows along one dimension (the dense KV cache's
keys and values, the pattern caches' keys, values and positions) keeps its tensors as views of the first
n positions of preallocated buffers (:class:`AppendStore`), grown geometrically (capacity doubles), so a
decoding step writes its t new entries once instead of copying the whole cache (``torch.cat``) every
token. What users rely on stays true:

- **States are values.** A state's tensors are views of positions [start, start + n) of the store;
  appending writes only past them, so no state ever sees its own positions change.
- **The rule** (:func:`append`): a state appends in place only when it is the tip of its store, i.e.
  its views end where the store's written positions end (``used``) and there is room. Otherwise
  (another state was continued from the same one first: decoding twice from one prefilled state,
  two beams of one parent) it copies its own positions into a new store and appends there.
- **Fixed slots** (LSH's bucket cache, :class:`SlotStore`): the same rule where a state overwrites
  slots instead of appending: it writes in place only when it is the last state written to its storage
  (its ``version`` is the store's), else it copies the storage first.
- **Reordering and moving** (``reorder_state``, ``.to(device)``) make new tensors that are no view of
  the store, so the next append copies them into a new store: the rule checks the views themselves
  (their data pointers), never trusts a store handed along with them.
- **Detached.** Buffers never require grad; what is written is detached. A call that needs gradient
  through the new entries (training with a bounded cache) attends over ``torch.cat`` of the cached
  views and its own tensors, as before, and still stores detached copies.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

MIN_CAPACITY = 64  # positions a fresh store holds at least


class AppendStore:
    """Buffers growing together along ``dims`` (one per buffer); ``used``: positions written so far
    (the end of the last state appended). A plain class, not a dataclass, so ``map_tensors`` (beam
    reordering, device moves) leaves it alone and the views it makes are checked instead."""

    def __init__(self, views: list[Tensor], dims: list[int], capacity: int):
        self.dims = dims
        self.buffers = []
        for view, dim in zip(views, dims):
            shape = list(view.shape)
            shape[dim] = capacity
            buffer = view.new_empty(shape)
            buffer.narrow(dim, 0, view.shape[dim]).copy_(view.detach())
            self.buffers.append(buffer)
        self.used = views[0].shape[dims[0]]

    @property
    def capacity(self) -> int:
        return self.buffers[0].shape[self.dims[0]]

    def start_of(self, views: list[Tensor]) -> int | None:
        """Where ``views`` start in this store when they are its tip (they end at ``used``), else None."""
        n = views[0].shape[self.dims[0]]
        start = self.used - n
        if start < 0:
            return None
        for view, buffer, dim in zip(views, self.buffers, self.dims):
            tip = buffer.narrow(dim, start, n)
            if view.data_ptr() != tip.data_ptr() or view.shape != tip.shape or view.stride() != tip.stride():
                return None
        return start

    def views(self, start: int, n: int) -> list[Tensor]:
        return [buffer.narrow(dim, start, n) for buffer, dim in zip(self.buffers, self.dims)]


def append(
    store: AppendStore | None, cached: list[Tensor], new: list[Tensor], dims: list[int]
) -> tuple[AppendStore, list[Tensor]]:
    """[cached ; new] along ``dims`` as views of a store: in place when ``cached`` is ``store``'s tip
    and it has room, else in a new store (capacity twice the length) holding a copy of ``cached``.
    Returns the store and the views of every cached and new position (detached)."""
    n, t = cached[0].shape[dims[0]], new[0].shape[dims[0]]
    start = None if store is None else store.start_of(cached)
    if start is None or start + n + t > store.capacity:
        store, start = AppendStore(cached, dims, max(MIN_CAPACITY, 2 * (n + t))), 0
    for buffer, x, dim in zip(store.buffers, new, dims):
        buffer.narrow(dim, start + n, t).copy_(x.detach())
    store.used = start + n + t
    return store, store.views(start, n + t)


def slide(store: AppendStore, views: list[Tensor], keep: int) -> list[Tensor]:
    """The last ``keep`` positions of the tip ``views`` of ``store``, as views of it (a rolling window
    evicts without copying; the store's ``used`` stays where it is, so the window stays its tip)."""
    n = views[0].shape[store.dims[0]]
    start = store.start_of(views)
    assert start is not None, "slide() takes the views append() returned"
    return store.views(start + n - keep, keep)


def new_store(first: list[Tensor], dims: list[int]) -> tuple[AppendStore, list[Tensor]]:
    """A store holding ``first`` (a prefill), with room to grow: its views of them."""
    n = first[0].shape[dims[0]]
    store = AppendStore(first, dims, max(MIN_CAPACITY, 2 * n))
    return store, store.views(0, n)


def needs_gradient(*tensors: Tensor) -> bool:
    """True when a call must attend over tensors that carry gradient (then it concatenates)."""
    return torch.is_grad_enabled() and any(x.requires_grad for x in tensors)


class SlotStore:
    """Fixed-size tensors a state overwrites at some slots (LSH's per-bucket windows); ``version``
    counts the writes, so a state knows whether it is the last one written. A plain class (see
    :class:`AppendStore`)."""

    def __init__(self, tensors: list[Tensor]):
        self.tensors = [x.detach().clone() for x in tensors]
        self.version = 0

    def holds(self, tensors: list[Tensor], version: int) -> bool:
        return version == self.version and all(
            a.data_ptr() == b.data_ptr() and a.shape == b.shape for a, b in zip(tensors, self.tensors)
        )


def write_slots(
    store: SlotStore | None, tensors: list[Tensor], version: int, write: Callable[[list[Tensor]], None]
) -> tuple[SlotStore, int]:
    """``write`` (in-place updates of the tensors it is given) applied to a state's ``tensors``: into
    their store when the state is the last written to it, else into a copy (the rule above). Returns
    the store and the new state's version."""
    if store is None or not store.holds(tensors, version):
        store = SlotStore(tensors)
    with torch.no_grad():
        write(store.tensors)
    store.version += 1
    return store, store.version
