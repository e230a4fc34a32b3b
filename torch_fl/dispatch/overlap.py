"""PyTorch's memory-overlap rules for in-place and out= ops, checked before any tier runs.

An op that writes a tensor while reading another view of the same memory gives
order-dependent garbage (x.add_(x.t()) reads elements it has already written),
so PyTorch refuses such calls before its kernel runs (ATen's MemoryOverlap.cpp,
called by TensorIterator and by the indexing kernels). torch_fl's tiers do not
all go through one kernel (a decomposition computes into a temporary and gets
the "right" numbers, a JIT kernel walks in its own order, the CPU fallback of a
host-accessible device sees separate storages), so the dispatcher applies the
same rules itself, once, for every tier.

The rules, as ATen states them:
* internal overlap: a written tensor in which two elements share one memory
  location (a stride 0 over a size > 1: an expanded tensor) is refused;
* overlap status of a written tensor `a` and an input `b`: FULL when they are
  the same tensor, or both dense with the same start, end and strides; PARTIAL
  when both are dense and their byte ranges meet otherwise (same memory in
  another order counts: x and x.t()); TOO_HARD when either is not dense (CPU
  lets those through); NO when they do not share memory;
* TensorIterator (the pointwise ops and most others) refuses PARTIAL between a
  written tensor and any input other than itself; the indexing ops (gather,
  index_select, index_copy_, scatter_, put_, cat, ...) refuse FULL as well.

Which ops check what was measured on CPU PyTorch 2.13 with OpInfo's samples
(each op called with outputs that fully, partly and internally overlap its
inputs); tests/dispatch/test_overlap.py compares every backend with CPU on those cases.
Ops no table names are not checked: CPU lets them compute (matmul, reductions,
linear algebra), and so does torch_fl."""

from __future__ import annotations

from typing import TypeGuard

import torch

from ..runtime import base_ptr, is_dense

INTERNAL_MESSAGE = (
    "unsupported operation: more than one element of the written-to tensor refers to a single "
    "memory location. Please clone() the tensor before performing the operation."
)
PARTIAL_MESSAGE = (
    "unsupported operation: some elements of the input tensor and the written-to tensor refer to a "
    "single memory location. Please clone() the tensor before performing the operation."
)

NO, FULL, PARTIAL, TOO_HARD = "no", "full", "partial", "too hard"


class Rule:
    """What an op's CPU kernel refuses: internal overlap of a written tensor, partial overlap of a
    written tensor with an input, and (indexing ops) full overlap too, except with the argument
    at index `full_ok` (an out= form that copies `self` into out first; -1: none)."""

    __slots__ = ("internal", "partial", "full", "full_ok")

    def __init__(self, internal: bool, partial: bool, full: bool, full_ok: int = -1) -> None:
        self.internal, self.partial, self.full, self.full_ok = internal, partial, full, full_ok

    def __repr__(self) -> str:
        return f"Rule(internal={self.internal}, partial={self.partial}, full={self.full}, full_ok={self.full_ok})"


# Non-pointwise ops whose CPU kernels refuse partial overlap (TensorIterator-based or checked
# explicitly), by overload name.
_PARTIAL_CHECKED = frozenset(
    {
        "aten::addbmm.out",
        "aten::addmv.out",
        "aten::addr.out",
        "aten::addmm.out",
        "aten::baddbmm.out",
        "aten::bernoulli.out",
        "aten::bernoulli_.Tensor",
        "aten::copy_",
        "aten::cumprod.out",
        "aten::cumsum.out",
        "aten::logcumsumexp.out",
        "aten::floor_divide.out",
        "aten::floor_divide_.Tensor",
        "aten::gelu.out",
        "aten::hardshrink.out",
        "aten::softplus.out",
        "aten::softshrink.out",
        "aten::index_reduce.out",
        "aten::index_reduce_",
        "aten::normal.Tensor_Tensor_out",
        "aten::normal.Tensor_float_out",
        "aten::normal.float_Tensor_out",
        "aten::renorm.out",
        "aten::sort.values",
        "aten::sort.values_stable",
        "aten::topk.values",
        "aten::where.self_out",
        "aten::scatter.reduce_out",
        "aten::scatter.value_reduce_out",
        "aten::scatter_reduce.two_out",
        "aten::scatter_reduce_.two",
        "aten::scatter_.reduce",
        "aten::scatter_.value_reduce",
        "aten::masked_fill_.Tensor",
        "aten::masked_fill_.Scalar",
    }
)
# Pointwise-tagged ops whose CPU kernels compute into a temporary first (no check).
_UNCHECKED = frozenset({"aten::mvlgamma.out"})
# Ops that also refuse a written tensor that is exactly one of their inputs (ATen's
# assert_no_overlap): gathering and scattering kernels read and write in index order.
_FULL_CHECKED = frozenset(
    {
        "aten::index_select.out",
        "aten::gather.out",
        "aten::linalg_cross.out",
        "aten::take.out",
        "aten::cat.out",
        "aten::masked_select.out",
        "aten::index_copy_",
        "aten::index_add_",
        "aten::scatter_.src",
        "aten::scatter_add_",
        "aten::put_",
        "aten::index_put_",
        "aten::_index_put_impl_",
    }
)
# out= forms of scatter-like ops: they start by copying `self` into out, so out may be `self`
# itself, but no other input may overlap it.
_FULL_CHECKED_BUT_SELF = frozenset(
    {
        "aten::index_copy.out",
        "aten::index_add.out",
        "aten::scatter.src_out",
        "aten::scatter_add.out",
        "aten::put.out",
    }
)
# Ops whose CPU kernels write into an expanded tensor without complaint (filling, masked
# writes, matrix products, reductions), by overload name, then by op name for whole families.
_NO_INTERNAL = frozenset(
    {
        "aten::fill_.Scalar",
        "aten::fill_.Tensor",
        "aten::zero_",
        "aten::masked_fill_.Scalar",
        "aten::masked_fill_.Tensor",
        "aten::index_fill_.int_Scalar",
        "aten::index_fill_.int_Tensor",
        "aten::index_put_",
        "aten::_index_put_impl_",
        "aten::conj_physical_",
        "aten::threshold_",
        "aten::tril_",
        "aten::triu_",
        "aten::tril.out",
        "aten::triu.out",
        "aten::addmv_",
        "aten::baddbmm_",
        "aten::bmm.out",
        "aten::mv.out",
        "aten::linear.out",
        "aten::resize_as_",
        "aten::set_",
        "aten::embedding_renorm_",
    }
)
_NO_INTERNAL_OPS = frozenset(
    {
        "sum",
        "nansum",
        "mean",
        "prod",
        "max",
        "min",
        "amax",
        "amin",
        "aminmax",
        "argmax",
        "argmin",
        "std",
        "var",
        "std_mean",
        "var_mean",
        "norm",
        "linalg_vector_norm",
        "all",
        "any",
        "count_nonzero",
    }
)


def _op_name(func) -> str:
    overload = func._overloadname
    return func._schema.name + ("" if overload == "default" else "." + overload)


def _pointwise_family(func, base: str) -> bool:
    """Pointwise by tag, or an in-place/out= form of an op whose other forms carry the tag
    (PyTorch tags `eq.Tensor` but not `eq_.Tensor`; both run through TensorIterator). A
    reduction is not one for sharing a name with a pointwise op (max.other, max.dim)."""
    if torch.Tag.pointwise in func.tags:
        return True
    if base in _NO_INTERNAL_OPS:
        return False
    packet = getattr(torch.ops.aten, base, None)
    if packet is None:
        return False
    return any(torch.Tag.pointwise in getattr(packet, o).tags for o in packet.overloads())


def rule_for(func, mutable: list) -> Rule | None:
    """The overlap rule of an op (None: nothing to check), computed once per overload."""
    if not mutable or not func._schema.name.startswith("aten::"):
        return None
    name = _op_name(func)
    base = func._schema.name.split("::")[1].rstrip("_")
    pointwise = _pointwise_family(func, base) and name not in _UNCHECKED
    internal = name not in _NO_INTERNAL and (pointwise or base not in _NO_INTERNAL_OPS)
    full_ok = 0 if name in _FULL_CHECKED_BUT_SELF else -1
    full = name in _FULL_CHECKED or full_ok == 0
    partial = full or pointwise or name in _PARTIAL_CHECKED
    if not (internal or partial):
        return None
    return Rule(internal, partial, full, full_ok)


# -- the storage questions ---------------------------------------------------------------


def _fl(v: object) -> TypeGuard[torch.Tensor]:
    return isinstance(v, torch.Tensor) and v.device.type == "fl"


def same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two fl tensors are views of one allocation."""
    return base_ptr(a) == base_ptr(b)


def has_internal_overlap(t: torch.Tensor) -> bool:
    """ATen's has_internal_overlap == YES: a stride of 0 over a dim of size > 1."""
    strides = t.stride()
    if 0 not in strides or t.numel() == 0:  # (an empty tensor has no element to share)
        return False
    return any(st == 0 and s > 1 for s, st in zip(t.shape, strides, strict=True))


def overlap_status(a: torch.Tensor, b: torch.Tensor) -> str:
    """ATen's get_overlap_status for two tensors known to share storage."""
    if a is b:
        return FULL
    if a.numel() == 0 or b.numel() == 0:
        return NO
    if not is_dense(a) or not is_dense(b):
        return TOO_HARD
    a_begin = a.storage_offset() * a.element_size()
    a_end = a_begin + a.numel() * a.element_size()
    b_begin = b.storage_offset() * b.element_size()
    b_end = b_begin + b.numel() * b.element_size()
    if a_begin == b_begin and a_end == b_end:
        return FULL if a.stride() == b.stride() else PARTIAL
    if a_begin < b_end and b_begin < a_end:
        return PARTIAL
    return NO


def check(rule: Rule, mutable: list, vals: list) -> None:
    """Raise PyTorch's error if a written tensor overlaps itself or an input as the op's CPU
    kernel would refuse. Costs an address comparison per argument when no memory is shared."""
    for idx in mutable:
        out = vals[idx] if idx < len(vals) else None
        if not _fl(out):
            continue
        if rule.internal and has_internal_overlap(out):
            raise RuntimeError(INTERNAL_MESSAGE)
        if not rule.partial:
            continue
        base = base_ptr(out)
        j = -1
        for v in vals:
            j += 1
            tv = type(v)
            if _fl(v):
                if j != idx and base_ptr(v) == base:
                    _check_pair(rule, out, v, j == rule.full_ok)
            elif tv is list or tv is tuple:
                for t in v:
                    if _fl(t) and base_ptr(t) == base:
                        _check_pair(rule, out, t, False)


def _check_pair(rule: Rule, out: torch.Tensor, t: torch.Tensor, full_ok: bool) -> None:
    status = overlap_status(out, t)
    if status == PARTIAL or (status == FULL and rule.full and not full_ok):
        raise RuntimeError(PARTIAL_MESSAGE)
