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

import torch

from . import _config
from ._abi import ffi

ALIGN = 16
POOL_ENABLED = _config.env_bool("FL_MEMORY_POOL", True)
# Cached bytes per device stay below a limit: FL_MEMORY_POOL_LIMIT (bytes, or
# "512M", "2G"), set_pool_limit(), else a quarter of the device's memory (host
# memory is shared with everything else in the process).
POOL_SHARE = 4


def parse_bytes(text: str, name: str = "size") -> int:
    """Bytes from "4096", "512M", "2G" (the one size grammar: _config.parse_size)."""
    return _config.parse_size(text, name)


def default_pool_limit(total_memory: int) -> int:
    limit = _config.env_size("FL_MEMORY_POOL_LIMIT")
    return limit if limit is not None else total_memory // POOL_SHARE


def set_pool_limit(nbytes: int, device=None) -> None:
    """Cap the bytes the pool keeps cached on a device (all devices when None);
    blocks above the new cap go back to the plugin at once."""
    from ._registry import REGISTRY

    if nbytes < 0:
        raise ValueError("the pool limit cannot be negative")
    devices = REGISTRY.devices if device is None else [REGISTRY.device(_index_of(device))]
    for dev in devices:
        dev.pool_limit = int(nbytes)
        if dev.cached > dev.pool_limit:
            empty_cache(dev)


def _index_of(device) -> int | None:
    import torch as _torch

    if isinstance(device, int):
        return device
    return _torch.device(device).index


def size_class(nbytes: int) -> int:
    """Blocks are cached and reused by size class: multiples of 512 bytes up to
    1 MiB, then eight classes per power of two (at most 12.5 % slack), so
    tensors of nearby sizes share blocks."""
    if nbytes <= 512:
        return (nbytes + ALIGN - 1) // ALIGN * ALIGN
    if nbytes <= 1 << 20:
        return (nbytes + 511) // 512 * 512
    step = 1 << (nbytes.bit_length() - 4)
    return (nbytes + step - 1) // step * step


def round_up(nbytes: int) -> int:
    return size_class(nbytes)


def allocate(device, nbytes: int):
    """A `void*` cdata of at least nbytes on the device (NULL for zero bytes)."""
    if nbytes == 0:
        return ffi.NULL
    size = size_class(nbytes)
    blocks = device.pool.get(size)
    if blocks:
        ptr = blocks.pop()
        device.cached -= size
        device.pool_hits += 1
    else:
        device.pool_misses += 1
        if size > _config.SIZE_MAX:  # beyond any size_t: no plugin can be asked for it
            raise _oom(device, size, "the request does not fit in a size_t", 0)
        try:
            ptr = device.plugin.malloc_ptr(device.local, size)
        except torch.OutOfMemoryError as first:
            if not device.cached:
                raise _oom(device, size, first, 0) from None
            flushed = device.cached
            empty_cache(device)  # cached blocks of other sizes may make room
            try:
                ptr = device.plugin.malloc_ptr(device.local, size)
            except torch.OutOfMemoryError as e:
                raise _oom(device, size, e, flushed) from None
    device.allocated += size
    device.allocations += 1
    if device.allocated > device.peak:
        device.peak = device.allocated
    return ptr


def release(device, ptr, nbytes: int) -> None:
    if ptr == ffi.NULL:
        return
    size = size_class(nbytes)
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


def _oom(device, size: int, cause: Exception | str, flushed: int) -> torch.OutOfMemoryError:
    total = device.props.total_memory
    pool = (f"the pool held {_fmt(flushed)} of cached blocks and gave them back before retrying"
            if flushed else "the pool held no cached blocks")
    return torch.OutOfMemoryError(
        f"fl:{device.index} ({device.backend.name}) out of memory: tried to allocate {_fmt(size)}; "
        f"{_fmt(device.allocated)} allocated by live tensors in {device.allocations} buffers; {pool}; "
        f"device capacity {_fmt(total)}. Free tensors (del, then gc.collect()) or use a smaller batch. "
        + (f"Plugin said: {cause}" if isinstance(cause, Exception) else f"Not attempted: {cause}.")
    )


def _fmt(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n} B"
        n /= 1024
    return f"{n} B"
