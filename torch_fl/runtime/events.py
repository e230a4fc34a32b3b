"""What the dispatcher tells observers about each op call.

Counters per (op, path) are always kept (one dict update per call). Timings
and per-call events are produced only while a listener is attached, so with
no profiler the cost stays at the counter."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

NATIVE, DECOMPOSITION, JIT, FALLBACK, VIEW, COPY = "native", "decomposition", "jit", "fallback", "view", "copy"
PATHS = (NATIVE, DECOMPOSITION, JIT, FALLBACK, VIEW, COPY)


@dataclass
class OpEvent:
    op: str
    backend: str
    path: str
    seconds: float
    kernels: int
    bytes_copied: int
    depth: int
    start: float = 0.0  # time.perf_counter() when the op began
    comm_bytes: int = 0  # a collective's message size on this rank (torch_fl.distributed)
    mark: object = None  # the device clock's mark recorded when the op ended (STATE.device_clock)
    host_seconds: float | None = None  # the host's time, where `seconds` became device time


class RuntimeState:
    """Per process: what every thread's ops add to, and the observers that see them. Listeners read the
    tallies as deltas across a piece of work; one object, so that who owns each piece is plain."""

    def __init__(self) -> None:
        self.kernels = 0  # kernels launched through Python (the C++ fast path counts its own: fast_kernels)
        self.bytes_copied = 0  # bytes moved between host and device
        self.listeners: list[Callable[[OpEvent], None]] = []  # fl.profile and friends, called per op event
        self.on_listeners: list[Callable[[], None]] = []  # called when listeners come or go (the fast path steps aside)
        self.recording: Any = None  # the graph Recorder (runtime.graph) while one records, else None
        # where the op being served runs, for a recorder's reason ("the decomposition of aten::index.Tensor");
        # the dispatcher installs its own (the runtime cannot see which decompositions are in progress)
        self.op_context: Callable[[], str] = lambda: ""
        self.fast_kernels: Callable[[], int] = lambda: 0  # kernels the C++ core's fast paths launched
        self.fast_bytes: Callable[[], int] = lambda: 0  # bytes the C++ core's CPU-fallback fast path moved
        self.native_calls = 0  # calls the Python dispatcher served with a native kernel (the fast path counts its own)
        # While fl.profile times an asynchronous device: a callable that records a mark (a device event) on
        # it and returns its handle. An op's device time is the time between the mark before it began and
        # its own.
        self.device_clock: Callable[[], Any] | None = None


class OpNesting(threading.local):
    """Per thread: how deep in nested ops this thread is (an op a decomposition calls reports at depth + 1).
    Class defaults keep the hot-path reads cheap."""

    depth = 0


STATE = RuntimeState()
NESTING = OpNesting()


def host_access(what: str) -> None:
    """Device memory met the host (a transfer, a host view, a plugin copy): a recording cannot replay it."""
    rec = STATE.recording
    if rec is not None:
        rec.transfer(what)


def kernel_count() -> int:
    """Kernels launched so far in this process, by either path (read deltas around a piece of work)."""
    return STATE.kernels + STATE.fast_kernels()


def bytes_moved() -> int:
    """Bytes moved between host and device so far in this process, by either path (read deltas)."""
    return STATE.bytes_copied + STATE.fast_bytes()


def add_listener(fn: Callable[[OpEvent], None]) -> None:
    STATE.listeners.append(fn)
    for hook in STATE.on_listeners:
        hook()


def remove_listener(fn: Callable[[OpEvent], None]) -> None:
    if fn in STATE.listeners:
        STATE.listeners.remove(fn)
    for hook in STATE.on_listeners:
        hook()


def count(backend: Any, name: str, path: str) -> None:
    """One call of op `name` served by `path` on a backend (its counts, always kept)."""
    if path == NATIVE:
        STATE.native_calls += 1
    key = (name, path)
    if STATE.recording is not None:
        STATE.recording.op(name, path)
    counts = backend.own_counts
    counts[key] = counts.get(key, 0) + 1


def uncount(backend: Any, name: str, path: str) -> None:
    """Take back one count of `count` (a second run of a call, made to record it: dispatch.decomp_replay)."""
    if path == NATIVE:
        STATE.native_calls -= 1
    counts = backend.own_counts
    n = counts.get((name, path), 0) - 1
    if n > 0:
        counts[(name, path)] = n
    else:
        counts.pop((name, path), None)


def emit(event: OpEvent) -> None:
    clock = STATE.device_clock
    if clock is not None:
        event.mark = clock()
    for fn in list(STATE.listeners):
        fn(event)
