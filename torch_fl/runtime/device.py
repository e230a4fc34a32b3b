"""Registers the `fl` device with PyTorch and provides `torch.fl`.

fl is PyTorch's PrivateUse1 device renamed: torch_fl's C++ core (core.py,
csrc/) gives it a device guard, hooks, a caching allocator over
the plugins' memory and the metadata ops, so fl tensors are plain
torch.Tensor objects; `torch.fl` (this module's FlDeviceModule) mirrors
torch.cuda's device, memory and random-number functions."""

from __future__ import annotations

import torch

from ..errors import PrivateUse1TakenError
from . import core, memory, streams
from .registry import REGISTRY

_registered = False


class device:
    """Context manager that makes an fl device current, like torch.cuda.device (torch.load's map_location
    uses it)."""

    def __init__(self, device) -> None:
        self.index = _index(device) if device is not None else None
        self.previous: int | None = None

    def __enter__(self):
        if self.index is not None:
            self.previous = REGISTRY.device(None).index
            FlDeviceModule.set_device(self.index)
        return self

    def __exit__(self, *exc) -> None:
        if self.previous is not None:
            FlDeviceModule.set_device(self.previous)


class FlDeviceModule:
    """`torch.fl`: what torch.cuda offers, for fl devices."""

    @staticmethod
    def is_available() -> bool:
        return bool(REGISTRY.available())

    @staticmethod
    def is_initialized() -> bool:
        return REGISTRY.current is not None

    @staticmethod
    def _is_in_bad_fork() -> bool:
        return False

    @staticmethod
    def _lazy_init() -> None:
        REGISTRY.ensure()

    @staticmethod
    def device_count() -> int:
        REGISTRY.discover()
        return len(REGISTRY.devices)

    @staticmethod
    def current_device() -> int:
        return REGISTRY.device(None).index

    @staticmethod
    def set_device(device) -> None:
        index = _index(device)
        dev = REGISTRY.device(index)
        REGISTRY.current = dev.backend
        REGISTRY.current_device = dev

    @staticmethod
    def synchronize(device=None) -> None:
        """Wait for this device's in-flight work: async copies, then the plugin's streams."""
        from . import async_copy

        dev = REGISTRY.device(_index(device))
        async_copy.wait_all(dev)
        dev.plugin.synchronize(dev.local)
        async_copy.settle_host(block=False)  # the device-to-host copies have landed: let their buffers go

    @staticmethod
    def get_device_name(device=None) -> str:
        dev = REGISTRY.device(_index(device))
        return f"{dev.backend.name}: {dev.props.name}"

    @staticmethod
    def get_device_properties(device=None):
        return REGISTRY.device(_index(device)).props

    device = device

    # streams and events: PyTorch's torch.Stream/torch.Event on fl (streams.py)
    Stream = streams.Stream
    Event = streams.Event
    StreamContext = streams.StreamContext
    stream = staticmethod(streams.stream)
    current_stream = staticmethod(streams.current_stream)
    default_stream = staticmethod(streams.default_stream)
    set_stream = staticmethod(streams.set_stream)

    # memory (the C++ core's caching allocator keeps the figures)
    @staticmethod
    def memory_allocated(device=None) -> int:
        return REGISTRY.device(_index(device)).allocated

    @staticmethod
    def max_memory_allocated(device=None) -> int:
        return REGISTRY.device(_index(device)).peak

    @staticmethod
    def memory_reserved(device=None) -> int:
        m = REGISTRY.device(_index(device)).memory()
        return m["allocated"] + m["cached"]

    @staticmethod
    def max_memory_reserved(device=None) -> int:
        m = REGISTRY.device(_index(device)).memory()
        return m["peak"] + m["cached"]

    @staticmethod
    def reset_peak_memory_stats(device=None) -> None:
        REGISTRY.device(_index(device)).peak = 0

    @staticmethod
    def empty_cache() -> None:
        """Return cached blocks of every fl device to their plugins."""
        for dev in REGISTRY.devices:
            memory.empty_cache(dev)

    @staticmethod
    def set_memory_pool_limit(nbytes: int, device=None) -> None:
        """Cap the bytes the caching pool keeps cached on a device (all devices when None; FL_MEMORY_POOL_LIMIT
        sets the default); blocks above the new cap go back to the plugin at once."""
        if nbytes < 0:
            raise ValueError("the pool limit cannot be negative")
        index = device if device is None or isinstance(device, int) else torch.device(device).index
        for dev in REGISTRY.devices if device is None else [REGISTRY.device(index)]:
            dev.pool.set_limit(nbytes)

    @staticmethod
    def mem_get_info(device=None) -> tuple[int, int]:
        """(free, total) bytes of the device, as its plugin reports them."""
        dev = REGISTRY.device(_index(device))
        used = dev.plugin.memory_used(dev.local)
        total = dev.props.total_memory
        return (max(total - used, 0) if used is not None else total, total)

    @staticmethod
    def memory_stats(device=None) -> dict[str, int]:
        m = REGISTRY.device(_index(device)).memory()
        return {
            "allocated_bytes.all.current": m["allocated"],
            "allocated_bytes.all.peak": m["peak"],
            "reserved_bytes.all.current": m["allocated"] + m["cached"],
            "pool.cached_bytes": m["cached"],
            "pool.hits": m["hits"],
            "pool.misses": m["misses"],
            "pool.limit_bytes": m["limit"],
            "allocation.all.current": m["allocations"],
            "num_device_alloc": m["device_allocs"],
            "num_device_free": m["device_frees"],
            "num_ooms": m["ooms"],
        }

    # random numbers
    @staticmethod
    def manual_seed(seed: int) -> None:
        dev = REGISTRY.device(None)
        dev.plugin.rng_set_state(dev.local, int(seed), 0)

    @staticmethod
    def manual_seed_all(seed: int) -> None:
        REGISTRY.discover()
        for dev in REGISTRY.devices:
            dev.plugin.rng_set_state(dev.local, int(seed), 0)

    @staticmethod
    def seed() -> None:
        import random

        FlDeviceModule.manual_seed(random.getrandbits(63))

    @staticmethod
    def seed_all() -> None:
        import random

        FlDeviceModule.manual_seed_all(random.getrandbits(63))

    @staticmethod
    def initial_seed() -> int:
        dev = REGISTRY.device(None)
        return dev.plugin.rng_get_state(dev.local)[0]

    @staticmethod
    def get_rng_state(device="fl") -> torch.Tensor:
        dev = REGISTRY.device(_index(device))
        seed, offset = dev.plugin.rng_get_state(dev.local)
        return torch.tensor([seed & 0x7FFFFFFFFFFFFFFF, seed >> 63, offset], dtype=torch.int64).view(torch.uint8)

    @staticmethod
    def set_rng_state(new_state: torch.Tensor, device="fl") -> None:
        dev = REGISTRY.device(_index(device))
        if new_state.dtype != torch.uint8 or new_state.numel() != 24:
            raise ValueError("fl RNG state must be the 24-byte uint8 tensor get_rng_state() returns")
        lo, hi, offset = new_state.view(torch.int64).tolist()
        dev.plugin.rng_set_state(dev.local, lo | (hi << 63), offset)

    @staticmethod
    def get_rng_state_all() -> list[torch.Tensor]:
        return [FlDeviceModule.get_rng_state(i) for i in range(FlDeviceModule.device_count())]

    @staticmethod
    def set_rng_state_all(states) -> None:
        for i, s in enumerate(states):
            FlDeviceModule.set_rng_state(s, i)

    # autocast
    @staticmethod
    def get_amp_supported_dtype() -> list[torch.dtype]:
        from .capability import amp_dtypes

        return amp_dtypes(REGISTRY.device(None).backend)


def _index(device) -> int | None:
    if device is None:
        return None
    if isinstance(device, int):
        return device
    device = torch.device(device)
    if device.type != "fl":
        raise ValueError(f"expected an fl device, got {device}")
    return device.index


def register() -> None:
    """Make `fl` a PyTorch device: rename PrivateUse1, load the C++ core (guard, hooks, allocator,
    metadata ops), register torch.fl and the Tensor/Module/Storage methods, find the plugins."""
    global _registered
    if _registered:
        return
    name = torch._C._get_privateuse1_backend_name()
    if name not in ("privateuseone", "fl"):
        raise PrivateUse1TakenError(
            f"PyTorch's PrivateUse1 device slot is already owned by '{name}' (another package such as "
            f"torch_npu or torch_mlu registered it in this process). torch_fl needs that slot for the 'fl' "
            f"device: import torch_fl in a process that does not import the '{name}' package."
        )
    lib = core.load()
    if not lib.fl_core_install():
        raise PrivateUse1TakenError(
            "another extension registered PyTorch's PrivateUse1 hooks in this process; "
            "torch_fl needs them for the 'fl' device: import torch_fl in a process "
            "without that extension"
        )
    lib.fl_core_set_pool_enabled(int(memory.POOL_ENABLED))
    if name == "privateuseone":
        torch.utils.rename_privateuse1_backend("fl")
        torch._register_device_module("fl", FlDeviceModule())
        torch.utils.generate_methods_for_privateuse1_backend(
            for_tensor=True, for_module=True, for_packed_sequence=True, for_storage=True
        )
    # Plugins are found now because the device guard must report every fl
    # device before the process's first backward.
    REGISTRY.discover()
    _registered = True
