"""What the dispatcher tells observers about each op call.

Counters per (op, path) are always kept (one dict update per call). Timings
and per-call events are produced only while a listener is attached, so with
no profiler the cost stays at the counter."""

from __future__ import annotations

from dataclasses import dataclass

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
    mark: object = None  # the device clock's mark recorded when the op ended (DEVICE_CLOCK)
    host_seconds: float | None = None  # the host's time, where `seconds` became device time


# Global tallies the dispatcher bumps; listeners read deltas across a call.
KERNELS = [0]
BYTES = [0]
LISTENERS: list = []
DEPTH = [0]


RECORDING: list = [None]  # the graph Recorder (runtime.graph) while one records, else None
# where the op being served runs, for a recorder's reason ("the decomposition of aten::index.Tensor"); the
# dispatcher installs its own (the runtime cannot see which decompositions are in progress)
OP_CONTEXT: list = [lambda: ""]


def host_access(what: str) -> None:
    """Device memory met the host (a transfer, a host view, a plugin copy): a recording cannot replay it."""
    rec = RECORDING[0]
    if rec is not None:
        rec.transfer(what)


FAST_KERNELS = [lambda: 0]  # kernels the C++ core's fast path launched (it runs only while nobody listens)


def kernel_count() -> int:
    """Kernels launched so far in this process, by either path (read deltas around a piece of work)."""
    return KERNELS[0] + FAST_KERNELS[0]()


FAST_BYTES = [lambda: 0]  # bytes the C++ core's CPU-fallback fast path moved between host and device


def bytes_moved() -> int:
    """Bytes moved between host and device so far in this process, by either path (read deltas)."""
    return BYTES[0] + FAST_BYTES[0]()


ON_LISTENERS: list = []  # called with no argument when listeners come or go (the C++ fast path steps aside)


def add_listener(fn) -> None:
    LISTENERS.append(fn)
    for hook in ON_LISTENERS:
        hook()


def remove_listener(fn) -> None:
    if fn in LISTENERS:
        LISTENERS.remove(fn)
    for hook in ON_LISTENERS:
        hook()


NATIVE_CALLS = [0]  # calls the Python dispatcher served with a native kernel (the fast path counts its own)


def count(backend, name: str, path: str) -> None:
    """One call of op `name` served by `path` on a backend (its counts, always kept)."""
    if path == NATIVE:
        NATIVE_CALLS[0] += 1
    key = (name, path)
    if RECORDING[0] is not None:
        RECORDING[0].op(name, path)
    counts = backend.own_counts
    counts[key] = counts.get(key, 0) + 1


# While fl.profile times an asynchronous device: a callable that records a mark (a device event) on it
# and returns its handle. An op's device time is the time between the mark before it began and its own.
DEVICE_CLOCK: list = [None]


def emit(event: OpEvent) -> None:
    clock = DEVICE_CLOCK[0]
    if clock is not None:
        event.mark = clock()
    for fn in list(LISTENERS):
        fn(event)
