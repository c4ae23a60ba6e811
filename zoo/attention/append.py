"""Storage that a decoding cache appends to in place, and the one copy-on-write rule that keeps states
values.

Not a mechanism (nothing registers here). A cache that grows along one dimension (the dense KV cache's
keys and values, the pattern caches' keys, values and positions) keeps its tensors as views of the first
n positions of preallocated buffers (:class:`AppendStore`), grown geometrically (capacity doubles), so a
decoding step writes its t new entries once instead of copying the whole cache (``torch.cat``) every
token. What users rely on stays true:

- **States are values.** A state's tensors are views of positions [start, start + n) of the store;
  appending writes only past them, so no state ever sees its own positions change.
- **The rule** (:func:`append`): a state appends in place only when nothing else can see the positions
  it writes, i.e. when there is room and either it is the tip of its store (its views end where the
  store's written positions end, ``used``) or its views are the only tensors left looking into the store
  (the storage's use count, :func:`sole_views`: the states continued from it first are gone, as when
  a prefilled state is decoded from again after the first continuation was dropped; the positions past
  it are then taken back). Otherwise (another state continued from the same one is still alive: decoding
  twice from one prefilled state while keeping the first continuation, two beams of one parent) it
  copies its own positions into a new store and appends there.
- **Fixed slots** (LSH's bucket cache, :class:`SlotStore`): a state overwrites slots instead of
  appending, so the state it continues from and the one it returns hold the same storage: it writes in
  place when it is the last state written to its storage (its ``version`` is the store's) and copies
  tensors that are not the store's (a prefill's, reordered beams'): into the storage its previous copy
  went to when no state holds a view of that one any more (decoding again from one prefilled state
  reuses warm memory; the state keeps that storage while it lives), else into a new one. A state whose
  storage a later step has overwritten is refused with the reason (its slots are gone): decode again
  from the state a prefill returned, or from the latest state.
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
        self.bare = [use_count(buffer) for buffer in self.buffers]  # before any view of them exists

    @property
    def capacity(self) -> int:
        return self.buffers[0].shape[self.dims[0]]

    def start_of(self, views: list[Tensor]) -> int | None:
        """Where ``views`` start in this store when they are its tip (they end at ``used``), else None."""
        start = self.located(views)
        return start if start is not None and start + views[0].shape[self.dims[0]] == self.used else None

    def located(self, views: list[Tensor]) -> int | None:
        """Where ``views`` start when they are views of positions [start, start + n) of every buffer
        (written ones: start + n <= ``used``), else None."""
        n, dim = views[0].shape[self.dims[0]], self.dims[0]
        step = self.buffers[0].stride(dim) * self.buffers[0].element_size()
        offset = views[0].data_ptr() - self.buffers[0].data_ptr()
        if offset % step or not 0 <= offset // step <= self.used - n:
            return None
        start = offset // step
        for view, buffer, dim in zip(views, self.buffers, self.dims):
            mine = buffer.narrow(dim, start, n)
            if view.data_ptr() != mine.data_ptr() or view.shape != mine.shape or view.stride() != mine.stride():
                return None
        return start

    def claim(self, views: list[Tensor]) -> int | None:
        """Where ``views`` start when they may append in place: they are the tip, or they are the only
        views of the store left (:func:`sole_views`), whose positions past them nobody can see any more and
        are taken back (``used`` moves to their end). None otherwise."""
        start = self.located(views)
        if start is None:
            return None
        end = start + views[0].shape[self.dims[0]]
        if end != self.used:
            if not sole_views(self, views):
                return None
            self.used = end
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
    start = None if store is None else store.claim(cached)
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


def use_count(x: Tensor) -> int | None:
    """How many tensors (the buffer itself and every view of it) hold ``x``'s storage, or None where this
    torch cannot tell (then no state is ever taken for the only one left)."""
    counter = getattr(torch._C, "_storage_Use_Count", None)
    return None if counter is None else counter(x.untyped_storage()._cdata)


def sole_views(store: AppendStore, views: list[Tensor]) -> bool:
    """True when ``views`` (one per buffer) are the only tensors besides the buffers looking into the
    store: no state, beam or tensor taken from one still sees any of its positions, so the positions past
    ``views`` can be overwritten without any state seeing its own change (the copy-on-write rule's test
    for being the only owner, as Swift's ``isKnownUniquelyReferenced``)."""
    for view, buffer, bare in zip(views, store.buffers, store.bare):
        count = use_count(buffer)
        if count is None or bare is None or count != bare + 1 or use_count(view) != count:
            return False
    return True


def needs_gradient(*tensors: Tensor) -> bool:
    """True when a call must attend over tensors that carry gradient (then it concatenates)."""
    return torch.is_grad_enabled() and any(x.requires_grad for x in tensors)


class SlotStore:
    """Fixed-size tensors a state overwrites at some slots (LSH's per-bucket windows); ``version``
    counts the writes, so a state knows whether it is the last one written. States hold views of
    ``tensors`` (:meth:`views`), so the storage's use count tells when none is left (:meth:`unused`).
    A plain class (see :class:`AppendStore`)."""

    def __init__(self, tensors: list[Tensor]):
        self.tensors = [x.detach().clone(memory_format=torch.contiguous_format) for x in tensors]
        self.version = 0
        self.bare = [use_count(x) for x in self.tensors]  # before any state's view of them exists

    def shares(self, tensors: list[Tensor]) -> bool:
        return all(a.data_ptr() == b.data_ptr() and a.shape == b.shape for a, b in zip(tensors, self.tensors))

    def holds(self, tensors: list[Tensor], version: int) -> bool:
        return version == self.version and self.shares(tensors)

    def views(self) -> list[Tensor]:
        return [x.view_as(x) for x in self.tensors]

    def unused(self, like: list[Tensor]) -> bool:
        """True when no state (nor any tensor taken from one) sees this storage any more, and it can hold
        ``like``: it may then be refilled instead of allocating (and faulting in) a new one."""
        return all(
            x.shape == y.shape
            and x.dtype == y.dtype
            and x.device == y.device
            and bare is not None
            and use_count(x) == bare
            for x, y, bare in zip(self.tensors, like, self.bare)
        )

    def refill(self, tensors: list[Tensor]) -> SlotStore:
        for mine, x in zip(self.tensors, tensors):
            mine.copy_(x.detach())
        return self


def own_slots(
    store: SlotStore | None, tensors: list[Tensor], version: int, spare: SlotStore | None = None
) -> SlotStore:
    """The store a state's next write goes to, holding the state's ``tensors`` (contiguous): their store
    when the state is the last written to it, else a copy (the rule above), made in ``spare`` (the store
    an earlier continuation of the same state copied into) when no state uses it any more. Refuses a
    state whose slots a later step overwrote. Write with :func:`write_slots`."""
    if store is not None and version != store.version and store.shares(tensors):
        raise ValueError(
            f"this state (write {version}) was continued in place by a later decoding step (write {store.version}) "
            "that overwrote its fixed slots (LSH's bucket cache): continue from the latest state, or from the state "
            "the prefill returned, which is never overwritten"
        )
    if store is not None and store.holds(tensors, version):
        return store
    return spare.refill(tensors) if spare is not None and spare.unused(tensors) else SlotStore(tensors)


def write_slots(store: SlotStore, write: Callable[[list[Tensor]], None]) -> int:
    """``write`` (in-place updates of the tensors it is given) applied to the store :func:`own_slots`
    returned; the new state's version."""
    with torch.no_grad():
        write(store.tensors)
    store.version += 1
    return store.version
