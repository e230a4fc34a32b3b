"""The fl tensor: a wrapper subclass that owns a view of a plugin buffer.

Why a wrapper subclass (route B in DESIGN.md): autograd, nn.Parameter,
optimizers and state_dict work unchanged, no C++ allocator is needed, and a
plugin buffer is freed by Python's refcount when the last view of it dies.
The PyTorch dispatcher sends every aten op on an FlTensor to
`__torch_dispatch__`, which hands it to torch_fl's dispatcher."""

from __future__ import annotations

import copy
from typing import Any

import torch

from . import _memory
from ._abi import ffi
from ._dtypes import TO_CODE


class Buffer:
    """One plugin allocation. Views share it; it is freed when the last dies."""

    __slots__ = ("device", "nbytes", "cptr", "_host", "pending", "__weakref__")

    def __init__(self, device, nbytes: int):
        self.device = device
        self.nbytes = nbytes
        self.cptr = ffi.NULL
        self.pending = None  # an async copy into this buffer still in flight (see _async)
        self.cptr = _memory.allocate(device, nbytes)
        self._host: torch.Tensor | None = None

    @property
    def ptr(self) -> int:
        """The address as an int, for copies and host views."""
        return int(ffi.cast("uintptr_t", self.cptr))

    def host_bytes(self) -> torch.Tensor:
        """The buffer as a CPU uint8 tensor (zero-copy); only for host-accessible devices."""
        if self._host is None:
            if self.nbytes == 0:
                self._host = torch.empty(0, dtype=torch.uint8)
            else:
                self._host = torch.frombuffer(ffi.buffer(ffi.cast("char*", self.ptr), self.nbytes),
                                              dtype=torch.uint8)
        return self._host

    def __del__(self) -> None:
        if getattr(self, "pending", None) is not None:  # the copy must land before the memory is reused
            try:
                from . import _async

                _async.wait(self)
            except Exception:  # interpreter shutdown
                pass
        cptr = getattr(self, "cptr", ffi.NULL)  # absent when allocation itself failed
        if cptr != ffi.NULL:
            self.cptr = ffi.NULL
            try:
                _memory.release(self.device, cptr, self.nbytes)
            except Exception:  # interpreter shutdown: the plugin may be gone already
                pass

    def __deepcopy__(self, memo):
        raise TypeError("a plugin Buffer cannot be deep-copied; copy the tensor that owns it")

    def __reduce__(self):
        raise TypeError("a plugin Buffer cannot be pickled; save tensor.cpu() instead")


_disabled = torch._C._disabled_torch_function_impl
_DATA = torch.Tensor.data


class FlTensor(torch.Tensor):
    """A tensor on an fl device. Users never construct it directly."""

    _buf: Buffer
    _d: dict | None = None  # ABI descriptor, cached
    _s: tuple | None = None  # dispatch signature, cached

    @staticmethod
    def __new__(cls, buf: Buffer, size, stride, offset: int, dtype: torch.dtype, requires_grad: bool = False):
        t = torch.Tensor._make_wrapper_subclass(
            cls, size, strides=stride, storage_offset=offset, dtype=dtype,
            device=buf.device.torch_device, requires_grad=requires_grad,
        )
        t._buf = buf
        t._d = None
        return t

    __torch_function__ = _disabled

    # `t.data = other` (nn.Module.double()/half()/to(dtype) do this) swaps the
    # C++ metadata under the same Python object; its buffer must follow.
    @property
    def data(self) -> torch.Tensor:
        return _DATA.__get__(self)

    @data.setter
    def data(self, new: torch.Tensor) -> None:
        _DATA.__set__(self, new)
        if isinstance(new, FlTensor):
            self._buf = new._buf
            self._d = None
            self._s = None

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return _DISPATCH(func, args, kwargs or {})

    # -- ABI descriptor, cached: an FlTensor's metadata never changes in place
    #    (in-place metadata ops swap in a new impl and reset the cache) --------
    def _sig(self) -> tuple:
        s = self._s = (self._buf.device, self.dtype, tuple(self.shape), self.stride(), self.storage_offset())
        return s

    def _desc(self) -> dict:
        d = self._d
        if d is None:
            d = self._d = {
                "data": self._buf.cptr, "offset": self.storage_offset(), "dtype": TO_CODE.get(self.dtype, -1),
                "ndim": self.dim(), "sizes": list(self.shape), "strides": list(self.stride()),
            }
        return d

    def _host_view(self) -> torch.Tensor:
        """Zero-copy CPU view of this tensor (host-accessible devices only)."""
        raw = self._buf.host_bytes()
        item = self.element_size()
        usable = (raw.numel() // item) * item
        return raw[:usable].view(self.dtype).as_strided(self.shape, self.stride(), self.storage_offset())

    def __repr__(self, *, tensor_contents=None) -> str:
        body = repr(self.detach().cpu())
        extra = f", device='{self.device}'"
        if self.grad_fn is not None:
            extra += f", grad_fn=<{type(self.grad_fn).__name__}>"
        elif self.requires_grad:
            extra += ", requires_grad=True"
        return body[:-1] + extra + ")" if body.endswith(")") else body

    def __reduce_ex__(self, protocol):
        # plugin memory cannot be pickled: save the values and the device
        return (_rebuild_fl_tensor, (self.detach().cpu(), str(self.device), self.requires_grad))

    def __deepcopy__(self, memo):
        if id(self) in memo:
            return memo[id(self)]
        with torch.no_grad():
            new = self.clone()
        if getattr(self, "_is_param", False):  # an nn.Parameter stays one (Module._apply relies on it)
            new = torch.nn.Parameter(new, requires_grad=self.requires_grad)
        else:
            new.requires_grad_(self.requires_grad)
        if self.grad is not None:
            new.grad = copy.deepcopy(self.grad, memo)
        new.__dict__.update({k: copy.deepcopy(v, memo) for k, v in self.__dict__.items() if not k.startswith("_")})
        memo[id(self)] = new
        return new

    def tolist(self) -> Any:
        return self.detach().cpu().tolist()

    def numpy(self, *, force: bool = False):
        raise TypeError(f"can't convert {self.device} device type tensor to numpy. "
                        "Use Tensor.cpu() to copy the tensor to host memory first.")


# -- math bits: a lazy conjugate (x.conj() of a complex tensor) or negation (_neg_view) is a
#    flag on the tensor, not a change of its memory; views keep it, copies resolve it ------


def with_bits(t: torch.Tensor, conj: bool, neg: bool) -> torch.Tensor:
    """t with the conj/neg flags set as given (t itself, modified)."""
    if conj != t.is_conj():
        torch._C._set_conj(t, conj)
    if neg != t.is_neg():
        torch._C._set_neg(t, neg)
    return t


def raw(t: FlTensor) -> FlTensor:
    """A view of t's memory as stored: same layout, no conj/neg flags."""
    return FlTensor(t._buf, t.shape, t.stride(), t.storage_offset(), t.dtype)


def _rebuild_fl_tensor(cpu: torch.Tensor, device: str, requires_grad: bool) -> torch.Tensor:
    """Unpickling target: loads onto the fl device when torch_fl can, as
    torch.load does for cuda tensors; use map_location='cpu' to stay on the host."""
    t = cpu.to(device)
    if requires_grad:
        t.requires_grad_(True)
    return t


def _DISPATCH(func, args, kwargs):  # replaced by the dispatcher at import
    raise RuntimeError("torch_fl dispatcher not initialised")


def set_dispatch(fn) -> None:
    global _DISPATCH
    _DISPATCH = fn


def is_fl(t: Any) -> bool:
    return type(t) is FlTensor or isinstance(t, FlTensor)
