"""Calls one host-plugin kernel directly on CPU tensors (the host plugin's
memory is host memory, so a CPU tensor's storage is valid device memory).
Used by the kernel unit tests; the runtime has its own marshalling."""

from __future__ import annotations

import glob
import os

import torch

from torch_fl.runtime import ffi

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DTYPE_CODES = {
    torch.float32: 0, torch.float64: 1, torch.float16: 2, torch.bfloat16: 3, torch.int64: 4,
    torch.int32: 5, torch.int16: 6, torch.int8: 7, torch.uint8: 8, torch.bool: 9,
    torch.complex64: 10, torch.complex128: 11,
}

_lib = None
_plugin = None
_kernels: dict[tuple[str, int], object] = {}


def plugin():
    global _lib, _plugin
    if _plugin is None:
        import torch_fl

        pkg = os.path.dirname(torch_fl.__file__)
        path = glob.glob(os.path.join(pkg, "runtime", "plugins", "libfl_cpu.so"))[0]
        _lib = ffi.dlopen(path)
        _plugin = ffi.new("fl_plugin_t*")
        assert _lib.fl_plugin_init(_plugin) == 0
        n = ffi.new("int*")
        _plugin.kernel_count(n)
        e = ffi.new("fl_kernel_entry_t*")
        for i in range(n[0]):
            _plugin.kernel_get(i, e)
            _kernels[ffi.string(e.op).decode()] = (e.dtypes, e.fn)
    return _plugin


def kernels() -> dict:
    plugin()
    return _kernels


def desc(t: torch.Tensor, d) -> None:
    assert t.device.type == "cpu"
    d.data = ffi.cast("void*", t.untyped_storage().data_ptr())
    d.offset = t.storage_offset()
    d.dtype = DTYPE_CODES[t.dtype]
    d.ndim = t.dim()
    for i in range(t.dim()):
        d.sizes[i] = t.size(i)
        d.strides[i] = t.stride(i)


def arg(a, value) -> None:
    """value: ("none",) ("tensor", i) ("tensors", start, n) ("int", v) ("float", v) ("bool", v)
    ("ints", [..]) ("dtype", torch.dtype) ("other",)"""
    kind = value[0]
    if kind == "none":
        a.kind = 0
    elif kind == "tensor":
        a.kind, a.i = 1, value[1]
    elif kind == "tensors":
        a.kind, a.i, a.len = 2, value[1], value[2]
    elif kind == "int":
        a.kind, a.i = 3, value[1]
    elif kind == "float":
        a.kind, a.f = 4, value[1]
    elif kind == "bool":
        a.kind, a.i = 5, int(value[1])
    elif kind == "ints":
        a.kind, a.len = 6, len(value[1])
        for i, v in enumerate(value[1]):
            a.list[i] = v
    elif kind == "dtype":
        a.kind, a.i = 7, DTYPE_CODES[value[1]]
    elif kind == "other":  # what the runtime passes for a string, a complex number, ...
        a.kind, a.i = 8, -1
    else:
        raise ValueError(kind)


def call(op: str, inputs: list[torch.Tensor], outputs: list[torch.Tensor], args: list) -> int:
    """Returns the kernel's status; raises if the kernel is missing."""
    p = plugin()
    mask, fn = _kernels[op]
    ins = ffi.new("fl_tensor_t[]", max(1, len(inputs)))
    outs = ffi.new("fl_tensor_t[]", max(1, len(outputs)))
    cargs = ffi.new("fl_arg_t[]", max(1, len(args)))
    for i, t in enumerate(inputs):
        desc(t, ins[i])
    for i, t in enumerate(outputs):
        desc(t, outs[i])
    for i, v in enumerate(args):
        arg(cargs[i], v)
    st = fn(ffi.NULL, 0, ins, len(inputs), outs, len(outputs), cargs, len(args))
    if st not in (0, 3):
        raise RuntimeError(f"{op} failed ({st}): {ffi.string(p.last_error()).decode()}")
    return st
