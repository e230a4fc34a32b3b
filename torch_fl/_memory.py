"""Device memory settings: the caching pool over the plugin's malloc/free lives
in the C++ core (_csrc/fl_core.cpp), so that allocating a tensor never enters
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

from . import _config

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
    from . import _core
    from ._registry import REGISTRY

    if nbytes < 0:
        raise ValueError("the pool limit cannot be negative")
    devices = REGISTRY.devices if device is None else [REGISTRY.device(_index_of(device))]
    for dev in devices:
        _core.lib().fl_core_set_pool_limit(dev.index, int(nbytes))


def _index_of(device) -> int | None:
    import torch

    if isinstance(device, int):
        return device
    return torch.device(device).index


def size_class(nbytes: int) -> int:
    """The block size the pool hands out for nbytes: multiples of 16 bytes up to 512, of 512 bytes up
    to 1 MiB, then eight classes per power of two (at most 12.5 % slack), so tensors of nearby sizes
    share blocks. The C++ core decides; this asks it."""
    from . import _core

    return int(_core.lib().fl_core_size_class(int(nbytes)))


def empty_cache(device) -> None:
    """Return every cached block of the device to its plugin."""
    from . import _core

    _core.lib().fl_core_empty_cache(device.index)
