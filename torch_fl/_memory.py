"""Device memory accounting over the plugin's malloc/free.

Stats mirror torch.cuda's: allocated (live tensor bytes), peak, reserved
(what the plugin holds). An allocation the device cannot satisfy raises
torch.OutOfMemoryError naming what is in use; the process stays usable."""

from __future__ import annotations

import torch

ALIGN = 16


def round_up(nbytes: int) -> int:
    return (nbytes + ALIGN - 1) // ALIGN * ALIGN


def allocate(device, nbytes: int) -> int:
    if nbytes == 0:
        return 0
    size = round_up(nbytes)
    try:
        ptr = device.plugin.malloc(device.local, size)
    except torch.OutOfMemoryError as e:
        total = device.props.total_memory
        raise torch.OutOfMemoryError(
            f"fl:{device.index} ({device.backend.name}) out of memory: tried to allocate {_fmt(size)}; "
            f"{_fmt(device.allocated)} allocated by live tensors in {device.allocations} buffers, "
            f"device capacity {_fmt(total)}. Free tensors (del, then gc.collect()) or use a smaller batch. "
            f"Plugin said: {e}"
        ) from None
    device.allocated += size
    device.allocations += 1
    if device.allocated > device.peak:
        device.peak = device.allocated
    return ptr


def release(device, ptr: int, nbytes: int) -> None:
    if not ptr:
        return
    device.plugin.free(device.local, ptr)
    device.allocated -= round_up(nbytes)
    device.allocations -= 1


def _fmt(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n} B"
        n /= 1024
    return f"{n} B"
