"""Device time for the profiler on an asynchronous device.

On a device whose kernels return before they run (FL_FEATURE_ASYNC_KERNELS),
the host clock around an op measures how long it took to queue the op; the
time the device spent shows up later, booked on whatever op waits (a `.item()`
a second after the matmul it waits for). So while `fl.profile` watches such a
device, every op that ends records a mark: a plugin event on the device's
queue. Work runs in queue order, so an op's device time is the time between
the last mark recorded before the op began and its own mark, read with the
plugin's `event_elapsed` once the profile ends. Nothing waits while the block
runs; the profile's exit waits once for the device."""

from __future__ import annotations

import bisect
import time

from .abi import ffi


class DeviceClock:
    """Marks on one device's queue: the stream current when each op ended, where its kernels went."""

    def __init__(self, device) -> None:
        self.device = device
        self._table = device.plugin.table
        self._hosts: list[float] = []  # perf_counter() when each mark was recorded
        self._events: list = []
        self.mark()  # the origin: work queued before the profile began ends here

    def mark(self) -> tuple[DeviceClock, int]:
        out = ffi.new("fl_event_t *")
        self.device.plugin.check(self._table.event_create(self.device.local, out), "event_create")
        ev = out[0]
        self.device.plugin.check(self._table.event_record(self.device.local, ev, self.device.stream()), "event_record")
        self._hosts.append(time.perf_counter())
        self._events.append(ev)
        return self, len(self._events) - 1

    def resolve(self, events: list) -> None:
        """Gives each event with a mark of this clock its device time (`seconds`), keeping the host's in
        `host_seconds`. Waits for the device; releases the marks."""
        try:
            ms = ffi.new("double *")
            stamps = []
            for ev in self._events:
                self.device.plugin.check(
                    self._table.event_elapsed(self.device.local, self._events[0], ev, ms), "event_elapsed"
                )
                stamps.append(ms[0] / 1e3)
            for e in events:
                if e.mark is None or e.mark[0] is not self:
                    continue
                at = e.mark[1]
                before = max(bisect.bisect_right(self._hosts, e.start, 0, at) - 1, 0)
                e.host_seconds = e.seconds
                e.seconds = max(stamps[at] - stamps[before], 0.0)
        finally:
            self.close()

    def close(self) -> None:
        for ev in self._events:
            self._table.event_destroy(self.device.local, ev)
        self._events.clear()
        self._hosts.clear()
