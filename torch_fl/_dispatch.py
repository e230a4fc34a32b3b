"""The dispatcher: every aten op on an fl tensor that PyTorch's C++ core
(_csrc/fl_core.cpp) does not serve itself arrives here, through the boxed
fallback PyTorch calls for the fl (PrivateUse1) device.

For each op the path is resolved once per (op, dtypes, backend) and cached:
native plugin kernel -> decomposition (torch._decomp plus ours) -> JIT ->
CPU fallback. An out= overload (which is how PyTorch hands structured ops
such as add, mm or sum to a backend) takes the plan of its functional twin
and writes into the given outputs. Views never touch the plugin; copies
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
from torch.utils._python_dispatch import _disable_current_modes

from . import (
    _abi,
    _argcheck,
    _async,
    _decompositions,
    _decompositions_linalg,
    _decompositions_nn,
    _decompositions_rnn,
    _overlap,
    _record,
)
from . import fused as _fused
from ._abi import ffi
from ._dtypes import COMPLEX_CODES, TO_CODE, dtype_name
from ._record import COPY, DECOMPOSITION, FALLBACK, JIT, NATIVE, VIEW
from ._registry import REGISTRY
from ._tensor import base_ptr, desc, device_of, host_view, is_dense, is_fl, new_tensor, raw, storage_nbytes, with_bits

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
                 "is_view", "pointwise", "ret_alias", "n_returns", "handler", "_functional", "tensor_arg", "overlap",
                 "precheck", "_inplace_overlap")

    def __init__(self, func):
        schema = func._schema
        self.func = func
        self.name = schema.name + ("" if func._overloadname == "default" else "." + func._overloadname)
        args = schema.arguments
        self.arg_names = [a.name for a in args]
        self.tensor_arg = [isinstance(a.type, torch.TensorType) for a in args]
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
        self._functional: tuple | None = None
        self.overlap = _overlap.rule_for(func, self.mutable)  # what CPU refuses when outputs alias inputs
        self.precheck = _argcheck.precheck_for(func)  # PyTorch's argument checks its meta function skips
        self._inplace_overlap: tuple | None = None

    def overlap_rule(self, vals):
        """The overlap rule for this call: PyTorch hands an in-place op (a.addmm_(b, c)) to a backend as
        its out= overload writing into self, and CPU judges it by the in-place op's rule."""
        if not self.is_out or vals[0] is not vals[self.mutable[0]]:
            return self.overlap
        if self._inplace_overlap is None:
            sibling = inplace_sibling(self)
            if sibling is None:  # no in-place form (gather): CPU judges the out= call as it is
                rule = self.overlap
            else:  # self is the written tensor itself here: it may overlap it fully
                rule = sibling.overlap
                if rule is not None:
                    rule = _overlap.Rule(rule.internal, rule.partial, rule.full, 0)
            self._inplace_overlap = (rule,)
        return self._inplace_overlap[0]

    @property
    def functional(self) -> tuple | None:
        """For an out= overload: (the functional overload's facts, the positions of its arguments among
        this op's, the positions of the outputs), e.g. add.out -> add.Tensor. None for other ops, and
        for out= overloads without a functional twin of the same arguments (factories)."""
        if self._functional is None:
            self._functional = (functional_twin(self),)
        return self._functional[0]

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
        return self.call_decomposition(self.func, vals)

    def call_decomposition(self, fn, vals):
        """Call fn (the op, or a function with its schema) with normalized values, leaving out the
        arguments that only repeat their schema default, as a caller would (a decomposition may treat
        "not given" differently from the default's value: torch._refs' add multiplies by an explicit
        alpha=1)."""
        pos, kw = [], {}
        for i, v in enumerate(vals):
            if self.kwarg_only[i]:
                if not self._is_default(i, v):
                    kw[self.arg_names[i]] = v
            else:
                pos.append(v)
        n = len(pos)
        while n and not self.kwarg_only[n - 1] and self._is_default(n - 1, pos[n - 1]):
            n -= 1
        return fn(*pos[:n], **kw)

    def _is_default(self, i: int, v) -> bool:
        if not self.has_default[i] or isinstance(v, torch.Tensor):
            return False
        d = self.defaults[i]
        return type(v) is type(d) and v == d if not isinstance(v, (list, tuple)) else list(v) == list(d or [])


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


def functional_twin(f: OpFacts) -> tuple | None:
    if not f.is_out:
        return None
    schema = f.func._schema
    outs = [i for i in f.mutable if f.kwarg_only[i]]
    inputs = [i for i in range(len(f.arg_names)) if i not in outs]
    want = [(schema.arguments[i].name, str(schema.arguments[i].type)) for i in inputs]
    packet = getattr(aten, schema.name.split("::")[1])
    for name in packet.overloads():
        op = getattr(packet, name)
        s = op._schema
        if s.is_mutable or len(s.returns) != len(outs):
            continue
        if [(a.name, str(a.type)) for a in s.arguments] == want:
            return facts(op), tuple(inputs), tuple(outs)
    return None


def inplace_sibling(f: OpFacts) -> OpFacts | None:
    """The in-place overload (addmm_) with the arguments of an out= overload's functional twin."""
    twin = f.functional
    if twin is None:
        return None
    want = [(a.name, str(a.type)) for a in twin[0].func._schema.arguments]
    packet = getattr(aten, twin[0].func._schema.name.split("::")[1] + "_", None)
    if packet is None:
        return None
    for name in packet.overloads():
        op = getattr(packet, name)
        if [(a.name, str(a.type)) for a in op._schema.arguments] == want:
            return facts(op)
    return None


def _composite(f: OpFacts, args, kwargs):
    """An op PyTorch defines in terms of other ops (aten::to, reshape, ...)
    reached us below autograd: run PyTorch's own definition."""
    out = f.func.decompose(*args, **kwargs)
    if out is NotImplemented:
        return _compute(f, args, kwargs)
    return out


def op_name(func) -> str:
    """The name reports use: an out= overload is named after its functional twin (PyTorch hands
    structured ops such as add or mm to a backend as add.out, mm.out)."""
    f = facts(func)
    twin = f.functional
    return twin[0].name if twin is not None else f.name


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
        if t.device.type == "fl":
            if t.layout is not torch.strided:
                raise RuntimeError(
                    f"{name}: a {t.layout} tensor on {t.device} is not supported by torch_fl (fl tensors are "
                    f"strided); keep {t.layout} tensors on the CPU and move dense ones with .to_dense() first")
            d = device_of(t)
            if dev is None:
                dev = d
            elif d is not dev:
                raise RuntimeError(
                    f"Expected all tensors to be on the same device, but found at least two devices, "
                    f"{dev.torch_device} ({dev.backend.name}) and {d.torch_device} ({d.backend.name})! "
                    f"(when checking arguments for {name}). Move one with .to() first."
                )
        elif t.dim() != 0 and t.device.type != "meta":
            other = t
            first = next((x for x in _iter_tensors(vals) if is_fl(x)), None)
            where = first.device if first is not None else "fl"
            raise RuntimeError(
                f"Expected all tensors to be on the same device, but found at least two devices, "
                f"{where} and {other.device}! (when checking arguments for {name}). Move the {other.device} "
                f"tensor with .to('{where}') first."
            )
    return dev


def storage_elems(t: torch.Tensor) -> int:
    return storage_nbytes(t) // t.element_size() if t.element_size() else 0


def to_meta(t: torch.Tensor) -> torch.Tensor:
    if is_fl(t):
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


_ITEMSIZE = {dt: torch.empty((), dtype=dt).element_size() for dt in TO_CODE}


def like_layout(dev, t: torch.Tensor, dtype=None) -> torch.Tensor:
    """A new fl tensor shaped like t, keeping t's strides when they are dense."""
    dtype = dtype or t.dtype
    if is_dense(t):
        return new_tensor(dev, t.shape, dtype, list(t.stride()))
    return new_tensor(dev, t.shape, dtype)


# -- host <-> device transfers -------------------------------------------------


def fl_to_cpu(t: torch.Tensor, *, writable_view: bool = False) -> torch.Tensor:
    """The values of t on the host, with t's exact strides. For host-accessible
    devices this is a zero-copy view of device memory (clone before handing it
    to a user); otherwise the storage span is copied."""
    dev = device_of(t)
    if _async.PENDING:
        _async.wait_for((t,))
    if dev.host_accessible:
        return with_bits(host_view(t), t.is_conj(), t.is_neg())
    lo, hi = span(t)
    item = t.element_size()
    host = torch.empty(max(hi - lo, 0) * item, dtype=torch.uint8)
    if hi > lo:
        dev.plugin.copy_d2h(dev.local, host.data_ptr(), base_ptr(t) + lo * item, (hi - lo) * item)
        _record.BYTES[0] += (hi - lo) * item
    host = host.view(t.dtype).as_strided(t.shape, t.stride(), t.storage_offset() - lo)
    return with_bits(host, t.is_conj(), t.is_neg())


def cpu_into_fl(dst: torch.Tensor, src: torch.Tensor) -> None:
    """Write CPU values into an fl tensor, any strides, any dtype, broadcast."""
    dev = device_of(dst)
    if _async.PENDING:
        _async.wait_for((dst,))
    if dst.numel() == 0:
        return
    if dev.host_accessible:
        with_bits(host_view(dst), dst.is_conj(), dst.is_neg()).copy_(src)
        return
    if dst.is_conj() or dst.is_neg() or src.is_conj() or src.is_neg():  # write the values as stored
        src = with_bits(src.detach().view_as(src), src.is_conj() != dst.is_conj(), src.is_neg() != dst.is_neg())
        src, dst = src.resolve_conj().resolve_neg(), raw(dst)
    lo, hi = span(dst)
    item = dst.element_size()
    if dst.is_contiguous():
        data = src.to(dst.dtype).expand(dst.shape).contiguous()
        dev.plugin.copy_h2d(dev.local, base_ptr(dst) + lo * item, data.data_ptr(), (hi - lo) * item)
    else:
        mirror = fl_to_cpu(dst)  # read-modify-write keeps bytes between strided elements
        _copy_unique(mirror, src.expand(dst.shape))
        base = mirror.as_strided((hi - lo,), (1,), 0)
        dev.plugin.copy_h2d(dev.local, base_ptr(dst) + lo * item, base.data_ptr(), (hi - lo) * item)
    _record.BYTES[0] += (hi - lo) * item


def _copy_unique(dst: torch.Tensor, src: torch.Tensor) -> None:
    """dst.copy_(src) where dst may be expanded (an out= tensor CPU let an op write into): each
    memory location takes the last value written to it along a stride-0 dim, as a kernel walking
    in order leaves it; PyTorch's copy_ refuses such a destination."""
    for d, (size, stride) in enumerate(zip(dst.shape, dst.stride(), strict=True)):
        if stride == 0 and size > 1:
            dst, src = dst.narrow(d, 0, 1), src.narrow(d, size - 1, 1)
    dst.copy_(src)


def cpu_to_new_fl(dev, src: torch.Tensor) -> torch.Tensor:
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
# zero_ as fill_: torch._decomp's zero_ goes through zeros_like, whose generic kernel calls zero_ again
DECOMPOSITIONS[aten.zero_.default] = lambda self: aten.fill_.Scalar(self, 0)


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
    start, end, step = (0, args[0], 1) if len(args) == 1 else (args[0], args[1], args[2] if len(args) > 2 else 1)
    res = native_factory(aten.arange.start_step, device_of(out), (start, end, step), {"dtype": out.dtype})
    if res is None:
        raise NotImplementedError(f"aten::arange has no kernel on fl backend '{device_of(out).backend.name}'")
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


class _ThreadState(threading.local):
    """Per-thread dispatcher state; class defaults make the hot-path reads cheap."""

    active: set | None = None  # ops whose decomposition is running (see _decomposing)
    device_only = 0  # > 0 inside a decomposition that must stay on the device


_tls = _ThreadState()


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
    from . import _core

    if _core.loaded():
        _core.lib().fl_core_fast_clear()
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
    if DECOMPOSITION in SETTINGS.disabled:
        plan.reasons.append("decompositions switched off")
    elif DECOMPOSITIONS.get(f.func) is not None:
        plan.paths.append(DECOMPOSITION)
        plan.decomposition = DECOMPOSITIONS[f.func]
        plan.reasons.append(f"decomposition of {f.name} into other aten ops")
    elif f.func in GENERIC:  # taken at the fl key for the plugins that have a kernel; PyTorch's for the rest
        plan.paths.append(DECOMPOSITION)
        plan.decomposition = _generic_kernel(f.func)
        plan.reasons.append(f"PyTorch's generic kernel for {f.name} (CompositeExplicitAutograd: other aten ops)")
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


def _compute(f: OpFacts, args, kwargs):
    vals = f.normalize(args, kwargs)
    if _async.PENDING:  # an async copy may still be writing one of these tensors
        _async.wait_for(_iter_tensors(vals))
    if f.overlap is not None and not _tls.active:
        # PyTorch's overlap checks on the user's call, before any tier; the sub-ops of a
        # decomposition are its own business (an out= wrapper copies a view into out)
        rule = f.overlap_rule(vals)
        if rule is not None:
            _overlap.check(rule, f.mutable, vals)
    if f.precheck is not None:
        f.precheck(vals)
    dev = _device_of(f.name, vals)
    if dev is None:  # no fl tensor among the arguments: a factory asked for the fl device
        return _factory(f, args, kwargs)
    twin = f.functional
    if twin is not None:
        return _compute_out(f, twin, dev, vals)
    plan = _plan(f, dev, vals)
    if plan.first == NATIVE and FAST[0]:
        site: dict = {}
        result = _run_plan(f, dev, vals, plan, None, site)
        if site:
            _commit(f, site, range(len(vals)), list(range(f.n_returns)))
        return result
    return _run_plan(f, dev, vals, plan)


def _plan(f: OpFacts, dev, vals) -> Plan:
    backend = dev.backend
    dtypes = tuple(t.dtype for t in _iter_tensors(vals) if t.device.type == "fl")
    key = (f.func, dtypes)
    plan = backend.plans.get(key)
    if plan is None:
        plan = backend.plans[key] = resolve(f, backend, dtypes)
    return plan


def _run_plan(f: OpFacts, dev, vals, plan: Plan, outs=None, site: dict | None = None, may_decline=False):
    """Try the plan's paths in order; the first that serves the call gives the result. With outs (the
    tensors an out= call writes), a native kernel writes into them directly; with site, a native call
    records its marshalling there."""
    backend = dev.backend
    listening = bool(_record.LISTENERS)
    if listening:
        t0 = time.perf_counter()
        k0, b0 = _record.KERNELS[0], _record.BYTES[0]
        _record.DEPTH[0] += 1
    failures: list = []
    try:
        for path in plan.paths:
            if path == NATIVE:
                result = _run_native(f, plan.kernel, dev, vals, outs, site)
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
                    result = f.call_decomposition(plan.decomposition, vals)
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
    if may_decline:
        return _NOT_HANDLED
    raise _no_path_error(f, backend, plan, failures)


def _compute_out(f: OpFacts, twin: tuple, dev, vals):
    """An out= overload: PyTorch hands structured ops (add, mul, mm, sum, ...) to a backend this way, with
    the outputs already allocated by their meta function, and so do in-place ops (add_ is add.out into
    self). The functional twin's plan serves it: a native kernel writes straight into the outputs when
    they have the layout the functional op would give and do not partly overlap an input; otherwise the
    functional result is copied in (resizing an output, as PyTorch's out= ops do)."""
    ff, ins, outs_at = twin
    fvals = [vals[i] for i in ins]
    outs = [vals[i] for i in outs_at]
    _check_out_dtypes(f, ff, fvals, outs)
    plan = _plan(ff, dev, fvals)
    if plan.first == NATIVE and _writes_in_place(ff, fvals, outs):
        site: dict | None = {} if FAST[0] else None
        result = _run_plan(ff, dev, fvals, _native_only(plan), outs, site, may_decline=True)
        if result is not _NOT_HANDLED:
            if site:
                _commit(f, site, ins, list(range(len(outs))), outs_at)
            return outs[0] if len(outs) == 1 else tuple(outs)
    result = _run_plan(ff, dev, fvals, plan)
    results = (result,) if ff.n_returns == 1 else tuple(result)
    rule = f.overlap_rule(vals)
    for out, r in zip(outs, results, strict=True):
        _write_out(f, out, r, rule)
    return outs[0] if len(outs) == 1 else tuple(outs)


# -- the C++ fast path ------------------------------------------------------------------
# A native call on an op's own arguments is committed to the C++ core's per-signature cache; later
# calls of that signature run there without entering Python (_csrc/fl_core.cpp, fallback()).
# Python still decides every plan; the fast path steps aside while the profiler listens, while an
# async copy is in flight, and for any call whose tensors partly share memory.

FAST = [os.environ.get("FL_FAST_PATH", "1").strip().lower() not in ("0", "false", "no", "off")]


def _commit(f: OpFacts, site: dict, stack_of, returns: list, given_at=None) -> None:
    """Hand the C++ core the marshalling of the native call just made for f (site: what _run_native
    recorded). stack_of maps the kernel call's value indices to f's arguments; given_at those of the
    outputs an out= call passed in; returns index the outputs."""
    from . import _core

    name = f.func.name().encode()
    lib = _core.lib()
    if not lib.fl_core_fast_can_commit(name):
        return
    in_src = []
    for i, k in site["in_src"]:
        in_src += [stack_of[i] if i >= 0 else -1, k]
    out_src, out_dtypes = [], []
    for (kind, j), t in zip(site["out_src"], site["outs"], strict=True):
        if kind == "given":
            out_src.append(given_at[j])
        elif kind == "arg":
            out_src.append(stack_of[j])
        elif kind == "fresh":
            out_src.append(-1)
        else:
            return  # an int an op returns beside its tensors: not a kernel output
        out_dtypes.append(_core.scalar_type_code(t.dtype) if isinstance(t, torch.Tensor) else 0)
    patches = [x for a, i, kind in site["patches"] for x in (a, stack_of[i], kind)]
    dev = site["dev"]
    n_in, n_out, n_args = len(site["inputs"]), len(site["out_descs"]), len(site["cargs"])
    c_in = ffi.new("fl_tensor_t[]", site["inputs"] or 1)
    c_out = ffi.new("fl_tensor_t[]", site["out_descs"] or 1)
    c_args = ffi.new("fl_arg_t[]", site["cargs"] or 1)
    ints = ffi.new("int32_t[]", in_src or [0]), ffi.new("int32_t[]", out_src or [0])
    dts, pats = ffi.new("int32_t[]", out_dtypes or [0]), ffi.new("int32_t[]", patches or [0])
    rets = ffi.new("int32_t[]", returns or [0])
    addr = lambda c: int(ffi.cast("uintptr_t", c))  # noqa: E731
    slot = _core.count_slot(dev.backend, f.name if f.functional is None else f.functional[0].name, NATIVE)
    lib.fl_core_fast_commit(name, addr(site["kernel"].fn), dev.index, dev.local, addr(c_in), n_in, addr(ints[0]),
                            addr(c_out), n_out, addr(ints[1]), addr(dts), addr(c_args), n_args, addr(pats),
                            len(patches) // 3, addr(rets), len(returns), slot)


def _sync_fast_path() -> None:
    """The fast path serves calls only while nobody listens (the profiler sees every call)."""
    from . import _core

    _core.lib().fl_core_fast_enable(int(FAST[0] and not _record.LISTENERS))


def _native_only(plan: Plan) -> Plan:
    p = plan.__dict__.get("_native_only")
    if p is None:
        p = Plan(plan.op, plan.backend, plan.dtypes, [NATIVE], plan.kernel, None, None, plan.reasons)
        plan.__dict__["_native_only"] = p
    return p


def _check_out_dtypes(f: OpFacts, ff: OpFacts, fvals, outs) -> None:
    """PyTorch refuses to write a result into an out= tensor of a dtype it cannot be cast to."""
    layouts = _output_layouts(ff, fvals)
    if not layouts:
        return
    for out, lay in zip(outs, layouts, strict=False):
        if isinstance(out, torch.Tensor) and isinstance(lay, tuple) and len(lay) == 3:
            if not torch.can_cast(lay[2], out.dtype):
                raise RuntimeError(f"result type {_type_name(lay[2])} can't be cast to the desired output type "
                                   f"{_type_name(out.dtype)}")


def _type_name(dtype: torch.dtype) -> str:
    return {torch.float32: "Float", torch.float64: "Double", torch.float16: "Half", torch.bfloat16: "BFloat16",
            torch.int64: "Long", torch.int32: "Int", torch.int16: "Short", torch.int8: "Char", torch.uint8: "Byte",
            torch.bool: "Bool", torch.complex64: "ComplexFloat", torch.complex128: "ComplexDouble"}.get(dtype,
                                                                                                       str(dtype))


def _writes_in_place(ff: OpFacts, fvals, outs) -> bool:
    """The outputs have exactly the layouts the functional op gives, and none partly overlaps an input
    (a pointwise kernel may write over an input of the same layout: that is what in-place ops are)."""
    layouts = _output_layouts(ff, fvals)
    if layouts is None or len(layouts) != len(outs):
        return False
    for out, lay in zip(outs, layouts, strict=True):
        if not is_fl(out) or not isinstance(lay, tuple) or len(lay) != 3:
            return False
        if list(out.shape) != lay[0] or out.dtype != lay[2] or (out.numel() > 1 and list(out.stride()) != lay[1]):
            return False
        if out.is_conj() or out.is_neg():
            return False
        base = base_ptr(out)
        for t in _iter_tensors(fvals):
            if t.device.type != "fl" or not t.numel() or base_ptr(t) != base:
                continue
            same = (t.storage_offset() == out.storage_offset() and t.shape == out.shape
                    and t.stride() == out.stride() and t.dtype == out.dtype)
            if not (ff.pointwise and same):
                return False
    return True


def _write_out(f: OpFacts, out: torch.Tensor, r, rule=None) -> None:
    if not isinstance(r, torch.Tensor):
        return
    if _adopt(out, r):
        return
    if out.shape != r.shape:
        if out.numel() != 0:
            warnings.warn(
                f"An output with one or more elements was resized since it had shape {list(out.shape)}, which "
                f"does not match the required output shape {list(r.shape)}. This behavior is deprecated, and in "
                f"a future PyTorch release outputs will not be resized unless they have zero elements. You can "
                f"explicitly reuse an out tensor t by resizing it, inplace, to zero elements with t.resize_(0).",
                UserWarning, stacklevel=3)
        out.resize_(r.shape)
        if r.dim() and not r.is_contiguous() and is_dense(r):
            out.as_strided_(r.shape, r.stride())
    if _overlap.has_internal_overlap(out) and not (rule is not None and rule.internal):
        _copy_unique(out, r)  # an expanded out= tensor the op's CPU kernel writes into without complaint
    else:
        out.copy_(r)


def _adopt(out: torch.Tensor, r: torch.Tensor) -> bool:
    """out takes r's storage instead of a copy of it, when nobody could tell the difference: out is the
    sole owner of its storage (a fresh output PyTorch allocated for a structured op), r the sole owner of
    its own (a fresh result), and both have the same layout."""
    if not (is_fl(r) and is_fl(out)) or r.device != out.device or r.dtype != out.dtype:
        return False
    if out.shape != r.shape or (out.numel() > 1 and out.stride() != r.stride()) or out.storage_offset():
        return False
    if out.is_conj() or out.is_neg() or r.is_conj() or r.is_neg() or out._base is not None:
        return False
    use_count = torch._C._storage_Use_Count
    if use_count(out.untyped_storage()._cdata) != 2 or use_count(r.untyped_storage()._cdata) != 2:
        return False  # (2: the tensor and the storage object asked about) another view shares it
    out.set_(r.untyped_storage(), r.storage_offset(), r.shape, r.stride())
    return True


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
    counts = backend.own_counts
    counts[key] = counts.get(key, 0) + 1


def _emit(name, backend, path, t0, k0, b0) -> None:
    _record.emit(_record.OpEvent(name, backend, path, time.perf_counter() - t0, _record.KERNELS[0] - k0,
                                 _record.BYTES[0] - b0, _record.DEPTH[0] - 1, t0))


# -- native path ---------------------------------------------------------------


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
    return {"data": d["data"], "offset": d["offset"], "dtype": d["dtype"], "ndim": nd, "sizes": sizes,
            "strides": strides}


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


def _run_native(f: OpFacts, kernel, dev, vals, given=None, site: dict | None = None):
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
            layouts = _output_layouts(f, vals)
            if layouts is None:
                return _NOT_HANDLED
        for r, a in enumerate(f.ret_alias):
            if a is not None:
                outs.append(vals[a])
                out_src.append(("arg", a))
                continue
            lay = layouts[r]
            if lay is None:
                outs.append(None)
                out_src.append(("fresh", None))
            elif lay is _NOT_HANDLED:
                return _NOT_HANDLED  # scalar / list returns are not a kernel's business
            elif type(lay) is _IntReturn:
                outs.append(lay[1])
                out_src.append(("int", None))
            else:
                outs.append(new_tensor(dev, lay[0], lay[2], lay[1]))
                out_src.append(("fresh", None))
    for t in _iter_tensors(outs):
        if t.dim() > _abi.MAX_DIMS:
            return _NOT_HANDLED
    shape = list(outs[0].shape) if f.pointwise and outs and isinstance(outs[0], torch.Tensor) else None
    inputs: list = []
    cargs: list = []
    in_src: list = []  # (value index, list index or -1) of each input descriptor
    patches: list = []  # (arg index, value index, kind) of the values the fast path reads per call
    tensor_arg = f.tensor_arg
    for i, v in enumerate(vals):
        if isinstance(v, torch.Tensor) and v.device.type == "fl":
            if v.dim() > _abi.MAX_DIMS:
                return _NOT_HANDLED
            cargs.append((_abi.ARG_TENSOR, 0, len(inputs)))
            in_src.append((i, -1))
            inputs.append(_desc_for(v, shape))
        elif v is None:
            cargs.append((_abi.ARG_NONE,))
        elif isinstance(v, bool):
            if tensor_arg[i]:  # a wrapped number
                patches.append((len(cargs), i, 1))
            cargs.append((_abi.ARG_BOOL, 0, int(v)))
        elif isinstance(v, int):
            if tensor_arg[i]:
                patches.append((len(cargs), i, 1))
            cargs.append((_abi.ARG_INT, 0, v))
        elif isinstance(v, float):
            patches.append((len(cargs), i, 1 if tensor_arg[i] else 0))
            cargs.append((_abi.ARG_FLOAT, 0, 0, v))
        elif isinstance(v, torch.Tensor):  # a 0-dim CPU tensor: a wrapped number
            patches.append((len(cargs), i, 1))
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
            if v and all(is_fl(x) or x is None for x in v) and any(x is not None for x in v):
                # a Tensor?[] (index lists: x[:, idx]) passes None as an undefined descriptor
                cargs.append((_abi.ARG_TENSOR_LIST, len(v), len(inputs)))
                for k, x in enumerate(v):
                    if x is None:
                        inputs.append(_UNDEFINED)
                        in_src.append((-1, -1))
                        continue
                    if x.dim() > _abi.MAX_DIMS:
                        return _NOT_HANDLED
                    in_src.append((i, k))
                    inputs.append(desc(x))
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
    out_descs = [(desc(t) if is_fl(t) else _UNDEFINED) for t in outs]
    n_in, n_out, n_args = len(inputs), len(out_descs), len(cargs)
    c_in = ffi.new("fl_tensor_t[]", inputs or 1)
    c_out = ffi.new("fl_tensor_t[]", out_descs or 1)
    c_args = ffi.new("fl_arg_t[]", cargs or 1)
    status = kernel.fn(ffi.NULL, dev.local, c_in, n_in, c_out, n_out, c_args, n_args)
    if status == _abi.FL_ERR_UNSUPPORTED:
        return _NOT_HANDLED
    _record.KERNELS[0] += 1
    dev.plugin.check(status, f"kernel {f.name}")
    if site is not None:
        site.update(kernel=kernel, dev=dev, inputs=inputs, in_src=in_src, outs=outs, out_descs=out_descs,
                    out_src=out_src, cargs=cargs, patches=patches)
    if f.n_returns == 0:
        return None
    if f.n_returns == 1:
        return outs[0]
    return tuple(outs)


# -- CPU fallback --------------------------------------------------------------


def _shared_mirrors(dev, vals) -> dict[int, torch.Tensor]:
    """Host copies of fl tensors that share an allocation, as views of ONE host
    copy of it: the CPU kernel then sees the same aliasing the device memory
    has (x[1:].add_(x[:-1]) must fail as it does on CPU, not silently read a
    stale copy)."""
    by_base: dict[int, list] = {}
    for t in _iter_tensors(vals):
        if t.device.type == "fl" and t.numel():
            by_base.setdefault(base_ptr(t), []).append(t)
    out: dict[int, torch.Tensor] = {}
    for base, views in by_base.items():
        if len(views) < 2:
            continue
        spans = [span(t) for t in views]
        lo = min(a * t.element_size() for (a, _), t in zip(spans, views, strict=True)) // 16 * 16
        hi = max(b * t.element_size() for (_, b), t in zip(spans, views, strict=True))
        staging = torch.empty(hi - lo, dtype=torch.uint8)
        dev.plugin.copy_d2h(dev.local, staging.data_ptr(), base + lo, hi - lo)
        _record.BYTES[0] += hi - lo
        for t in views:
            item = t.element_size()
            typed = staging[: (hi - lo) // item * item].view(t.dtype)
            out[id(t)] = typed.as_strided(t.shape, t.stride(), (t.storage_offset() * item - lo) // item)
    return out


def _run_fallback(f: OpFacts, dev, vals):
    mirrors: dict[int, torch.Tensor] = {} if dev.host_accessible else _shared_mirrors(dev, vals)

    def host(t):
        if t.device.type == "fl":
            if device_of(t) is not dev:
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
            if not is_fl(fl_t):
                continue
            if tuple(cpu_t.shape) != tuple(fl_t.shape) or cpu_t.stride() != fl_t.stride():
                replace_storage(fl_t, cpu_to_new_fl(dev, cpu_t))  # an out= tensor the op resized
            elif not dev.host_accessible:
                cpu_into_fl(fl_t, cpu_t)
    if f.n_returns == 0:
        return None
    outs = (out,) if f.n_returns == 1 else tuple(out)
    results = []
    for r, o in enumerate(outs):
        a = f.ret_alias[r]
        if a is not None and is_fl(vals[a]):
            results.append(vals[a])
        elif isinstance(o, torch.Tensor):
            results.append(cpu_to_new_fl(dev, o))
        elif isinstance(o, (list, tuple)):
            results.append(type(o)(cpu_to_new_fl(dev, x) if isinstance(x, torch.Tensor) else x for x in o))
        else:
            results.append(o)
    return results[0] if f.n_returns == 1 else tuple(results)


def replace_storage(t: torch.Tensor, new: torch.Tensor) -> None:
    """Give t new's storage and metadata in place (an out= tensor an op resized)."""
    t.set_(new.untyped_storage(), new.storage_offset(), new.shape, new.stride())


# -- metadata ops -------------------------------------------------------------


def view_of(base: torch.Tensor, m):
    """The fl views a meta computation describes (m: meta tensor(s) laid over base's storage)."""
    if isinstance(m, torch.Tensor):
        if m.dtype == base.dtype:
            v = aten.as_strided.default(base, m.shape, m.stride(), m.storage_offset())
        else:  # a view that reinterprets the bytes (view_as_real, view_as_complex)
            v = torch.empty(0, dtype=m.dtype, device=base.device)
            v.set_(base.untyped_storage(), m.storage_offset(), m.shape, m.stride())
        return with_bits(v, m.is_conj(), m.is_neg())
    if isinstance(m, (list, tuple)):
        return type(m)(view_of(base, x) for x in m)
    return m


def _view_op(f: OpFacts, args, kwargs):
    """A view op PyTorch has no generic kernel for (unfold, view_as_real, ...): its meta function says
    where the view lies in the base's storage."""
    base = args[0]
    if not is_fl(base):
        return _compute(f, args, kwargs)
    m = f.func(*_map(to_meta, args), **kwargs)
    _count(device_of(base).backend, f.name, VIEW)
    return view_of(base, m)


def _inplace_meta(f: OpFacts, args, kwargs):
    """An in-place metadata op PyTorch has no generic kernel for: the tensor takes the new layout its
    meta function gives, over the same storage."""
    t = args[0]
    m = f.func(*_map(to_meta, args), **kwargs)
    t.set_(t.untyped_storage(), m.storage_offset(), m.shape, m.stride())
    _count(device_of(t).backend, f.name, VIEW)
    return t


# -- copies and transfers -------------------------------------------------------


def _copy_from(f: OpFacts, args, kwargs):
    """Every copy that involves an fl tensor (Tensor.copy_, .to(), .cpu(), torch.tensor(..., device="fl"))
    reaches the device as _copy_from(src, dst, non_blocking)."""
    vals = f.normalize(args, kwargs)
    src, dst = vals[0], vals[1]
    return copy_into(dst, src, bool(vals[2]) if len(vals) > 2 else False)


def _copy_from_and_resize(f: OpFacts, args, kwargs):
    vals = f.normalize(args, kwargs)
    src, dst = vals[0], vals[1]
    if dst.shape != src.shape:
        dst.resize_(src.shape)
    return copy_into(dst, src, False)


_COPY_FACTS: list = []


def copy_into(dst: torch.Tensor, src: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    if src.is_complex() and not dst.is_complex():
        warnings.warn("Casting complex values to real discards the imaginary part", UserWarning, stacklevel=4)
    if is_fl(dst) and is_fl(src) and device_of(dst) is device_of(src):
        if dst.is_conj() != src.is_conj() or dst.is_neg() != src.is_neg():
            return copy_math_bits(dst, src)
        if not _COPY_FACTS:
            _COPY_FACTS.append(facts(aten.copy_.default))
        return _compute(_COPY_FACTS[0], (dst, src), {})
    listening = bool(_record.LISTENERS)
    t0, b0 = time.perf_counter(), _record.BYTES[0]
    if non_blocking and is_fl(dst) and not is_fl(src) and _async_ok(dst, src):
        _async.h2d(dst, src)
        _count(device_of(dst).backend, "aten::copy_", COPY)
        return dst
    if is_fl(dst):
        host_src = fl_to_cpu(src) if is_fl(src) else src
        cpu_into_fl(dst, host_src)
        backend = device_of(dst).backend.name
    else:  # fl -> cpu
        dst.copy_(fl_to_cpu(src))
        backend = device_of(src).backend.name
    for t in (dst, src):
        if is_fl(t):
            _count(device_of(t).backend, "aten::copy_", COPY)
    if listening:
        _record.emit(_record.OpEvent("aten::copy_", backend, COPY, time.perf_counter() - t0, 0,
                                     _record.BYTES[0] - b0, _record.DEPTH[0], t0))
    return dst


def copy_math_bits(dst: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """dst.copy_(src) on one device where the conj/neg flags differ: copy the stored values, then
    conjugate/negate dst's memory by the difference (conj and neg commute)."""
    aten.copy_.default(raw(dst), raw(src))
    if dst.is_conj() != src.is_conj() and dst.is_complex():
        aten.conj_physical_.default(raw(dst))
    if dst.is_neg() != src.is_neg():
        aten.neg_.default(raw(dst))
    return dst


def _async_ok(dst: torch.Tensor, src: torch.Tensor) -> bool:
    """An async copy needs pinned, contiguous host bytes of dst's dtype and
    layout, and a device with async copies; anything else copies now."""
    dev = device_of(dst)
    return (src.device.type == "cpu" and src.dtype == dst.dtype and src.shape == dst.shape and dst.numel() > 0
            and not (src.is_conj() or src.is_neg() or dst.is_conj() or dst.is_neg())
            and src.is_contiguous() and dst.is_contiguous() and not dev.host_accessible
            and _async.supports(dev) and src.is_pinned())


def _local_scalar_dense(f: OpFacts, args, kwargs):
    t = args[0]
    _count(device_of(t).backend, f.name, COPY)
    return fl_to_cpu(t).item()


# -- factories: ops dispatched to the fl device without an fl tensor argument ---


def _factory(f: OpFacts, args, kwargs):
    """An op that reached the fl device with no fl tensor among its arguments: a factory asked for device
    "fl" (torch.eye, tril_indices, _efficientzerotensor, ...). A plugin kernel makes it on the device when
    there is one, else its decomposition on the device, else the host computes it and it is copied over;
    the path is reported like any op's."""
    device = kwargs.get("device")
    dev = REGISTRY.device(torch.device(device).index if device is not None and torch.device(device).type == "fl"
                          else None)
    if not _record.LISTENERS:
        return _factory_run(f, dev, args, kwargs)[0]
    t0, k0, b0 = time.perf_counter(), _record.KERNELS[0], _record.BYTES[0]
    _record.DEPTH[0] += 1
    try:
        out, path = _factory_run(f, dev, args, kwargs)
        _emit(f.name, dev.backend.name, path, t0, k0, b0)
    finally:
        _record.DEPTH[0] -= 1
    return out


def _factory_run(f: OpFacts, dev, args, kwargs):
    """_factory's work; returns (result, path)."""
    if f.func is aten._efficientzerotensor.default:
        # autograd's zero gradients (sgn, ...): PyTorch's CPU one has no storage (data_ptr 0);
        # on fl it is a real zero-filled tensor, made on the device with the fill_ every plugin has
        dtype = kwargs.get("dtype") or torch.get_default_dtype()
        return new_tensor(dev, list(args[0]), dtype).zero_(), NATIVE
    native = native_factory(f.func, dev, args, kwargs)
    if native is not None:
        return native, NATIVE
    if f.func in GENERIC:  # PyTorch's generic factory (empty, then an out= op torch_fl serves)
        return _generic_kernel(f.func)(*args, **kwargs), DECOMPOSITION
    decomposition = DECOMPOSITIONS.get(f.func)
    active = _decomposing()
    if decomposition is not None and DECOMPOSITION not in SETTINGS.disabled and f.func not in active:
        # torch.eye, tril_indices ... as device ops (arange, comparisons) rather than a host copy; all on
        # the device or not at all (a sub-op that needs the host sends the whole factory there instead)
        active.add(f.func)
        _tls.device_only = getattr(_tls, "device_only", 0) + 1
        try:
            out = decomposition(*args, **kwargs)
        except NotImplementedError:
            if not SETTINGS.cpu_fallback or _tls.device_only > 1:
                raise
        else:
            _count(dev.backend, f.name, DECOMPOSITION)
            return out, DECOMPOSITION
        finally:
            _tls.device_only -= 1
            active.discard(f.func)
    if not SETTINGS.cpu_fallback or getattr(_tls, "device_only", 0):
        raise NotImplementedError(
            f"{f.name} has no kernel on fl backend '{dev.backend.name}' and the CPU fallback is switched off "
            f"(FL_CPU_FALLBACK=0); enable it with FL_CPU_FALLBACK=1 or torch_fl.set_cpu_fallback(True)")
    if "device" in kwargs:
        kwargs = dict(kwargs, device="cpu")
    out = f.func(*args, **kwargs)
    _count(dev.backend, f.name, FALLBACK)
    if isinstance(out, torch.Tensor) and out.device.type == "cpu":
        return cpu_to_new_fl(dev, out), FALLBACK
    return out, FALLBACK


def native_factory(op, dev, args, kwargs):
    """A factory (arange, ...) the plugin has a kernel for: allocated and filled on the device. The
    output layout comes from the meta device; the kernel sees the op's scalar arguments."""
    f = facts(op)
    entry = dev.backend.plugin.kernels.get(f.name)
    if entry is None or NATIVE in SETTINGS.disabled or "device" not in f.arg_names:
        return None
    vals = f.normalize(args, dict(kwargs, device=torch.device("meta")))
    layouts = _output_layouts(f, vals)  # on the meta device, cached: the same call _run_native makes
    if not layouts or not isinstance(layouts[0], tuple) or len(layouts[0]) != 3:
        return None  # arguments the factory rejects: the host path reports them
    code = TO_CODE.get(layouts[0][2], -1)
    if code < 0 or not (entry.dtypes >> code) & 1 or not (dev.props.dtypes >> code) & 1:
        return None
    out = _run_native(f, entry, dev, vals)
    if out is _NOT_HANDLED:
        return None
    _count(dev.backend, f.name, NATIVE)
    return out


_SDPA_FWD = "aten::_scaled_dot_product_fused_attention_overrideable"
_SDPA_BWD = "aten::_scaled_dot_product_fused_attention_overrideable_backward"


def sdpa_fused_eligible(q, k, v, dropout_p: float, enable_gqa: bool) -> bool:
    """Whether the plugin's fused attention kernels (forward and backward both)
    serve this call: 4-D fl inputs of one dtype the device computes in, no
    dropout, no grouped-query broadcasting, native path not switched off."""
    if not is_fl(q) or enable_gqa or dropout_p or q.dim() != 4:
        return False
    if not (isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor)) or k.dim() != 4 or v.dim() != 4:
        return False
    if k.dtype != q.dtype or v.dtype != q.dtype or NATIVE in SETTINGS.disabled:
        return False
    dev = device_of(q)
    kernels = dev.backend.plugin.kernels
    fwd, bwd = kernels.get(_SDPA_FWD), kernels.get(_SDPA_BWD)
    code = TO_CODE.get(q.dtype, -1)
    return (fwd is not None and bwd is not None and code >= 0 and bool((fwd.dtypes >> code) & 1)
            and bool((bwd.dtypes >> code) & 1) and bool((dev.props.dtypes >> code) & 1))


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
    aten._copy_from.default: _copy_from,
    aten._copy_from_and_resize.default: _copy_from_and_resize,
    aten._local_scalar_dense.default: _local_scalar_dense,
    aten._fused_sdp_choice.default: _sdp_choice,
    aten.record_stream.default: _noop,
}
for _name in ("as_strided_", "squeeze_", "unsqueeze_", "t_", "transpose_", "swapdims_", "swapaxes_"):
    _packet = getattr(aten, _name, None)
    if _packet is not None:
        for _ov in _packet.overloads():
            _SPECIAL[getattr(_packet, _ov)] = _inplace_meta


_HANDLER_PATH = {_view_op: VIEW, _inplace_meta: VIEW, _copy_from: COPY, _copy_from_and_resize: COPY,
                 _local_scalar_dense: COPY, _composite: DECOMPOSITION, _sdp_choice: "meta", _noop: "meta",
                 _foreach: "foreach"}


_SELF_REPORTING = (_compute, _copy_from, _copy_from_and_resize)


def _is_foreach(func) -> bool:
    return func._schema.name.startswith("aten::_foreach_")


def dispatch(func, args, kwargs):
    f = _FACTS.get(func)
    if f is None:
        f = facts(func)
        if _is_foreach(func) and func not in _SPECIAL and DECOMPOSITIONS.get(func) is None:
            f.handler = _foreach
    if _record.LISTENERS and f.handler not in _SELF_REPORTING:
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
    first = next((t for t in _iter_tensors(list(args) + list(kwargs.values())) if is_fl(t)), None)
    backend = device_of(first).backend.name if first is not None else (
        REGISTRY.current.name if REGISTRY.current is not None else "?")
    _record.emit(_record.OpEvent(f.name, backend, _HANDLER_PATH.get(f.handler, "other"), time.perf_counter() - t0,
                                 _record.KERNELS[0] - k0, _record.BYTES[0] - b0, depth, t0))
    return result


# -- the entry PyTorch calls -----------------------------------------------------
# The C++ core's boxed fallback hands every op it does not serve to the PrivateUse3 key, where
# _device registers `entry`; the profiler swaps the function behind it to add torch.profiler ranges.

_ENTRY = [dispatch]


def entry(func, *args, **kwargs):
    return _ENTRY[0](func, args, kwargs)


def set_dispatch(fn) -> None:
    """Route every op through fn(func, args, kwargs) instead of dispatch (None restores dispatch)."""
    _ENTRY[0] = fn if fn is not None else dispatch


_LIBS: list = []


def install() -> None:
    """Hand PyTorch the dispatcher: the C++ core's fallback sends every op it does not serve to the
    PrivateUse3 key, whose fallback is `entry`."""
    if _LIBS:
        return
    lib = torch.library.Library("_", "IMPL")
    lib.fallback(entry, dispatch_key="PrivateUse3")
    for key in ("SparsePrivateUse1", "SparseCsrPrivateUse1"):
        lib.fallback(_sparse_on_fl, dispatch_key=key)
    _LIBS.append(lib)
    _record.ON_LISTENERS.append(_sync_fast_path)
    _sync_fast_path()
    from . import _core

    _record.FAST_KERNELS[0] = _core.lib().fl_core_fast_hits
    direct = set(DIRECT) | _own_decomposed_ops() | _generic_out_ops()
    GENERIC.update(_native_generic_ops() - direct)
    libs: dict = {}
    for op in sorted(direct | GENERIC | _prims_served(), key=str):
        ns, name = op._schema.name.split("::")
        if ns not in libs:
            libs[ns] = torch.library.Library(ns, "IMPL")
        libs[ns].impl(name + ("" if op._overloadname == "default" else "." + op._overloadname), _direct(op),
                      "PrivateUse1")
    overrides = {**_implicit_overrides(), **_decompositions.AUTOGRAD_COMPOSITIONS}
    for op, fn in sorted(overrides.items(), key=lambda kv: str(kv[0])):
        ns, name = op._schema.name.split("::")
        if ns not in libs:
            libs[ns] = torch.library.Library(ns, "IMPL")
        libs[ns].impl(name + ("" if op._overloadname == "default" else "." + op._overloadname), fn,
                      "AutogradPrivateUse1")
    _LIBS.extend(libs.values())


def _own_decomposed_ops() -> set:
    """Ops torch_fl has its own device decomposition for, where PyTorch's kernel for other backends is a
    generic composition (CompositeExplicitAutograd, or a structured op whose out= kernel is generic):
    taken at the fl key, so torch_fl's plan (native, its decomposition, JIT, fallback) serves them."""
    from torch._decomp import decomposition_table

    found = set()
    for op, fn in DECOMPOSITIONS.items():
        if not isinstance(op, torch._ops.OpOverload) or op.namespace != "aten" or decomposition_table.get(op) is fn:
            continue
        if op in _NEVER_DIRECT:
            continue
        if any(torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), k)
               for k in ("CompositeExplicitAutograd", "CompositeExplicitAutogradNonFunctional")):
            found.add(op)
    return found


# private ops that move or wrap memory rather than compute, or belong to other layouts and libraries
_PLUMBING = ("__", "_copy_from", "_to_copy", "_pin_memory", "_resize_output", "_unsafe_view", "_to_dense", "_nested",
             "_sparse", "_cudnn", "_mkldnn", "_miopen", "_foreach", "_fbgemm", "_make_", "_new_", "_pack", "_pad")


def _generic_out_ops() -> set:
    """out= overloads whose kernel for other backends is PyTorch's generic out= wrapper (compute, then
    copy into out): taken at the fl key, so an out= call is judged as CPU judges it (the overlap rules
    run before any tier; an expanded out= tensor the CPU kernel writes into is written the same way)
    and served by its functional twin's plan."""
    found = set()
    for qualified in torch._C._dispatch_get_all_op_names():  # every registered op (torch.ops.aten is lazy)
        if not qualified.startswith("aten::") or qualified[6:].startswith(_PLUMBING):
            continue
        op = overload_named(qualified)
        if op is None:
            continue
        schema = op._schema
        mutable = [i for i, a in enumerate(schema.arguments) if a.alias_info is not None and a.alias_info.is_write]
        if not mutable or not any(schema.arguments[i].kwarg_only for i in mutable):
            continue
        if op in _NEVER_DIRECT:
            continue
        if torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeExplicitAutograd") and \
                functional_twin(facts(op)) is not None:
            found.add(op)
    return found


def _implicit_overrides() -> dict:
    """torch_fl's own decompositions of ops PyTorch composes itself above the backend
    (CompositeImplicitAutograd): PyTorch's composition is generic, torch_fl's keeps the work on a device
    that lacks what the generic one needs (linalg.pinv's tolerances in the input's dtype, not float64).
    They run at the fl autograd key, composed of differentiable ops, so autograd records them."""
    from torch._decomp import decomposition_table

    return {op: fn for op, fn in DECOMPOSITIONS.items()
            if isinstance(op, torch._ops.OpOverload) and decomposition_table.get(op) is not fn
            and torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeImplicitAutograd")}


def _prims_served() -> set:
    """The prims torch_fl serves (torch._decomp's decompositions bottom out in them: prims.rev for flip,
    prims.sum for sum ...): PyTorch's own implementation of a prim calls the aten op back, so without
    these the decomposition of that op would have no way down."""
    from . import _jit_reduce

    found = {op for op in DECOMPOSITIONS if isinstance(op, torch._ops.OpOverload) and op.namespace == "prims"}
    found |= {op for op in _jit_reduce.OPS if op.namespace == "prims"}
    return found


GENERIC: set = set()  # ops taken at the fl key whose PyTorch generic kernel serves backends without a kernel
_GENERIC_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.PrivateUse2)


def _generic_kernel(op):
    """PyTorch's CompositeExplicitAutograd kernel of op, reached through a backend key torch_fl leaves
    empty (PrivateUse2), where the generic kernel is what the dispatcher computes."""
    def run(*args, **kwargs):
        return op.redispatch(_GENERIC_KEYS, *args, **kwargs)

    return run


def _native_generic_ops() -> set:
    """Ops some loaded plugin has a kernel for whose PyTorch kernel for other backends is generic
    (CompositeExplicitAutograd: native_layer_norm as mean/var/..., embedding as index_select): taken at
    the fl key, so the plugin's kernel runs instead of PyTorch's composition. Copies are PyTorch's
    (they reach torch_fl as _copy_from)."""
    found = set()
    for backend in REGISTRY.backends.values():
        for name in backend.plugin.kernels:
            op = overload_named(name)
            if op is None or op in _NEVER_DIRECT:
                continue
            if torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeExplicitAutograd"):
                found.add(op)
    return found


_NEVER_DIRECT = {aten.copy_.default}


def overload_named(name: str):
    """The aten OpOverload an ABI kernel name ("aten::add.Tensor") means, or None."""
    ns, _, rest = name.partition("::")
    if ns != "aten":
        return None
    base, _, overload = rest.partition(".")
    packet = getattr(aten, base, None)
    return getattr(packet, overload or "default", None) if packet is not None else None


# Ops whose generic (CompositeExplicitAutograd) kernel cannot serve a PrivateUse1 device, so the
# dispatcher takes them at the fl key itself: the attention ops PyTorch declares for PrivateUse1
# backends to implement (their generic kernel only raises), and ops whose generic kernel calls a
# CPU/CUDA-only DispatchStub ("DispatchStub: missing kernel for fl").
DIRECT = (
    aten._scaled_dot_product_fused_attention_overrideable.default,
    aten._scaled_dot_product_fused_attention_overrideable_backward.default,
    aten.conj_physical_.default,
    # convolution picks a backend itself and, for PrivateUse1, calls convolution_overrideable (which
    # raises): plugins name their kernels aten::convolution / aten::convolution_backward
    aten.convolution.default,
    aten.convolution_backward.default,
)


def _sparse_on_fl(op, *args, **kwargs):
    """PyTorch moves a sparse layout to fl (x.to_sparse_csr().to("fl")); no op can run on it."""
    layout = next((t.layout for t in _iter_tensors(list(args) + list(kwargs.values()))
                   if t.device.type == "fl" and t.layout is not torch.strided), "sparse")
    where = next((t.device for t in _iter_tensors(list(args) + list(kwargs.values())) if t.device.type == "fl"), "fl")
    raise RuntimeError(f"{op.name()}: a {layout} tensor on {where} is not supported by torch_fl (fl tensors are "
                       f"strided); keep {layout} tensors on the CPU and move dense ones with .to_dense() first")


def _direct(op):
    def impl(*args, **kwargs):
        if torch._C._len_torch_dispatch_stack():  # a mode saw the op above the backend (see fl_core.cpp)
            with _disable_current_modes():
                return _ENTRY[0](op, args, kwargs)
        return _ENTRY[0](op, args, kwargs)

    return impl
