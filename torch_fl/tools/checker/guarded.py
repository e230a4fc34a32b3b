"""Guarded device memory for the conformance checker: canary bytes around every tensor.

Why: a kernel that writes a few elements past its output usually survives a
test (the bytes land in allocator slack) and corrupts the heap of a real run
later, far from the cause. In the checker every tensor a kernel sees (inputs
and the outputs the checker allocates for it) lives in its own device block
with GUARD_BYTES of canary bytes before and after the tensor's span; after a
kernel call, every byte outside the span must still be the canary. A changed
byte after the span is an overrun, before it an underrun, reported with the op
and the size."""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import torch

from ...runtime import base_ptr, device_of, span

GUARD_BYTES = 4096  # a multiple of every element size, so the tensor's offset stays whole
CANARY = 0xFD


class GuardedMemory:
    """Allocates guarded tensors on one device and says how far a kernel wrote outside them."""

    def __init__(self, plugin: Any) -> None:
        self.plugin = plugin
        # block address -> (bytes, guards included; a token): only while the guarded tensor lives. A freed
        # block's address is soon another tensor's, unguarded and of another size: reading "its guards"
        # would read past that allocation (a plugin error) or report damage that is not there.
        self.blocks: dict[int, tuple[int, object]] = {}

    def empty(
        self, dev: Any, shape: Sequence[int], stride: Sequence[int], offset: int, dtype: torch.dtype
    ) -> torch.Tensor:
        """An uninitialised fl tensor of this layout whose span sits between two canary zones."""
        item = torch.empty((), dtype=dtype).element_size()
        probe = torch.empty(0, dtype=dtype, device="meta").as_strided(shape, stride, offset)
        _, hi = span(probe)
        total = GUARD_BYTES + max(hi, offset) * item + GUARD_BYTES
        block = torch.empty(total, dtype=torch.uint8, device=dev.torch_device)
        fill = torch.full((total,), CANARY, dtype=torch.uint8)
        dev.copy_h2d(block.data_ptr(), fill.data_ptr(), total)
        token, ptr = object(), block.data_ptr()
        self.blocks[ptr] = (total, token)
        out = torch.empty(0, dtype=dtype, device=dev.torch_device)
        out.set_(block.untyped_storage(), GUARD_BYTES // item + offset, shape, stride)
        weakref.finalize(out, self._forget, ptr, token)
        return out

    def _forget(self, ptr: int, token: object) -> None:
        entry = self.blocks.get(ptr)
        if entry is not None and entry[1] is token:
            del self.blocks[ptr]

    def damage(self, t: torch.Tensor) -> str | None:
        """How far the last kernel wrote outside t's span: "N bytes past the end" /
        "N bytes before the start", or None when every guard byte is intact."""
        base = base_ptr(t)
        entry = self.blocks.get(base)
        if entry is None:
            return None
        total = entry[0]
        host = torch.empty(total, dtype=torch.uint8)
        device_of(t).copy_d2h(host.data_ptr(), base, total)
        lo, hi = span(t)
        start, end = lo * t.element_size(), hi * t.element_size()
        changed = (host != CANARY).nonzero().flatten()
        after = changed[changed >= end]
        if after.numel():
            return f"{int(after.max()) - end + 1} bytes past the end"
        before = changed[changed < start]
        if before.numel():
            return f"{start - int(before.min())} bytes before the start"
        return None
