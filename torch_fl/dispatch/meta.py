"""The ops that move no numbers through a kernel: views (their meta function
says where the view lies in the base's storage), in-place metadata changes,
copies and transfers (every copy involving an fl tensor arrives as
_copy_from), reading one element (.item()), the SDPA kernel choice, and the
_foreach_ loops optimizers call (one call per tensor). SPECIAL maps each such
op to its handler; dispatch.entry routes the others to the tiers (plan)."""

from __future__ import annotations

import time
import warnings

import torch

from ..runtime import (
    COPY,
    VIEW,
    async_copy,
    copy_on_device,
    core,
    cpu_into_fl,
    device_of,
    events,
    fl_to_cpu,
    is_dense,
    is_fl,
    map_tensors,
    native,
    raw,
    to_meta,
    with_bits,
)
from .decompositions.attention import sdpa_fused_eligible
from .plan import compute, copy_within

aten = torch.ops.aten


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


def view_op(f, args, kwargs):
    """A view op PyTorch has no generic kernel for (unfold, view_as_real, ...): its meta function says
    where the view lies in the base's storage."""
    base = args[0]
    if not is_fl(base):
        return compute(f, args, kwargs)
    m = f.func(*map_tensors(to_meta, args), **kwargs)
    events.count(device_of(base).backend, f.name, VIEW)
    return view_of(base, m)


def inplace_meta(f, args, kwargs):
    """An in-place metadata op PyTorch has no generic kernel for: the tensor takes the new layout its
    meta function gives, over the same storage."""
    t = args[0]
    m = f.func(*map_tensors(to_meta, args), **kwargs)
    t.set_(t.untyped_storage(), m.storage_offset(), m.shape, m.stride())
    events.count(device_of(t).backend, f.name, VIEW)
    return t


# -- copies and transfers -------------------------------------------------------


def copy_from(f, args, kwargs):
    """Every copy that involves an fl tensor (Tensor.copy_, .to(), .cpu(), torch.tensor(..., device="fl"))
    reaches the device as _copy_from(src, dst, non_blocking)."""
    vals = f.normalize(args, kwargs)
    src, dst = vals[0], vals[1]
    return copy_into(dst, src, bool(vals[2]) if len(vals) > 2 else False)


def copy_from_and_resize(f, args, kwargs):
    vals = f.normalize(args, kwargs)
    src, dst = vals[0], vals[1]
    if dst.shape != src.shape:
        dst.resize_(src.shape)
    return copy_into(dst, src, False)


def copy_into(dst: torch.Tensor, src: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    if src.is_complex() and not dst.is_complex():
        warnings.warn("Casting complex values to real discards the imaginary part", UserWarning, stacklevel=4)
    if is_fl(dst) and is_fl(src) and device_of(dst) is device_of(src):
        if dst.is_conj() != src.is_conj() or dst.is_neg() != src.is_neg():
            return copy_math_bits(dst, src)
        if device_copy(dst, src):
            return dst
        return copy_within(dst, src)
    listening = bool(events.STATE.listeners)
    t0, b0 = time.perf_counter(), events.STATE.bytes_copied
    if non_blocking and is_fl(dst) and not is_fl(src) and _async_ok(dst, src):
        async_copy.h2d(dst, src)
        events.count(device_of(dst).backend, "aten::copy_", COPY)
        return dst
    if non_blocking and is_fl(src) and not is_fl(dst) and _async_d2h_ok(dst, src):
        async_copy.d2h(dst, src)
        events.count(device_of(src).backend, "aten::copy_", COPY)
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
            events.count(device_of(t).backend, "aten::copy_", COPY)
    if listening:
        events.emit(
            events.OpEvent(
                "aten::copy_",
                backend,
                COPY,
                time.perf_counter() - t0,
                0,
                events.STATE.bytes_copied - b0,
                events.NESTING.depth,
                t0,
            )
        )
    return dst


def device_copy(dst: torch.Tensor, src: torch.Tensor) -> bool:
    """dst.copy_(src) within one device, of one dtype and one dense layout, as one device memory copy of the
    plugin (copy_d2d): the bytes are the values, in every dtype and on every backend, with no kernel and no
    host round trip (clone, gradcheck's perturbations of a float64 input on a chip without float64). Later
    such copies on the device take the same copy in the C++ core (csrc/fl_cpu_fallback.cpp). Returns whether it
    copied: other copies (a broadcast, a cast, strided or overlapping memory) are the tiers' (copy_), as is
    every copy while a kernel graph records (a replay runs kernels only)."""
    if (
        src.dtype != dst.dtype
        or src.shape != dst.shape
        or src.stride() != dst.stride()
        or not dst.numel()
        or dst.is_conj()
        or dst.is_neg()
        or src.is_conj()
        or src.is_neg()
        or not is_dense(dst)
        or events.STATE.recording is not None
        or dst.untyped_storage().data_ptr() == src.untyped_storage().data_ptr()
    ):
        return False
    dev = device_of(dst)
    t0 = time.perf_counter()
    if async_copy.PENDING:  # an async copy into one of them must land first, as before a kernel
        async_copy.order_for_kernels((dst, src))
    copy_on_device(dev, dst.data_ptr(), src.data_ptr(), dst.numel() * dst.element_size())
    events.STATE.kernels += 1  # a launch on the device, as a mem_set fill is (kernel counts compare backends)
    events.count(dev.backend, "aten::copy_", COPY)
    if events.STATE.listeners:
        events.emit(
            events.OpEvent(
                "aten::copy_", dev.backend.name, COPY, time.perf_counter() - t0, 1, 0, events.NESTING.depth, t0
            )
        )
    if native.FAST.enabled:
        core.lib().fl_fallback_copy_commit(dev.index, core.count_slot(dev.backend, "aten::copy_", COPY))
    return True


def copy_math_bits(dst: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """dst.copy_(src) on one device where the conj/neg flags differ: copy the stored values, then
    conjugate/negate dst's memory by the difference (conj and neg commute)."""
    aten.copy_.default(raw(dst), raw(src))
    if dst.is_conj() != src.is_conj() and dst.is_complex():
        aten.conj_physical_.default(raw(dst))
    if dst.is_neg() != src.is_neg():
        aten.neg_.default(raw(dst))
    return dst


def _async_d2h_ok(dst: torch.Tensor, src: torch.Tensor) -> bool:
    """fl -> pinned host without waiting: same dtype, shape and contiguous bytes on both sides, from a
    device whose kernels are asynchronous (on the others the copy has landed when it returns anyway)."""
    dev = device_of(src)
    return (
        src.dtype == dst.dtype
        and src.shape == dst.shape
        and dst.numel() > 0
        and not (src.is_conj() or src.is_neg() or dst.is_conj() or dst.is_neg())
        and src.is_contiguous()
        and dst.is_contiguous()
        and not async_copy.is_pending(src)
        and async_copy.supports_d2h(dev)
        and dst.is_pinned()
    )


def _async_ok(dst: torch.Tensor, src: torch.Tensor) -> bool:
    """An async copy needs pinned, contiguous host bytes of dst's dtype and
    layout, and a device with async copies; anything else copies now."""
    dev = device_of(dst)
    return (
        src.device.type == "cpu"
        and src.dtype == dst.dtype
        and src.shape == dst.shape
        and dst.numel() > 0
        and not (src.is_conj() or src.is_neg() or dst.is_conj() or dst.is_neg())
        and src.is_contiguous()
        and dst.is_contiguous()
        and not dev.host_accessible
        and async_copy.supports(dev)
        and src.is_pinned()
    )


def local_scalar_dense(f, args, kwargs):
    t = args[0]
    events.count(device_of(t).backend, f.name, COPY)
    return fl_to_cpu(t).item()


def sdp_choice(f, args, kwargs):
    """Asked by code that picks an SDPA kernel itself (nn.MultiheadAttention's
    fast path): OVERRIDEABLE when the plugin's fused kernels serve the call."""
    from torch.nn.attention import SDPBackend

    vals = f.normalize(args, kwargs)
    if sdpa_fused_eligible(vals[0], vals[1], vals[2], vals[4], vals[7] if len(vals) > 7 else False):
        return int(SDPBackend.OVERRIDEABLE)
    return int(SDPBackend.MATH)


# -- foreach: one call per tensor (optimizers use these on accelerators) ---------


def foreach(f, args, kwargs):
    base = f.func._schema.name.split("::")[1][len("_foreach_") :]
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


SPECIAL: dict = {
    aten._copy_from.default: copy_from,
    aten._copy_from_and_resize.default: copy_from_and_resize,
    aten._local_scalar_dense.default: local_scalar_dense,
    aten._fused_sdp_choice.default: sdp_choice,
}
for _name in ("as_strided_", "squeeze_", "unsqueeze_", "t_", "transpose_", "swapdims_", "swapaxes_"):
    _packet = getattr(aten, _name, None)
    if _packet is not None:
        for _ov in _packet.overloads():
            SPECIAL[getattr(_packet, _ov)] = inplace_meta
