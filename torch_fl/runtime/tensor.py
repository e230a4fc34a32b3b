"""fl tensors are plain torch.Tensor objects on the `fl` (PrivateUse1) device:
their storage is plugin memory handed out by the C++ core's caching allocator,
and their sizes, strides and views are PyTorch's own. This module is the one
place the rest of torch_fl asks what an fl tensor is made of: its device, the
base address of its allocation (the ABI's `fl_tensor_t.data`), its descriptor
for a kernel call, and a zero-copy host view where the device allows one."""

from __future__ import annotations

from typing import Any, TypeGuard

import torch

from . import events
from .abi import ffi
from .dtypes import TO_CODE
from .registry import REGISTRY

FL = "fl"


def is_fl(t: Any) -> TypeGuard[torch.Tensor]:
    """t is a tensor on an fl device."""
    return isinstance(t, torch.Tensor) and t.device.type == FL


def device_of(t: torch.Tensor):
    """The torch_fl Device (plugin, local index, pool) that holds t."""
    return REGISTRY.devices[t.get_device()]


def base_ptr(t: torch.Tensor) -> int:
    """The address of t's allocation (what the plugin's malloc returned); t's first element lives
    storage_offset elements further."""
    return t.data_ptr() - int(t.storage_offset()) * t.element_size()  # int: a real tensor's offset is one


def storage_nbytes(t: torch.Tensor) -> int:
    return t.untyped_storage().nbytes()


def desc(t: torch.Tensor) -> dict:
    """t as the ABI's fl_tensor_t (a dict cffi fills the struct from)."""
    return {
        "data": ffi.cast("void*", base_ptr(t)),
        "offset": t.storage_offset(),
        "dtype": TO_CODE.get(t.dtype, -1),
        "ndim": t.dim(),
        "sizes": list(t.shape),
        "strides": list(t.stride()),
    }


def host_bytes(t: torch.Tensor) -> torch.Tensor:
    """t's whole storage as a CPU uint8 tensor aliasing device memory (host-accessible devices only)."""
    n = storage_nbytes(t)
    events.host_access("reads or writes device memory through a host view")
    if n == 0:
        return torch.empty(0, dtype=torch.uint8)
    return torch.frombuffer(ffi.buffer(ffi.cast("char*", base_ptr(t)), n), dtype=torch.uint8)


def host_view(t: torch.Tensor) -> torch.Tensor:
    """Zero-copy CPU view of t with t's strides (host-accessible devices only); keep t alive while it is used."""
    raw = host_bytes(t)
    item = t.element_size()
    usable = (raw.numel() // item) * item
    return raw[:usable].view(t.dtype).as_strided(t.shape, t.stride(), t.storage_offset())


def new_tensor(dev, size, dtype: torch.dtype, stride=None) -> torch.Tensor:
    """A fresh fl tensor on dev (contiguous unless strides are given)."""
    if stride is None:
        return torch.empty(list(size), dtype=dtype, device=dev.torch_device)
    return torch.empty_strided(list(size), list(stride), dtype=dtype, device=dev.torch_device)


def with_bits(t: torch.Tensor, conj: bool, neg: bool) -> torch.Tensor:
    """t with the conj/neg flags set as given (t itself, modified): a lazy conjugate or negation is a flag on
    the tensor, not a change of its memory."""
    if conj != t.is_conj():
        torch._C._set_conj(t, conj)
    if neg != t.is_neg():
        torch._C._set_neg(t, neg)
    return t


def raw(t: torch.Tensor) -> torch.Tensor:
    """A view of t's memory as stored: same layout, no conj/neg flags."""
    return with_bits(torch.ops.aten.alias.default(t), False, False)


def storage_elems(t: torch.Tensor) -> int:
    return storage_nbytes(t) // t.element_size() if t.element_size() else 0


def span(t: torch.Tensor) -> tuple[int, int]:
    """[lo, hi) in elements of the storage a strided tensor touches."""
    lo = int(t.storage_offset())  # a real tensor's, never symbolic: the caller copies its bytes
    if t.numel() == 0:
        return lo, lo
    hi = lo + sum((int(s) - 1) * st for s, st in zip(t.shape, t.stride(), strict=True))
    return lo, hi + 1


def to_meta(t: torch.Tensor) -> torch.Tensor:
    """An fl tensor as a meta tensor of the same layout over a storage of the same size (other values
    pass through): what PyTorch's meta functions are asked with."""
    if is_fl(t):
        base = torch.empty((storage_elems(t),), dtype=t.dtype, device="meta")
        return with_bits(base.as_strided(t.shape, t.stride(), t.storage_offset()), t.is_conj(), t.is_neg())
    return t


def map_tensors(fn, vals) -> list:
    """vals with fn applied to every tensor, also inside lists and tuples."""
    out = []
    for v in vals:
        if isinstance(v, torch.Tensor):
            out.append(fn(v))
        elif isinstance(v, (list, tuple)) and any(isinstance(x, torch.Tensor) for x in v):
            out.append(type(v)(fn(x) if isinstance(x, torch.Tensor) else x for x in v))
        else:
            out.append(v)
    return out


def iter_tensors(vals):
    """The tensors among vals, also inside lists and tuples."""
    for v in vals:
        if isinstance(v, torch.Tensor):
            yield v
        elif isinstance(v, (list, tuple)):
            for x in v:
                if isinstance(x, torch.Tensor):
                    yield x


def is_dense(t: torch.Tensor) -> bool:
    """Non-overlapping and dense: the strides are a permutation of a contiguous layout."""
    if t.numel() <= 1:
        return True
    dims = sorted((st, s) for s, st in zip(t.shape, t.stride(), strict=True) if s != 1)
    expected = 1
    for st, s in dims:
        if st != expected:
            return False
        expected *= s
    return True


def like_layout(dev, t: torch.Tensor, dtype=None) -> torch.Tensor:
    """A new fl tensor shaped like t, keeping t's strides when they are dense."""
    dtype = dtype or t.dtype
    if is_dense(t):
        return new_tensor(dev, t.shape, dtype, list(t.stride()))
    return new_tensor(dev, t.shape, dtype)
