"""The dispatcher: every aten op on an fl tensor arrives here.

For each op the path is resolved once per (op, dtypes, backend) and cached:
native plugin kernel -> decomposition (torch._decomp plus ours) -> JIT ->
CPU fallback. Metadata-only ops (views) never touch the plugin; copies
between devices are explicit and counted."""

from __future__ import annotations

import contextlib
import os
import threading
import time
import warnings
from dataclasses import dataclass, field

import torch
from torch._decomp import decomposition_table

from . import _abi, _async, _decompositions, _decompositions_linalg, _decompositions_nn, _decompositions_rnn, _record
from . import fused as _fused
from ._abi import ffi
from ._dtypes import COMPLEX_CODES, TO_CODE, dtype_name
from ._record import COPY, DECOMPOSITION, FALLBACK, JIT, NATIVE, VIEW
from ._registry import REGISTRY
from ._tensor import Buffer, FlTensor, raw, set_dispatch, with_bits

aten = torch.ops.aten

# -- settings -------------------------------------------------------------------


class _Settings:
    def __init__(self) -> None:
        self._cpu_fallback: bool | None = None
        self.disabled: frozenset = frozenset()  # paths switched off (tests, bring-up of a new chip)

    @property
    def cpu_fallback(self) -> bool:
        if self._cpu_fallback is None:
            from . import _config

            env = os.environ.get("FL_CPU_FALLBACK")
            if env is not None and env != "":
                self._cpu_fallback = _config.parse_bool(env, "FL_CPU_FALLBACK")
            else:
                self._cpu_fallback = _config.parse_bool(_config.load_config().get("cpu_fallback", True),
                                                        "cpu_fallback")
        return self._cpu_fallback

    @cpu_fallback.setter
    def cpu_fallback(self, value: bool) -> None:
        self._cpu_fallback = bool(value)
        _clear_plans()


SETTINGS = _Settings()

# Strings the ABI passes as FL_ARG_OTHER with a known code in `i`.
# strings kernels read (fl_plugin.h FL_ARG_OTHER; docs/writing-a-plugin.md lists them): a new one gets the next code
STRING_CODES = {"none": 0, "tanh": 1, "trunc": 2, "floor": 3, "mean": 4, "sum": 5, "L": 6, "U": 7, "prod": 8,
                "amax": 9, "amin": 10, "add": 11, "multiply": 12, "left": 13, "right": 14, "max": 15, "min": 16}

# -- per-op static facts ---------------------------------------------------------


class OpFacts:
    """What the schema says about an op, computed once per OpOverload."""

    __slots__ = ("func", "name", "arg_names", "kwarg_only", "defaults", "has_default", "mutable", "is_out",
                 "is_view", "pointwise", "ret_alias", "n_returns", "handler")

    def __init__(self, func):
        schema = func._schema
        self.func = func
        self.name = schema.name + ("" if func._overloadname == "default" else "." + func._overloadname)
        args = schema.arguments
        self.arg_names = [a.name for a in args]
        self.kwarg_only = [a.kwarg_only for a in args]
        self.has_default = [a.has_default_value() for a in args]
        self.defaults = [a.default_value if a.has_default_value() else None for a in args]
        self.mutable = [i for i, a in enumerate(args) if a.alias_info is not None and a.alias_info.is_write]
        self.is_out = any(args[i].kwarg_only for i in self.mutable)
        # which argument (if any) each return aliases
        sets = {}
        for i, a in enumerate(args):
            if a.alias_info is not None:
                for s in a.alias_info.before_set:
                    sets[s] = i
        self.ret_alias = []
        view = False
        for r in schema.returns:
            idx = None
            if r.alias_info is not None:
                for s in r.alias_info.before_set:
                    idx = sets.get(s, idx)
                if not r.alias_info.is_write:
                    view = True
            self.ret_alias.append(idx)
        self.n_returns = len(schema.returns)
        self.is_view = view and not self.mutable
        self.pointwise = torch.Tag.pointwise in func.tags
        self.handler = None

    def normalize(self, args, kwargs) -> list:
        n = len(args)
        total = len(self.arg_names)
        if n == total and not kwargs:
            return list(args)
        vals = list(args) + [None] * (total - n)
        for i in range(n, total):
            name = self.arg_names[i]
            if name in kwargs:
                vals[i] = kwargs[name]
            elif self.has_default[i]:
                vals[i] = self.defaults[i]
        return vals

    def call(self, vals):
        """Call the op with normalized values (keyword-only ones by name)."""
        pos, kw = [], {}
        for i, v in enumerate(vals):
            if self.kwarg_only[i]:
                kw[self.arg_names[i]] = v
            else:
                pos.append(v)
        return self.func(*pos, **kw)


_FACTS: dict = {}


def facts(func) -> OpFacts:
    f = _FACTS.get(func)
    if f is None:
        f = _FACTS[func] = OpFacts(func)
        f.handler = _SPECIAL.get(func)
        if f.handler is None:
            if torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd"):
                f.handler = _composite
            else:
                f.handler = _view_op if f.is_view else _compute
    return f


def _composite(f: OpFacts, args, kwargs):
    """An op PyTorch defines in terms of other ops (aten::to, reshape, ...)
    reached us below autograd: run PyTorch's own definition."""
    out = f.func.decompose(*args, **kwargs)
    if out is NotImplemented:
        return _compute(f, args, kwargs)
    return out


def op_name(func) -> str:
    return facts(func).name


# -- helpers -----------------------------------------------------------------


def _iter_tensors(vals):
    for v in vals:
        if isinstance(v, torch.Tensor):
            yield v
        elif isinstance(v, (list, tuple)):
            for x in v:
                if isinstance(x, torch.Tensor):
                    yield x


def _device_of(name: str, vals):
    """The single fl device of an op's tensors; PyTorch's own error otherwise."""
    dev = None
    for t in _iter_tensors(vals):
        if type(t) is FlTensor or isinstance(t, FlTensor):
            d = t._buf.device
            if dev is None:
                dev = d
            elif d is not dev:
                raise RuntimeError(
                    f"Expected all tensors to be on the same device, but found at least two devices, "
                    f"{dev.torch_device} ({dev.backend.name}) and {d.torch_device} ({d.backend.name})! "
                    f"(when checking arguments for {name}). Move one with .to() first."
                )
        elif t.device.type == "fl":  # on the fl device but not an FlTensor: a layout torch_fl does not hold
            raise RuntimeError(
                f"{name}: a {t.layout} tensor on {t.device} is not supported by torch_fl (fl tensors are strided); "
                f"keep {t.layout} tensors on the CPU and move dense ones with .to_dense() first")
        elif t.dim() != 0 and t.device.type != "meta":
            other = t
            first = next((x for x in _iter_tensors(vals) if isinstance(x, FlTensor)), None)
            where = first.device if first is not None else "fl"
            raise RuntimeError(
                f"Expected all tensors to be on the same device, but found at least two devices, "
                f"{where} and {other.device}! (when checking arguments for {name}). Move the {other.device} "
                f"tensor with .to('{where}') first."
            )
    return dev


def storage_elems(t: FlTensor) -> int:
    return t._buf.nbytes // t.element_size() if t.element_size() else 0


def to_meta(t: torch.Tensor) -> torch.Tensor:
    if isinstance(t, FlTensor):
        base = torch.empty((storage_elems(t),), dtype=t.dtype, device="meta")
        return with_bits(base.as_strided(t.shape, t.stride(), t.storage_offset()), t.is_conj(), t.is_neg())
    return t


def _map(fn, vals):
    out = []
    for v in vals:
        if isinstance(v, torch.Tensor):
            out.append(fn(v))
        elif isinstance(v, (list, tuple)) and any(isinstance(x, torch.Tensor) for x in v):
            out.append(type(v)(fn(x) if isinstance(x, torch.Tensor) else x for x in v))
        else:
            out.append(v)
    return out


def span(t: torch.Tensor) -> tuple[int, int]:
    """[lo, hi) in elements of the storage a strided tensor touches."""
    if t.numel() == 0:
        return t.storage_offset(), t.storage_offset()
    hi = t.storage_offset() + sum((s - 1) * st for s, st in zip(t.shape, t.stride(), strict=True))
    return t.storage_offset(), hi + 1


def new_tensor(dev, size, dtype, stride=None) -> FlTensor:
    size = list(size)
    if stride is None:
        stride, acc = [0] * len(size), 1
        for i in range(len(size) - 1, -1, -1):
            stride[i] = acc
            acc *= max(size[i], 1)
    numel = 1
    for s in size:
        numel *= s
    item = torch.empty((), dtype=dtype).element_size() if dtype not in _ITEMSIZE else _ITEMSIZE[dtype]
    nbytes = 0 if numel == 0 else (1 + sum((s - 1) * st for s, st in zip(size, stride, strict=True))) * item
    return FlTensor(Buffer(dev, nbytes), size, stride, 0, dtype)


_ITEMSIZE = {dt: torch.empty((), dtype=dt).element_size() for dt in TO_CODE}


def like_layout(dev, t: torch.Tensor, dtype=None) -> FlTensor:
    """A new fl tensor shaped like t, keeping t's strides when they are dense."""
    dtype = dtype or t.dtype
    if _dense(t):
        return new_tensor(dev, t.shape, dtype, list(t.stride()))
    return new_tensor(dev, t.shape, dtype)


def _dense(t: torch.Tensor) -> bool:
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


# -- host <-> device transfers -------------------------------------------------


def fl_to_cpu(t: FlTensor, *, writable_view: bool = False) -> torch.Tensor:
    """The values of t on the host, with t's exact strides. For host-accessible
    devices this is a zero-copy view of device memory (clone before handing it
    to a user); otherwise the storage span is copied."""
    dev = t._buf.device
    if t._buf.pending is not None:
        _async.wait(t._buf)
    if dev.host_accessible:
        return with_bits(t._host_view(), t.is_conj(), t.is_neg())
    lo, hi = span(t)
    item = t.element_size()
    host = torch.empty(max(hi - lo, 0) * item, dtype=torch.uint8)
    if hi > lo:
        dev.plugin.copy_d2h(dev.local, host.data_ptr(), t._buf.ptr + lo * item, (hi - lo) * item)
        _record.BYTES[0] += (hi - lo) * item
    host = host.view(t.dtype).as_strided(t.shape, t.stride(), t.storage_offset() - lo)
    return with_bits(host, t.is_conj(), t.is_neg())


def cpu_into_fl(dst: FlTensor, src: torch.Tensor) -> None:
    """Write CPU values into an fl tensor, any strides, any dtype, broadcast."""
    dev = dst._buf.device
    if dst._buf.pending is not None:
        _async.wait(dst._buf)
    if dst.numel() == 0:
        return
    if dev.host_accessible:
        with_bits(dst._host_view(), dst.is_conj(), dst.is_neg()).copy_(src)
        return
    if dst.is_conj() or dst.is_neg() or src.is_conj() or src.is_neg():  # write the values as stored
        src = with_bits(src.detach().view_as(src), src.is_conj() != dst.is_conj(), src.is_neg() != dst.is_neg())
        src, dst = src.resolve_conj().resolve_neg(), raw(dst)
    lo, hi = span(dst)
    item = dst.element_size()
    if dst.is_contiguous():
        data = src.to(dst.dtype).expand(dst.shape).contiguous()
        dev.plugin.copy_h2d(dev.local, dst._buf.ptr + lo * item, data.data_ptr(), (hi - lo) * item)
    else:
        mirror = fl_to_cpu(dst)  # read-modify-write keeps bytes between strided elements
        mirror.copy_(src)
        base = mirror.as_strided((hi - lo,), (1,), 0)
        dev.plugin.copy_h2d(dev.local, dst._buf.ptr + lo * item, base.data_ptr(), (hi - lo) * item)
    _record.BYTES[0] += (hi - lo) * item


def cpu_to_new_fl(dev, src: torch.Tensor) -> FlTensor:
    out = like_layout(dev, src)
    cpu_into_fl(out, src)
    return out


# -- plans ---------------------------------------------------------------------


@dataclass
class Plan:
    """The ordered paths to try for one (op, dtypes) on one backend, and why."""

    op: str
    backend: str
    dtypes: tuple
    paths: list = field(default_factory=list)
    kernel: object = None
    decomposition: object = None
    jit: object = None
    reasons: list = field(default_factory=list)
    failed: set = field(default_factory=set)  # paths found broken at run time (a JIT compile that failed)

    @property
    def first(self) -> str | None:
        return next((p for p in self.paths if p not in self.failed), None)


DECOMPOSITIONS: dict = dict(decomposition_table)
_fused.register_decompositions(DECOMPOSITIONS)
_decompositions.register(DECOMPOSITIONS)
_decompositions_nn.register(DECOMPOSITIONS)
_decompositions_linalg.register(DECOMPOSITIONS)
_decompositions_rnn.register(DECOMPOSITIONS)


def _full_like(self, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    """full_like as empty_like + fill_: autograd seeds every backward with it
    (ones_like -> full_like), and fill_ is a primitive every plugin has, so
    this keeps the seed on the device instead of a host round trip."""
    out = torch.empty_like(self, dtype=dtype, layout=layout, device=device, pin_memory=pin_memory,
                           memory_format=memory_format or torch.preserve_format)
    return out.fill_(fill_value)


DECOMPOSITIONS[aten.full_like.default] = _full_like


# PyTorch's decompositions bottom out in prims; the ones below are aten ops any
# plugin has kernels for, so decomposed ops stay on the device.
def _prims_clone(self, *, memory_format=None):
    out = torch.empty_like(self, memory_format=memory_format or torch.preserve_format)
    return out.copy_(self)


def _prims_copy_to(a, b):
    return a.copy_(b)


def _prims_div(a, b):
    # prims.div: true division for floating types, truncation towards zero for integers
    if (a.is_floating_point() or a.is_complex()) if isinstance(a, torch.Tensor) else isinstance(a, float):
        return aten.div.Tensor(a, b)
    return aten.div.Tensor_mode(a, b, rounding_mode="trunc")


def _slice_backward(grad_output, input_sizes, dim, start, end, step):
    """Zeros with the gradient copied into the slice: a view, fill_ and copy_, on any plugin."""
    out = grad_output.new_zeros(input_sizes)
    aten.slice.Tensor(out, dim, start, end, step).copy_(grad_output)
    return out


def _equal(a, b) -> bool:
    return a.shape == b.shape and bool((a == b).all())


def _arange_out(*args, out):
    """arange's out= overloads (what torch.arange(..., device="fl") becomes): the plugin's arange kernel
    when it has one, else no device path here (the next tier serves it)."""
    from ._device import _native_factory

    start, end, step = (0, args[0], 1) if len(args) == 1 else (args[0], args[1], args[2] if len(args) > 2 else 1)
    res = _native_factory(aten.arange.start_step, out._buf.device, (start, end, step), {"dtype": out.dtype})
    if res is None:
        raise NotImplementedError(f"aten::arange has no kernel on fl backend '{out._buf.device.backend.name}'")
    if tuple(out.shape) != tuple(res.shape):
        out.resize_(res.shape)
    return out.copy_(res)


DECOMPOSITIONS[aten.arange.out] = _arange_out
DECOMPOSITIONS[aten.arange.start_out] = _arange_out
DECOMPOSITIONS[aten.slice_backward.default] = _slice_backward
DECOMPOSITIONS[aten.equal.default] = _equal

_PRIMS = {"clone": _prims_clone, "copy_to": _prims_copy_to, "div": _prims_div,
          "mul": lambda a, b: torch.mul(a, b), "gt": lambda a, b: torch.gt(a, b),  # b may be a Python number
          "add": lambda a, b: torch.add(a, b), "sub": lambda a, b: torch.sub(a, b),
          "abs": lambda a: aten.abs.default(a), "signbit": lambda a: aten.signbit.default(a)}
for _name, _fn in _PRIMS.items():
    _op = getattr(getattr(torch.ops.prims, _name, None), "default", None)
    if _op is not None:
        DECOMPOSITIONS[_op] = _fn
_tls = threading.local()


def _decomposing() -> set:
    s = getattr(_tls, "active", None)
    if s is None:
        s = _tls.active = set()
    return s


@contextlib.contextmanager
def disabled_paths(*paths: str):
    """Switch dispatch paths off inside the block, e.g. disabled_paths("native")
    runs every op through decomposition or fallback, to check those paths."""
    unknown = set(paths) - {NATIVE, DECOMPOSITION, JIT}
    if unknown:
        raise ValueError(f"can only disable native, decomposition or jit (the CPU fallback has its own switch), "
                         f"not {', '.join(sorted(unknown))}")
    before = SETTINGS.disabled
    SETTINGS.disabled = frozenset(paths) | before
    _clear_plans()
    try:
        yield
    finally:
        SETTINGS.disabled = before
        _clear_plans()


def _clear_plans() -> None:
    _SITES.clear()
    for backend in REGISTRY.backends.values():
        backend.plans.clear()


def resolve(f: OpFacts, backend, dtypes: tuple) -> Plan:
    plan = Plan(f.name, backend.name, tuple(dtype_name(d) for d in dtypes))
    dev_mask = backend.devices[0].props.dtypes if backend.devices else 0
    entry = backend.plugin.kernels.get(f.name)
    lookup = dtypes[0] if dtypes else None
    code = TO_CODE.get(lookup, -1) if lookup is not None else -1
    if NATIVE in SETTINGS.disabled:
        plan.reasons.append("native kernels switched off")
    elif f.is_out:
        plan.reasons.append("out= overloads are not sent to plugin kernels")
    elif entry is None:
        plan.reasons.append(f"no native kernel for {f.name} in plugin '{backend.name}'")
    elif code < 0 or not (entry.dtypes >> code) & 1 or _unserved_complex(entry, dtypes):
        from ._dtypes import mask_to_names

        what = _unserved_complex(entry, dtypes) or (dtype_name(lookup) if lookup else "?")
        plan.reasons.append(f"native kernel {f.name} does not serve {what} "
                            f"(serves {', '.join(mask_to_names(entry.dtypes))})")
    elif not (dev_mask >> code) & 1:
        plan.reasons.append(f"device does not compute in {dtype_name(lookup)}")
    else:
        plan.paths.append(NATIVE)
        plan.kernel = entry
        plan.reasons.append(f"native kernel {f.name} [{dtype_name(lookup)}] in plugin '{backend.name}'")
    note = _complex_note(backend, dtypes, dev_mask)
    if note:
        plan.reasons.insert(0, note)
    decomp = DECOMPOSITIONS.get(f.func) if DECOMPOSITION not in SETTINGS.disabled else None
    if decomp is not None:
        plan.paths.append(DECOMPOSITION)
        plan.decomposition = decomp
        plan.reasons.append(f"decomposition of {f.name} into other aten ops")
    else:
        plan.reasons.append(f"no decomposition for {f.name}")
    from . import _jit

    jit = _jit.lookup(backend, f, dtypes) if JIT not in SETTINGS.disabled else None
    if jit is not None:
        plan.paths.append(JIT)
        plan.jit = jit
        plan.reasons.append(_jit_claim(f.name))
    else:
        plan.reasons.append("no JIT kernel")
    if SETTINGS.cpu_fallback:
        plan.paths.append(FALLBACK)
        plan.reasons.append("CPU fallback (copy to host, run PyTorch's CPU kernel, copy back)")
    else:
        plan.reasons.append("CPU fallback is switched off (FL_CPU_FALLBACK=0)")
    return plan


def _jit_claim(name: str) -> str:
    return f"JIT-compiled kernel for {name}"


def _note_jit_failure(plan: Plan, f: OpFacts, backend) -> None:
    """A JIT kernel that failed to compile is said so, with the compiler's
    reason, in the plan's reasons -- which the no-path error and fl.explain
    print -- instead of being listed as if it were there."""
    from . import _jit

    why = _jit.compile_failure(backend.name, f.name)
    if why is None:
        return
    plan.failed.add(JIT)
    text = f"the JIT kernel for {f.name} failed to compile: {why}"
    plan.reasons[:] = [text if r == _jit_claim(f.name) or r.startswith(f"the JIT kernel for {f.name} failed")
                       else r for r in plan.reasons]


def _unserved_complex(entry, dtypes) -> str | None:
    """A complex operand dtype the kernel's mask does not name: a kernel sees complex memory only
    if it says it can read it (plugins written before complex dtypes would read it as real)."""
    for d in dtypes:
        c = TO_CODE.get(d, -1)
        if c in COMPLEX_CODES and not (entry.dtypes >> c) & 1:
            return dtype_name(d)
    return None


def _complex_note(backend, dtypes, dev_mask: int) -> str | None:
    """Why a complex operand cannot run natively on this device at all, said first."""
    cplx = [d for d in dtypes if d.is_complex]
    if not cplx:
        return None
    unnamed = [d for d in cplx if d not in TO_CODE]
    if unnamed:
        return (f"{dtype_name(unnamed[0])} has no fl dtype (the plugin ABI has complex64 and complex128; "
                "convert with .cfloat() or .cdouble())")
    if not any((dev_mask >> c) & 1 for c in COMPLEX_CODES):
        return f"fl backend '{backend.name}' computes in no complex dtype (its device's dtype mask has none)"
    return None


_NOT_HANDLED = object()


def _check_overlap(f: OpFacts, vals) -> None:
    """PyTorch's rule for in-place and out= ops (TensorIterator's
    assert_no_partial_overlap): a written tensor may not partly overlap an
    input in memory. As there, only dense layouts are judged."""
    for idx in f.mutable:
        out = vals[idx] if idx < len(vals) else None
        if not isinstance(out, FlTensor) or not out.numel() or not out.is_contiguous():
            continue
        item = out.element_size()
        o_lo, o_hi = out.storage_offset() * item, (out.storage_offset() + out.numel()) * item
        for j, t in enumerate(vals):
            if j == idx or not isinstance(t, FlTensor) or t._buf is not out._buf or not t.numel():
                continue
            if not t.is_contiguous():
                continue
            ti = t.element_size()
            t_lo, t_hi = t.storage_offset() * ti, (t.storage_offset() + t.numel()) * ti
            if (t_lo, t_hi) == (o_lo, o_hi) or t_hi <= o_lo or o_hi <= t_lo:
                continue
            raise RuntimeError(
                "unsupported operation: some elements of the input tensor and the written-to tensor refer to a "
                "single memory location. Please clone() the tensor before performing the operation.")


def _compute(f: OpFacts, args, kwargs):
    vals = f.normalize(args, kwargs)
    if _async.PENDING:  # an async copy may still be writing one of these tensors
        _async.wait_for(_iter_tensors(vals))
    if f.mutable:
        _check_overlap(f, vals)
    site_key = None
    if not _record.LISTENERS:
        site_key = _site_key(f.func, vals)
        if site_key is not None:
            site = _SITES.get(site_key)
            if site is not None:
                result = site.run(vals)
                if result is not _NOT_HANDLED:
                    return result
    dev = _device_of(f.name, vals)
    if dev is None:  # no fl tensor among the arguments: nothing of ours to do
        return f.call(vals)
    backend = dev.backend
    dtypes = tuple(t.dtype for t in _iter_tensors(vals) if isinstance(t, FlTensor))
    key = (f.func, dtypes)
    plan = backend.plans.get(key)
    if plan is None:
        plan = backend.plans[key] = resolve(f, backend, dtypes)
    listening = bool(_record.LISTENERS)
    if listening:
        t0 = time.perf_counter()
        k0, b0 = _record.KERNELS[0], _record.BYTES[0]
        _record.DEPTH[0] += 1
    failures: list = []
    try:
        for path in plan.paths:
            if path == NATIVE:
                result = _run_native(f, plan.kernel, dev, vals, site_key)
            elif path == DECOMPOSITION:
                active = _decomposing()
                if f.func in active:
                    continue
                active.add(f.func)
                # With a JIT kernel to fall back on, a functional op's decomposition must stay on
                # the device: if one of its sub-ops would need the CPU fallback, the JIT serves
                # the whole op instead (native -> decomposition -> JIT -> CPU fallback).
                strict = plan.jit is not None and not f.mutable
                if strict:
                    _tls.device_only = getattr(_tls, "device_only", 0) + 1
                try:
                    result = plan.decomposition(*args, **kwargs)
                except NotImplementedError as e:  # a sub-op had no path: say so for this op
                    failures.append(_decomposition_needs(f, plan, e))
                    continue
                finally:
                    active.discard(f.func)
                    if strict:
                        _tls.device_only -= 1
                if result is NotImplemented:  # some torch._decomp entries decline cases they do not cover
                    failures.append("its decomposition does not cover this case")
                    continue
            elif path == JIT:
                result = plan.jit(f, dev, vals)
                if result is _NOT_HANDLED:
                    _note_jit_failure(plan, f, backend)
            else:
                if getattr(_tls, "device_only", 0):  # inside a decomposition that must stay on the device
                    failures.append("the CPU fallback is not used inside a device-only decomposition")
                    continue
                result = _run_fallback(f, dev, vals)
            if result is _NOT_HANDLED:
                continue
            _count(backend, f.name, path)
            if listening:
                _emit(f.name, backend.name, path, t0, k0, b0)
            return result
    finally:
        if listening:
            _record.DEPTH[0] -= 1
    raise _no_path_error(f, backend, plan, failures)


def _no_path_error(f: OpFacts, backend, plan: Plan, failures=()) -> NotImplementedError:
    """The error of an op none of whose paths could run: a plain
    NotImplementedError (what users and PyTorch expect) that also carries the
    message without its advice (`fl_what`), so an enclosing op whose
    decomposition needed this one quotes it once and the advice comes once."""
    tried = "; ".join(list(plan.reasons) + list(failures))
    what = f"{f.name} ({', '.join(plan.dtypes) or 'no tensors'}) cannot run on fl backend '{backend.name}': {tried}"
    e = NotImplementedError(f"{what}. Enable the CPU fallback (FL_CPU_FALLBACK=1 or "
                            f"torch_fl.set_cpu_fallback(True)) or use a backend that implements it.")
    e.fl_what, e.fl_op = what, (f.name, plan.dtypes)
    return e


def _decomposition_needs(f: OpFacts, plan: Plan, e: NotImplementedError) -> str:
    """Why a decomposition failed, for the enclosing op's message: the sub-op's
    own tiers without its advice, and only a short note when the sub-op is the
    op itself again (its other tiers are already listed)."""
    what = getattr(e, "fl_what", None)
    if what is None:
        return f"its decomposition needs {e}"
    if getattr(e, "fl_op", None) == (f.name, plan.dtypes):
        return f"its decomposition calls {f.name} ({', '.join(plan.dtypes)}) itself again"
    return f"its decomposition needs {what}"


def _count(backend, name: str, path: str) -> None:
    key = (name, path)
    counts = backend.counts
    counts[key] = counts.get(key, 0) + 1


def _emit(name, backend, path, t0, k0, b0) -> None:
    _record.emit(_record.OpEvent(name, backend, path, time.perf_counter() - t0, _record.KERNELS[0] - k0,
                                 _record.BYTES[0] - b0, _record.DEPTH[0] - 1, t0))


# -- native path ---------------------------------------------------------------


def _desc_for(t: FlTensor, shape=None) -> dict:
    """Descriptor of t, broadcast to `shape` when given (pointwise ops)."""
    d = t._desc()
    if shape is None or d["sizes"] == shape:
        return d
    nd, td = len(shape), t.dim()
    sizes, strides = list(shape), [0] * nd
    for i in range(td):
        j = nd - td + i
        strides[j] = d["strides"][i] if d["sizes"][i] == shape[j] else 0
    return {"data": d["data"], "offset": d["offset"], "dtype": d["dtype"], "ndim": nd, "sizes": sizes,
            "strides": strides}


_LAYOUT_CACHE: dict = {}
_LAYOUT_CACHE_MAX = 8192


def _key_of(v):
    if isinstance(v, torch.Tensor):
        if isinstance(v, FlTensor):
            return (tuple(v.shape), v.stride(), v.dtype, v.storage_offset())
        return (v.dtype, v.dim())  # a wrapped number: its value never changes a shape
    if isinstance(v, list):
        return tuple(_key_of(x) for x in v)
    if isinstance(v, float):  # by value (arange's bounds shape its result); NaN-safe
        return (float, v if v == v else "nan")
    return v


def _output_layouts(f: OpFacts, vals):
    """(shape, strides, dtype) of each fresh return, from PyTorch's meta
    functions, cached per signature: the meta call costs far more than a kernel
    on a small tensor."""
    try:
        key = (f.func, tuple(_key_of(v) for v in vals))
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
        meta_out = f.call(_map(to_meta, vals))
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
            layouts.append(_NOT_HANDLED)
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
_LAYOUT_FIXES = {aten.native_batch_norm.default: _batch_norm_eval_saves,
                 aten._native_batch_norm_legit.default: _batch_norm_eval_saves,
                 aten._embedding_bag.default: _embedding_bag_per_bag}


class _IntReturn(tuple):
    """An int an op returns beside its tensors; kernels see an undefined output."""

    def __new__(cls, value: int):
        return super().__new__(cls, ("int", value))


def _run_native(f: OpFacts, kernel, dev, vals, site_key=None):
    # outputs: aliases of mutated arguments, or fresh tensors shaped by PyTorch's meta functions
    fresh = [i for i, a in enumerate(f.ret_alias) if a is None]
    layouts = None
    if fresh:
        layouts = _output_layouts(f, vals)
        if layouts is None:
            return _NOT_HANDLED
    outs: list = []
    out_spec: list = []
    for r, a in enumerate(f.ret_alias):
        if a is not None:
            outs.append(vals[a])
            out_spec.append(a)
        else:
            lay = layouts[r]
            if lay is None:
                outs.append(None)
                out_spec.append(None)
            elif lay is _NOT_HANDLED:
                return _NOT_HANDLED  # scalar / list returns are not a kernel's business
            elif type(lay) is _IntReturn:
                outs.append(lay[1])
                out_spec.append(lay)
            else:
                t = new_tensor(dev, lay[0], lay[2], lay[1])
                outs.append(t)
                out_spec.append((t.shape, lay[1], lay[2], t._buf.nbytes))
    for t in _iter_tensors(outs):
        if t.dim() > _abi.MAX_DIMS:
            return _NOT_HANDLED
    shape = list(outs[0].shape) if f.pointwise and outs and isinstance(outs[0], torch.Tensor) else None
    inputs: list = []
    cargs: list = []
    in_src: list = []  # (value index, list index or -1) of each input descriptor
    float_slots: list = []  # (value index, arg index) of the floats a site patches per call
    for i, v in enumerate(vals):
        if isinstance(v, FlTensor):
            if v.dim() > _abi.MAX_DIMS:
                return _NOT_HANDLED
            cargs.append((_abi.ARG_TENSOR, 0, len(inputs)))
            in_src.append((i, -1))
            inputs.append(_desc_for(v, shape))
        elif v is None:
            cargs.append((_abi.ARG_NONE,))
        elif isinstance(v, bool):
            cargs.append((_abi.ARG_BOOL, 0, int(v)))
        elif isinstance(v, int):
            cargs.append((_abi.ARG_INT, 0, v))
        elif isinstance(v, float):
            float_slots.append((i, len(cargs)))
            cargs.append((_abi.ARG_FLOAT, 0, 0, v))
        elif isinstance(v, torch.Tensor):  # a 0-dim CPU tensor: a wrapped number
            x = v.item()
            if isinstance(x, bool):
                cargs.append((_abi.ARG_BOOL, 0, int(x)))
            elif isinstance(x, int):
                cargs.append((_abi.ARG_INT, 0, x))
            elif isinstance(x, float):
                cargs.append((_abi.ARG_FLOAT, 0, 0, x))
            else:
                return _NOT_HANDLED
        elif isinstance(v, (list, tuple)):
            if v and all(isinstance(x, FlTensor) or x is None for x in v) and any(x is not None for x in v):
                # a Tensor?[] (index lists: x[:, idx]) passes None as an undefined descriptor
                cargs.append((_abi.ARG_TENSOR_LIST, len(v), len(inputs)))
                for k, x in enumerate(v):
                    if x is None:
                        inputs.append(_UNDEFINED)
                        site_key = None  # the call-site replay patches tensors only: not recorded
                        continue
                    if x.dim() > _abi.MAX_DIMS:
                        return _NOT_HANDLED
                    in_src.append((i, k))
                    inputs.append(x._desc())
            elif len(v) <= _abi.MAX_DIMS and all(isinstance(x, (int, bool)) for x in v):
                cargs.append({"kind": _abi.ARG_INT_LIST, "len": len(v), "list": [int(x) for x in v]})
            elif not v:
                cargs.append({"kind": _abi.ARG_INT_LIST, "len": 0})
            else:
                cargs.append((_abi.ARG_OTHER, 0, -1))
        elif isinstance(v, torch.dtype):
            cargs.append((_abi.ARG_DTYPE, 0, TO_CODE.get(v, -1)))
        elif isinstance(v, str):
            cargs.append((_abi.ARG_OTHER, 0, STRING_CODES.get(v, -1)))
        else:
            cargs.append((_abi.ARG_OTHER, 0, -1))
    out_descs = [(t._desc() if isinstance(t, FlTensor) else _UNDEFINED) for t in outs]
    n_in, n_out, n_args = len(inputs), len(out_descs), len(cargs)
    c_in = ffi.new("fl_tensor_t[]", inputs or 1)
    c_out = ffi.new("fl_tensor_t[]", out_descs or 1)
    c_args = ffi.new("fl_arg_t[]", cargs or 1)
    status = kernel.fn(ffi.NULL, dev.local, c_in, n_in, c_out, n_out, c_args, n_args)
    if status == _abi.FL_ERR_UNSUPPORTED:
        return _NOT_HANDLED
    _record.KERNELS[0] += 1
    dev.plugin.check(status, f"kernel {f.name}")
    if site_key is not None:
        _remember_site(site_key, _Site(f, kernel, dev, inputs, out_descs, cargs, in_src, out_spec, float_slots))
    if f.n_returns == 0:
        return None
    if f.n_returns == 1:
        return outs[0]
    return tuple(outs)


# -- call sites: the native path without the work ------------------------------
#
# A native call's marshalling (output layouts, descriptors, scalar arguments) is
# fixed by its signature: the op, each tensor's device/dtype/shape/strides/
# offset, and every non-float argument. The first call of a signature records
# it; later calls only allocate outputs, patch data pointers and float values
# into prepared cffi arrays, and call the kernel (docs/runtime.md has the
# figures). Listeners (the profiler) take the full path.

_SITES: dict = {}
_SITES_MAX = 8192


def _site_key(func, vals):
    key = [func]
    for v in vals:
        tv = type(v)
        if tv is FlTensor:
            sig = v._s
            key.append(sig if sig is not None else v._sig())
        elif tv is float:
            key.append(float)
        elif v is None or tv is int or tv is bool or tv is str or tv is torch.dtype:
            key.append((tv, v))
        elif tv is list or tv is tuple:
            part = [tv]
            for x in v:
                tx = type(x)
                if tx is FlTensor:
                    sig = x._s
                    part.append(sig if sig is not None else x._sig())
                elif tx is int or tx is bool:
                    part.append((tx, x))
                else:
                    return None
            key.append(tuple(part))
        else:
            return None
    return tuple(key)


def _remember_site(key, site) -> None:
    if len(_SITES) >= _SITES_MAX:
        _SITES.clear()
    _SITES[key] = site


class _Site:
    __slots__ = ("f", "name", "fn", "dev", "counts", "count_key", "in_src", "out_spec", "float_slots", "templates",
                 "free", "n_in", "n_out", "n_args")

    def __init__(self, f, kernel, dev, inputs, out_descs, cargs, in_src, out_spec, float_slots):
        self.f, self.name, self.fn, self.dev = f, f.name, kernel.fn, dev
        self.counts, self.count_key = dev.backend.counts, (f.name, NATIVE)
        self.in_src, self.out_spec, self.float_slots = tuple(in_src), tuple(out_spec), tuple(float_slots)
        self.templates = (inputs, out_descs, cargs)
        self.n_in, self.n_out, self.n_args = len(inputs), len(out_descs), len(cargs)
        self.free: list = []  # prepared argument arrays; one per concurrent caller

    def _arrays(self):
        inputs, outs, cargs = self.templates
        c_in = ffi.new("fl_tensor_t[]", inputs or 1)
        c_out = ffi.new("fl_tensor_t[]", outs or 1)
        c_args = ffi.new("fl_arg_t[]", cargs or 1)
        return ([c_in[j] for j in range(len(inputs))], [c_out[j] for j in range(len(outs))],
                [c_args[j] for j in range(len(cargs))], c_in, c_out, c_args)

    def run(self, vals):
        dev = self.dev
        outs = []
        for spec in self.out_spec:
            if spec is None:
                outs.append(None)
            elif spec.__class__ is int:
                outs.append(vals[spec])
            elif spec.__class__ is _IntReturn:
                outs.append(spec[1])
            else:
                outs.append(FlTensor(Buffer(dev, spec[3]), spec[0], spec[1], 0, spec[2]))
        try:
            arrays = self.free.pop()
        except IndexError:  # first call, or another thread holds the prepared arrays
            arrays = self._arrays()
        in_refs, out_refs, arg_refs, c_in, c_out, c_args = arrays
        j = 0
        for i, k in self.in_src:
            in_refs[j].data = (vals[i] if k < 0 else vals[i][k])._buf.cptr
            j += 1
        j = 0
        for o in outs:
            if isinstance(o, FlTensor):
                out_refs[j].data = o._buf.cptr
            j += 1
        for i, a in self.float_slots:
            arg_refs[a].f = vals[i]
        status = self.fn(ffi.NULL, dev.local, c_in, self.n_in, c_out, self.n_out, c_args, self.n_args)
        self.free.append(arrays)
        if status:
            if status == _abi.FL_ERR_UNSUPPORTED:
                return _NOT_HANDLED
            _record.KERNELS[0] += 1
            dev.plugin.check(status, f"kernel {self.name}")
        _record.KERNELS[0] += 1
        counts, key = self.counts, self.count_key
        counts[key] = counts.get(key, 0) + 1
        n = self.f.n_returns
        if n == 0:
            return None
        if n == 1:
            return outs[0]
        return tuple(outs)


# -- CPU fallback --------------------------------------------------------------


def _shared_mirrors(dev, vals) -> dict[int, torch.Tensor]:
    """Host copies of fl tensors that share a buffer, as views of ONE host copy
    of that buffer: the CPU kernel then sees the same aliasing the device
    memory has (x[1:].add_(x[:-1]) must fail as it does on CPU, not silently
    read a stale copy)."""
    by_buf: dict[int, list] = {}
    for t in _iter_tensors(vals):
        if isinstance(t, FlTensor) and t.numel():
            by_buf.setdefault(id(t._buf), []).append(t)
    out: dict[int, torch.Tensor] = {}
    for views in by_buf.values():
        if len(views) < 2:
            continue
        buf = views[0]._buf
        spans = [span(t) for t in views]
        lo = min(a * t.element_size() for (a, _), t in zip(spans, views, strict=True)) // 16 * 16
        hi = max(b * t.element_size() for (_, b), t in zip(spans, views, strict=True))
        staging = torch.empty(hi - lo, dtype=torch.uint8)
        dev.plugin.copy_d2h(dev.local, staging.data_ptr(), buf.ptr + lo, hi - lo)
        _record.BYTES[0] += hi - lo
        for t in views:
            item = t.element_size()
            typed = staging[: (hi - lo) // item * item].view(t.dtype)
            out[id(t)] = typed.as_strided(t.shape, t.stride(), (t.storage_offset() * item - lo) // item)
    return out


def _run_fallback(f: OpFacts, dev, vals):
    mirrors: dict[int, torch.Tensor] = {} if dev.host_accessible else _shared_mirrors(dev, vals)

    def host(t):
        if isinstance(t, FlTensor):
            if t._buf.device is not dev:
                raise RuntimeError(f"{f.name}: tensor on {t.device} mixed with {dev.torch_device}")
            c = mirrors.get(id(t))
            if c is None:
                c = mirrors[id(t)] = fl_to_cpu(t)
            return c
        return t

    cpu_vals = _map(host, vals)
    out = f.call(cpu_vals)
    # write back what the op mutated (zero-copy views on host-accessible devices need nothing)
    for i in f.mutable:
        pairs = [(vals[i], cpu_vals[i])]
        if isinstance(vals[i], (list, tuple)):  # Tensor(a!)[]: _foreach_*_, _amp_foreach_non_finite_check_and_unscale_
            pairs = list(zip(vals[i], cpu_vals[i], strict=True))
        for fl_t, cpu_t in pairs:
            if not isinstance(fl_t, FlTensor):
                continue
            if tuple(cpu_t.shape) != tuple(fl_t.shape) or cpu_t.stride() != fl_t.stride():
                _replace_impl(fl_t, cpu_to_new_fl(dev, cpu_t))  # an out= tensor the op resized
            elif not dev.host_accessible:
                cpu_into_fl(fl_t, cpu_t)
    if f.n_returns == 0:
        return None
    outs = (out,) if f.n_returns == 1 else tuple(out)
    results = []
    for r, o in enumerate(outs):
        a = f.ret_alias[r]
        if a is not None and isinstance(vals[a], FlTensor):
            results.append(vals[a])
        elif isinstance(o, torch.Tensor):
            results.append(cpu_to_new_fl(dev, o))
        elif isinstance(o, (list, tuple)):
            results.append(type(o)(cpu_to_new_fl(dev, x) if isinstance(x, torch.Tensor) else x for x in o))
        else:
            results.append(o)
    return results[0] if f.n_returns == 1 else tuple(results)


def _replace_impl(t: FlTensor, new: FlTensor) -> None:
    """Give t new storage and metadata in place (resize_, set_, out= resizes)."""
    torch.Tensor.data.__set__(t, new)
    t._buf = new._buf
    t._d = None
    t._s = None


# -- metadata ops -------------------------------------------------------------


def _wrap_view(base: FlTensor, m):
    if isinstance(m, torch.Tensor):
        need = span(m)[1] * m.element_size()
        if m.numel() and need > base._buf.nbytes:  # PyTorch's own check, which meta tensors skip
            raise RuntimeError(
                f"setStorage: sizes {list(m.shape)}, strides {list(m.stride())}, storage offset "
                f"{m.storage_offset()}, and itemsize {m.element_size()} requiring a storage size of {need} are out "
                f"of bounds for storage of size {base._buf.nbytes}")
        return with_bits(FlTensor(base._buf, m.shape, m.stride(), m.storage_offset(), m.dtype), m.is_conj(), m.is_neg())
    if isinstance(m, (list, tuple)):
        return type(m)(_wrap_view(base, x) for x in m)
    return m


def _view_op(f: OpFacts, args, kwargs):
    base = args[0]
    if not isinstance(base, FlTensor):
        return _compute(f, args, kwargs)
    m = f.func(*_map(to_meta, args), **kwargs)
    _count(base._buf.device.backend, f.name, VIEW)
    return _wrap_view(base, m)


def _alias(f: OpFacts, args, kwargs):
    t = args[0]
    _count(t._buf.device.backend, f.name, VIEW)
    return with_bits(FlTensor(t._buf, t.shape, t.stride(), t.storage_offset(), t.dtype), t.is_conj(), t.is_neg())


def _inplace_meta(f: OpFacts, args, kwargs):
    """as_strided_, squeeze_, t_, resize_ ... : new metadata for the same tensor."""
    t = args[0]
    if t._buf.pending is not None:
        _async.wait(t._buf)
    m = f.func(*_map(to_meta, args), **kwargs)
    need = span(m)[1] * m.element_size()
    if need > t._buf.nbytes:  # resize_ grew the tensor: new buffer, old contents kept
        new = new_tensor(t._buf.device, m.shape, m.dtype, list(m.stride()))
        old = t._buf
        n = old.nbytes
        if n:
            dev = old.device
            dev.plugin.copy_d2d(dev.local, new._buf.ptr, old.ptr, n)
    else:
        new = FlTensor(t._buf, m.shape, m.stride(), m.storage_offset(), m.dtype)
    _replace_impl(t, new)
    _count(t._buf.device.backend, f.name, VIEW)
    return t


def _set_source(f: OpFacts, args, kwargs):
    t, src = args[0], args[1]
    if not isinstance(src, FlTensor):
        raise RuntimeError(f"{f.name}: can only set an fl tensor from another fl tensor")
    _replace_impl(t, FlTensor(src._buf, src.shape, src.stride(), src.storage_offset(), src.dtype))
    return t


# -- copies and transfers -------------------------------------------------------


def _copy_(f: OpFacts, args, kwargs):
    vals = f.normalize(args, kwargs)
    dst, src = vals[0], vals[1]
    if isinstance(src, torch.Tensor) and src.is_complex() and not dst.is_complex():
        warnings.warn("Casting complex values to real discards the imaginary part", UserWarning, stacklevel=2)
    if isinstance(dst, FlTensor) and isinstance(src, FlTensor) and dst._buf.device is src._buf.device:
        if dst.is_conj() != src.is_conj() or dst.is_neg() != src.is_neg():
            return copy_math_bits(dst, src)
        return _compute(f, args, kwargs)
    listening = bool(_record.LISTENERS)
    t0, b0 = time.perf_counter(), _record.BYTES[0]
    non_blocking = len(vals) > 2 and bool(vals[2])
    if (non_blocking and isinstance(dst, FlTensor) and not isinstance(src, FlTensor) and _async_ok(dst, src)):
        _async.h2d(dst._buf, dst.storage_offset() * dst.element_size(), src, dst.numel() * dst.element_size())
        _count(dst._buf.device.backend, f.name, COPY)
        return dst
    if isinstance(dst, FlTensor):
        host_src = fl_to_cpu(src) if isinstance(src, FlTensor) else src
        cpu_into_fl(dst, host_src)
        backend = dst._buf.device.backend.name
    else:  # fl -> cpu
        dst.copy_(fl_to_cpu(src))
        backend = src._buf.device.backend.name
    for t in (dst, src):
        if isinstance(t, FlTensor):
            _count(t._buf.device.backend, f.name, COPY)
    if listening:
        _record.emit(_record.OpEvent(f.name, backend, COPY, time.perf_counter() - t0, 0,
                                     _record.BYTES[0] - b0, _record.DEPTH[0], t0))
    return dst


def copy_math_bits(dst: FlTensor, src: FlTensor) -> FlTensor:
    """dst.copy_(src) on one device where the conj/neg flags differ: copy the stored values, then
    conjugate/negate dst's memory by the difference (conj and neg commute)."""
    aten.copy_.default(raw(dst), raw(src))
    if dst.is_conj() != src.is_conj() and dst.is_complex():
        aten.conj_physical_.default(raw(dst))
    if dst.is_neg() != src.is_neg():
        aten.neg_.default(raw(dst))
    return dst


def _async_ok(dst: FlTensor, src: torch.Tensor) -> bool:
    """An async copy needs pinned, contiguous host bytes of dst's dtype and
    layout, and a device with async copies; anything else copies now."""
    return (src.device.type == "cpu" and src.dtype == dst.dtype and src.shape == dst.shape and dst.numel() > 0
            and not (src.is_conj() or src.is_neg() or dst.is_conj() or dst.is_neg())
            and src.is_contiguous() and dst.is_contiguous() and not dst._buf.device.host_accessible
            and _async.supports(dst._buf.device) and src.is_pinned())


def _to_copy(f: OpFacts, args, kwargs):
    self = args[0]
    dtype = kwargs.get("dtype") or self.dtype
    device = kwargs.get("device") or self.device
    device = torch.device(device)
    if not isinstance(self, FlTensor):  # host -> fl, reached below Python dispatch (torch.tensor(..., device="fl"))
        target = REGISTRY.device(device.index)
        src = self.to(dtype)
        out = like_layout(target, src)
        _copy_(facts(aten.copy_.default), (out, src, bool(kwargs.get("non_blocking", False))), {})
        return out
    if device.type == "fl":
        target = REGISTRY.device(device.index if device.index is not None else self._buf.device.index)
        if target is self._buf.device:
            out = like_layout(target, self, dtype)
            return aten.copy_.default(out, self)
        out = like_layout(target, self, dtype)
        cpu_into_fl(out, fl_to_cpu(self))
        _count(target.backend, f.name, COPY)
        return out
    if device.type != "cpu":
        raise RuntimeError(f"cannot copy an fl tensor to {device} directly; go through .cpu() first")
    host = fl_to_cpu(self)
    out = torch.empty_strided(self.shape, self.stride(), dtype=dtype) if _dense(self) else \
        torch.empty(self.shape, dtype=dtype)
    out.copy_(host)
    if kwargs.get("pin_memory"):
        out = out.pin_memory()
    mf = kwargs.get("memory_format")
    if mf is not None and mf is not torch.preserve_format:
        out = out.contiguous(memory_format=mf)
    _count(self._buf.device.backend, f.name, COPY)
    return out


def _local_scalar_dense(f: OpFacts, args, kwargs):
    t = args[0]
    _count(t._buf.device.backend, f.name, COPY)
    return fl_to_cpu(t).item()


def _empty_like_op(f: OpFacts, args, kwargs):
    self = args[0]
    m = f.func(*_map(to_meta, args), **{k: v for k, v in kwargs.items() if k != "device"})
    device = kwargs.get("device")
    dev = REGISTRY.device(torch.device(device).index) if device is not None and torch.device(device).type == "fl" \
        else self._buf.device
    if device is not None and torch.device(device).type == "cpu":
        return torch.empty_strided(m.shape, m.stride(), dtype=m.dtype)
    out = new_tensor(dev, m.shape, m.dtype, list(m.stride()))
    _count(dev.backend, f.name, VIEW)
    return out


def _is_pinned(f: OpFacts, args, kwargs):
    return False


_SDPA_FWD = "aten::_scaled_dot_product_fused_attention_overrideable"
_SDPA_BWD = "aten::_scaled_dot_product_fused_attention_overrideable_backward"


def sdpa_fused_eligible(q, k, v, dropout_p: float, enable_gqa: bool) -> bool:
    """Whether the plugin's fused attention kernels (forward and backward both)
    serve this call: 4-D fl inputs of one dtype the device computes in, no
    dropout, no grouped-query broadcasting, native path not switched off."""
    if not isinstance(q, FlTensor) or enable_gqa or dropout_p or q.dim() != 4:
        return False
    if not (isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor)) or k.dim() != 4 or v.dim() != 4:
        return False
    if k.dtype != q.dtype or v.dtype != q.dtype or NATIVE in SETTINGS.disabled:
        return False
    kernels = q._buf.device.backend.plugin.kernels
    fwd, bwd = kernels.get(_SDPA_FWD), kernels.get(_SDPA_BWD)
    code = TO_CODE.get(q.dtype, -1)
    return (fwd is not None and bwd is not None and code >= 0 and bool((fwd.dtypes >> code) & 1)
            and bool((bwd.dtypes >> code) & 1) and bool((q._buf.device.props.dtypes >> code) & 1))


def _sdp_choice(f: OpFacts, args, kwargs):
    """Asked by code that picks an SDPA kernel itself (nn.MultiheadAttention's
    fast path): OVERRIDEABLE when the plugin's fused kernels serve the call."""
    from torch.nn.attention import SDPBackend

    vals = f.normalize(args, kwargs)
    if sdpa_fused_eligible(vals[0], vals[1], vals[2], vals[4], vals[7] if len(vals) > 7 else False):
        return int(SDPBackend.OVERRIDEABLE)
    return int(SDPBackend.MATH)


def _noop(f: OpFacts, args, kwargs):
    return None


# -- foreach: one call per tensor (optimizers use these on accelerators) ---------


def _foreach(f: OpFacts, args, kwargs):
    base = f.func._schema.name.split("::")[1][len("_foreach_"):]
    overload = f.func._overloadname
    packet = getattr(aten, base)
    lists = [i for i, a in enumerate(args) if isinstance(a, (list, tuple))]
    n = len(args[lists[0]])
    results = []
    for k in range(n):
        call_args = [a[k] if i in lists else a for i, a in enumerate(args)]
        op = _pick_overload(packet, overload, call_args)
        results.append(op(*call_args, **kwargs))
    inplace = base.endswith("_")
    return None if inplace else results


def _pick_overload(packet, overload: str, call_args):
    names = packet.overloads()
    if overload in ("List", "Tensor"):
        prefs = ["Tensor", "default", "Scalar"]
    elif overload in ("Scalar", "ScalarList"):
        prefs = ["Scalar", "default", "Tensor"]
    else:
        prefs = [overload, "default", "Tensor", "Scalar"]
    for p in prefs:
        if p in names:
            return getattr(packet, p)
    return getattr(packet, names[0])


_SPECIAL: dict = {
    aten.copy_.default: _copy_,
    aten._to_copy.default: _to_copy,
    aten._local_scalar_dense.default: _local_scalar_dense,
    aten.detach.default: _alias,
    aten.alias.default: _alias,
    aten.lift_fresh.default: _alias,
    aten._unsafe_view.default: _view_op,
    aten.empty_like.default: _empty_like_op,
    aten.new_empty.default: _empty_like_op,
    aten.new_empty_strided.default: _empty_like_op,
    aten.is_pinned.default: _is_pinned,
    aten._fused_sdp_choice.default: _sdp_choice,
    aten.record_stream.default: _noop,
    aten.set_.source_Tensor: _set_source,
}
for _name in ("as_strided_", "resize_", "squeeze_", "unsqueeze_", "t_", "transpose_", "swapdims_", "swapaxes_",
              "resize_as_"):
    _packet = getattr(aten, _name, None)
    if _packet is not None:
        for _ov in _packet.overloads():
            _SPECIAL[getattr(_packet, _ov)] = _inplace_meta


_HANDLER_PATH = {_view_op: VIEW, _alias: VIEW, _inplace_meta: VIEW, _set_source: VIEW, _to_copy: COPY,
                 _local_scalar_dense: COPY, _empty_like_op: "alloc", _composite: DECOMPOSITION,
                 _sdp_choice: "meta", _noop: "meta", _is_pinned: "meta", _foreach: "foreach"}


def _is_foreach(func) -> bool:
    return func._schema.name.startswith("aten::_foreach_")


def dispatch(func, args, kwargs):
    f = _FACTS.get(func)
    if f is None:
        f = facts(func)
        if _is_foreach(func) and func not in _SPECIAL and DECOMPOSITIONS.get(func) is None:
            f.handler = _foreach
    if _record.LISTENERS and f.handler is not _compute and f.handler is not _copy_:
        return _observed(f, args, kwargs)
    return f.handler(f, args, kwargs)


def _observed(f: OpFacts, args, kwargs):
    """Ops whose handler does not report itself (views, transfers, foreach
    loops), timed for a listener; their sub-ops report at depth + 1."""
    t0, k0, b0 = time.perf_counter(), _record.KERNELS[0], _record.BYTES[0]
    depth = _record.DEPTH[0]
    _record.DEPTH[0] += 1
    try:
        result = f.handler(f, args, kwargs)
    finally:
        _record.DEPTH[0] -= 1
    first = next((t for t in _iter_tensors(list(args) + list(kwargs.values())) if isinstance(t, FlTensor)), None)
    backend = first._buf.device.backend.name if first is not None else (
        REGISTRY.current.name if REGISTRY.current is not None else "?")
    _record.emit(_record.OpEvent(f.name, backend, _HANDLER_PATH.get(f.handler, "other"), time.perf_counter() - t0,
                                 _record.KERNELS[0] - k0, _record.BYTES[0] - b0, depth, t0))
    return result


set_dispatch(dispatch)
