"""torch.cuda backed by fl: device count and properties, memory, seeds, streams and events answered for
the active backend's devices (COVERED: the torch.cuda names replaced, and by what)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..runtime import FlDeviceModule, streams
from .devices import backend_name, current_device, fl_device, fl_devices, local_index
from .errors import CudaAliasError
from .mode import MODE
from .state import STATE
from .unsupported import CAPABILITY, unsupported_message


class device:  # noqa: N801 - torch.cuda.device's name
    """torch.cuda.device(N): makes cuda:N (an fl device) current inside the block."""

    def __init__(self, device: Any) -> None:
        self.target = None if device is None or (isinstance(device, int) and device < 0) else fl_device(device)
        self.previous: torch.device | None = None

    def __enter__(self):
        if self.target is not None:
            self.previous = current_device()
            FlDeviceModule.set_device(self.target.index)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.previous is not None:
            FlDeviceModule.set_device(self.previous.index)


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
        raise AttributeError(
            unsupported_message(f"torch.cuda.get_device_properties().{name}", *CAPABILITY)
            if name in ("major", "minor", "gcnArchName", "uuid", "L2_cache_size", "is_integrated", "is_multi_gpu_board")
            else name
        )


def _is_available() -> bool:
    return bool(STATE["active"])


def _device_count() -> int:
    return len(fl_devices(backend_name()))


def _current_device() -> int:
    return local_index(current_device())


def _set_device(device: Any) -> None:
    if isinstance(device, int) and device < 0:
        return  # torch.cuda.set_device(-1) is a no-op
    FlDeviceModule.set_device(fl_device(device).index)


def _get_device_name(device: Any = None) -> str:
    return FlDeviceModule.get_device_name(fl_device(device).index)


def _get_device_properties(device: Any = None) -> CudaDeviceProperties:
    d = fl_device(device)
    props = FlDeviceModule.get_device_properties(d.index)
    return CudaDeviceProperties(
        name=FlDeviceModule.get_device_name(d.index),
        total_memory=int(props.total_memory),
        multi_processor_count=int(props.compute_units),
        fl_device=d,
        backend=FlDeviceModule.get_device_name(d.index).split(":", 1)[0],
    )


def _dtypes(device: Any = None) -> list[str]:
    d = fl_device(device)
    return list(FlDeviceModule.get_device_properties(d.index).dtype_names)


def _is_bf16_supported(including_emulation: bool = True) -> bool:
    return "bfloat16" in _dtypes()


def _is_tf32_supported() -> bool:
    return False  # fl backends compute float32 matmuls in float32


def _on(fn_name: str) -> Callable[..., Any]:
    """torch.cuda.<fn_name>(device=None) as torch.fl.<fn_name> on the fl device `device` names."""

    def call(device: Any = None) -> Any:
        return getattr(FlDeviceModule, fn_name)(fl_device(device).index)

    call.__name__ = fn_name
    return call


def _synchronize(device: Any = None) -> None:
    FlDeviceModule.synchronize(fl_device(device).index)


def _empty_cache() -> None:
    FlDeviceModule.empty_cache()


def _memory_summary(device: Any = None, abbreviated: bool = False) -> str:
    d = fl_device(device)
    stats = FlDeviceModule.memory_stats(d.index)
    width = max(len(k) for k in stats)
    lines = [f"fl memory summary: cuda:{local_index(d)} = {d} ({FlDeviceModule.get_device_name(d.index)})"]
    lines += [f"  {k:<{width}}  {v}" for k, v in stats.items()]
    return "\n".join(lines)


def _manual_seed(seed: int) -> None:
    FlDeviceModule.manual_seed(int(seed))


def _manual_seed_all(seed: int) -> None:
    FlDeviceModule.manual_seed_all(int(seed))


def _get_rng_state(device: Any = "cuda") -> torch.Tensor:
    return FlDeviceModule.get_rng_state(fl_device(device).index)


def _set_rng_state(new_state: torch.Tensor, device: Any = "cuda") -> None:
    FlDeviceModule.set_rng_state(new_state, fl_device(device).index)


def _get_rng_state_all() -> list[torch.Tensor]:
    return [FlDeviceModule.get_rng_state(d.index) for d in fl_devices(backend_name())]


def _set_rng_state_all(new_states) -> None:
    for d, state in zip(fl_devices(backend_name()), new_states, strict=False):
        FlDeviceModule.set_rng_state(state, d.index)


class Stream(metaclass=streams.FlInstance):
    """torch.cuda.Stream(device=None, priority=0): torch.fl.Stream on the fl device the cuda device names."""

    base = torch.Stream

    # a factory, so not an instance of cls (mypy's rule for __new__): FlInstance's isinstance accepts it
    def __new__(cls, device: Any = None, priority: int = 0, **kwargs: Any) -> torch.Stream:  # type: ignore[misc]
        if kwargs:  # (stream_id=, device_index=, device_type=): wrapping an existing stream
            return torch.Stream(**kwargs)
        return streams.Stream(fl_device(device), priority)


class Event(metaclass=streams.FlInstance):
    """torch.cuda.Event(enable_timing=False, blocking=False, interprocess=False): a torch.Event on the current
    fl device (plain torch.Event objects: elapsed_time accepts only those)."""

    base = torch.Event

    # a factory, so not an instance of cls (mypy's rule for __new__): FlInstance's isinstance accepts it
    def __new__(  # type: ignore[misc]
        cls,
        enable_timing: bool = False,
        blocking: bool = False,
        interprocess: bool = False,
        **kwargs: Any,
    ) -> torch.Event:
        return streams.Event(enable_timing, blocking, interprocess)


def _current_stream(device: Any = None) -> torch.Stream:
    return streams.current_stream(fl_device(device))


def _default_stream(device: Any = None) -> torch.Stream:
    return streams.default_stream(fl_device(device))


def _noop() -> None:
    """Nothing to do on fl: there is no CUDA context to create, and no inter-process memory to collect."""


def _lazy_init() -> None:
    """What PyTorch's C++ calls when a CUDA device got past the device mode (torch.cuda._lazy_init).

    Usually that is a thread the mode was never entered in (TorchFunctionMode stacks are per thread):
    the error says so. Otherwise something reached C++ without a torch function (a CUDA-only corner):
    PyTorch's own error, which the wrapper of a leftover torch.cuda function turns into one naming it."""
    if MODE not in torch.overrides._get_current_function_mode_stack():
        raise CudaAliasError(
            "'cuda' reached PyTorch in a thread where torch_fl's cuda alias is not entered "
            "(its device mode is per thread, like every TorchFunctionMode): call "
            "torch_fl.alias_cuda() at the start of this thread"
        )
    raise AssertionError("Torch not compiled with CUDA enabled")


COVERED: dict[str, Any] = {
    "is_available": _is_available,
    "is_initialized": _is_available,
    "init": _noop,
    "_lazy_init": _lazy_init,
    "ipc_collect": _noop,
    "device_count": _device_count,
    "current_device": _current_device,
    "set_device": _set_device,
    "device": device,
    "device_of": device_of,
    "get_device_name": _get_device_name,
    "get_device_properties": _get_device_properties,
    "is_bf16_supported": _is_bf16_supported,
    "is_tf32_supported": _is_tf32_supported,
    "get_arch_list": list,
    "get_gencode_flags": str,
    "mem_get_info": _on("mem_get_info"),
    "memory_allocated": _on("memory_allocated"),
    "max_memory_allocated": _on("max_memory_allocated"),
    "memory_reserved": _on("memory_reserved"),
    "max_memory_reserved": _on("max_memory_reserved"),
    "memory_cached": _on("memory_reserved"),
    "max_memory_cached": _on("max_memory_reserved"),
    "reset_peak_memory_stats": _on("reset_peak_memory_stats"),
    "reset_max_memory_allocated": _on("reset_peak_memory_stats"),
    "reset_max_memory_cached": _on("reset_peak_memory_stats"),
    "memory_stats": _on("memory_stats"),
    "memory_summary": _memory_summary,
    "empty_cache": _empty_cache,
    "synchronize": _synchronize,
    "manual_seed": _manual_seed,
    "manual_seed_all": _manual_seed_all,
    "seed": lambda: FlDeviceModule.seed(),
    "seed_all": lambda: FlDeviceModule.seed_all(),
    "initial_seed": lambda: FlDeviceModule.initial_seed(),
    "get_rng_state": _get_rng_state,
    "set_rng_state": _set_rng_state,
    "get_rng_state_all": _get_rng_state_all,
    "set_rng_state_all": _set_rng_state_all,
    "Stream": Stream,
    "Event": Event,
    "stream": streams.stream,
    "StreamContext": streams.StreamContext,
    "current_stream": _current_stream,
    "default_stream": _default_stream,
    "set_stream": streams.set_stream,
    "is_current_stream_capturing": lambda: False,
}
