"""Asynchronous host-to-device copies (the Torch-FL article's pitfall 2).

`t.to("fl", non_blocking=True)` from pinned host memory, on a device that
declares FL_FEATURE_ASYNC_COPY, enqueues the copy on the device's copy stream
and returns at once; the destination buffer remembers an event recorded
after the copy. Whatever touches that buffer next (a kernel, the CPU
fallback, a copy, a read, `torch.fl.synchronize()`, freeing it) first waits
for the event, so no op ever sees the bytes before they land; work on other
tensors overlaps with the copy. From pageable memory, or on a device without
async copies, the copy is synchronous, as with CUDA.

The profiler sees each async copy as a `copy-async` event (the time the
caller spent enqueuing it) and each wait that blocked as `copy-wait` (copy
time not hidden behind other work)."""

from __future__ import annotations

import time

from . import abi, core, events
from .abi import ffi
from .tensor import base_ptr, device_of

ASYNC_COPY, COPY_WAIT = "copy-async", "copy-wait"
# allocations whose bytes are still in flight: (fl index, base address) -> _Pending. The C++ core
# holds the plugin event; freeing the allocation waits for it there.
PENDING: dict = {}
STATS = {"async_copies": 0, "async_bytes": 0, "waits": 0, "wait_s": 0.0, "device_waits": 0}


class _Pending:
    __slots__ = ("device", "event", "keepalive", "nbytes", "ordered")

    def __init__(self, device, event, keepalive, nbytes: int):
        self.device, self.event, self.keepalive, self.nbytes = device, event, keepalive, nbytes
        self.ordered: set[int] = set()  # streams told to wait for the copy on the device (stream_wait_event)


def supports(device) -> bool:
    p = device.plugin
    return bool(device.props.features & abi.FEATURE_ASYNC_COPY) and all(
        p.optional.get(n)
        for n in ("stream_create", "event_create", "event_record", "event_synchronize", "event_destroy")
    )


def supports_d2h(device) -> bool:
    """A device whose kernels run after their call returns can also copy to the host that way (ABI v2's
    copy_d2h_async): `x.to("cpu", non_blocking=True)` then returns before the bytes land, as on CUDA."""
    p = device.plugin
    return device.props.async_kernels and all(
        p.optional.get(n) for n in ("copy_d2h_async", "event_create", "event_record", "event_query", "event_destroy")
    )


# device-to-host copies in flight: (device, event, host tensor kept alive until the event completes)
HOST_PENDING: list = []


def d2h(dst, src) -> None:
    """Enqueue the contiguous fl tensor src's bytes into dst (pinned, contiguous, same dtype and shape) on
    the current stream, after the kernels that write src. The caller waits the way CUDA code does
    (torch.fl.synchronize(), a stream's or an event's synchronize); dst stays alive until then."""
    dev = device_of(src)
    events.host_access("reads device memory to the host")
    p, t = dev.plugin, dev.plugin.table
    nbytes = src.numel() * src.element_size()
    t0 = time.perf_counter()
    stream = dev.stream()
    p.check(
        t.copy_d2h_async(
            dev.local, ffi.cast("void*", dst.data_ptr()), ffi.cast("void*", src.data_ptr()), nbytes, stream
        ),
        "copy_d2h_async",
    )
    event = ffi.new("fl_event_t*")
    p.check(t.event_create(dev.local, event), "event_create")
    p.check(t.event_record(dev.local, event[0], stream), "event_record")
    settle_host(block=False)
    HOST_PENDING.append((dev, event[0], dst))
    STATS["async_d2h"] = STATS.get("async_d2h", 0) + 1
    events.STATE.bytes_copied += nbytes
    if events.STATE.listeners:
        events.emit(
            events.OpEvent(
                "fl::copy_d2h_async",
                dev.backend.name,
                ASYNC_COPY,
                time.perf_counter() - t0,
                0,
                nbytes,
                events.NESTING.depth,
                t0,
            )
        )


def settle_host(block: bool = True) -> None:
    """Forget the device-to-host copies that have landed (all of them, waiting, when block)."""
    done = ffi.new("int*")
    keep = []
    for dev, event, host in HOST_PENDING:
        t = dev.plugin.table
        if block:
            dev.plugin.check(t.event_synchronize(dev.local, event), "event_synchronize")
            done[0] = 1
        else:
            dev.plugin.check(t.event_query(dev.local, event, done), "event_query")
        if done[0]:
            t.event_destroy(dev.local, event)
        else:
            keep.append((dev, event, host))
    HOST_PENDING[:] = keep


def copy_stream(device):
    s = getattr(device, "copy_stream", None)
    if s is None:
        out = ffi.new("fl_stream_t*")
        device.plugin.check(device.plugin.table.stream_create(device.local, out), "stream_create")
        s = device.copy_stream = out[0]
    return s


def h2d(dst, src) -> None:
    """Enqueue src's bytes (a pinned, contiguous CPU tensor, kept alive) into the contiguous fl tensor dst."""
    dev = device_of(dst)
    events.host_access("writes device memory from the host")
    p, t = dev.plugin, dev.plugin.table
    base = base_ptr(dst)
    key = (dev.index, base)
    if key in PENDING:
        _wait_key(key)  # an earlier copy into the same allocation lands first
    nbytes = dst.numel() * dst.element_size()
    t0 = time.perf_counter()
    stream = copy_stream(dev)
    if _waits_on_device(dev):
        _after_current_stream(dev, stream)
    elif dev.props.async_kernels:  # no device-side wait: the current stream's kernels must be done first
        cur = dev.stream()
        p.check(t.stream_synchronize(dev.local, cur) if cur != ffi.NULL else t.synchronize(dev.local), "synchronize")
    event = ffi.new("fl_event_t*")
    p.check(
        t.copy_h2d(dev.local, ffi.cast("void*", dst.data_ptr()), ffi.cast("void*", src.data_ptr()), nbytes, stream),
        "copy_h2d (async)",
    )
    p.check(t.event_create(dev.local, event), "event_create")
    p.check(t.event_record(dev.local, event[0], stream), "event_record")
    core.lib().fl_core_set_pending(dev.index, core.pointer(base), event[0])
    PENDING[key] = _Pending(dev, event[0], src, nbytes)
    STATS["async_copies"] += 1
    STATS["async_bytes"] += nbytes
    events.STATE.bytes_copied += nbytes
    if events.STATE.listeners:
        events.emit(
            events.OpEvent(
                "fl::copy_h2d_async",
                dev.backend.name,
                ASYNC_COPY,
                time.perf_counter() - t0,
                0,
                nbytes,
                events.NESTING.depth,
                t0,
            )
        )


def _after_current_stream(dev, stream) -> None:
    """The copy stream waits, on the device, for the work queued so far on the current stream. dst's block
    came from the current stream's pool: kernels queued there may still read the tensor that held it before
    (freed, in that stream's order), and the copy must not overwrite them; that is also CUDA's order for a
    non-blocking copy, which runs on the current stream. On a synchronous device those kernels are done.
    One event per device, recorded again each time (a wait holds the recording it was queued behind)."""
    p, t = dev.plugin, dev.plugin.table
    mark = getattr(dev, "copy_order_event", None)
    if mark is None:
        out = ffi.new("fl_event_t*")
        p.check(t.event_create(dev.local, out), "event_create")
        mark = dev.copy_order_event = out[0]
    p.check(t.event_record(dev.local, mark, dev.stream()), "event_record")
    p.check(t.stream_wait_event(dev.local, stream, mark), "stream_wait_event")


def _wait_key(key) -> None:
    pend = PENDING.pop(key, None)
    if pend is None:
        return
    dev = pend.device
    t0 = time.perf_counter()
    done = ffi.new("int*")
    if dev.plugin.optional.get("event_query"):
        dev.plugin.table.event_query(dev.local, pend.event, done)
    core.lib().fl_core_wait_pending(dev.index, core.pointer(key[1]))  # synchronizes and destroys the event
    blocked = time.perf_counter() - t0
    if not done[0]:
        STATS["waits"] += 1
        STATS["wait_s"] += blocked
        if events.STATE.listeners:
            events.emit(
                events.OpEvent("fl::copy_wait", dev.backend.name, COPY_WAIT, blocked, 0, 0, events.NESTING.depth, t0)
            )


def pending() -> list:
    """The (fl index, base address) of every allocation an async copy may still be writing (a freed
    allocation's copy was settled by the C++ core when it was freed)."""
    _forget_landed()  # and those whose events say they are done (a kernel waited for them on the device)
    return list(PENDING)


def is_pending(t) -> bool:
    """An async copy into t's allocation may still be in flight."""
    return t.device.type == "fl" and (t.get_device(), base_ptr(t)) in pending()


def wait_for(tensors) -> None:
    """Settle every in-flight copy into the allocations of these fl tensors."""
    for t in tensors:
        if t.device.type == "fl":
            key = (t.get_device(), base_ptr(t))
            if key in PENDING:
                _wait_key(key)


def _waits_on_device(dev) -> bool:
    """Kernels of this device run in stream order on the device (ABI v2's asynchronous kernels) and a stream
    can wait for another's event there: a kernel may then be queued behind a copy without the host waiting.
    A synchronous device runs each kernel in its call, so only the host can wait."""
    return bool(dev.props.async_kernels) and bool(dev.plugin.optional.get("stream_wait_event"))


def order_for_kernels(tensors) -> None:
    """Before kernels on the current stream use these fl tensors: a copy still in flight into one of them is
    waited for by the stream, on the device (its event; the host goes on, as cudaStreamWaitEvent), where the
    device can, else on the host. Everything queued on that stream afterwards, the device-to-host copies of a
    CPU fallback included, comes after the copy. Copies that have landed are forgotten on the way."""
    for t in tensors:
        if t.device.type != "fl":
            continue
        key = (t.get_device(), base_ptr(t))
        pend = PENDING.get(key)
        if pend is None:
            continue
        dev = pend.device
        if not core.lib().fl_core_is_pending(key[0], core.pointer(key[1])):  # settled by the core (free, synchronize)
            PENDING.pop(key, None)  # and its event destroyed there
            continue
        if not _waits_on_device(dev):
            _wait_key(key)
            continue
        stream = dev.stream()
        sid = int(ffi.cast("uintptr_t", stream))
        if sid in pend.ordered:
            continue
        dev.plugin.check(dev.plugin.table.stream_wait_event(dev.local, stream, pend.event), "stream_wait_event")
        pend.ordered.add(sid)
        STATS["device_waits"] += 1
    _forget_landed()


def _forget_landed() -> None:
    """Settle the copies whose events say they are done (no wait): their source buffers go, and once none is
    in flight the C++ fast path, which does not order kernels behind copies, serves calls again."""
    done = ffi.new("int*")
    lib = core.lib()
    for key, pend in list(PENDING.items()):
        t = pend.device.plugin.table
        if not lib.fl_core_is_pending(key[0], core.pointer(key[1])):  # the core settled it and destroyed its event
            PENDING.pop(key, None)
            continue
        if not pend.device.plugin.optional.get("event_query"):
            continue
        done[0] = 0
        pend.device.plugin.check(t.event_query(pend.device.local, pend.event, done), "event_query")
        if done[0]:
            PENDING.pop(key, None)
            lib.fl_core_wait_pending(pend.device.index, core.pointer(key[1]))


def wait_all(device=None) -> None:
    for key in list(PENDING):
        if device is None or key[0] == device.index:
            _wait_key(key)
