"""Guarded device memory for the conformance checker: canary bytes around every tensor.

Why: a kernel that writes a few elements past its output usually survives a
test (the bytes land in allocator slack) and corrupts the heap of a real run
later, far from the cause. In the checker every device block is allocated
GUARD_BYTES larger than asked and filled with a canary byte first; after a
kernel call, every byte outside the span of each tensor it was given must
still be the canary. A changed byte after the span is an overrun, before it
an underrun, reported with the op and the size. (The checker runs with the
memory pool off, so every buffer is a fresh, freshly filled block.)"""

from __future__ import annotations

import torch

from .. import _dispatch
from .._abi import ffi

GUARD_BYTES = 4096
CANARY = 0xFD


class GuardedMemory:
    """Wraps one plugin's allocator (its Plugin object's malloc_ptr/free_ptr) with guard zones."""

    def __init__(self, plugin) -> None:
        self.plugin = plugin
        self.blocks: dict[int, int] = {}  # address -> bytes allocated, guard included
        self._malloc, self._free = plugin.malloc_ptr, plugin.free_ptr
        plugin.malloc_ptr, plugin.free_ptr = self.malloc, self.free

    def uninstall(self) -> None:
        self.plugin.malloc_ptr, self.plugin.free_ptr = self._malloc, self._free

    def malloc(self, device: int, nbytes: int):
        total = nbytes + GUARD_BYTES
        ptr = self._malloc(device, total)
        fill = torch.full((total,), CANARY, dtype=torch.uint8)
        self.plugin.copy_h2d(device, int(ffi.cast("uintptr_t", ptr)), fill.data_ptr(), total)
        self.blocks[int(ffi.cast("uintptr_t", ptr))] = total
        return ptr

    def free(self, device: int, ptr) -> None:
        self.blocks.pop(int(ffi.cast("uintptr_t", ptr)), None)
        self._free(device, ptr)

    def damage(self, t: torch.Tensor) -> str | None:
        """How far the last kernel wrote outside t's span: "N bytes past the end" /
        "N bytes before the start", or None when every guard byte is intact."""
        buf = getattr(t, "_buf", None)
        total = self.blocks.get(buf.ptr) if buf is not None else None
        if total is None:
            return None
        host = torch.empty(total, dtype=torch.uint8)
        self.plugin.copy_d2h(buf.device.local, host.data_ptr(), buf.ptr, total)
        lo, hi = _dispatch.span(t)
        start, end = lo * t.element_size(), hi * t.element_size()
        changed = (host != CANARY).nonzero().flatten()
        after = changed[changed >= end]
        if after.numel():
            return f"{int(after.max()) - end + 1} bytes past the end"
        before = changed[changed < start]
        if before.numel():
            return f"{start - int(before.min())} bytes before the start"
        return None
