"""Host <-> device transfers of fl tensors, synchronous and counted: the values of
an fl tensor on the host (a zero-copy view where the device is host-accessible),
and host values written into an fl tensor of any layout. The dispatcher's CPU
fallback and copies, the conformance checker and the collectives' host staging
all move data through here; asynchronous copies are async_copy's."""

from __future__ import annotations

import torch

from . import async_copy, events
from .abi import ffi
from .tensor import base_ptr, device_of, host_view, like_layout, raw, span, with_bits


def fl_to_cpu(t: torch.Tensor, *, writable_view: bool = False) -> torch.Tensor:
    """The values of t on the host, with t's exact strides. For host-accessible
    devices this is a zero-copy view of device memory (clone before handing it
    to a user); otherwise the storage span is copied."""
    dev = device_of(t)
    if async_copy.PENDING:
        async_copy.wait_for((t,))
    if dev.host_accessible:
        return with_bits(host_view(t), t.is_conj(), t.is_neg())
    lo, hi = span(t)
    item = t.element_size()
    host = torch.empty(max(hi - lo, 0) * item, dtype=torch.uint8)
    if hi > lo:
        dev.copy_d2h(host.data_ptr(), base_ptr(t) + lo * item, (hi - lo) * item)
        events.STATE.bytes_copied += (hi - lo) * item
    host = host.view(t.dtype).as_strided(t.shape, t.stride(), t.storage_offset() - lo)
    return with_bits(host, t.is_conj(), t.is_neg())


def cpu_into_fl(dst: torch.Tensor, src: torch.Tensor) -> None:
    """Write CPU values into an fl tensor, any strides, any dtype, broadcast."""
    dev = device_of(dst)
    if async_copy.PENDING:
        async_copy.wait_for((dst,))
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
        dev.copy_h2d(base_ptr(dst) + lo * item, data.data_ptr(), (hi - lo) * item)
    else:
        mirror = fl_to_cpu(dst)  # read-modify-write keeps bytes between strided elements
        copy_unique(mirror, src.expand(dst.shape))
        base = mirror.as_strided((hi - lo,), (1,), 0)
        dev.copy_h2d(base_ptr(dst) + lo * item, base.data_ptr(), (hi - lo) * item)
    events.STATE.bytes_copied += (hi - lo) * item


def copy_unique(dst: torch.Tensor, src: torch.Tensor) -> None:
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


def copy_on_device(dev, dst_ptr: int, src_ptr: int, nbytes: int) -> None:
    """nbytes from src_ptr to dst_ptr within dev, one plugin copy_d2d on the current stream. On a device whose
    kernels complete within their call, the copy lands before this returns, so the kernel called next (which
    runs at once) reads it; an asynchronous device orders it on the stream."""
    stream = dev.stream()
    dev.plugin.copy_d2d(dev.local, dst_ptr, src_ptr, nbytes, stream)
    if stream != ffi.NULL and not dev.props.async_kernels:
        dev.plugin.stream_synchronize(dev.local, stream)
