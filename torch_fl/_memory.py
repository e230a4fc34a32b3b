"""Device memory: a caching pool over the plugin's malloc/free.

Why a pool: a training step frees and re-allocates the same sizes every
iteration, and a plugin call per tensor costs more than a small kernel (the
same reason torch.cuda caches). Freed blocks wait in per-size free lists and are
handed back on the next request of that size; an allocation the device cannot
satisfy first returns the cached blocks to the plugin, then retries. Stats
mirror torch.cuda's: allocated (live tensor bytes), peak, reserved (live plus
cached), and pool hits/misses. FL_MEMORY_POOL=0 switches caching off (every
free goes straight to the plugin), as PYTORCH_NO_CUDA_MEMORY_CACHING does."""

from __future__ import annotations

import os

import torch

from ._abi import ffi

ALIGN = 16
POOL_ENABLED = os.environ.get("FL_MEMORY_POOL", "1").strip() not in ("0", "false", "no", "off")
# Cached bytes per device stay below this share of its memory: host memory is
# shared with everything else in the process.
POOL_SHARE = 4


def round_up(nbytes: int) -> int:
    return (nbytes + ALIGN - 1) // ALIGN * ALIGN


def allocate(device, nbytes: int):
    """A `void*` cdata of at least nbytes on the device (NULL for zero bytes)."""
    if nbytes == 0:
        return ffi.NULL
    size = (nbytes + ALIGN - 1) // ALIGN * ALIGN
    blocks = device.pool.get(size)
    if blocks:
        ptr = blocks.pop()
        device.cached -= size
        device.pool_hits += 1
    else:
        device.pool_misses += 1
        try:
            ptr = device.plugin.malloc_ptr(device.local, size)
        except torch.OutOfMemoryError as first:
            if not device.cached:
                raise _oom(device, size, first) from None
            empty_cache(device)  # cached blocks of other sizes may make room
            try:
                ptr = device.plugin.malloc_ptr(device.local, size)
            except torch.OutOfMemoryError as e:
                raise _oom(device, size, e) from None
    device.allocated += size
    device.allocations += 1
    if device.allocated > device.peak:
        device.peak = device.allocated
    return ptr


def release(device, ptr, nbytes: int) -> None:
    if ptr == ffi.NULL:
        return
    size = (nbytes + ALIGN - 1) // ALIGN * ALIGN
    device.allocated -= size
    device.allocations -= 1
    if POOL_ENABLED and device.cached + size <= device.pool_limit:
        blocks = device.pool.get(size)
        if blocks is None:
            blocks = device.pool[size] = []
        blocks.append(ptr)
        device.cached += size
    else:
        device.plugin.free_ptr(device.local, ptr)


def empty_cache(device) -> None:
    """Return every cached block to the plugin."""
    pool, device.pool = device.pool, {}
    device.cached = 0
    for blocks in pool.values():
        for ptr in blocks:
            device.plugin.free_ptr(device.local, ptr)


def _oom(device, size: int, cause: Exception) -> torch.OutOfMemoryError:
    total = device.props.total_memory
    return torch.OutOfMemoryError(
        f"fl:{device.index} ({device.backend.name}) out of memory: tried to allocate {_fmt(size)}; "
        f"{_fmt(device.allocated)} allocated by live tensors in {device.allocations} buffers, "
        f"device capacity {_fmt(total)}. Free tensors (del, then gc.collect()) or use a smaller batch. "
        f"Plugin said: {cause}"
    )


def _fmt(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n} B"
        n /= 1024
    return f"{n} B"
