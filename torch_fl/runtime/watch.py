"""Whether the tensors a cached value was derived from were written since: the C++ core's write watch.

torch.compile(backend="fl") caches values computed from weights (a Conv+BN fold, packed QKV weights, a
channels-last weight copy) across calls. A tensor's `_version` misses writes made through another alias:
`p.data.mul_(0.5)`, hand-written gradient clipping, an EMA update all write through `p.data`, which has a version
counter of its own, and an inference tensor has none at all. Every write into fl memory goes through torch_fl
(the C++ fast path, or the Python dispatcher), so the core counts writes per watched storage instead: a cache
watches its sources' storages and is valid while their write generations stand still."""

from __future__ import annotations

import weakref

import torch

from . import core
from .tensor import base_ptr


class Watch:
    """Process-wide: how many storages are watched (the dispatcher's cheap test) and the core's counter of
    writes into any of them."""

    def __init__(self) -> None:
        self.active = 0  # watched storages (counted per watcher): the dispatcher notes writes only while > 0

    def writes(self) -> int:
        return core.watched_writes()

    def note_written(self, t: torch.Tensor) -> None:
        core.lib().fl_core_note_write(core.pointer(base_ptr(t)))


WATCH = Watch()


class WriteGuard:
    """Storages watched from now on: written() says whether any was written since (through any alias). The
    common case, nothing watched written anywhere, costs one read of the core's counter."""

    def __init__(self, tensors) -> None:
        self._bases = tuple(core.pointer(b) for b in sorted({base_ptr(t) for t in tensors if t is not None} - {0}))
        lib = core.lib()
        for b in self._bases:
            lib.fl_core_watch(b, 1)
        WATCH.active += len(self._bases)
        self._writes = WATCH.writes()
        self._gens = self._generations()

    def _generations(self) -> tuple:
        lib = core.lib()
        return tuple(lib.fl_core_write_generation(b) for b in self._bases)

    def written(self) -> bool:
        writes = WATCH.writes()
        if writes == self._writes:
            return False
        if self._generations() != self._gens:
            return True
        self._writes = writes  # writes elsewhere
        return False

    def __del__(self) -> None:
        try:
            if core.loaded():
                lib = core.lib()
                for b in self._bases:
                    lib.fl_core_watch(b, 0)
                WATCH.active -= len(self._bases)
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


class Sources:
    """The tensors one cached value is derived from. key(tensors) changes when any of them is another
    tensor (storage, offset, shape, strides) or was written since, through any alias; the storages stay
    watched while this object lives."""

    def __init__(self) -> None:
        self._meta: tuple | None = None
        self._guard: WriteGuard | None = None
        self._epoch = 0

    def key(self, tensors) -> tuple:
        meta = tuple(
            (t.data_ptr(), base_ptr(t), t.shape, t.stride(), t.dtype) if t is not None else None for t in tensors
        )
        if meta != self._meta:
            self._meta, self._guard = meta, WriteGuard(tensors)
            self._epoch += 1
        elif self._guard is None or self._guard.written():  # None only before the first key
            self._guard = WriteGuard(tensors)
            self._epoch += 1
        return (meta, self._epoch)


# Values a cache derived from parameters and keeps (a folded or channels-last weight, a concatenation of
# weights): alive with their cache whatever runs. A replay that reads one pins nothing the model does not hold
# already, so compile.replay leaves their storages out of the device memory it counts against its bound.
CACHED: dict[int, weakref.ref] = {}  # id(value) -> a weak reference (a WeakSet would compare tensors with ==)


def cached_value(t: torch.Tensor) -> torch.Tensor:
    """Registers t as a cache's value (CACHED) while t lives; returns t."""
    key = id(t)

    def gone(ref: weakref.ref, key: int = key) -> None:
        if CACHED.get(key) is ref:
            del CACHED[key]

    CACHED[key] = weakref.ref(t, gone)
    return t


def cached_storages() -> set[int]:
    """The data pointers of the storages of the cached values alive now."""
    alive = (ref() for ref in list(CACHED.values()))
    return {t.untyped_storage().data_ptr() for t in alive if t is not None}
