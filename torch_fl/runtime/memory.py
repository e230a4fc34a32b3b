"""Device memory settings: the caching pool over the plugin's malloc/free lives
in the C++ core (csrc/fl_allocator.cpp), so that allocating a tensor never enters
Python; this module reads its configuration.

Why a pool: a training step frees and re-allocates the same sizes every
iteration, and a plugin call per tensor costs more than a small kernel (the
same reason torch.cuda caches). Freed blocks wait in per-size free lists and are
handed back on the next request of that size; an allocation the device cannot
satisfy first returns the cached blocks to the plugin, then retries. Stats
mirror torch.cuda's: allocated (live tensor bytes), peak, reserved (live plus
cached), and pool hits/misses. FL_MEMORY_POOL=0 switches caching off (every
free goes straight to the plugin), as PYTORCH_NO_CUDA_MEMORY_CACHING does."""

from __future__ import annotations

from . import config, core

POOL_ENABLED = config.env_bool("FL_MEMORY_POOL", True)
# Cached bytes per device stay below a limit: FL_MEMORY_POOL_LIMIT (bytes, or
# "512M", "2G"), torch.fl.set_memory_pool_limit(), else a quarter of the device's memory (host
# memory is shared with everything else in the process).
POOL_SHARE = 4


class Pool:
    """The caching pool of one fl device (Device.pool). Its free lists and figures live in the C++
    core, which allocates from the device's plugin; this object reads and steers them."""

    def __init__(self, index: int) -> None:
        self.index = index

    def stats(self) -> dict[str, int]:
        """allocated (live tensor bytes), peak, cached, allocations, hits, misses, limit, device_allocs,
        device_frees, ooms."""
        return core.memory_stats(self.index)

    def set_limit(self, nbytes: int) -> None:
        """Cap the bytes kept cached; blocks above the new cap go back to the plugin at once."""
        if nbytes < 0:
            raise ValueError("the pool limit cannot be negative")
        core.lib().fl_core_set_pool_limit(self.index, int(nbytes))

    def set_peak(self, value: int) -> None:
        """The peak becomes max(value, allocated) (0 resets it)."""
        core.lib().fl_core_set_peak(self.index, int(value))

    def empty(self) -> None:
        """Return every cached block to the plugin."""
        core.lib().fl_core_empty_cache(self.index)

    def __repr__(self) -> str:
        m = self.stats()
        return f"<Pool fl:{self.index} allocated={m['allocated']} cached={m['cached']} limit={m['limit']}>"


def parse_bytes(text: str, name: str = "size") -> int:
    """Bytes from "4096", "512M", "2G" (the one size grammar: config.parse_size)."""
    return config.parse_size(text, name)


def default_pool_limit(total_memory: int) -> int:
    limit = config.env_size("FL_MEMORY_POOL_LIMIT")
    return limit if limit is not None else total_memory // POOL_SHARE


def size_class(nbytes: int) -> int:
    """The block size the pool hands out for nbytes: multiples of 16 bytes up to 512, of 512 bytes up
    to 1 MiB, then eight classes per power of two (at most 12.5 % slack), so tensors of nearby sizes
    share blocks. The C++ core decides; this asks it."""
    return int(core.lib().fl_core_size_class(int(nbytes)))


def empty_cache(device) -> None:
    """Return every cached block of the device to its plugin."""
    device.pool.empty()
