"""Which fl device a CUDA device means: `cuda:N` is the active backend's N-th device, `cuda` its current one."""

from __future__ import annotations

import functools
from typing import Any

import torch

from ..errors import FlError
from ..runtime import REGISTRY


def backend_name() -> str:
    """The active fl backend ('cuda' runs there): FL_BACKEND, the config file, or the most capable one."""
    return REGISTRY.ensure().name


def current_device() -> torch.device:
    """The current fl device (what a bare 'cuda' means)."""
    return REGISTRY.device(None).torch_device


@functools.cache
def fl_devices(backend: str) -> tuple[torch.device, ...]:
    """The fl devices of a backend in local order: cuda:N is the N-th (the plugins are found once, at import)."""
    return tuple(d.torch_device for d in REGISTRY.get(backend).devices)


def cuda_index(spec: Any, ints: bool) -> tuple[bool, int | None]:
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


def fl_for(index: int | None) -> torch.device:
    """The fl device cuda:index means: the active backend's index-th device, or its current one."""
    if index is None:
        return current_device()
    backend = backend_name()
    devices = fl_devices(backend)
    if not 0 <= index < len(devices):
        raise FlError(
            f"cuda:{index} does not exist: torch_fl's cuda alias runs 'cuda' on fl backend '{backend}', "
            f"which has {len(devices)} device(s) (cuda:0 to cuda:{len(devices) - 1})"
        )
    return devices[index]


def mapped(spec: Any, ints: bool = True) -> Any:
    """A device argument with a CUDA device replaced by its fl device; anything else unchanged."""
    is_cuda, index = cuda_index(spec, ints)
    return fl_for(index) if is_cuda else spec


def fl_device(device: Any = None) -> torch.device:
    """The fl device a torch.cuda function's `device` argument names: None (current), an index, 'cuda[:N]',
    torch.device('cuda', N), or an fl device itself (x.device of an aliased tensor)."""
    if device is None:
        return current_device()
    if isinstance(device, str) and device.startswith("fl"):
        device = torch.device(device)
    if isinstance(device, torch.device) and device.type == "fl":
        return device if device.index is not None else current_device()
    is_cuda, index = cuda_index(device, ints=True)
    if not is_cuda:
        raise ValueError(
            f"Expected a cuda device, but got: {device!r} (torch_fl's cuda alias: an index, 'cuda', "
            f"'cuda:N', torch.device('cuda', N) or an fl device)"
        )
    return fl_for(index)


def local_index(device: torch.device) -> int:
    """The cuda:N index of an fl device of the active backend (its fl index if it belongs to another)."""
    devices = fl_devices(backend_name())
    return devices.index(device) if device in devices else int(device.index)
