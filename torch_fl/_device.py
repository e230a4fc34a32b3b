"""Registers the `fl` device with PyTorch and provides `torch.fl`.

Uses PyTorch's Python backend route (torch >= 2.9):
`_setup_privateuseone_for_python_backend` renames PrivateUse1 to `fl` and
installs hooks and a device guard; factories reach torch_fl through
`torch.library` impls of `aten::empty.memory_format` / `aten::empty_strided`,
and any other op dispatched to the device with no fl tensor argument (iota,
scalar_tensor, ...) is computed on the host and moved."""

from __future__ import annotations

import torch

from ._dtypes import TO_CODE
from ._registry import REGISTRY
from .errors import PrivateUse1TakenError

_registered = False
_lib: torch.library.Library | None = None


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
        from . import _async

        dev = REGISTRY.device(_index(device))
        _async.wait_all(dev)
        dev.plugin.synchronize(dev.local)

    @staticmethod
    def get_device_name(device=None) -> str:
        dev = REGISTRY.device(_index(device))
        return f"{dev.backend.name}: {dev.props.name}"

    @staticmethod
    def get_device_properties(device=None):
        return REGISTRY.device(_index(device)).props

    # memory
    @staticmethod
    def memory_allocated(device=None) -> int:
        return REGISTRY.device(_index(device)).allocated

    @staticmethod
    def max_memory_allocated(device=None) -> int:
        return REGISTRY.device(_index(device)).peak

    @staticmethod
    def memory_reserved(device=None) -> int:
        dev = REGISTRY.device(_index(device))
        return dev.allocated + dev.cached

    @staticmethod
    def reset_peak_memory_stats(device=None) -> None:
        dev = REGISTRY.device(_index(device))
        dev.peak = dev.allocated

    @staticmethod
    def empty_cache() -> None:
        """Return cached blocks of every fl device to their plugins."""
        from . import _memory

        for dev in REGISTRY.devices:
            _memory.empty_cache(dev)

    @staticmethod
    def set_memory_pool_limit(nbytes: int, device=None) -> None:
        """Cap the bytes the caching pool keeps (FL_MEMORY_POOL_LIMIT sets the default)."""
        from . import _memory

        _memory.set_pool_limit(nbytes, device)

    @staticmethod
    def memory_stats(device=None) -> dict[str, int]:
        dev = REGISTRY.device(_index(device))
        return {"allocated_bytes.all.current": dev.allocated, "allocated_bytes.all.peak": dev.peak,
                "reserved_bytes.all.current": dev.allocated + dev.cached, "pool.cached_bytes": dev.cached,
                "pool.hits": dev.pool_hits, "pool.misses": dev.pool_misses, "pool.limit_bytes": dev.pool_limit,
                "allocation.all.current": dev.allocations}

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
        from ._capability import amp_dtypes

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


class _Hooks(torch._C._acc.PrivateUse1Hooks):
    def is_available(self) -> bool:
        return True

    def has_primary_context(self, dev_id) -> bool:
        return True

    def is_built(self) -> bool:
        return True


class _Guard(torch._C._acc.DeviceGuard):
    def type_(self):
        return torch._C._autograd.DeviceType.PrivateUse1


def _target(device) -> object:
    index = None
    if device is not None:
        index = torch.device(device).index
    return REGISTRY.device(index)


def _empty_memory_format(size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    from ._dispatch import new_tensor

    dev = _target(device)
    dtype = dtype or torch.get_default_dtype()
    out = new_tensor(dev, size, dtype)
    if memory_format is not None and memory_format not in (torch.contiguous_format, torch.preserve_format):
        meta = torch.empty(size, dtype=dtype, device="meta", memory_format=memory_format)
        out = new_tensor(dev, size, dtype, list(meta.stride()))
    return out


def _empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):
    from ._dispatch import new_tensor

    return new_tensor(_target(device), size, dtype or torch.get_default_dtype(), list(stride))


def _direct(op):
    def impl(*args, **kwargs):
        from ._dispatch import dispatch

        return dispatch(op, args, kwargs)

    return impl


def _native_factory(op, dev, args, kwargs):
    """A factory (arange, ...) the plugin has a kernel for: allocated and filled on the device. The
    output layout comes from the meta device; the kernel sees the op's scalar arguments."""
    from ._dispatch import _NOT_HANDLED, NATIVE, SETTINGS, _count, _output_layouts, _run_native, facts

    f = facts(op)
    entry = dev.backend.plugin.kernels.get(f.name)
    if entry is None or NATIVE in SETTINGS.disabled or "device" not in f.arg_names:
        return None
    vals = f.normalize(args, dict(kwargs, device=torch.device("meta")))
    layouts = _output_layouts(f, vals)  # on the meta device, cached: the same call _run_native makes
    if not layouts or not isinstance(layouts[0], tuple) or len(layouts[0]) != 3:
        return None  # arguments the factory rejects: the host path reports them
    code = TO_CODE.get(layouts[0][2], -1)
    if code < 0 or not (entry.dtypes >> code) & 1 or not (dev.props.dtypes >> code) & 1:
        return None
    out = _run_native(f, entry, dev, vals)
    if out is _NOT_HANDLED:
        return None
    _count(dev.backend, f.name, NATIVE)
    return out


def _factory_fallback(first, second, *args, **kwargs):
    """An op dispatched to the fl device without an fl tensor argument, such as
    a factory a decomposition calls: compute on the host, move to the device.
    (PyTorch hands a keyset-aware fallback (op, keyset, ...) on some paths and
    (keyset, op, ...) on others, e.g. under autograd's backward.)"""
    from . import _record

    op = first if isinstance(first, torch._ops.OpOverload) else second
    from ._dispatch import SETTINGS, cpu_to_new_fl, facts

    device = kwargs.get("device")
    dev = _target(device if device is not None and torch.device(device).type == "fl" else None)
    from ._dispatch import _tls

    if op is torch.ops.aten._efficientzerotensor.default:
        # autograd's zero gradients (sgn, ...): PyTorch's CPU one has no storage (data_ptr 0);
        # on fl it is a real zero-filled tensor, made on the device with the fill_ every plugin has
        from ._dispatch import new_tensor

        dtype = kwargs.get("dtype") or torch.get_default_dtype()
        return new_tensor(dev, list(args[0]), dtype).zero_()

    if not SETTINGS.cpu_fallback or getattr(_tls, "device_only", 0):
        raise NotImplementedError(
            f"{facts(op).name} has no kernel on fl backend '{dev.backend.name}' and the CPU fallback is "
            f"switched off (FL_CPU_FALLBACK=0); enable it with FL_CPU_FALLBACK=1 or torch_fl.set_cpu_fallback(True)")
    native = _native_factory(op, dev, args, kwargs)
    if native is not None:
        return native
    if "device" in kwargs:
        kwargs = dict(kwargs, device="cpu")
    out = op(*args, **kwargs)
    from ._dispatch import _count

    _count(dev.backend, facts(op).name, _record.FALLBACK)
    if isinstance(out, torch.Tensor) and out.device.type == "cpu":
        return cpu_to_new_fl(dev, out)
    return out


def register() -> None:
    global _registered, _lib
    if _registered:
        return
    name = torch._C._get_privateuse1_backend_name()
    if name not in ("privateuseone", "fl"):
        raise PrivateUse1TakenError(
            f"PyTorch's PrivateUse1 device slot is already owned by '{name}' (another package such as "
            f"torch_npu or torch_mlu registered it in this process). torch_fl needs that slot for the 'fl' "
            f"device: import torch_fl in a process that does not import the '{name}' package."
        )
    if name == "privateuseone":
        # the steps of torch.utils.backend_registration._setup_privateuseone_for_python_backend, with
        # torch_fl's C++ guard and hooks (see _guard.py) in place of the Python ones where they build
        torch.utils.rename_privateuse1_backend("fl")
        torch.utils.generate_methods_for_privateuse1_backend()
        torch._register_device_module("fl", FlDeviceModule())
    _lib = torch.library.Library("aten", "IMPL")
    _lib.impl("empty.memory_format", _empty_memory_format, "PrivateUse1")
    _lib.impl("empty_strided", _empty_strided, "PrivateUse1")
    # torch.tensor(data, device="fl") and friends run with Python dispatch excluded, so the
    # transfer ops reach the PrivateUse1 key directly: give them the dispatcher's handlers
    for name in ("_to_copy", "copy_", "lift_fresh", "_local_scalar_dense"):
        _lib.impl(name, _direct(getattr(torch.ops.aten, name).default), "PrivateUse1")
    _fallback_lib = torch.library.Library("_", "IMPL")
    _fallback_lib.fallback(_factory_fallback, dispatch_key="PrivateUse1", with_keyset=True)
    globals()["_fallback_lib"] = _fallback_lib
    torch.serialization.add_safe_globals([_rebuild()])
    # Plugins are found now (13 ms for the bundled four) because the device
    # guard must report every fl device before the process's first backward.
    from . import _guard

    REGISTRY.discover()
    if _guard.install(len(REGISTRY.devices)):
        _guard.set_sync_hook(FlDeviceModule.synchronize)  # torch.Stream/Event/accelerator synchronize
    else:
        _patch_to()
    # no-ops where the C++ guard and hooks are registered already (first registration wins)
    torch._C._acc.register_python_privateuseone_hook(_Hooks())
    torch._C._acc.register_python_privateuseone_device_guard(_Guard())
    from . import amp

    amp.register()
    _registered = True


def _is_bare_fl(device) -> bool:
    if isinstance(device, str):
        return device == "fl"
    return isinstance(device, torch.device) and device.type == "fl" and device.index is None


def _patch_to() -> None:
    """Only without torch_fl's C++ guard (see _guard.py): `.to("fl")` means
    the current fl device, as `.to("cuda")` means the current CUDA device, but
    PyTorch's Python guard resolves a bare "fl" to fl:0. Tensor.to (which
    Module.to calls) names the current device instead; every other argument
    passes through untouched."""
    original = torch.Tensor.to
    if getattr(original, "_fl_patched", False):
        return

    def to(self, *args, **kwargs):
        if args and _is_bare_fl(args[0]):
            args = (REGISTRY.device(None).torch_device,) + args[1:]
        elif "device" in kwargs and _is_bare_fl(kwargs["device"]):
            kwargs["device"] = REGISTRY.device(None).torch_device
        return original(self, *args, **kwargs)

    to.__doc__ = original.__doc__
    to._fl_patched = True  # type: ignore[attr-defined]
    torch.Tensor.to = to  # type: ignore[method-assign]


def _rebuild():
    from ._tensor import _rebuild_fl_tensor

    return _rebuild_fl_tensor
