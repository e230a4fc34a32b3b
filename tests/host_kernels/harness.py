"""Calls one plugin kernel directly on CPU tensors (a bundled plugin's memory is host memory, so a CPU
tensor's storage is valid device memory). Used by the kernel unit tests; the runtime has its own
marshalling, which this one follows: one fl_arg_t per schema argument in schema order, defaults filled,
tensors by input index, strings as their fl_string_code_t, outputs preallocated, an undefined tensor as a
descriptor with ndim -1."""

from __future__ import annotations

import math
import os

import torch

from torch_fl.runtime import STRING_CODES, ffi

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DTYPE_CODES = {
    torch.float32: 0,
    torch.float64: 1,
    torch.float16: 2,
    torch.bfloat16: 3,
    torch.int64: 4,
    torch.int32: 5,
    torch.int16: 6,
    torch.int8: 7,
    torch.uint8: 8,
    torch.bool: 9,
    torch.complex64: 10,
    torch.complex128: 11,
}

_loaded: dict[str, tuple] = {}
_kernels: dict[str, tuple] = {}


def load(lib: str = "libfl_cpu.so") -> tuple:
    """A bundled plugin (a file of torch_fl/runtime/plugins), loaded once: (its fl_plugin_t,
    {kernel name: (dtypes, flags, fn)})."""
    if lib not in _loaded:
        import torch_fl

        path = os.path.join(os.path.dirname(torch_fl.__file__), "runtime", "plugins", lib)
        handle = ffi.dlopen(path)
        p = ffi.new("fl_plugin_t*")
        assert handle.fl_plugin_init(p) == 0, path
        n = ffi.new("int*")
        assert p.kernel_count(n) == 0
        e = ffi.new("fl_kernel_entry_t*")
        table = {}
        for i in range(n[0]):
            assert p.kernel_get(i, e) == 0
            table[ffi.string(e.op).decode()] = (e.dtypes, e.flags, e.fn)
        _loaded[lib] = (handle, p, table)  # the handle keeps the library mapped
    return _loaded[lib][1], _loaded[lib][2]


def plugin():
    """The host plugin's fl_plugin_t."""
    return load()[0]


def kernels() -> dict:
    """The host plugin's kernels: {name: (dtypes, fn)}."""
    if not _kernels:
        _kernels.update({name: (dtypes, fn) for name, (dtypes, _flags, fn) in load()[1].items()})
    return _kernels


def entry_name(op) -> str:
    """The kernel-table name of an aten overload: "aten::add.Tensor", "aten::mm"."""
    s = op._schema
    return f"{s.name}.{s.overload_name}" if s.overload_name else s.name


def bind(op, args: tuple, kwargs: dict, required: bool = True) -> list:
    """One value per schema argument of `op`, in schema order: positional, else keyword, else the
    schema's default; an argument without any raises (required) or binds None."""
    vals = []
    for i, sa in enumerate(op._schema.arguments):
        if i < len(args):
            vals.append(args[i])
        elif sa.name in kwargs:
            vals.append(kwargs[sa.name])
        elif sa.has_default_value():
            vals.append(sa.default_value)
        elif required:
            raise TypeError(f"{entry_name(op)}: missing {sa.name}")
        else:
            vals.append(None)
    return vals


def to_specs(values: list, strings: dict = STRING_CODES) -> tuple[list, list]:
    """(inputs, specs): the arg specs (see `arg`) of bound values and the tensors they index. A list
    holding a tensor is a run of inputs (its None entries become undefined descriptors); a string is
    FL_ARG_OTHER with its code in `strings` (FL_STR_UNKNOWN, -1, when it has none)."""
    inputs, specs = [], []
    for v in values:
        if v is None:
            specs.append(("none",))
        elif isinstance(v, torch.Tensor):
            specs.append(("tensor", len(inputs)))
            inputs.append(v)
        elif isinstance(v, (list, tuple)) and any(isinstance(x, torch.Tensor) for x in v):
            specs.append(("tensors", len(inputs), len(v)))
            inputs.extend(v)
        elif isinstance(v, torch.dtype):
            specs.append(("dtype", v))
        elif isinstance(v, bool):
            specs.append(("bool", v))
        elif isinstance(v, int):
            specs.append(("int", v))
        elif isinstance(v, float):
            specs.append(("float", v))
        elif isinstance(v, str):
            specs.append(("other", strings.get(v, -1)))
        elif isinstance(v, (list, tuple)) and all(isinstance(x, int) for x in v):
            specs.append(("ints", [int(x) for x in v]))
        else:
            raise TypeError(f"{v!r} has no fl_arg_t form here")
    return inputs, specs


def meta_outputs(op, args: tuple, kwargs: dict, fill: float = math.nan, int_fill: int | None = 7) -> list:
    """The outputs of `op` preallocated as the runtime does, with the strides of PyTorch's meta function
    (often not contiguous), floating ones filled with `fill` and the others with `int_fill` (None: left
    as allocated), so an element a kernel leaves unwritten shows; an undefined or non-tensor result is None."""

    def meta(v):
        if isinstance(v, torch.Tensor):
            return torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device="meta")
        return v

    results = op(*[meta(v) for v in args], **{k: meta(v) for k, v in kwargs.items()})
    results = [] if results is None else list(results) if isinstance(results, (tuple, list)) else [results]
    outs = []
    for m in results:
        if not isinstance(m, torch.Tensor):
            outs.append(None)
            continue
        t = torch.empty_strided(m.shape, m.stride(), dtype=m.dtype)
        if t.is_floating_point():
            t.fill_(fill)
        elif int_fill is not None:
            t.fill_(int_fill)
        outs.append(t)
    return outs


def desc(t: torch.Tensor | None, d) -> None:
    """Fills descriptor d for CPU tensor t; None gives an undefined tensor (NULL data, ndim -1)."""
    if t is None:
        d.data, d.ndim = ffi.NULL, -1
        return
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
    ("ints", [..]) ("dtype", torch.dtype) ("other",) ("other", string code)"""
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
    elif kind == "other":  # what the runtime passes for a string (its code), a complex number, ...
        a.kind, a.i = 8, value[1] if len(value) > 1 else -1
    else:
        raise ValueError(kind)


def call(op: str, inputs: list, outputs: list, args: list, lib: str = "libfl_cpu.so") -> int:
    """Runs kernel `op` of plugin `lib` (None inputs and outputs: undefined tensors). Returns the status,
    0 or 3 (declined); raises for a missing kernel or any other status, with the plugin's message."""
    p, table = load(lib)
    fn = table[op][2]
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
