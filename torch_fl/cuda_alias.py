"""The opt-in `cuda` alias: code written for NVIDIA runs on the active fl backend unchanged.

Most "unchanged PyTorch code" is CUDA code: `device = "cuda" if
torch.cuda.is_available() else "cpu"`, `.cuda()`, `torch.autocast("cuda")`,
`torch.amp.GradScaler("cuda")`, `torch.cuda.synchronize()`,
`dist.init_process_group("nccl")`. The string "cuda" is parsed in C++ to
DeviceType::CUDA, which a CPU-only PyTorch cannot allocate on, and no backend
registration can claim it. So the alias works where CUDA enters from Python:

* a TorchFunctionMode, entered once and kept, rewrites CUDA device arguments
  (`device="cuda:1"`, `torch.device("cuda")`, a bare index, `.to("cuda")`,
  `.cuda()`, `torch.set_default_device("cuda")`) to the fl device they mean:
  `cuda:N` is the active backend's N-th device, `cuda` its current device;
* the `torch.cuda` functions are replaced by fl-backed ones (device count,
  memory, seeds, streams, events); the ones with no fl meaning (CUDA graphs,
  NCCL, NVTX, jiterator, compute capability ...) raise UnsupportedCudaFeatureError
  naming the feature and what to do instead;
* `torch.autocast("cuda")`, `torch.amp.GradScaler("cuda")`, `torch.load` of
  CUDA checkpoints, storages' `.cuda()`, `dist.init_process_group("nccl")`
  and DDP's `device_ids` are mapped to the fl device type.

Tensors keep reporting their real device (`fl:N`): code that tests
`x.is_cuda` or `x.device.type == "cuda"` sees False. The alias is off by
default, turns on with `FL_ALIAS_CUDA=1` (at `import torch` through the
autoload entry point, or at `import torch_fl`) or `torch_fl.alias_cuda()`,
never over a real CUDA device unless forced (`FL_ALIAS_CUDA=force`,
`alias_cuda(force=True)`), says so in one line on stderr, and lasts for the
process. docs/user-guide.md ("Code written for CUDA") lists what it covers."""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.abc
import importlib.machinery
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils import _device as _torch_device

import torch_fl as fl
from torch_fl.errors import ConfigError, FlError
from torch_fl.notice import notice
from torch_fl.runtime import config, streams

ENV = "FL_ALIAS_CUDA"

__all__ = ["ENV", "CudaAliasError", "UnsupportedCudaFeatureError", "alias_cuda", "autoload_in_progress",
           "from_environment", "is_active", "requested"]


class CudaAliasError(FlError):
    """The alias was asked for but cannot turn on (a real CUDA device is present and force was not given)."""


class UnsupportedCudaFeatureError(FlError, NotImplementedError):
    """A CUDA feature the alias does not cover (CUDA graphs, NCCL, custom CUDA kernels, ...). The message
    names the feature and what to use instead."""


_lock = threading.RLock()
_state: dict[str, Any] = {"active": False, "forced": False, "nccl_said": False}
_MISSING = object()
# (owner, name, what was in owner.__dict__ or _MISSING), in the order the alias replaced them: what
# _restore() puts back if turning the alias on fails half-way
_originals: list[tuple[Any, str, Any]] = []
_mode_threads: set[int] = set()


# -- turning it on --------------------------------------------------------------------------------


def is_active() -> bool:
    """Whether the cuda alias is on in this process."""
    return bool(_state["active"])


def _real_cuda_available() -> bool:
    """Whether this PyTorch sees a real CUDA device (asked before the alias replaces is_available)."""
    try:
        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001 - a broken CUDA install counts as none
        return False


def alias_cuda(force: bool = False) -> str:
    """Make code written for CUDA run on the active fl backend, unchanged; returns the backend's name.

    Why opt-in: it changes what `torch.cuda` answers for the whole process. Why
    it refuses a real CUDA device unless `force=True`: there, "cuda" already
    means something, and silently sending it elsewhere would surprise. Calling
    it again is harmless (and enters the device mode in a thread that lacks it)."""
    with _lock:
        if _state["active"]:
            _enter_mode()
            return fl.get_current_backend_name()
        if not force and _real_cuda_available():
            raise CudaAliasError("torch_fl's cuda alias stays off: this PyTorch sees a real CUDA device, so 'cuda' "
                                 "already means it. Call alias_cuda(force=True) (or set FL_ALIAS_CUDA=force) to "
                                 "send 'cuda' to the fl backend anyway")
        backend = fl.get_current_backend_name()  # FL_BACKEND, the config file, or auto
        try:
            _install()
        except BaseException:
            _restore()
            raise
        _state.update(active=True, forced=bool(force))
        _enter_mode()
    devices = ", ".join(f"cuda:{i} -> {d}" for i, d in enumerate(_devices(backend)))
    notice(f"torch_fl: cuda alias on: 'cuda' runs on fl backend '{backend}' ({devices}); tensors report their "
           f"real device (fl:N)")
    return backend


def requested() -> str | None:
    """What FL_ALIAS_CUDA asks for: None (unset, empty, 0/false/no/off), "on" (1/true/yes/on) or "force".
    Any other value raises ConfigError naming the variable and the accepted values."""
    text = os.environ.get(ENV, "").strip()
    if not text:
        return None
    if text.lower() == "force":
        return "force"
    try:
        return "on" if config.parse_bool(text, ENV) else None
    except ConfigError:
        raise ConfigError(f"{ENV}={text!r} is not valid: use 1 to alias 'cuda' to the active fl backend, "
                          f"force to do so even over a real CUDA device, or 0 to leave it off") from None


def autoload_in_progress() -> bool:
    """Whether torch_fl is being imported by the `import torch` autoload entry point (torch_fl_autoload.load),
    which turns the alias on itself once the device is registered, so a failure gets its own warning."""
    return bool(getattr(sys.modules.get("torch_fl_autoload"), "loading", False))


def from_environment() -> str | None:
    """Honour FL_ALIAS_CUDA (see `requested`); returns the backend 'cuda' now runs on, or None. Called at
    `import torch_fl`, and by the autoload entry point, so with autoload `import torch` alone is enough.
    A real CUDA device without force leaves the alias off with one line on stderr instead of an error:
    the variable may be set machine-wide."""
    want = requested()
    if want is None:
        return None
    try:
        return alias_cuda(force=want == "force")
    except CudaAliasError:
        notice(f"torch_fl: {ENV}={os.environ[ENV].strip()} ignored: this PyTorch sees a real CUDA device, "
               f"so 'cuda' stays CUDA ({ENV}=force aliases it anyway)")
        return None


# -- which fl device a CUDA device means ----------------------------------------------------------


@functools.cache
def _devices(backend: str) -> tuple[torch.device, ...]:
    """The fl devices of a backend in local order: cuda:N is the N-th (the plugins are found once, at import)."""
    out = []
    while True:
        try:
            out.append(fl.device(backend, len(out)))
        except ValueError:
            return tuple(out)


def _cuda_index(spec: Any, ints: bool) -> tuple[bool, int | None]:
    """(is it a CUDA device, its index or None) for a device argument."""
    if isinstance(spec, str):
        if not spec.startswith("cuda"):
            return False, None
        spec = torch.device(spec)  # "cuda", "cuda:1"; a malformed string raises torch's own error
    if isinstance(spec, torch.device):
        return (True, spec.index) if spec.type == "cuda" else (False, None)
    if ints and isinstance(spec, int) and not isinstance(spec, bool):
        return True, spec
    return False, None


def _fl_for(index: int | None) -> torch.device:
    """The fl device cuda:index means: the active backend's index-th device, or its current one."""
    if index is None:
        return fl.current_device()
    backend = fl.get_current_backend_name()
    devices = _devices(backend)
    if not 0 <= index < len(devices):
        raise FlError(f"cuda:{index} does not exist: torch_fl's cuda alias runs 'cuda' on fl backend '{backend}', "
                      f"which has {len(devices)} device(s) (cuda:0 to cuda:{len(devices) - 1})")
    return devices[index]


def _mapped(spec: Any, ints: bool = True) -> Any:
    """A device argument with a CUDA device replaced by its fl device; anything else unchanged."""
    is_cuda, index = _cuda_index(spec, ints)
    return _fl_for(index) if is_cuda else spec


def _fl_device(device: Any = None) -> torch.device:
    """The fl device a torch.cuda function's `device` argument names: None (current), an index, 'cuda[:N]',
    torch.device('cuda', N), or an fl device itself (x.device of an aliased tensor)."""
    if device is None:
        return fl.current_device()
    if isinstance(device, str) and device.startswith("fl"):
        device = torch.device(device)
    if isinstance(device, torch.device) and device.type == "fl":
        return device if device.index is not None else fl.current_device()
    is_cuda, index = _cuda_index(device, ints=True)
    if not is_cuda:
        raise ValueError(f"Expected a cuda device, but got: {device!r} (torch_fl's cuda alias: an index, 'cuda', "
                         f"'cuda:N', torch.device('cuda', N) or an fl device)")
    return _fl_for(index)


def _local_index(device: torch.device) -> int:
    """The cuda:N index of an fl device of the active backend (its fl index if it belongs to another)."""
    devices = _devices(fl.get_current_backend_name())
    return devices.index(device) if device in devices else int(device.index)


# -- the device mode ------------------------------------------------------------------------------


def _legacy_type_name(arg: Any) -> str | None:
    """'torch.cuda.FloatTensor' for the legacy CUDA tensor types (as a class or a string), else None."""
    name = arg if isinstance(arg, str) else f"{getattr(arg, '__module__', '')}.{getattr(arg, '__name__', '')}"
    return name if isinstance(name, str) and name.startswith("torch.cuda.") else None


class _CudaDeviceMode(TorchFunctionMode):
    """Rewrites CUDA device arguments of every torch function (factories, Tensor.to/.cuda, ...) to fl."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if kwargs:
            device = kwargs.get("device")
            if device is not None:
                new = _mapped(device)
                if new is not device:
                    kwargs = {**kwargs, "device": new}
        special = _POSITIONAL.get(func)
        if special is not None and args:
            args = special(args)
        elif func in _DIRECT:
            return _DIRECT[func](*args, **(kwargs or {}))
        default = _torch_device.CURRENT_DEVICE  # torch.set_default_device / `with torch.device(...)`
        if (default is not None and default.type == "cuda" and func in _torch_device._device_constructors()
                and (kwargs or {}).get("device") is None):
            kwargs = {**(kwargs or {}), "device": _fl_for(default.index)}
        return func(*args, **(kwargs or {}))


def _first_positional(args: tuple) -> tuple:
    if len(args) < 2:
        return args
    new = _mapped(args[1])
    return args if new is args[1] else (args[0], new, *args[2:])


def _parse_to(args: tuple) -> tuple:
    """nn.Module.to(1) / .to("cuda"): the module's argument parser turns a bare index into an fl device
    before any tensor sees it, so the device is mapped at the parser."""
    new = _mapped(args[0])
    return args if new is args[0] else (new, *args[1:])


_LEGACY_DTYPES = {"FloatTensor": torch.float32, "DoubleTensor": torch.float64, "HalfTensor": torch.float16,
                  "BFloat16Tensor": torch.bfloat16, "LongTensor": torch.int64, "IntTensor": torch.int32,
                  "ShortTensor": torch.int16, "CharTensor": torch.int8, "ByteTensor": torch.uint8,
                  "BoolTensor": torch.bool}
_SPARSE = ("sparse CUDA tensors have no fl counterpart in the alias",
           "Build the sparse tensor on the CPU, or keep it dense on 'cuda'")


def _legacy_dtype(name: str) -> torch.dtype:
    """The dtype of a legacy CUDA tensor type ('torch.cuda.HalfTensor' -> float16); sparse ones raise."""
    short = name.rsplit(".", 1)[-1]
    if ".sparse." in name or short not in _LEGACY_DTYPES:
        raise UnsupportedCudaFeatureError(_unsupported_message(name, *_SPARSE))
    return _LEGACY_DTYPES[short]


def _tensor_type(self, dtype=None, non_blocking=False, **kwargs):
    """x.type(torch.cuda.FloatTensor) / x.type('torch.cuda.HalfTensor'): to the current fl device in that dtype
    (the legacy types' meaning); every other use of Tensor.type is PyTorch's."""
    name = _legacy_type_name(dtype) if dtype is not None else None
    if name is None:
        return torch.Tensor.type(self) if dtype is None else torch.Tensor.type(self, dtype, non_blocking, **kwargs)
    return self.to(fl.current_device(), _legacy_dtype(name), non_blocking=non_blocking)


class _LegacyTensorType(type):
    """The legacy torch.cuda.FloatTensor-style classes under the alias: calling one builds the tensor on the
    current fl device; isinstance() is False, as for every check that asks whether a tensor is a CUDA one."""

    def __instancecheck__(cls, obj: Any) -> bool:
        return False

    def __call__(cls, *args: Any, **kwargs: Any) -> torch.Tensor:
        return getattr(torch, cls.__name__)(*args, **kwargs).to(fl.current_device())


def _legacy_class(name: str) -> type:
    return _LegacyTensorType(name, (), {"__module__": "torch.cuda", "dtype": _LEGACY_DTYPES[name],
                                        "__doc__": f"torch.cuda.{name} on the current fl device (cuda alias)."})


def _set_default_tensor_type(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def set_default_tensor_type(t: Any) -> None:
        """torch.set_default_tensor_type('torch.cuda.FloatTensor'): what it meant, the default dtype and
        the default device 'cuda' (set_default_dtype + set_default_device, as PyTorch now spells it)."""
        name = _legacy_type_name(t)
        if name is None:
            if _state.get("legacy_default"):  # a CPU type after a CUDA one: back to the CPU
                torch.set_default_device(None)
                _state["legacy_default"] = False
            return original(t)
        dtype = _legacy_dtype(name)
        if not dtype.is_floating_point:
            raise TypeError("only floating-point types are supported as the default type")
        torch.set_default_dtype(dtype)
        torch.set_default_device("cuda")
        _state["legacy_default"] = True
        return None

    return set_default_tensor_type


def _tensor_cuda(self, device=None, non_blocking=False, memory_format=torch.preserve_format):
    return self.to(_fl_device(device), non_blocking=non_blocking, memory_format=memory_format)


_POSITIONAL: dict[Callable, Callable[[tuple], tuple]] = {  # functions whose positional device is mapped
    torch.Tensor.to: _first_positional,
    torch.Tensor.pin_memory: _first_positional,
    torch.Tensor.is_pinned: _first_positional,
    torch._C._nn._parse_to: _parse_to,
}
_DIRECT: dict[Callable, Callable[..., Any]] = {  # functions the alias answers itself
    torch.Tensor.cuda: _tensor_cuda,
    torch.Tensor.type: _tensor_type,
}


_MODE = _CudaDeviceMode()


def _enter_mode() -> None:
    """Push the device mode in this thread (TorchFunctionMode stacks are per thread) and keep it there."""
    tid = threading.get_ident()
    if tid in _mode_threads and _MODE in torch.overrides._get_current_function_mode_stack():
        return
    torch._C._push_on_torch_function_stack(_MODE)
    _mode_threads.add(tid)


# -- errors for what the alias does not cover -------------------------------------------------------


def _unsupported_message(feature: str, why: str, instead: str) -> str:
    backend = fl.get_current_backend_name() if _state["active"] else "?"
    return (f"{feature} is not covered by torch_fl's cuda alias ('cuda' runs on fl backend '{backend}'): {why}. "
            f"{instead}")


def _raiser(feature: str, why: str, instead: str) -> Callable[..., Any]:
    def unsupported(*args, **kwargs):
        raise UnsupportedCudaFeatureError(_unsupported_message(feature, why, instead))

    unsupported.__name__ = feature.rsplit(".", 1)[-1]
    unsupported.__doc__ = f"Not covered by torch_fl's cuda alias: {why}."
    return unsupported


def _raising_class(feature: str, why: str, instead: str) -> type:
    """A stand-in for a CUDA class: isinstance() still works (always False), constructing it raises."""
    def __new__(cls, *args, **kwargs):
        raise UnsupportedCudaFeatureError(_unsupported_message(feature, why, instead))

    return type(feature.rsplit(".", 1)[-1], (), {"__new__": __new__, "__module__": "torch_fl.cuda_alias",
                                                  "__doc__": f"Not covered by torch_fl's cuda alias: {why}."})


_GRAPHS = ("CUDA graphs record and replay CUDA kernel launches, and fl devices have no graph capture",
           "Run the captured code eagerly (drop the graph capture), or use fl.compile for fused kernels")
_NCCL = ("torch.cuda.nccl calls NVIDIA's collective library directly",
         "Use torch.distributed: init_process_group('nccl') is mapped to the fl process group")
_NVTX = ("NVTX markers are read by NVIDIA's profilers only",
         "Use torch.profiler.record_function, or fl.profile() for per-op paths")
_JIT = ("the jiterator compiles CUDA C++ source",
        "Write the function with PyTorch ops: fl's JIT tier compiles pointwise ops for the device")
_KERNELS = ("custom CUDA kernels are compiled with nvcc for NVIDIA GPUs",
            "A device kernel for an fl backend goes into its plugin (docs/writing-a-plugin.md); "
            "CppExtension / load_inline(cpp_sources=...) still build CPU code")
_COMM = ("torch.cuda.comm copies between GPUs with CUDA kernels",
         "Move tensors with .to('cuda:N'), or use DistributedDataParallel with torchrun")
_DP = ("torch.nn.DataParallel scatters and gathers through CUDA's comm kernels",
       "Run the model on one device ('cuda'), or use DistributedDataParallel with torchrun (init_process_group('nccl') "
       "is mapped to the fl process group)")
_DEVICE_ID = ("the fl process group does not bind to a device yet (it runs collectives on the tensors' own "
              "devices)", "Drop device_id and call torch.cuda.set_device(local_rank) before init_process_group")
_CAPABILITY = ("an fl device has no CUDA compute capability",
               "Ask what it computes in instead: torch.cuda.is_bf16_supported(), or "
               "fl.capabilities().devices[0].dtypes")
_NVML = ("it reads NVIDIA's management library (NVML)", "Use torch.cuda.mem_get_info() / memory_allocated() for memory")
_ALLOCATOR = ("it configures CUDA's caching allocator", "fl has its own pool: FL_MEMORY_POOL_LIMIT, "
              "torch.fl.set_memory_pool_limit(), torch.cuda.empty_cache()")
_RUNTIME = ("it needs the CUDA runtime itself", "Leave it out when running on an fl backend")
_PROFILER = ("torch.cuda.profiler drives NVIDIA's profiler", "Use torch.profiler or fl.profile()")
_EXTERNAL = ("it wraps a raw cudaStream_t", "Use torch.cuda.Stream() (an fl stream)")

UNSUPPORTED: dict[str, tuple[str, str]] = {  # torch.cuda name -> (why, what instead)
    "CUDAGraph": _GRAPHS, "graph": _GRAPHS, "make_graphed_callables": _GRAPHS, "graph_pool_handle": _GRAPHS,
    "get_device_capability": _CAPABILITY, "ExternalStream": _EXTERNAL, "get_stream_from_external": _EXTERNAL,
    "utilization": _NVML, "temperature": _NVML, "power_draw": _NVML, "clock_rate": _NVML, "memory_usage": _NVML,
    "device_memory_used": _NVML, "list_gpu_processes": _NVML,
    "set_per_process_memory_fraction": _ALLOCATOR, "get_per_process_memory_fraction": _ALLOCATOR,
    "caching_allocator_alloc": _ALLOCATOR, "caching_allocator_delete": _ALLOCATOR,
    "caching_allocator_enable": _ALLOCATOR, "change_current_allocator": _ALLOCATOR,
    "CUDAPluggableAllocator": _ALLOCATOR,
    "MemPool": _ALLOCATOR, "use_mem_pool": _ALLOCATOR, "memory_snapshot": _ALLOCATOR,
    "cudart": _RUNTIME, "current_blas_handle": _RUNTIME, "current_solver_handle": _RUNTIME,
    "can_device_access_peer": _RUNTIME, "check_error": _RUNTIME, "get_sync_debug_mode": _RUNTIME,
    "set_sync_debug_mode": _RUNTIME, "GreenContext": _RUNTIME,
}
UNSUPPORTED_MODULES: dict[str, tuple[str, str]] = {  # every public function of these modules raises
    "torch.cuda.nccl": _NCCL, "torch.cuda.nvtx": _NVTX, "torch.cuda.jiterator": _JIT, "torch.cuda.comm": _COMM,
    "torch.nn.parallel.comm": _COMM, "torch.cuda.profiler": _PROFILER, "torch.cuda.graphs": _GRAPHS,
}


# -- torch.cuda, backed by fl ---------------------------------------------------------------------


class device:  # noqa: N801 - torch.cuda.device's name
    """torch.cuda.device(N): makes cuda:N (an fl device) current inside the block."""

    def __init__(self, device: Any) -> None:
        self.target = None if device is None or (isinstance(device, int) and device < 0) else _fl_device(device)
        self.previous: torch.device | None = None

    def __enter__(self):
        if self.target is not None:
            self.previous = fl.current_device()
            torch.fl.set_device(self.target.index)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.previous is not None:
            torch.fl.set_device(self.previous.index)


class device_of(device):  # noqa: N801 - torch.cuda.device_of's name
    """torch.cuda.device_of(tensor): the tensor's device current inside the block (no-op for host tensors)."""

    def __init__(self, obj: Any) -> None:
        super().__init__(obj.device if obj.device.type in ("fl", "cuda") else None)


@dataclass(frozen=True)
class CudaDeviceProperties:
    """torch.cuda.get_device_properties() for an fl device: what the plugin reports, named as CUDA names it.
    There is no compute capability: `major`/`minor` raise AttributeError saying so."""

    name: str
    total_memory: int
    multi_processor_count: int
    fl_device: torch.device
    backend: str

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(_unsupported_message(f"torch.cuda.get_device_properties().{name}", *_CAPABILITY)
                             if name in ("major", "minor", "gcnArchName", "uuid", "L2_cache_size",
                                         "is_integrated", "is_multi_gpu_board") else name)


def _is_available() -> bool:
    return bool(_state["active"])


def _device_count() -> int:
    return len(_devices(fl.get_current_backend_name()))


def _current_device() -> int:
    return _local_index(fl.current_device())


def _set_device(device: Any) -> None:
    if isinstance(device, int) and device < 0:
        return  # torch.cuda.set_device(-1) is a no-op
    torch.fl.set_device(_fl_device(device).index)


def _get_device_name(device: Any = None) -> str:
    return torch.fl.get_device_name(_fl_device(device).index)


def _get_device_properties(device: Any = None) -> CudaDeviceProperties:
    d = _fl_device(device)
    props = torch.fl.get_device_properties(d.index)
    return CudaDeviceProperties(name=torch.fl.get_device_name(d.index), total_memory=int(props.total_memory),
                                multi_processor_count=int(props.compute_units), fl_device=d,
                                backend=torch.fl.get_device_name(d.index).split(":", 1)[0])


def _dtypes(device: Any = None) -> list[str]:
    d = _fl_device(device)
    return list(torch.fl.get_device_properties(d.index).dtype_names)


def _is_bf16_supported(including_emulation: bool = True) -> bool:
    return "bfloat16" in _dtypes()


def _is_tf32_supported() -> bool:
    return False  # fl backends compute float32 matmuls in float32


def _on(fn_name: str) -> Callable[..., Any]:
    """torch.cuda.<fn_name>(device=None) as torch.fl.<fn_name> on the fl device `device` names."""
    def call(device: Any = None) -> Any:
        return getattr(torch.fl, fn_name)(_fl_device(device).index)

    call.__name__ = fn_name
    return call


def _synchronize(device: Any = None) -> None:
    torch.fl.synchronize(_fl_device(device).index)


def _empty_cache() -> None:
    torch.fl.empty_cache()


def _memory_summary(device: Any = None, abbreviated: bool = False) -> str:
    d = _fl_device(device)
    stats = torch.fl.memory_stats(d.index)
    width = max(len(k) for k in stats)
    lines = [f"fl memory summary: cuda:{_local_index(d)} = {d} ({torch.fl.get_device_name(d.index)})"]
    lines += [f"  {k:<{width}}  {v}" for k, v in stats.items()]
    return "\n".join(lines)


def _manual_seed(seed: int) -> None:
    torch.fl.manual_seed(int(seed))


def _manual_seed_all(seed: int) -> None:
    torch.fl.manual_seed_all(int(seed))


def _get_rng_state(device: Any = "cuda") -> torch.Tensor:
    return torch.fl.get_rng_state(_fl_device(device).index)


def _set_rng_state(new_state: torch.Tensor, device: Any = "cuda") -> None:
    torch.fl.set_rng_state(new_state, _fl_device(device).index)


def _get_rng_state_all() -> list[torch.Tensor]:
    return [torch.fl.get_rng_state(d.index) for d in _devices(fl.get_current_backend_name())]


def _set_rng_state_all(new_states) -> None:
    for d, state in zip(_devices(fl.get_current_backend_name()), new_states, strict=False):
        torch.fl.set_rng_state(state, d.index)


class Stream(metaclass=streams.FlInstance):
    """torch.cuda.Stream(device=None, priority=0): torch.fl.Stream on the fl device the cuda device names."""

    base = torch.Stream

    def __new__(cls, device: Any = None, priority: int = 0, **kwargs: Any) -> torch.Stream:
        if kwargs:  # (stream_id=, device_index=, device_type=): wrapping an existing stream
            return torch.Stream(**kwargs)
        return streams.Stream(_fl_device(device), priority)


class Event(metaclass=streams.FlInstance):
    """torch.cuda.Event(enable_timing=False, blocking=False, interprocess=False): a torch.Event on the current
    fl device (plain torch.Event objects: elapsed_time accepts only those)."""

    base = torch.Event

    def __new__(cls, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False,
                **kwargs: Any) -> torch.Event:
        return streams.Event(enable_timing, blocking, interprocess)


def _current_stream(device: Any = None) -> torch.Stream:
    return streams.current_stream(_fl_device(device))


def _default_stream(device: Any = None) -> torch.Stream:
    return streams.default_stream(_fl_device(device))


def _noop() -> None:
    """Nothing to do on fl: there is no CUDA context to create, and no inter-process memory to collect."""


def _lazy_init() -> None:
    """What PyTorch's C++ calls when a CUDA device got past the device mode (torch.cuda._lazy_init).

    Usually that is a thread the mode was never entered in (TorchFunctionMode stacks are per thread):
    the error says so. Otherwise something reached C++ without a torch function (a CUDA-only corner):
    PyTorch's own error, which the wrapper of a leftover torch.cuda function turns into one naming it."""
    if _MODE not in torch.overrides._get_current_function_mode_stack():
        raise CudaAliasError("'cuda' reached PyTorch in a thread where torch_fl's cuda alias is not entered "
                             "(its device mode is per thread, like every TorchFunctionMode): call "
                             "torch_fl.alias_cuda() at the start of this thread")
    raise AssertionError("Torch not compiled with CUDA enabled")


COVERED: dict[str, Any] = {
    "is_available": _is_available, "is_initialized": _is_available, "init": _noop, "_lazy_init": _lazy_init,
    "ipc_collect": _noop, "device_count": _device_count, "current_device": _current_device,
    "set_device": _set_device, "device": device, "device_of": device_of, "get_device_name": _get_device_name,
    "get_device_properties": _get_device_properties, "is_bf16_supported": _is_bf16_supported,
    "is_tf32_supported": _is_tf32_supported, "get_arch_list": list, "get_gencode_flags": str,
    "mem_get_info": _on("mem_get_info"), "memory_allocated": _on("memory_allocated"),
    "max_memory_allocated": _on("max_memory_allocated"), "memory_reserved": _on("memory_reserved"),
    "max_memory_reserved": _on("max_memory_reserved"), "memory_cached": _on("memory_reserved"),
    "max_memory_cached": _on("max_memory_reserved"), "reset_peak_memory_stats": _on("reset_peak_memory_stats"),
    "reset_max_memory_allocated": _on("reset_peak_memory_stats"),
    "reset_max_memory_cached": _on("reset_peak_memory_stats"), "memory_stats": _on("memory_stats"),
    "memory_summary": _memory_summary, "empty_cache": _empty_cache, "synchronize": _synchronize,
    "manual_seed": _manual_seed, "manual_seed_all": _manual_seed_all, "seed": lambda: torch.fl.seed(),
    "seed_all": lambda: torch.fl.seed_all(), "initial_seed": lambda: torch.fl.initial_seed(),
    "get_rng_state": _get_rng_state, "set_rng_state": _set_rng_state, "get_rng_state_all": _get_rng_state_all,
    "set_rng_state_all": _set_rng_state_all, "Stream": Stream, "Event": Event, "stream": streams.stream,
    "StreamContext": streams.StreamContext, "current_stream": _current_stream, "default_stream": _default_stream,
    "set_stream": streams.set_stream, "is_current_stream_capturing": lambda: False,
}


# -- autocast, GradScaler, checkpoints, storages ---------------------------------------------------


def _amp_device(device_type: Any) -> Any:
    return "fl" if _state["active"] and device_type == "cuda" else device_type


def _patch_amp() -> None:
    from torch.amp import autocast_mode, grad_scaler

    autocast_init = autocast_mode.autocast.__init__

    @functools.wraps(autocast_init)
    def __init__(self, device_type, dtype=None, enabled=True, cache_enabled=None):
        if _state["active"] and device_type == "cuda":
            device_type = "fl"
            if dtype is None:  # CUDA's default is float16; the fl backend's is its capability table's choice
                dtype = fl.amp.autocast_dtype()
                if dtype is None:  # the device computes in float32 only
                    enabled, dtype = False, torch.get_autocast_dtype("fl")
        autocast_init(self, device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

    _set(autocast_mode.autocast, "__init__", __init__)

    scaler_init = grad_scaler.GradScaler.__init__

    @functools.wraps(scaler_init)
    def scaler(self, device="cuda", *args, **kwargs):
        scaler_init(self, _amp_device(device), *args, **kwargs)

    _set(grad_scaler.GradScaler, "__init__", scaler)

    for name in ("is_autocast_enabled", "get_autocast_dtype", "set_autocast_enabled", "set_autocast_dtype"):
        _set(torch, name, _first_arg_mapped(getattr(torch, name)))
    _set(torch.amp, "is_autocast_available", _first_arg_mapped(torch.amp.is_autocast_available))
    _set(autocast_mode, "is_autocast_available", _first_arg_mapped(autocast_mode.is_autocast_available))
    cast = autocast_mode._cast
    _set(autocast_mode, "_cast", lambda value, device_type, dtype: cast(value, _amp_device(device_type), dtype))
    _set(torch, "get_autocast_gpu_dtype", lambda: torch.get_autocast_dtype("fl"))


def _first_arg_mapped(fn: Callable[..., Any]) -> Callable[..., Any]:
    """torch.is_autocast_enabled("cuda") and friends on "fl"; the argument-less (CUDA) forms too."""

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        if args and isinstance(args[0], str):
            args = (_amp_device(args[0]), *args[1:])
        elif not args and not kwargs and fn.__name__ in ("is_autocast_enabled",):
            args = ("fl",)
        elif "device_type" in kwargs:
            kwargs = {**kwargs, "device_type": _amp_device(kwargs["device_type"])}
        return fn(*args, **kwargs)

    return call


def _cuda_location_to_fl(obj: Any, location: str) -> Any:
    """torch.load: a storage saved on CUDA ("cuda", "cuda:1") comes back on the fl device the alias maps it to."""
    if not (_state["active"] and isinstance(location, str) and location.startswith("cuda")):
        return None
    return obj.to(device=_fl_for(torch.device(location).index))


_GENERATOR = ("fl devices have no Generator objects (torch.Generator(device='fl') is unsupported too)",
              "Draw with a CPU generator (torch.Generator().manual_seed(0)) and move the tensor with .to('cuda'), "
              "or seed the device with torch.manual_seed()")


class _GeneratorType(type(torch._C.Generator)):
    """isinstance(g, torch.Generator) stays true for every generator while torch.Generator is the alias's."""

    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, torch._C.Generator)

    def __subclasscheck__(cls, sub: type) -> bool:
        return issubclass(sub, torch._C.Generator)


class Generator(torch._C.Generator, metaclass=_GeneratorType):
    """torch.Generator while the alias is on: a CUDA device raises UnsupportedCudaFeatureError; any other
    device gets PyTorch's own (plain torch._C.Generator) object."""

    def __new__(cls, device: Any = "cpu", *args: Any, **kwargs: Any) -> torch._C.Generator:
        if _cuda_index(kwargs.get("device", device), ints=False)[0]:
            raise UnsupportedCudaFeatureError(_unsupported_message("torch.Generator(device='cuda')", *_GENERATOR))
        if "device" in kwargs:
            return torch._C.Generator(*args, **kwargs)
        return torch._C.Generator(device, *args, **kwargs)


def _patch_storages() -> None:
    import torch.storage as storage

    base_new = torch._C.StorageBase.__new__

    def storage_new(cls, *args: Any, device: Any = None, **kwargs: Any) -> Any:
        if device is not None:
            kwargs["device"] = _mapped(device, ints=False)
        return base_new(cls, *args, **kwargs)

    _set(torch.UntypedStorage, "__new__", storage_new)
    _set(torch, "Generator", Generator)

    for cls in (storage._StorageBase, storage.TypedStorage):
        to = cls.to

        def mapped_to(self, *, device, non_blocking=False, _to=to):
            return _to(self, device=_mapped(device), non_blocking=non_blocking)

        def cuda(self, device=None, non_blocking=False, _to=to):
            return _to(self, device=_fl_device(device), non_blocking=non_blocking)

        _set(cls, "to", functools.wraps(to)(mapped_to))
        _set(cls, "cuda", functools.wraps(cls.cuda)(cuda))
    torch.serialization.register_package(19, lambda obj: None, _cuda_location_to_fl)


# -- torch.distributed, DataParallel, extensions ---------------------------------------------------


def _map_pg_backend(backend: Any) -> Any:
    """'nccl' (or 'cuda:nccl' in a device:backend list) -> the fl process group, said once per process."""
    if not isinstance(backend, str) or "nccl" not in backend.lower():
        return backend
    parts = [p.strip() for p in backend.lower().split(",")]
    if len(parts) == 1 and ":" not in parts[0]:
        new = "fl"
    else:
        new = ",".join("fl:fl" if p in ("cuda:nccl", "fl:nccl") else p for p in parts)
    if not _state["nccl_said"]:
        _state["nccl_said"] = True
        notice(f"torch_fl: process group backend '{backend}' runs as the fl process group on backend "
               f"'{fl.get_current_backend_name()}' (cuda alias)")
    return new


def _patch_distributed() -> None:
    import torch.distributed as dist

    if not dist.is_available():
        return
    from torch.distributed import distributed_c10d as c10d
    from torch.nn.parallel import DistributedDataParallel

    init = c10d.init_process_group

    def no_device_id(call: str, kwargs: dict) -> None:
        if kwargs.get("device_id") is not None:
            raise UnsupportedCudaFeatureError(_unsupported_message(f"{call}(..., device_id=...)", *_DEVICE_ID))

    @functools.wraps(init)
    def init_process_group(backend=None, *args, **kwargs):
        no_device_id("torch.distributed.init_process_group", kwargs)
        return init(_map_pg_backend(backend), *args, **kwargs)

    new_group_orig = c10d.new_group

    @functools.wraps(new_group_orig)
    def new_group(*args, **kwargs):
        if "backend" in kwargs:
            kwargs["backend"] = _map_pg_backend(kwargs["backend"])
        elif len(args) > 2:
            args = (*args[:2], _map_pg_backend(args[2]), *args[3:])
        no_device_id("torch.distributed.new_group", kwargs)
        return new_group_orig(*args, **kwargs)

    barrier_orig = c10d.barrier

    @functools.wraps(barrier_orig)
    def barrier(*args, **kwargs):
        ids = kwargs.get("device_ids")
        if ids is not None:
            kwargs["device_ids"] = [_mapped(i).index if _cuda_index(i, True)[0] else i for i in ids]
        return barrier_orig(*args, **kwargs)

    for module in (c10d, dist):
        _set(module, "init_process_group", init_process_group)
        _set(module, "new_group", new_group)
        _set(module, "barrier", barrier)
        _set(module, "is_nccl_available", lambda: True)

    ddp_init = DistributedDataParallel.__init__

    @functools.wraps(ddp_init)
    def ddp(self, module, device_ids=None, output_device=None, *args, **kwargs):
        if device_ids is not None:
            device_ids = [_mapped(d) for d in device_ids]
        if output_device is not None:
            output_device = _mapped(output_device)
        ddp_init(self, module, device_ids, output_device, *args, **kwargs)

    _set(DistributedDataParallel, "__init__", ddp)


def _patch_data_parallel() -> None:
    from torch.nn.parallel import DataParallel

    init = DataParallel.__init__

    @functools.wraps(init)
    def data_parallel(self, *args, **kwargs):
        raise UnsupportedCudaFeatureError(_unsupported_message("torch.nn.DataParallel", *_DP))

    _set(DataParallel, "__init__", data_parallel)


def _is_cuda_source(path: Any) -> bool:
    return isinstance(path, str) and os.path.splitext(path)[1] in (".cu", ".cuh")


def _patch_extensions(cpp_extension: Any) -> None:
    """CUDAExtension and CUDA sources in load()/load_inline() raise, naming the feature."""
    what = "a custom CUDA kernel ({})"
    _set(cpp_extension, "CUDAExtension", _raiser("torch.utils.cpp_extension.CUDAExtension", *_KERNELS))
    load, load_inline = cpp_extension.load, cpp_extension.load_inline

    @functools.wraps(load)
    def checked_load(name, sources, *args, **kwargs):
        srcs = [sources] if isinstance(sources, str) else list(sources)
        if kwargs.get("with_cuda") or any(_is_cuda_source(s) for s in srcs):
            raise UnsupportedCudaFeatureError(_unsupported_message(
                what.format("torch.utils.cpp_extension.load with .cu sources or with_cuda=True"), *_KERNELS))
        return load(name, sources, *args, **kwargs)

    @functools.wraps(load_inline)
    def checked_inline(name, cpp_sources, cuda_sources=None, *args, **kwargs):
        if cuda_sources or kwargs.get("with_cuda"):
            raise UnsupportedCudaFeatureError(_unsupported_message(
                what.format("torch.utils.cpp_extension.load_inline with cuda_sources or with_cuda=True"), *_KERNELS))
        return load_inline(name, cpp_sources, cuda_sources, *args, **kwargs)

    _set(cpp_extension, "load", checked_load)
    _set(cpp_extension, "load_inline", checked_inline)


# -- installing the replacements ------------------------------------------------------------------


def _set(owner: Any, name: str, value: Any) -> None:
    _originals.append((owner, name, owner.__dict__.get(name, _MISSING)))
    setattr(owner, name, value)


def _restore() -> None:
    """Undo every replacement, newest first: a failure while turning the alias on must not leave half of
    torch.cuda answering for fl (the half-done alias the issue warns about)."""
    while _originals:
        owner, name, value = _originals.pop()
        if value is _MISSING:
            with contextlib.suppress(AttributeError):
                delattr(owner, name)
        else:
            setattr(owner, name, value)
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _PatchOnImport)]


def _cuda_modules() -> list[Any]:
    """torch.cuda and its loaded submodules: a replaced function is replaced wherever torch.cuda re-exports it."""
    return [m for n, m in list(sys.modules.items()) if m is not None and (n == "torch.cuda" or
                                                                        n.startswith("torch.cuda."))]


def _replace_everywhere(name: str, value: Any) -> None:
    original = getattr(torch.cuda, name, None)
    _set(torch.cuda, name, value)
    if original is None:
        return
    for module in _cuda_modules():
        if module is not torch.cuda and module.__dict__.get(name) is original:
            _set(module, name, value)


def _wrap_leftover(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """A torch.cuda function neither covered nor listed as unsupported: it runs as before, but an error from
    PyTorch's missing CUDA runtime comes back naming the function and the alias."""

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (AssertionError, RuntimeError, AttributeError) as e:
            if "cuda" not in str(e).lower() or isinstance(e, FlError):
                raise
            raise UnsupportedCudaFeatureError(_unsupported_message(
                f"torch.cuda.{name}", f"it reached PyTorch's CUDA runtime, which this process does not use "
                f"({type(e).__name__}: {str(e).splitlines()[0]})", "Leave it out on an fl backend")) from e

    return call


def _install() -> None:
    import inspect

    for mod_name in UNSUPPORTED_MODULES:
        with contextlib.suppress(ImportError):
            importlib.import_module(mod_name)
    for name, value in COVERED.items():
        _replace_everywhere(name, value)
    for name, reason in UNSUPPORTED.items():
        original = getattr(torch.cuda, name, None)
        stand_in = (_raising_class if inspect.isclass(original) else _raiser)(f"torch.cuda.{name}", *reason)
        _replace_everywhere(name, stand_in)
    for mod_name, reason in UNSUPPORTED_MODULES.items():
        module = sys.modules.get(mod_name)
        if module is None:
            continue
        for name, value in list(vars(module).items()):
            if name.startswith("_") and not (mod_name == "torch.cuda.jiterator" and name.startswith("_create")):
                continue
            if getattr(value, "__module__", None) != mod_name:
                continue  # names it imported from elsewhere (typing, torch)
            if inspect.isclass(value):
                _set(module, name, _raising_class(f"{mod_name}.{name}", *reason))
            elif callable(value):
                _set(module, name, _raiser(f"{mod_name}.{name}", *reason))
    for name, value in list(vars(torch.cuda).items()):
        if (not name.startswith("_") and inspect.isfunction(value) and name not in COVERED
                and name not in UNSUPPORTED and value.__module__.startswith("torch.cuda")):
            _replace_everywhere(name, _wrap_leftover(name, value))
    for name in _LEGACY_DTYPES:
        if hasattr(torch.cuda, name):
            _set(torch.cuda, name, _legacy_class(name))
    _set(torch, "set_default_tensor_type", _set_default_tensor_type(torch.set_default_tensor_type))
    _patch_amp()
    _patch_storages()
    _patch_distributed()
    _patch_data_parallel()
    extensions = sys.modules.get("torch.utils.cpp_extension")
    if extensions is not None:
        _patch_extensions(extensions)
    else:  # importing it pulls in setuptools: patch it when the program imports it, not before
        sys.meta_path.insert(0, _PatchOnImport("torch.utils.cpp_extension", _patch_extensions))


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Runs `patch(module)` right after the module `name` is first imported."""

    def __init__(self, name: str, patch: Callable[[Any], None]) -> None:
        self.name, self.patch = name, patch

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module, patch = spec.loader.exec_module, self.patch

        def exec_and_patch(module: Any) -> None:
            exec_module(module)
            patch(module)

        spec.loader.exec_module = exec_and_patch
        return spec
