"""Asynchronous host-to-device copies (the article's pitfall 2).

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
STATS = {"async_copies": 0, "async_bytes": 0, "waits": 0, "wait_s": 0.0}


class _Pending:
    __slots__ = ("device", "event", "keepalive", "nbytes")

    def __init__(self, device, event, keepalive, nbytes: int):
        self.device, self.event, self.keepalive, self.nbytes = device, event, keepalive, nbytes


def supports(device) -> bool:
    p = device.plugin
    return bool(device.props.features & abi.FEATURE_ASYNC_COPY) and all(
        p.optional.get(n) for n in ("stream_create", "event_create", "event_record", "event_synchronize",
                                    "event_destroy"))


def supports_d2h(device) -> bool:
    """A device whose kernels run after their call returns can also copy to the host that way (ABI v2's
    copy_d2h_async): `x.to("cpu", non_blocking=True)` then returns before the bytes land, as on CUDA."""
    p = device.plugin
    return device.props.async_kernels and all(
        p.optional.get(n) for n in ("copy_d2h_async", "event_create", "event_record", "event_query", "event_destroy"))


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
    p.check(t.copy_d2h_async(dev.local, ffi.cast("void*", dst.data_ptr()), ffi.cast("void*", src.data_ptr()),
                             nbytes, stream), "copy_d2h_async")
    event = ffi.new("fl_event_t*")
    p.check(t.event_create(dev.local, event), "event_create")
    p.check(t.event_record(dev.local, event[0], stream), "event_record")
    settle_host(block=False)
    HOST_PENDING.append((dev, event[0], dst))
    STATS["async_d2h"] = STATS.get("async_d2h", 0) + 1
    events.BYTES[0] += nbytes
    if events.LISTENERS:
        events.emit(events.OpEvent("fl::copy_d2h_async", dev.backend.name, ASYNC_COPY, time.perf_counter() - t0,
                                   0, nbytes, events.DEPTH[0], t0))


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
    event = ffi.new("fl_event_t*")
    p.check(t.copy_h2d(dev.local, ffi.cast("void*", dst.data_ptr()), ffi.cast("void*", src.data_ptr()),
                       nbytes, stream), "copy_h2d (async)")
    p.check(t.event_create(dev.local, event), "event_create")
    p.check(t.event_record(dev.local, event[0], stream), "event_record")
    core.lib().fl_core_set_pending(dev.index, base, int(ffi.cast("uintptr_t", event[0])))
    PENDING[key] = _Pending(dev, event[0], src, nbytes)
    STATS["async_copies"] += 1
    STATS["async_bytes"] += nbytes
    events.BYTES[0] += nbytes
    if events.LISTENERS:
        events.emit(events.OpEvent("fl::copy_h2d_async", dev.backend.name, ASYNC_COPY, time.perf_counter() - t0,
                                   0, nbytes, events.DEPTH[0], t0))


def _wait_key(key) -> None:
    pend = PENDING.pop(key, None)
    if pend is None:
        return
    dev = pend.device
    t0 = time.perf_counter()
    done = ffi.new("int*")
    if dev.plugin.optional.get("event_query"):
        dev.plugin.table.event_query(dev.local, pend.event, done)
    core.lib().fl_core_wait_pending(dev.index, key[1])  # synchronizes and destroys the event
    blocked = time.perf_counter() - t0
    if not done[0]:
        STATS["waits"] += 1
        STATS["wait_s"] += blocked
        if events.LISTENERS:
            events.emit(events.OpEvent("fl::copy_wait", dev.backend.name, COPY_WAIT, blocked, 0, 0,
                                       events.DEPTH[0], t0))


def pending() -> list:
    """The (fl index, base address) of every allocation an async copy may still be writing (a freed
    allocation's copy was settled by the C++ core when it was freed)."""
    lib = core.lib()
    for key in list(PENDING):
        if not lib.fl_core_is_pending(key[0], key[1]):
            PENDING.pop(key, None)
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


def wait_all(device=None) -> None:
    for key in list(PENDING):
        if device is None or key[0] == device.index:
            _wait_key(key)
