"""The runtime: plugins, devices, memory and tensors.

It loads the vendor plugins (plugin, registry: discovery, isolation, ELF
checks), builds and loads the C++ core that makes `fl` a PyTorch device
(core, csrc/, device), keeps one caching pool per device (memory), knows what
an fl tensor is made of and moves its bytes (tensor, transfers, async_copy),
calls a plugin kernel (native), counts and reports what ran (events), and
holds the settings and configuration every layer above reads (settings,
config). It never imports the dispatcher: dispatch, jit and the tools sit
above it and import what is exported here."""

from __future__ import annotations

from . import abi, async_copy, config, core, events, memory, native, plugin, private, spawn, streams
from . import device as _device_module
from . import ipc as _ipc
from .abi import STRING_CODES, ffi, get_include, header_path, special_math_paths
from .capability import CapabilityTable, amp_dtypes
from .clock import DeviceClock
from .device import FlDeviceModule
from .dtypes import COMPLEX_CODES, FROM_CODE, TO_CODE, dtype_name, mask_to_names
from .events import COPY, DECOMPOSITION, FALLBACK, JIT, NATIVE, PATHS, VIEW, OpEvent
from .graph import KernelGraph, Recorder, recording
from .memory import Pool
from .native import NOT_HANDLED, call_kernel, mem_set_zero, native_factory, output_layouts, run_native
from .registry import REGISTRY, Backend, Device, using_backend
from .settings import SETTINGS, clear_plans, disabled_paths
from .tensor import (
    base_ptr,
    desc,
    device_of,
    host_bytes,
    host_view,
    is_dense,
    is_fl,
    iter_tensors,
    like_layout,
    map_tensors,
    new_tensor,
    raw,
    span,
    storage_nbytes,
    to_meta,
    with_bits,
)
from .transfers import copy_on_device, copy_unique, cpu_into_fl, cpu_to_new_fl, fl_to_cpu
from .untraced import not_traced
from .watch import WATCH, Sources, WriteGuard, cached_storages, cached_value


def register() -> None:
    """Make `fl` a PyTorch device (the C++ core, torch.fl, the plugins) and let fl tensors travel
    through multiprocessing queues and DataLoader workers."""
    _device_module.register()
    _ipc.install()


__all__ = [
    "COMPLEX_CODES",
    "COPY",
    "DECOMPOSITION",
    "FALLBACK",
    "FROM_CODE",
    "JIT",
    "NATIVE",
    "NOT_HANDLED",
    "PATHS",
    "REGISTRY",
    "SETTINGS",
    "STRING_CODES",
    "TO_CODE",
    "VIEW",
    "WATCH",
    "Backend",
    "CapabilityTable",
    "Device",
    "DeviceClock",
    "FlDeviceModule",
    "KernelGraph",
    "OpEvent",
    "Pool",
    "Recorder",
    "Sources",
    "WriteGuard",
    "abi",
    "amp_dtypes",
    "async_copy",
    "base_ptr",
    "clear_plans",
    "config",
    "copy_unique",
    "core",
    "copy_on_device",
    "cpu_into_fl",
    "cpu_to_new_fl",
    "desc",
    "device_of",
    "disabled_paths",
    "dtype_name",
    "events",
    "ffi",
    "fl_to_cpu",
    "get_include",
    "header_path",
    "host_bytes",
    "host_view",
    "is_dense",
    "is_fl",
    "iter_tensors",
    "like_layout",
    "map_tensors",
    "call_kernel",
    "mask_to_names",
    "mem_set_zero",
    "memory",
    "native",
    "native_factory",
    "new_tensor",
    "not_traced",
    "output_layouts",
    "plugin",
    "private",
    "raw",
    "recording",
    "register",
    "run_native",
    "span",
    "spawn",
    "special_math_paths",
    "storage_nbytes",
    "streams",
    "to_meta",
    "using_backend",
    "with_bits",
    "cached_storages",
    "cached_value",
]
