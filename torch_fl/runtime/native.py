"""The one native-kernel call: an op's arguments marshalled into the ABI's
fl_tensor_t / fl_arg_t arrays, fresh outputs allocated with the layouts
PyTorch's meta functions give, the plugin's kernel called, its status turned
into an exception. The dispatcher's native tier, the JIT's generated kernels
and the conformance checker all call kernels through `run_native`, and a native
call can be committed to the C++ core's fast path (`commit`), which replays the
same marshalling without entering Python.

The contract: `f` describes the op (the dispatcher's OpFacts, or anything with
these attributes): `func` (the OpOverload), `name`, `ret_alias` (per return, the
index of the argument it aliases, or None for a fresh tensor), `pointwise`
(inputs are broadcast to the output's shape), `tensor_arg` (per argument,
whether the schema says Tensor), `n_returns`, and `call(vals)` (the op called
with normalized argument values, used on meta tensors for the output layouts).
`vals` are the op's normalized arguments. A kernel that declines a call
(FL_ERR_UNSUPPORTED), and a call this path cannot marshal, give NOT_HANDLED:
the caller tries its next tier."""

from __future__ import annotations

import ctypes
import os

import torch

from . import abi, async_copy, core, events
from .abi import ffi
from .dtypes import TO_CODE
from .events import NATIVE
from .settings import SETTINGS
from .tensor import desc, device_of, is_dense, is_fl, iter_tensors, map_tensors, new_tensor, to_meta

aten = torch.ops.aten

NOT_HANDLED = object()  # what a call returns when this path does not serve it


def _desc_for(t: torch.Tensor, shape=None) -> dict:
    """Descriptor of t, broadcast to `shape` when given (pointwise ops)."""
    d = desc(t)
    if shape is None or d["sizes"] == shape:
        return d
    nd, td = len(shape), t.dim()
    sizes, strides = list(shape), [0] * nd
    for i in range(td):
        j = nd - td + i
        strides[j] = d["strides"][i] if d["sizes"][i] == shape[j] else 0
    return {
        "data": d["data"],
        "offset": d["offset"],
        "dtype": d["dtype"],
        "ndim": nd,
        "sizes": sizes,
        "strides": strides,
    }


_LAYOUT_CACHE: dict = {}
_LAYOUT_CACHE_MAX = 8192


def _key_of(v):
    if isinstance(v, torch.Tensor):
        if v.device.type == "fl":
            return (tuple(v.shape), v.stride(), v.dtype, v.storage_offset())
        return (v.dtype, v.dim())  # a wrapped number: its value never changes a shape
    if isinstance(v, list):
        return tuple(_key_of(x) for x in v)
    if isinstance(v, float):  # by value (arange's bounds shape its result); NaN-safe
        return (float, v if v == v else "nan")
    return v


def output_layouts(f, vals):
    """(shape, strides, dtype) of each fresh return, from PyTorch's meta
    functions, cached per signature: the meta call costs far more than a kernel
    on a small tensor."""
    try:
        key = (f.func, tuple(_key_of(v) for v in vals))
        if not any(isinstance(v, torch.Tensor) for v in vals):  # a factory: its dtype may be the default one
            key += (torch.get_default_dtype(),)
        hash(key)
    except TypeError:
        key = None
    if key is not None:
        hit = _LAYOUT_CACHE.get(key)
        if hit is not None:
            return hit
    like = _LAYOUT_OF_ARG.get(f.func)
    if like is not None:  # no meta function: the result has that argument's shape (contiguous)
        t = vals[like]
        return ((list(t.shape), _contiguous_strides(t.shape), t.dtype),)
    try:
        meta_out = f.call(map_tensors(to_meta, vals))
    except Exception:  # no meta function or data-dependent shape: not for this tier
        return None
    if f.n_returns == 1:
        meta_out = (meta_out,)
    layouts = []
    for m in meta_out:
        if m is None:
            layouts.append(None)
        elif isinstance(m, torch.Tensor):
            layouts.append((list(m.shape), list(m.stride()), m.dtype))
        elif type(m) is int:  # a size the meta function computed (max_q of fused attention)
            layouts.append(_IntReturn(m))
        else:
            layouts.append(NOT_HANDLED)
    fix = _LAYOUT_FIXES.get(f.func)
    if fix is not None:
        fix(vals, layouts)
    layouts = tuple(layouts)
    if key is not None:
        if len(_LAYOUT_CACHE) >= _LAYOUT_CACHE_MAX:
            _LAYOUT_CACHE.clear()
        _LAYOUT_CACHE[key] = layouts
    return layouts


_UNDEFINED = {"data": ffi.NULL, "offset": 0, "dtype": 0, "ndim": -1}
# ops PyTorch has no meta function for, whose one result is laid out like an argument (its index)
_LAYOUT_OF_ARG = {aten.fractional_max_pool3d_backward.default: 1}


def _contiguous_strides(shape) -> list[int]:
    strides, step = [], 1
    for size in reversed(list(shape)):
        strides.append(step)
        step *= max(int(size), 1)
    return strides[::-1]


def _batch_norm_eval_saves(vals, layouts) -> None:
    """CPU returns empty save_mean/save_invstd in inference mode where the meta function says (C,)."""
    if not vals[5] and len(layouts) == 3:
        dtype = layouts[1][2]
        layouts[1:] = [([0], [1], dtype), ([0], [1], dtype)]


def _embedding_bag_per_bag(vals, layouts) -> None:
    """CPU gives bag_size and (in every mode) max_indices one entry per bag, where the meta
    function says one per offset and (sum/mean) none."""
    if len(layouts) == 4:
        bags = vals[2].shape[0] - int(bool(vals[7]))
        layouts[2] = ([bags], [1], layouts[2][2])
        if vals[4] != 2:
            layouts[3] = ([bags], [1], layouts[3][2])


# where PyTorch's CPU kernel and its meta function disagree, the runtime allocates what CPU returns
_LAYOUT_FIXES = {
    aten.native_batch_norm.default: _batch_norm_eval_saves,
    aten._native_batch_norm_legit.default: _batch_norm_eval_saves,
    aten._embedding_bag.default: _embedding_bag_per_bag,
}


# a patch's kind bit (csrc/fl_fallback.cpp, Patch): the float read per call is rounded to float32 first
ROUND_F32 = 4


class _IntReturn(tuple):
    """An int an op returns beside its tensors; kernels see an undefined output."""

    def __new__(cls, value: int):
        return super().__new__(cls, ("int", value))


def call_kernel(kernel, dev, c_in, n_in: int, c_out, n_out: int, c_args, n_args: int, name: str = "") -> int:
    """One kernel call on the thread's current stream: a plugin kernel or a host-C JIT kernel is a
    function (kernel.fn); a device JIT kernel is the plugin's jit_launch with its handle. While
    torch.profiler records the fl device (csrc/fl_kineto.cpp), the launch is recorded under `name`."""
    if not core.tracing():
        return _launch(kernel, dev, c_in, n_in, c_out, n_out, c_args, n_args)
    lib = core.lib()
    lib.fl_core_trace_begin(dev.index)
    try:
        return _launch(kernel, dev, c_in, n_in, c_out, n_out, c_args, n_args)
    finally:
        lib.fl_core_trace_end((name or "kernel").encode())


def _launch(kernel, dev, c_in, n_in: int, c_out, n_out: int, c_args, n_args: int) -> int:
    handle = getattr(kernel, "handle", None)
    if handle is not None:
        return kernel.launch(handle, dev.stream(), dev.local, c_in, n_in, c_out, n_out, c_args, n_args)
    return kernel.fn(dev.stream(), dev.local, c_in, n_in, c_out, n_out, c_args, n_args)


def kernel_call(kernel, local: int, inputs: list, outputs: list, cargs: list, slot: int) -> tuple:
    """(call, arrays): a kernel call as the C++ core keeps it (fl_core.h's fl_core_kernel_call_t: a fast-path
    plan, a kernel graph's step), and the descriptor and argument arrays it points at, which must live until
    the core has copied them. The core calls launch(handle, ...) for a kernel with a handle (a device JIT
    kernel), fn(...) otherwise; both are cast, since a kernel may come from another cffi instance."""
    cast, null = core.ffi.cast, core.ffi.NULL
    arrays = (
        ffi.new("fl_tensor_t[]", inputs or 1),
        ffi.new("fl_tensor_t[]", outputs or 1),
        ffi.new("fl_arg_t[]", cargs or 1),
    )
    handle = getattr(kernel, "handle", None)
    if handle is not None:
        fn, launch, handle = null, cast("fl_core_launch_fn", kernel.launch), cast("void *", handle)
    else:
        fn, launch, handle = cast("fl_kernel_fn", kernel.fn), null, null
    call = core.ffi.new(
        "fl_core_kernel_call_t *",
        {
            "fn": fn,
            "launch": launch,
            "handle": handle,
            "local": local,
            "n_inputs": len(inputs),
            "inputs": arrays[0],
            "n_outputs": len(outputs),
            "outputs": arrays[1],
            "n_args": len(cargs),
            "args": arrays[2],
            "slot": slot,
        },
    )
    return call, arrays


def run_native(f, kernel, dev, vals, given=None, site: dict | None = None):
    """Call the plugin kernel. Outputs: the tensors given (an out= call writing in place), aliases of
    mutated arguments, or fresh tensors shaped by PyTorch's meta functions. With site, the call's
    marshalling is recorded there (what the C++ fast path replays)."""
    outs: list = []
    out_src: list = []  # per output: ("given", j), ("arg", i) or ("fresh", None)
    if given is not None:
        outs = list(given)
        out_src = [("given", j) for j in range(len(outs))]
    else:
        fresh = [i for i, a in enumerate(f.ret_alias) if a is None]
        layouts = None
        if fresh:
            layouts = output_layouts(f, vals)
            if layouts is None:
                return NOT_HANDLED
        for r, a in enumerate(f.ret_alias):
            if a is not None:
                outs.append(vals[a])
                out_src.append(("arg", a))
                continue
            assert layouts is not None, "an output that aliases no argument is fresh: its layouts were computed"
            lay = layouts[r]
            if lay is None:
                outs.append(None)
                out_src.append(("fresh", None))
            elif lay is NOT_HANDLED:
                return NOT_HANDLED  # scalar / list returns are not a kernel's business
            elif type(lay) is _IntReturn:
                outs.append(lay[1])
                out_src.append(("int", None))
            else:
                outs.append(new_tensor(dev, lay[0], lay[2], lay[1]))
                out_src.append(("fresh", None))
    for t in iter_tensors(outs):
        if t.dim() > abi.MAX_DIMS:
            return NOT_HANDLED
    shape = list(outs[0].shape) if f.pointwise and outs and isinstance(outs[0], torch.Tensor) else None
    inputs: list = []
    cargs: list = []
    in_src: list = []  # (value index, list index or -1) of each input descriptor
    patches: list = []  # (arg index, value index, kind) of the values the fast path reads per call
    tensor_arg = f.tensor_arg
    # A float scalar of an op computing in complex64 reaches the kernel rounded to float32, as PyTorch's
    # kernels see it (they cast a scalar to the op's complex<float> first): a kernel that computes in
    # double would otherwise use more digits than the CPU (sinc's pi * x; kind bit 4 for the fast path).
    r32 = ROUND_F32 if outs and isinstance(outs[0], torch.Tensor) and outs[0].dtype == torch.complex64 else 0
    for i, v in enumerate(vals):
        if isinstance(v, torch.Tensor) and v.device.type == "fl":
            if v.dim() > abi.MAX_DIMS:
                return NOT_HANDLED
            cargs.append((abi.ARG_TENSOR, 0, len(inputs)))
            in_src.append((i, -1))
            inputs.append(_desc_for(v, shape))
            if inputs[-1]["dtype"] < 0:  # a dtype the ABI has no code for: no kernel may read it
                return NOT_HANDLED
        elif v is None:
            cargs.append((abi.ARG_NONE,))
        elif isinstance(v, bool):
            if tensor_arg[i]:  # a wrapped number
                patches.append((len(cargs), i, 1))
            cargs.append((abi.ARG_BOOL, 0, int(v)))
        elif isinstance(v, int):
            if tensor_arg[i]:
                patches.append((len(cargs), i, 1))
            cargs.append((abi.ARG_INT, 0, v))
        elif isinstance(v, float):
            patches.append((len(cargs), i, (1 if tensor_arg[i] else 0) | r32))
            cargs.append((abi.ARG_FLOAT, 0, 0, ctypes.c_float(v).value if r32 else v))
        elif isinstance(v, torch.Tensor):  # a 0-dim CPU tensor: a wrapped number
            patches.append((len(cargs), i, 1 | r32))
            x = v.item()
            if isinstance(x, bool):
                cargs.append((abi.ARG_BOOL, 0, int(x)))
            elif isinstance(x, int):
                cargs.append((abi.ARG_INT, 0, x))
            elif isinstance(x, float):
                cargs.append((abi.ARG_FLOAT, 0, 0, ctypes.c_float(x).value if r32 else x))
            else:
                return NOT_HANDLED
        elif isinstance(v, (list, tuple)):
            if v and all(is_fl(x) or x is None for x in v) and any(x is not None for x in v):
                # a Tensor?[] (index lists: x[:, idx]) passes None as an undefined descriptor
                cargs.append((abi.ARG_TENSOR_LIST, len(v), len(inputs)))
                for k, x in enumerate(v):
                    if x is None:
                        inputs.append(_UNDEFINED)
                        in_src.append((-1, -1))
                        continue
                    if x.dim() > abi.MAX_DIMS:
                        return NOT_HANDLED
                    in_src.append((i, k))
                    inputs.append(desc(x))
                    if inputs[-1]["dtype"] < 0:
                        return NOT_HANDLED
            elif len(v) <= abi.MAX_DIMS and all(isinstance(x, (int, bool)) for x in v):
                cargs.append({"kind": abi.ARG_INT_LIST, "len": len(v), "list": [int(x) for x in v]})
            elif not v:
                cargs.append({"kind": abi.ARG_INT_LIST, "len": 0})
            else:
                cargs.append((abi.ARG_OTHER, 0, -1))
        elif isinstance(v, torch.dtype):
            cargs.append((abi.ARG_DTYPE, 0, TO_CODE.get(v, -1)))
        elif isinstance(v, str):
            cargs.append((abi.ARG_OTHER, 0, abi.STRING_CODES.get(v, abi.STRING_UNKNOWN)))
        else:
            cargs.append((abi.ARG_OTHER, 0, -1))
    out_descs = [(desc(t) if is_fl(t) else _UNDEFINED) for t in outs]
    if any(d["dtype"] < 0 and d["ndim"] >= 0 for d in out_descs):
        return NOT_HANDLED
    n_in, n_out, n_args = len(inputs), len(out_descs), len(cargs)
    c_in = ffi.new("fl_tensor_t[]", inputs or 1)
    c_out = ffi.new("fl_tensor_t[]", out_descs or 1)
    c_args = ffi.new("fl_arg_t[]", cargs or 1)
    status = call_kernel(kernel, dev, c_in, n_in, c_out, n_out, c_args, n_args, f.name)
    if status == abi.FL_ERR_UNSUPPORTED:
        return NOT_HANDLED
    events.STATE.kernels += 1
    dev.plugin.check(status, f"kernel {f.name}")
    if events.STATE.recording is not None:
        events.STATE.recording.kernel(f, kernel, dev, vals, outs, inputs, out_descs, cargs)
    if site is not None:
        site.update(
            kernel=kernel,
            dev=dev,
            inputs=inputs,
            in_src=in_src,
            outs=outs,
            out_descs=out_descs,
            out_src=out_src,
            cargs=cargs,
            patches=patches,
        )
    if f.n_returns == 0:
        return None
    if f.n_returns == 1:
        return outs[0]
    return tuple(outs)


def native_factory(f, dev, args, kwargs):
    """A factory (arange, ...) the plugin has a kernel for: allocated and filled on the device. The
    output layout comes from the meta device; the kernel sees the op's scalar arguments. f describes
    the factory op (see the module's contract); None when the plugin has no kernel for the call."""
    entry = dev.backend.plugin.kernels.get(f.name)
    if entry is None or NATIVE in SETTINGS.disabled or "device" not in f.arg_names:
        return None
    vals = f.normalize(args, dict(kwargs, device=torch.device("meta")))
    layouts = output_layouts(f, vals)  # on the meta device, cached: the same call run_native makes
    if not layouts or not isinstance(layouts[0], tuple) or len(layouts[0]) != 3:
        return None  # arguments the factory rejects: the host path reports them
    code = TO_CODE.get(layouts[0][2], -1)
    if code < 0 or not (entry.dtypes >> code) & 1 or not (dev.props.dtypes >> code) & 1:
        return None
    out = run_native(f, entry, dev, vals)
    if out is NOT_HANDLED:
        return None
    events.count(dev.backend, f.name, NATIVE)
    return out


# -- the C++ fast path ------------------------------------------------------------------
# A native call on an op's own arguments (or a JIT kernel's call: dispatch.jit_replay) is committed to the
# C++ core's per-signature cache; later calls of that signature run there without entering Python
# (csrc/fl_fallback.cpp, fallback()).
# Python still decides every plan; the fast path steps aside while the profiler listens, while an
# async copy is in flight, and for any call whose tensors partly share memory.


class FastPathSwitch:
    """Per process: whether the C++ fast path may serve calls at all (FL_FAST_PATH=0 turns it off, for
    comparisons; tests flip it)."""

    def __init__(self) -> None:
        self.enabled = os.environ.get("FL_FAST_PATH", "1").strip().lower() not in ("0", "false", "no", "off")


FAST = FastPathSwitch()


def commit(f, count_as: str, site: dict, stack_of, returns: list, given_at=None, path: str = NATIVE) -> None:
    """Hand the C++ core the marshalling of the kernel call just made for f (site: what run_native
    recorded): a plugin kernel's, or a JIT kernel's (path "jit"). stack_of maps the kernel call's value
    indices to f's arguments; given_at those of the outputs an out= call passed in; returns index the
    outputs. The fast path counts each call it serves under (backend, count_as, path)."""
    name = f.func.name().encode()
    lib = core.lib()
    if not lib.fl_core_fast_can_commit(name):
        return
    in_src = [(stack_of[i] if i >= 0 else -1, k) for i, k in site["in_src"]]
    out_src, out_dtypes, out_ints = [], [], []
    for (kind, j), t in zip(site["out_src"], site["outs"], strict=True):
        if kind == "given":
            out_src.append(given_at[j])
        elif kind == "arg":
            out_src.append(stack_of[j])
        elif kind == "fresh":
            out_src.append(-1)
        elif kind == "int" and type(t) is int:  # its meta function's, from the shapes the key fixes
            out_src.append(-2)
        else:
            return
        out_ints.append(t if kind == "int" else 0)
        out_dtypes.append(core.scalar_type_code(t.dtype) if isinstance(t, torch.Tensor) else 0)
    patches = [(a, stack_of[i], kind) for a, i, kind in site["patches"]]
    dev = site["dev"]
    slot = core.count_slot(dev.backend, count_as, path)
    call, arrays = kernel_call(site["kernel"], dev.local, site["inputs"], site["out_descs"], site["cargs"], slot)
    new = core.ffi.new
    keep = {
        "name": new("char[]", name),
        "input_src": new("fl_core_input_src_t[]", in_src or 1),
        "output_src": new("int32_t[]", out_src or [0]),
        "output_dtypes": new("int32_t[]", out_dtypes or [0]),
        "patches": new("fl_core_patch_t[]", patches or 1),
        "returns": new("int32_t[]", returns or [0]),
        "output_ints": new("int64_t[]", out_ints) if -2 in out_src else core.ffi.NULL,
    }
    plan = new(
        "fl_core_fast_plan_t *",
        {**keep, "device": dev.index, "call": call[0], "n_patches": len(patches), "n_returns": len(returns)},
    )
    lib.fl_core_fast_commit(plan)  # copies what plan points at (arrays and keep live until then)


def sync_fast_path() -> None:
    """The fast path serves calls only while nobody listens (the profiler sees every call) and nothing
    records (a kernel graph's recorder sees every call: runtime.graph)."""
    core.lib().fl_core_fast_enable(int(FAST.enabled and not events.STATE.listeners and events.STATE.recording is None))


def mem_set_zero(t) -> bool:
    """zero_ as one call of the plugin's mem_set (ABI v2; all-zero bytes are 0 in every dtype), for a tensor
    whose elements fill one byte range. Not while a kernel graph records (a replay runs kernels only):
    the caller then fills with a kernel. Returns whether it zeroed t."""
    dev = device_of(t)
    if not dev.plugin.optional.get("mem_set") or events.STATE.recording is not None:
        return False
    if t.numel() == 0 or not is_dense(t):
        return False
    if async_copy.PENDING:
        async_copy.wait_for((t,))
    table = dev.plugin.table
    stream = dev.stream()
    dev.plugin.check(
        table.mem_set(dev.local, ffi.cast("void *", t.data_ptr()), 0, t.numel() * t.element_size(), stream), "mem_set"
    )
    if stream != ffi.NULL and not dev.props.async_kernels:  # a kernel called next runs at once: land first
        dev.plugin.stream_synchronize(dev.local, stream)
    events.STATE.kernels += 1
    return True
