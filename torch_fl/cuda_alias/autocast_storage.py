"""`torch.autocast("cuda")`, `torch.amp.GradScaler("cuda")`, `torch.load` of CUDA checkpoints, storages'
`.cuda()` and `torch.Generator`, mapped to the fl device type."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from ..amp import autocast_dtype
from .devices import cuda_index, fl_device, fl_for, mapped
from .errors import UnsupportedCudaFeatureError
from .state import STATE, replace
from .unsupported import unsupported_message


def _amp_device(device_type: Any) -> Any:
    return "fl" if STATE["active"] and device_type == "cuda" else device_type


def patch_amp() -> None:
    from torch.amp import autocast_mode, grad_scaler

    autocast_init = autocast_mode.autocast.__init__

    @functools.wraps(autocast_init)
    def __init__(self, device_type, dtype=None, enabled=True, cache_enabled=None):
        if STATE["active"] and device_type == "cuda":
            device_type = "fl"
            if dtype is None:  # CUDA's default is float16; the fl backend's is its capability table's choice
                dtype = autocast_dtype()
                if dtype is None:  # the device computes in float32 only
                    enabled, dtype = False, torch.get_autocast_dtype("fl")
        autocast_init(self, device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

    replace(autocast_mode.autocast, "__init__", __init__)

    scaler_init = grad_scaler.GradScaler.__init__

    @functools.wraps(scaler_init)
    def scaler(self, device="cuda", *args, **kwargs):
        scaler_init(self, _amp_device(device), *args, **kwargs)

    replace(grad_scaler.GradScaler, "__init__", scaler)

    for name in ("is_autocast_enabled", "get_autocast_dtype", "set_autocast_enabled", "set_autocast_dtype"):
        replace(torch, name, _first_arg_mapped(getattr(torch, name)))
    replace(torch.amp, "is_autocast_available", _first_arg_mapped(torch.amp.is_autocast_available))
    replace(autocast_mode, "is_autocast_available", _first_arg_mapped(autocast_mode.is_autocast_available))
    cast = autocast_mode._cast
    replace(autocast_mode, "_cast", lambda value, device_type, dtype: cast(value, _amp_device(device_type), dtype))
    replace(torch, "get_autocast_gpu_dtype", lambda: torch.get_autocast_dtype("fl"))


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
    if not (STATE["active"] and isinstance(location, str) and location.startswith("cuda")):
        return None
    return obj.to(device=fl_for(torch.device(location).index))


_GENERATOR = (
    "fl devices have no Generator objects (torch.Generator(device='fl') is unsupported too)",
    "Draw with a CPU generator (torch.Generator().manual_seed(0)) and move the tensor with .to('cuda'), "
    "or seed the device with torch.manual_seed()",
)


_GeneratorMeta: type = type(torch._C.Generator)  # pybind's metaclass, which has no name to import


class _GeneratorType(_GeneratorMeta):
    """isinstance(g, torch.Generator) stays true for every generator while torch.Generator is the alias's."""

    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, torch._C.Generator)

    def __subclasscheck__(cls, sub: type) -> bool:
        return issubclass(sub, torch._C.Generator)


class Generator(torch._C.Generator, metaclass=_GeneratorType):
    """torch.Generator while the alias is on: a CUDA device raises UnsupportedCudaFeatureError; any other
    device gets PyTorch's own (plain torch._C.Generator) object."""

    # a factory, so not an instance of cls (mypy's rule for __new__): _GeneratorType's isinstance accepts it
    def __new__(cls, device: Any = "cpu", *args: Any, **kwargs: Any) -> torch._C.Generator:  # type: ignore[misc]
        if cuda_index(kwargs.get("device", device), ints=False)[0]:
            raise UnsupportedCudaFeatureError(unsupported_message("torch.Generator(device='cuda')", *_GENERATOR))
        if "device" in kwargs:
            return torch._C.Generator(*args, **kwargs)
        return torch._C.Generator(device, *args, **kwargs)


def patch_storages() -> None:
    import torch.storage as storage

    base_new = torch._C.StorageBase.__new__

    def storage_new(cls, *args: Any, device: Any = None, **kwargs: Any) -> Any:
        if device is not None:
            kwargs["device"] = mapped(device, ints=False)
        return base_new(cls, *args, **kwargs)

    replace(torch.UntypedStorage, "__new__", storage_new)
    replace(torch, "Generator", Generator)

    for cls in (storage._StorageBase, storage.TypedStorage):
        to = cls.to

        def mapped_to(self, *, device, non_blocking=False, _to=to):
            return _to(self, device=mapped(device), non_blocking=non_blocking)

        def cuda(self, device=None, non_blocking=False, _to=to):
            return _to(self, device=fl_device(device), non_blocking=non_blocking)

        replace(cls, "to", functools.wraps(to)(mapped_to))
        replace(cls, "cuda", functools.wraps(cls.cuda)(cuda))
    torch.serialization.register_package(19, lambda obj: None, _cuda_location_to_fl)
