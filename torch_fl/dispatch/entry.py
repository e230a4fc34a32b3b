"""Where PyTorch hands ops to torch_fl: install() registers `entry` as the
fallback of the key the C++ core's boxed fallback forwards to (PrivateUse3),
and takes at the fl key itself the ops whose generic kernels cannot serve a
PrivateUse1 device. dispatch() picks each op's handler once (a metadata op,
a copy, a _foreach_ loop, or the tiers of dispatch.plan) and times for the
profiler the handlers that do not report themselves."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch._decomp import decomposition_table
from torch.utils._python_dispatch import _disable_current_modes

from .. import jit
from ..runtime import (
    COPY,
    DECOMPOSITION,
    REGISTRY,
    VIEW,
    WATCH,
    core,
    device_of,
    events,
    is_fl,
    iter_tensors,
    native,
    not_traced,
)
from .decompositions import AUTOGRAD_COMPOSITIONS, DECOMPOSITIONS
from .facts import FACTS, facts, functional_twin
from .meta import (
    SPECIAL,
    copy_from,
    copy_from_and_resize,
    foreach,
    inplace_meta,
    local_scalar_dense,
    sdp_choice,
    view_op,
)
from .plan import GENERIC, composite, compute, decomposition_context

aten = torch.ops.aten

HANDLER_PATH = {
    view_op: VIEW,
    inplace_meta: VIEW,
    copy_from: COPY,
    copy_from_and_resize: COPY,
    local_scalar_dense: COPY,
    composite: DECOMPOSITION,
    sdp_choice: "meta",
    foreach: "foreach",
}
_SELF_REPORTING = (compute, copy_from, copy_from_and_resize)


def _is_foreach(func) -> bool:
    return func._schema.name.startswith("aten::_foreach_")


def handler_for(f) -> object:
    """The function that serves an op: its special handler (metadata ops, copies), PyTorch's own
    composition for a CompositeImplicitAutograd op that reached the backend, a _foreach_ loop, a view's
    meta function, or the tiers."""
    func = f.func
    handler = SPECIAL.get(func)
    if handler is not None:
        return handler
    if _is_foreach(func) and DECOMPOSITIONS.get(func) is None:
        return foreach
    if torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd"):
        return composite
    return view_op if f.is_view else compute


def dispatch(func, args, kwargs):
    f = FACTS.get(func)
    if f is None or f.handler is None:
        f = facts(func)
        f.handler = handler_for(f)
    try:
        if events.STATE.listeners and f.handler not in _SELF_REPORTING:
            result = _observed(f, args, kwargs)
        else:
            result = f.handler(f, args, kwargs)
    except RuntimeError:
        plain = _without_uninitialized(args, kwargs)
        if plain is None:
            raise
        return dispatch(func, *plain)
    if WATCH.active and (f.mutable or f.func in _COPIES_INTO):
        _note_writes(f, args, kwargs)
    return result


_COPIES_INTO = {aten._copy_from.default: 1, aten._copy_from_and_resize.default: 1}  # dst: written, not marked (a!)


def _without_uninitialized(args, kwargs) -> tuple | None:
    """The arguments with the lazy modules' UninitializedParameter/Buffer as plain tensors, or None when
    there are none. PyTorch hands a backend's Python kernel the Python objects themselves, and those refuse
    Python-level shape access (their .shape raises), which a C++ kernel never makes: an op on them (the dtype
    conversion in nn.LazyConv1d(4, 2).to("fl").to(torch.float64)) runs on a plain view of the same tensor.
    Looked for only after an op failed, so other calls pay nothing."""
    mixin = torch.nn.parameter.UninitializedTensorMixin  # type: ignore[attr-defined]  # not in torch's stub

    def plain(v):
        if isinstance(v, mixin):
            return torch.Tensor.as_subclass(v, torch.Tensor)
        if isinstance(v, (list, tuple)) and any(isinstance(x, mixin) for x in v):
            return type(v)(plain(x) for x in v)
        return v

    if not any(isinstance(t, mixin) for t in iter_tensors(list(args) + list(kwargs.values()))):
        return None
    return tuple(plain(a) for a in args), {k: plain(v) for k, v in kwargs.items()}


def _note_writes(f, args, kwargs) -> None:
    """Tell the C++ core's write watch which fl storages the op wrote (runtime.watch: caches of values
    derived from weights see p.data.mul_() too)."""
    vals = f.normalize(args, kwargs)
    at = _COPIES_INTO.get(f.func)
    for i in f.mutable if at is None else (at,):
        for t in iter_tensors([vals[i]]):
            if t.device.type == "fl":
                WATCH.note_written(t)


def _observed(f, args, kwargs):
    """Ops whose handler does not report itself (views, transfers, foreach
    loops), timed for a listener; their sub-ops report at depth + 1."""
    t0, k0, b0 = time.perf_counter(), events.STATE.kernels, events.STATE.bytes_copied
    depth = events.NESTING.depth
    events.NESTING.depth += 1
    try:
        result = f.handler(f, args, kwargs)
    finally:
        events.NESTING.depth -= 1
    first = next((t for t in iter_tensors(list(args) + list(kwargs.values())) if is_fl(t)), None)
    backend = (
        device_of(first).backend.name
        if first is not None
        else (REGISTRY.current.name if REGISTRY.current is not None else "?")
    )
    events.emit(
        events.OpEvent(
            f.name,
            backend,
            HANDLER_PATH.get(f.handler, "other"),
            time.perf_counter() - t0,
            events.STATE.kernels - k0,
            events.STATE.bytes_copied - b0,
            depth,
            t0,
        )
    )
    return result


# -- the entry PyTorch calls -----------------------------------------------------
# The C++ core's boxed fallback hands every op it does not serve to the PrivateUse3 key, where
# install() registers `entry`; the profiler swaps the function behind it to add torch.profiler ranges.


class EntryState:
    """Per process: the function PyTorch's PrivateUse3 fallback calls for every op (set_dispatch swaps it)."""

    def __init__(self) -> None:
        self.dispatch: Callable = dispatch


ENTRY = EntryState()


def entry(func, *args, **kwargs):
    return ENTRY.dispatch(func, args, kwargs)


def set_dispatch(fn) -> None:
    """Route every op through fn(func, args, kwargs) instead of dispatch (None restores dispatch)."""
    ENTRY.dispatch = fn if fn is not None else dispatch


_LIBS: list = []


def install() -> None:
    """Hand PyTorch the dispatcher: the C++ core's fallback sends every op it does not serve to the
    PrivateUse3 key, whose fallback is `entry`."""
    if _LIBS:
        return
    lib = torch.library.Library("_", "IMPL")
    lib.fallback(not_traced(entry), dispatch_key="PrivateUse3")
    for key in ("SparsePrivateUse1", "SparseCsrPrivateUse1"):
        lib.fallback(not_traced(_sparse_on_fl), dispatch_key=key)
    _LIBS.append(lib)
    events.STATE.on_listeners.append(native.sync_fast_path)
    events.STATE.op_context = decomposition_context
    native.sync_fast_path()
    lib = core.lib()
    # native kernels, and the device copies and mem_set fills the CPU-fallback fast path makes
    events.STATE.fast_kernels = lambda: (
        lib.fl_core_fast_hits() + lib.fl_fallback_copies() + lib.fl_fallback_fills() + lib.fl_core_decomp_kernels()
    )
    events.STATE.fast_bytes = lib.fl_fallback_bytes
    direct = set(DIRECT) | _own_decomposed_ops() | _generic_out_ops()
    GENERIC.update(_native_generic_ops() - direct)
    libs: dict = {}
    route = core.lib().fl_core_route_to_fallback
    for op in sorted(direct | GENERIC | _prims_served(), key=str):
        ns, name = op._schema.name.split("::")
        qualified = name + ("" if op._overloadname == "default" else "." + op._overloadname)
        if ns not in libs:
            libs[ns] = torch.library.Library(ns, "IMPL")
        # The C++ core's fallback as the op's kernel: its fast path first. A miss goes on to PrivateUse3, where
        # the Python kernel is registered instead: PyTorch's composite kernel would otherwise take the op there.
        key = "PrivateUse3" if route(ns.encode(), qualified.encode()) == 0 else "PrivateUse1"
        libs[ns].impl(qualified, not_traced(_direct(op)), key)
    overrides = {**_implicit_overrides(), **AUTOGRAD_COMPOSITIONS}
    for op, fn in sorted(overrides.items(), key=lambda kv: str(kv[0])):
        ns, name = op._schema.name.split("::")
        if ns not in libs:
            libs[ns] = torch.library.Library(ns, "IMPL")
        libs[ns].impl(
            name + ("" if op._overloadname == "default" else "." + op._overloadname),
            not_traced(fn),
            "AutogradPrivateUse1",
        )
    _LIBS.extend(libs.values())


def _own_decomposed_ops() -> set:
    """Ops torch_fl has its own device decomposition for, where PyTorch's kernel for other backends is a
    generic composition (CompositeExplicitAutograd, or a structured op whose out= kernel is generic):
    taken at the fl key, so torch_fl's plan (native, its decomposition, JIT, fallback) serves them."""
    found = set()
    for op, fn in DECOMPOSITIONS.items():
        if not isinstance(op, torch._ops.OpOverload) or op.namespace != "aten" or decomposition_table.get(op) is fn:
            continue
        if op in _NEVER_DIRECT:
            continue
        if any(
            torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), k)
            for k in ("CompositeExplicitAutograd", "CompositeExplicitAutogradNonFunctional")
        ):
            found.add(op)
    return found


# private ops that move or wrap memory rather than compute, or belong to other layouts and libraries
_PLUMBING = (
    "__",
    "_copy_from",
    "_to_copy",
    "_pin_memory",
    "_resize_output",
    "_unsafe_view",
    "_to_dense",
    "_nested",
    "_sparse",
    "_cudnn",
    "_mkldnn",
    "_miopen",
    "_foreach",
    "_fbgemm",
    "_make_",
    "_new_",
    "_pack",
    "_pad",
)


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
        if (
            torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeExplicitAutograd")
            and functional_twin(facts(op)) is not None
        ):
            found.add(op)
    return found


def _implicit_overrides() -> dict:
    """torch_fl's own decompositions of ops PyTorch composes itself above the backend
    (CompositeImplicitAutograd): PyTorch's composition is generic, torch_fl's keeps the work on a device
    that lacks what the generic one needs (linalg.pinv's tolerances in the input's dtype, not float64).
    They run at the fl autograd key, composed of differentiable ops, so autograd records them."""
    return {
        op: fn
        for op, fn in DECOMPOSITIONS.items()
        if isinstance(op, torch._ops.OpOverload)
        and decomposition_table.get(op) is not fn
        and torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeImplicitAutograd")
    }


def _prims_served() -> set:
    """The prims torch_fl serves (torch._decomp's decompositions bottom out in them: prims.rev for flip,
    prims.sum for sum ...): PyTorch's own implementation of a prim calls the aten op back, so without
    these the decomposition of that op would have no way down."""
    found = {op for op in DECOMPOSITIONS if isinstance(op, torch._ops.OpOverload) and op.namespace == "prims"}
    found |= {op for op in jit.REDUCTIONS if op.namespace == "prims"}
    return found


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
    layout = next(
        (
            t.layout
            for t in iter_tensors(list(args) + list(kwargs.values()))
            if t.device.type == "fl" and t.layout is not torch.strided
        ),
        "sparse",
    )
    where = next((t.device for t in iter_tensors(list(args) + list(kwargs.values())) if t.device.type == "fl"), "fl")
    raise RuntimeError(
        f"{op.name()}: a {layout} tensor on {where} is not supported by torch_fl (fl tensors are "
        f"strided); keep {layout} tensors on the CPU and move dense ones with .to_dense() first"
    )


def _direct(op):
    def impl(*args, **kwargs):
        if torch._C._len_torch_dispatch_stack():  # a mode saw the op above the backend (see fl_fallback.cpp)
            with _disable_current_modes():
                return ENTRY.dispatch(op, args, kwargs)
        return ENTRY.dispatch(op, args, kwargs)

    return impl
