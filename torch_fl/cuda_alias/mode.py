"""The device mode: a TorchFunctionMode, entered once per thread and kept, that rewrites CUDA device arguments
of every torch function (factories, Tensor.to/.cuda, nn.Module.to, the default device) to the fl device they
mean, and the legacy torch.cuda.FloatTensor-style types."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils import _device as _torch_device

from .devices import current_device, fl_device, fl_for, mapped
from .errors import UnsupportedCudaFeatureError
from .state import STATE
from .unsupported import unsupported_message

_mode_threads: set[int] = set()


def legacy_type_name(arg: Any) -> str | None:
    """'torch.cuda.FloatTensor' for the legacy CUDA tensor types (as a class or a string), else None."""
    name = arg if isinstance(arg, str) else f"{getattr(arg, '__module__', '')}.{getattr(arg, '__name__', '')}"
    return name if isinstance(name, str) and name.startswith("torch.cuda.") else None


class CudaDeviceMode(TorchFunctionMode):
    """Rewrites CUDA device arguments of every torch function (factories, Tensor.to/.cuda, ...) to fl."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if kwargs:
            device = kwargs.get("device")
            if device is not None:
                new = mapped(device)
                if new is not device:
                    kwargs = {**kwargs, "device": new}
        special = _POSITIONAL.get(func)
        if special is not None and args:
            args = special(args)
        elif func in _DIRECT:
            return _DIRECT[func](*args, **(kwargs or {}))
        default = _torch_device.CURRENT_DEVICE  # torch.set_default_device / `with torch.device(...)`
        if (
            default is not None
            and default.type == "cuda"
            and func in _torch_device._device_constructors()
            and (kwargs or {}).get("device") is None
        ):
            kwargs = {**(kwargs or {}), "device": fl_for(default.index)}
        return func(*args, **(kwargs or {}))


def _first_positional(args: tuple) -> tuple:
    if len(args) < 2:
        return args
    new = mapped(args[1])
    return args if new is args[1] else (args[0], new, *args[2:])


def _parse_to(args: tuple) -> tuple:
    """nn.Module.to(1) / .to("cuda"): the module's argument parser turns a bare index into an fl device
    before any tensor sees it, so the device is mapped at the parser."""
    new = mapped(args[0])
    return args if new is args[0] else (new, *args[1:])


LEGACY_DTYPES = {
    "FloatTensor": torch.float32,
    "DoubleTensor": torch.float64,
    "HalfTensor": torch.float16,
    "BFloat16Tensor": torch.bfloat16,
    "LongTensor": torch.int64,
    "IntTensor": torch.int32,
    "ShortTensor": torch.int16,
    "CharTensor": torch.int8,
    "ByteTensor": torch.uint8,
    "BoolTensor": torch.bool,
}
SPARSE = (
    "sparse CUDA tensors have no fl counterpart in the alias",
    "Build the sparse tensor on the CPU, or keep it dense on 'cuda'",
)


def legacy_dtype(name: str) -> torch.dtype:
    """The dtype of a legacy CUDA tensor type ('torch.cuda.HalfTensor' -> float16); sparse ones raise."""
    short = name.rsplit(".", 1)[-1]
    if ".sparse." in name or short not in LEGACY_DTYPES:
        raise UnsupportedCudaFeatureError(unsupported_message(name, *SPARSE))
    return LEGACY_DTYPES[short]


def _tensor_type(self, dtype=None, non_blocking=False, **kwargs):
    """x.type(torch.cuda.FloatTensor) / x.type('torch.cuda.HalfTensor'): to the current fl device in that dtype
    (the legacy types' meaning); every other use of Tensor.type is PyTorch's."""
    name = legacy_type_name(dtype) if dtype is not None else None
    if name is None:
        return torch.Tensor.type(self) if dtype is None else torch.Tensor.type(self, dtype, non_blocking, **kwargs)
    return self.to(current_device(), legacy_dtype(name), non_blocking=non_blocking)


class _LegacyTensorType(type):
    """The legacy torch.cuda.FloatTensor-style classes under the alias: calling one builds the tensor on the
    current fl device; isinstance() is False, as for every check that asks whether a tensor is a CUDA one."""

    def __instancecheck__(cls, obj: Any) -> bool:
        return False

    def __call__(cls, *args: Any, **kwargs: Any) -> torch.Tensor:
        return getattr(torch, cls.__name__)(*args, **kwargs).to(current_device())


def legacy_class(name: str) -> type:
    return _LegacyTensorType(
        name,
        (),
        {
            "__module__": "torch.cuda",
            "dtype": LEGACY_DTYPES[name],
            "__doc__": f"torch.cuda.{name} on the current fl device (cuda alias).",
        },
    )


def legacy_default_tensor_type(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def set_default_tensor_type(t: Any) -> None:
        """torch.set_default_tensor_type('torch.cuda.FloatTensor'): what it meant, the default dtype and
        the default device 'cuda' (set_default_dtype + set_default_device, as PyTorch now spells it)."""
        name = legacy_type_name(t)
        if name is None:
            if STATE.get("legacy_default"):  # a CPU type after a CUDA one: back to the CPU
                torch.set_default_device(None)
                STATE["legacy_default"] = False
            return original(t)
        dtype = legacy_dtype(name)
        if not dtype.is_floating_point:
            raise TypeError("only floating-point types are supported as the default type")
        torch.set_default_dtype(dtype)
        torch.set_default_device("cuda")
        STATE["legacy_default"] = True
        return None

    return set_default_tensor_type


def _tensor_cuda(self, device=None, non_blocking=False, memory_format=torch.preserve_format):
    return self.to(fl_device(device), non_blocking=non_blocking, memory_format=memory_format)


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


MODE = CudaDeviceMode()


def enter_mode() -> None:
    """Push the device mode in this thread (TorchFunctionMode stacks are per thread) and keep it there."""
    tid = threading.get_ident()
    if tid in _mode_threads and MODE in torch.overrides._get_current_function_mode_stack():
        return
    torch._C._push_on_torch_function_stack(MODE)
    _mode_threads.add(tid)
