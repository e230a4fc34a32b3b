"""Decompositions that keep ops on the device for a backend with few kernels.

PyTorch's own table (torch._decomp) covers most composite ops, but some of its
entries bottom out in prims no plugin has (prims.rev for flip), in ops that
are themselves hard (index_select -> advanced indexing), or are missing (the
random *_like factories). These rewrite such ops into primitives every plugin
has (empty_like, uniform_, normal_, copy_, arange) and into gather, which the
JIT tier generates where a plugin lacks it (_jit_index). They are tried after
a native kernel and before the CPU fallback, like every decomposition."""

from __future__ import annotations

import math

import torch

aten = torch.ops.aten
prims = torch.ops.prims


def _rand_like(self, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return torch.empty_like(self, dtype=dtype, device=device,
                            memory_format=memory_format or torch.preserve_format).uniform_(0.0, 1.0)


def _randn_like(self, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return torch.empty_like(self, dtype=dtype, device=device,
                            memory_format=memory_format or torch.preserve_format).normal_(0.0, 1.0)


def _randint(self, low, high, dtype, device, memory_format):
    """Uniform integers in [low, high): floor of a uniform float, clamped against float rounding at the top."""
    if high <= low:
        raise RuntimeError(f"random_ expects 'from' to be less than 'to', but got from={low} >= to={high}")
    u = torch.empty_like(self, dtype=torch.float32, device=device,
                         memory_format=memory_format or torch.preserve_format).uniform_(float(low), float(high))
    return u.floor().clamp_(max=float(high - 1)).to(dtype or self.dtype)


def _randint_like(self, high, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return _randint(self, 0, int(high), dtype, device, memory_format)


def _randint_like_low(self, low, high, *, dtype=None, layout=None, device=None, pin_memory=None,
                      memory_format=None):
    return _randint(self, int(low), int(high), dtype, device, memory_format)


def _index_select(x, dim, index):
    """index_select as a gather with the index broadcast along the other dims (a view: no copy)."""
    if index.dim() > 1:
        raise IndexError(f"index_select(): Index is supposed to be a vector, got a {index.dim()}-D tensor")
    if x.dim() == 0 or index.dtype not in (torch.int64, torch.int32):
        return NotImplemented
    dim = dim % x.dim()
    idx = index.reshape(-1)
    if idx.dtype != torch.int64:
        idx = idx.to(torch.int64)
    shape = list(x.shape)
    shape[dim] = idx.numel()
    view = [1] * x.dim()
    view[dim] = -1
    return aten.gather.default(x, dim, idx.view(view).expand(shape))


def _rev(a, dims):
    """prims.rev (what flip decomposes to): an index_select per dim with a descending arange."""
    out = a
    for d in dims:
        n = a.shape[d]
        if n > 1:
            out = _index_select(out, d, torch.arange(n - 1, -1, -1, device=a.device))
    return out if out is not a else out.clone()


def _index_tensor(x, indices):
    """Advanced indexing x[i0, i1, ...] with integer index tensors: the indexed dims are
    flattened into one, the indices combined into a linear index (negatives wrapped and every
    index checked against its own dim, as PyTorch does), and one index_select does the rest.
    Boolean masks have a data-dependent result size: not served here."""
    indices = list(indices)
    pos = [k for k, i in enumerate(indices) if i is not None]
    if not pos or any(indices[k].dtype not in (torch.int64, torch.int32) for k in pos):
        return NotImplemented
    idx = torch.broadcast_tensors(*[indices[k] for k in pos])
    bshape = list(idx[0].shape)
    lead = list(range(len(pos)))
    xs = x.movedim(pos, lead)
    sizes = [x.shape[k] for k in pos]
    lin = None
    for k, (i, n) in enumerate(zip(idx, sizes, strict=True)):
        i = i.to(torch.int64)
        if i.numel():
            lo, hi = int(i.amin().item()), int(i.amax().item())
            bad = hi if hi >= n else (lo if lo < -n else None)
            if bad is not None:
                raise IndexError(f"index {bad} is out of bounds for dimension {pos[k]} with size {n}")
            i = torch.where(i < 0, i + n, i)
        lin = i if lin is None else lin * n + i
    rest = list(xs.shape[len(pos):])
    flat = xs.reshape([math.prod(sizes)] + rest)
    out = _index_select(flat, 0, lin.reshape(-1))
    if out is NotImplemented:
        return out
    out = out.reshape(bshape + rest)
    adjacent = pos == list(range(pos[0], pos[-1] + 1))
    if adjacent and pos[0] > 0:  # PyTorch keeps adjacent indexed dims in place
        nb = len(bshape)
        out = out.movedim(list(range(nb)), list(range(pos[0], pos[0] + nb)))
    return out.contiguous()


def register(table: dict) -> None:
    table[aten.rand_like.default] = _rand_like
    table[aten.randn_like.default] = _randn_like
    table[aten.randint_like.default] = _randint_like
    table[aten.randint_like.low_dtype] = _randint_like_low
    table[aten.index_select.default] = _index_select
    table[aten.index.Tensor] = _index_tensor
    table[prims.rev.default] = _rev
