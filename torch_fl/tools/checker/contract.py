"""The entry-point contract of fl_plugin.h, checked call by call.

Each check calls the plugin through the same cffi table the runtime uses and
yields rows (check, status, detail). A plugin that crashes the process is
caught by the parent (see __init__), which names the check that was running."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from ...runtime import abi, ffi

PASS, FAIL, WARN, SKIP = "PASS", "FAIL", "WARN", "SKIP"
Row = tuple[str, str, str]


def _status(code: int) -> str:
    return abi.STATUS_NAMES.get(code, str(code))


def identity(plugin: Any) -> Iterator[Row]:
    problems = [f for f in ("name", "vendor", "version", "description") if not getattr(plugin, f)]
    kind = "emulator" if plugin.emulated else "real device"
    if problems:
        yield "identity", WARN, f"empty field(s): {', '.join(problems)} ({kind})"
    else:
        yield "identity", PASS, f"{plugin.name} {plugin.version} by {plugin.vendor} ({kind}): {plugin.description}"


def devices(plugin: Any) -> Iterator[Row]:
    if not plugin.devices:
        yield "devices", FAIL, "device_count reported 0 devices"
        return
    for d in plugin.devices:
        bad = []
        if d.total_memory <= 0:
            bad.append("total_memory is 0")
        if not d.dtypes:
            bad.append("no dtypes")
        if not d.name:
            bad.append("empty name")
        good = f"{d.name}, {d.total_memory / 2**30:.2f} GiB, dtypes {','.join(d.dtype_names)}"
        yield f"device {d.index} properties", FAIL if bad else PASS, "; ".join(bad) if bad else good
    t = plugin.table
    st = t.device_props(len(plugin.devices), ffi.new("fl_device_props_t*"))
    yield (
        "invalid device index",
        PASS if st != abi.FL_OK and plugin.last_error() else FAIL,
        f"device_props({len(plugin.devices)}) -> {_status(st)}: {plugin.last_error() or '(no message)'}",
    )


def memory(plugin: Any) -> Iterator[Row]:
    t = plugin.table
    out = ffi.new("void**")
    st = t.malloc(0, 0, out)
    if st == abi.FL_OK:
        st2 = t.free(0, out[0]) if out[0] != ffi.NULL else abi.FL_OK
        yield "malloc(0)", PASS if st2 == abi.FL_OK else FAIL, f"free -> {_status(st2)}"
    else:
        yield "malloc(0)", FAIL, f"malloc of 0 bytes returned {_status(st)} (must be FL_OK)"
    sizes = [1, 4096, 1 << 20]
    used0 = plugin.memory_used(0)
    ptrs = []
    for n in sizes:
        st = t.malloc(0, n, out)
        if st != abi.FL_OK:
            yield f"malloc({n})", FAIL, f"{_status(st)}: {plugin.last_error()}"
            continue
        if out[0] == ffi.NULL:
            yield f"malloc({n})", FAIL, "returned FL_OK with a NULL pointer: return a valid block or FL_ERR_OOM"
            continue
        ptrs.append(out[0])
    distinct = len({int(ffi.cast("uintptr_t", p)) for p in ptrs}) == len(ptrs)
    yield "malloc distinct blocks", PASS if distinct else FAIL, f"{len(ptrs)} blocks"
    if used0 is not None:
        used1 = plugin.memory_used(0)
        yield (
            "memory_used accounting",
            PASS if used1 - used0 >= sum(sizes) else FAIL,
            f"grew by {used1 - used0} bytes for {sum(sizes)} allocated",
        )
    for p in ptrs:
        st = t.free(0, p)
        if st != abi.FL_OK:
            yield "free", FAIL, f"{_status(st)}: {plugin.last_error()}"
    if used0 is not None:
        yield (
            "memory returned",
            PASS if plugin.memory_used(0) == used0 else FAIL,
            f"memory_used {plugin.memory_used(0)} after free, {used0} before",
        )
    total = plugin.devices[0].total_memory
    st = t.malloc(0, total + (1 << 20), out)
    if st == abi.FL_ERR_OOM:
        yield (
            "allocation beyond capacity",
            PASS if plugin.last_error() else WARN,
            f"FL_ERR_OOM: {plugin.last_error() or '(no message: last_error is empty)'}",
        )
    else:
        if st == abi.FL_OK:
            t.free(0, out[0])
        yield "allocation beyond capacity", FAIL, f"malloc({total + (1 << 20)}) returned {_status(st)}, not FL_ERR_OOM"


def copies(plugin: Any) -> Iterator[Row]:
    t = plugin.table
    n = 4099
    src = torch.randint(0, 255, (n,), dtype=torch.uint8)
    back = torch.zeros(n, dtype=torch.uint8)
    out = ffi.new("void**")
    if t.malloc(0, 2 * n + 16, out) != abi.FL_OK or out[0] == ffi.NULL:
        yield "copies", FAIL, f"malloc for the copy test failed: {plugin.last_error() or 'a NULL block'}"
        return
    base = int(ffi.cast("uintptr_t", out[0]))
    try:
        a, b = ffi.cast("void*", base + 3), ffi.cast("void*", base + n + 9)  # unaligned on purpose
        host_src, host_back = ffi.cast("void*", src.data_ptr()), ffi.cast("void*", back.data_ptr())
        s1 = t.copy_h2d(0, a, host_src, n, ffi.NULL)
        s2 = t.copy_d2d(0, b, a, n, ffi.NULL)
        s3 = t.copy_d2h(0, host_back, b, n, ffi.NULL)
        ok = s1 == s2 == s3 == abi.FL_OK and torch.equal(src, back)
        yield (
            "copy round trip h2d->d2d->d2h",
            PASS if ok else FAIL,
            f"{n} bytes at unaligned offsets"
            if ok
            else f"statuses {_status(s1)}, {_status(s2)}, {_status(s3)}; bytes equal: {torch.equal(src, back)}",
        )
        s4 = t.copy_h2d(0, ffi.NULL, host_src, n, ffi.NULL)
        yield (
            "copy with a NULL pointer",
            PASS if s4 != abi.FL_OK else FAIL,
            f"{_status(s4)}: {plugin.last_error() or '(no message)'}"
            if s4 != abi.FL_OK
            else "copy_h2d to NULL returned FL_OK; it must fail with FL_ERR_INVALID and a message",
        )
        if plugin.optional.get("stream_create"):
            stream = ffi.new("fl_stream_t*")
            event = ffi.new("fl_event_t*")
            done = ffi.new("int*")
            st = [t.stream_create(0, stream)]
            st.append(t.copy_h2d(0, a, host_src, n, stream[0]))
            st.append(t.event_create(0, event) if t.event_create != ffi.NULL else 0)
            st.append(t.event_record(0, event[0], stream[0]) if t.event_record != ffi.NULL else 0)
            st.append(t.event_synchronize(0, event[0]) if t.event_synchronize != ffi.NULL else 0)
            st.append(t.event_query(0, event[0], done) if t.event_query != ffi.NULL else 0)
            st.append(t.stream_synchronize(0, stream[0]) if t.stream_synchronize != ffi.NULL else 0)
            st.append(t.event_destroy(0, event[0]) if t.event_destroy != ffi.NULL else 0)
            st.append(t.stream_destroy(0, stream[0]) if t.stream_destroy != ffi.NULL else 0)
            ok = all(s == abi.FL_OK for s in st)
            yield (
                "streams and events",
                PASS if ok else FAIL,
                "create/copy/record/synchronize/query/destroy" if ok else f"statuses {[_status(s) for s in st]}",
            )
            if plugin.optional.get("stream_wait_event") and ok:
                yield _stream_wait_event(plugin, a, b, n, src)
        else:
            yield "streams and events", SKIP, "not provided (the runtime treats work as synchronous)"
    finally:
        t.free(0, out[0])


def _stream_wait_event(plugin: Any, a: Any, b: Any, n: int, src: torch.Tensor) -> Row:
    """Stream 2 waits for an event recorded on stream 1 after a copy there: a device copy queued on stream 2
    after the wait must see the bytes stream 1 wrote."""
    t = plugin.table
    zeros = torch.zeros(n, dtype=torch.uint8)
    back = torch.zeros(n, dtype=torch.uint8)
    s1, s2, event = ffi.new("fl_stream_t*"), ffi.new("fl_stream_t*"), ffi.new("fl_event_t*")
    st = [
        t.copy_h2d(0, a, ffi.cast("void*", zeros.data_ptr()), n, ffi.NULL),
        t.stream_create(0, s1),
        t.stream_create(0, s2),
        t.event_create(0, event),
    ]
    if all(x == abi.FL_OK for x in st):
        st += [
            t.copy_h2d(0, a, ffi.cast("void*", src.data_ptr()), n, s1[0]),
            t.event_record(0, event[0], s1[0]),
            t.stream_wait_event(0, s2[0], event[0]),
            t.copy_d2d(0, b, a, n, s2[0]),
            t.copy_d2h(0, ffi.cast("void*", back.data_ptr()), b, n, s2[0]),
            t.stream_synchronize(0, s2[0]),
            t.stream_synchronize(0, s1[0]),
        ]
    t.event_destroy(0, event[0])
    t.stream_destroy(0, s1[0])
    t.stream_destroy(0, s2[0])
    if any(x != abi.FL_OK for x in st):
        why = plugin.last_error() or "(no message)"
        return "stream_wait_event", FAIL, f"statuses {[_status(x) for x in st]}: {why}"
    if not torch.equal(back, src):
        return (
            "stream_wait_event",
            FAIL,
            "a copy queued on stream 2 after waiting for an event of stream 1 did "
            "not see the bytes stream 1 wrote before the event: the wait does not order the streams",
        )
    return "stream_wait_event", PASS, "work queued after the wait sees what the other stream did before the event"


def version2(plugin: Any) -> Iterator[Row]:
    """ABI version 2's optional entry points, where the plugin has them: mem_set fills exactly its range,
    copy_d2h_async lands after a wait, event_elapsed measures between two recorded events."""
    t = plugin.table
    have = {n: plugin.optional.get(n) for n in ("mem_set", "copy_d2h_async", "event_elapsed")}
    if not any(have.values()):
        yield (
            "version 2 entry points",
            SKIP,
            (
                f"ABI version {getattr(plugin, 'abi_version', 1)}: mem_set, "
                "copy_d2h_async and event_elapsed not provided (optional)"
            ),
        )
        return
    n = 1000
    out = ffi.new("void**")
    if t.malloc(0, n, out) != abi.FL_OK or out[0] == ffi.NULL:
        yield "version 2 entry points", FAIL, f"malloc failed: {plugin.last_error() or 'a NULL block'}"
        return
    base = int(ffi.cast("uintptr_t", out[0]))
    back = torch.zeros(n, dtype=torch.uint8)
    host_back = ffi.cast("void*", back.data_ptr())
    try:
        ones = torch.full((n,), 0x11, dtype=torch.uint8)
        t.copy_h2d(0, out[0], ffi.cast("void*", ones.data_ptr()), n, ffi.NULL)
        if have["mem_set"]:
            st = t.mem_set(0, ffi.cast("void*", base + 100), 0xAB, 300, ffi.NULL)
            t.copy_d2h(0, host_back, out[0], n, ffi.NULL)
            want = ones.clone()
            want[100:400] = 0xAB
            ok = st == abi.FL_OK and torch.equal(back, want)
            yield (
                "mem_set",
                PASS if ok else FAIL,
                "filled bytes 100..400 of 1000, nothing else"
                if ok
                else f"status {_status(st)}; bytes as expected: {torch.equal(back, want)}",
            )
        if have["copy_d2h_async"]:
            back.zero_()
            st = [t.copy_d2h_async(0, host_back, out[0], n, ffi.NULL), t.synchronize(0) if t.synchronize else 0]
            expected = ones.clone()
            if have["mem_set"]:
                expected[100:400] = 0xAB
            ok = all(s == abi.FL_OK for s in st) and torch.equal(back, expected)
            yield (
                "copy_d2h_async",
                PASS if ok else FAIL,
                "landed after synchronize"
                if ok
                else f"statuses {[_status(s) for s in st]}; bytes equal: {torch.equal(back, expected)}",
            )
        if have["event_elapsed"]:
            e1, e2, ms = ffi.new("fl_event_t*"), ffi.new("fl_event_t*"), ffi.new("double*")
            st = [
                t.event_create(0, e1),
                t.event_create(0, e2),
                t.event_record(0, e1[0], ffi.NULL),
                t.copy_h2d(0, out[0], ffi.cast("void*", ones.data_ptr()), n, ffi.NULL),
                t.event_record(0, e2[0], ffi.NULL),
                t.event_synchronize(0, e2[0]),
                t.event_elapsed(0, e1[0], e2[0], ms),
            ]
            ok = all(s == abi.FL_OK for s in st) and ms[0] >= 0
            yield (
                "event_elapsed",
                PASS if ok else FAIL,
                f"{ms[0]:.3f} ms between two events" if ok else f"statuses {[_status(s) for s in st]}, {ms[0]} ms",
            )
            t.event_destroy(0, e1[0])
            t.event_destroy(0, e2[0])
    finally:
        t.free(0, out[0])


def rng(plugin: Any) -> Iterator[Row]:
    """The RNG state pair is optional (fl_plugin.h): both NULL is a note, one of the two is a fault."""
    t = plugin.table
    have = [n for n in ("rng_set_state", "rng_get_state") if plugin.optional.get(n)]
    if not have:
        yield (
            "rng state round trip",
            SKIP,
            (
                "not provided (optional: rng_set_state and rng_get_state are NULL, so "
                "torch.manual_seed does not reach the device)"
            ),
        )
        return
    if len(have) == 1:
        missing = "rng_get_state" if have == ["rng_set_state"] else "rng_set_state"
        yield "rng state round trip", FAIL, f"{have[0]} is provided but {missing} is NULL: provide both or neither"
        return
    seed, off = ffi.new("uint64_t*"), ffi.new("uint64_t*")
    s1 = t.rng_set_state(0, 123456789, 7)
    s2 = t.rng_get_state(0, seed, off)
    ok = s1 == s2 == abi.FL_OK and seed[0] == 123456789 and off[0] == 7
    yield "rng state round trip", PASS if ok else FAIL, f"set (123456789, 7), got ({seed[0]}, {off[0]})"


def kernel_table(plugin: Any) -> Iterator[Row]:
    unknown = []
    for op in plugin.kernels:
        ns, _, rest = op.partition("::")
        name, _, overload = rest.partition(".")
        try:
            packet = getattr(getattr(torch.ops, ns), name)
            getattr(packet, overload or "default")
        except (AttributeError, RuntimeError):
            unknown.append(op)
    yield (
        "kernel names",
        FAIL if unknown else PASS,
        f"not PyTorch operator overloads: {', '.join(unknown[:8])}"
        if unknown
        else f"{len(plugin.kernels)} kernels, each a PyTorch operator overload",
    )
    if plugin.duplicate_kernels:
        yield "kernel table duplicates", FAIL, f"listed more than once: {', '.join(plugin.duplicate_kernels[:8])}"
    dev_mask = plugin.devices[0].dtypes if plugin.devices else 0
    extra = [op for op, k in plugin.kernels.items() if k.dtypes & ~dev_mask]
    if extra:
        yield (
            "kernel dtypes vs device",
            WARN,
            f"{len(extra)} kernels declare dtypes the device does not compute in (ignored): {', '.join(extra[:5])}",
        )


def all_contract_checks(plugin: Any) -> Iterator[Row]:
    for check in (identity, devices, memory, copies, version2, rng, kernel_table):
        yield from check(plugin)
