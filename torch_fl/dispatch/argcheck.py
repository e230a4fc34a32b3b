"""PyTorch's argument checks that its meta functions skip, run before any tier.

A reduction without an identity (max, min, amax, amin, argmax, argmin) over no
elements is an error in PyTorch, raised by the CPU kernel (ATen's
zero_numel_check_dims), not by the meta function torch_fl shapes its outputs
with. Left to the tiers, a JIT kernel returns -inf, a plugin kernel words the
error its own way, a decomposition raises whatever its sub-op says. Checked here
once, every backend and tier raises what CPU raises, with CPU's words."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

import torch

aten = torch.ops.aten


def _no_dim(name: str, index_error: bool = False) -> Exception:
    if index_error:  # argmax/argmin word it without the advice
        return IndexError(f"{name}(): Expected reduction dim to be specified for input.numel() == 0.")
    return RuntimeError(
        f"{name}(): Expected reduction dim to be specified for input.numel() == 0. "
        "Specify the reduction dim with the 'dim' argument."
    )


def _zero_size(name: str, dim: int) -> IndexError:
    return IndexError(f"{name}(): Expected reduction dim {dim} to have non-zero size.")


def _dims_check(name: str, x: torch.Tensor, dims, wrap: bool) -> None:
    """ATen's zero_numel_check_dims for an empty x: a dim must be given and each must be non-empty
    (named as the user gave it, or wrapped into range where ATen wraps it first)."""
    if dims is None or (isinstance(dims, (list, tuple)) and not dims):
        raise _no_dim(name)
    for d in dims if isinstance(dims, (list, tuple)) else (dims,):
        if x.dim() and x.shape[d] == 0:
            raise _zero_size(name, d % x.dim() if wrap else d)


def _whole(name: str) -> Callable:
    def check(vals: list) -> None:
        if vals[0].numel() == 0:
            raise _no_dim(name)

    return check


def _over_dims(name: str, wrap: bool) -> Callable:
    def check(vals: list) -> None:
        x = vals[0]
        if x.numel() == 0:
            _dims_check(name, x, vals[1] if len(vals) > 1 else None, wrap)

    return check


def _arg_extreme(name: str) -> Callable:
    def check(vals: list) -> None:
        x = vals[0]
        if x.numel() != 0:
            return
        dim = vals[1] if len(vals) > 1 else None
        if dim is None:
            raise _no_dim(name, index_error=True)
        _dims_check(name, x, dim, wrap=True)

    return check


def _wrap64(v: int) -> int:
    return (v + 2**63) % 2**64 - 2**63


def _at_dim(name: str, at: int) -> Callable:
    """An op over one dim (median, mode, kthvalue): on an empty input that dim must be non-empty (ATen's
    zero_numel_check_dims, the dim wrapped first), else IndexError in ATen's words."""

    def check(vals: list) -> None:
        x = vals[0]
        if x.numel() == 0:
            _dims_check(name, x, vals[at] if len(vals) > at else -1, wrap=True)

    return check


def _std_var(name: str) -> Callable:
    """var/std/var_mean/std_mean: a dim given twice is an error, and a correction that leaves no degrees of
    freedom warns (ATen's std_var_out; the decompositions and kernels check neither). Returns True where it
    warned or judged a float correction (the fast path keys no floats)."""

    def check(vals: list) -> bool:
        x, dims = vals[0], vals[1] if len(vals) > 1 else None
        correction = vals[2] if len(vals) > 2 else None
        nd = max(x.dim(), 1)
        if isinstance(dims, int):
            dims = [dims]
        seen: set[int] = set()
        for d in dims or ():
            if not -nd <= d < nd:
                return False  # out of range: the op's own error
            w = d % nd
            if w in seen:
                raise RuntimeError(f"dim {w} appears multiple times in the list of dims")
            seen.add(w)
        kept = 1
        if dims:  # None or []: every dim is reduced
            for i, size in enumerate(x.shape):
                if i not in seen:
                    kept *= size
        c = 1.0 if correction is None else float(correction)
        factor = 0 if kept == 0 else x.numel() // kept
        if factor - c <= 0:
            warnings.warn(
                f"{name}(): degrees of freedom is <= 0. Correction should be strictly less than the reduction "
                "factor (input numel divided by output numel).",
                UserWarning,
                stacklevel=4,
            )
            return True
        return isinstance(correction, float)

    return check


def _heaviside(vals: list) -> None:
    """ATen's heaviside kernel refuses operands of two dtypes (its meta function promotes them)."""
    x, values = vals[0], vals[1]
    if isinstance(values, torch.Tensor) and x.dtype != values.dtype:
        raise RuntimeError("heaviside is not yet implemented for tensors with different dtypes.")


def _abs_inplace(vals: list) -> None:
    """abs_ of a complex tensor would write a real result into it: ATen refuses it by name."""
    if vals[0].is_complex():
        raise RuntimeError("In-place abs is not supported for complex tensors.")


def _nonzero_static(vals: list) -> None:
    """nonzero_static's size and out checks (ATen's CPU kernel makes them, in its words)."""
    size = vals[1] if len(vals) > 1 else None
    if isinstance(size, int) and size < 0:
        raise RuntimeError("nonzero_static: 'size' must be an non-negative integer")
    out = vals[3] if len(vals) > 3 else None
    if isinstance(out, torch.Tensor) and out.dtype != torch.int64:
        # sic: ATen's message has no space before the type's name
        raise RuntimeError(
            f"nonzero_static: Expected out tensor to have scalar type Long but got scalar type"
            f"{scalar_type_name(out.dtype)}"
        )


def _arange_size(vals: list) -> None:
    """ATen's compute_arange_size for int64 results computes the length in int64 arithmetic,
    (end - start + step - sign) / step, and refuses a negative one (a range wider than int64 wraps
    around); the meta function computes it exactly and would let it through."""
    start, end, step = vals[0], vals[1], vals[2] if len(vals) > 2 else 1
    dtype = vals[3] if len(vals) > 3 else None
    ints = all(isinstance(v, int) for v in (start, end, step))
    if not (dtype is torch.int64 or (dtype is None and ints)) or not ints or step == 0:
        return
    sign = (step > 0) - (step < 0)
    span = _wrap64(_wrap64(_wrap64(end - start) + step) - sign)
    if span != 0 and (span < 0) != (step < 0) and abs(span) >= abs(step):  # C's division truncates
        raise RuntimeError("invalid size, possible overflow?")


_INDEX_DTYPES = (torch.int64, torch.int32, torch.uint8, torch.bool)


def _indexing(vals: list) -> bool:
    """ATen's checks of advanced indexing (index, index_put_), which run before its kernels and raise
    IndexError: index dtypes, a mask's shape against the dims it covers, too many indices, and index
    shapes that do not broadcast (judged without masks, whose sizes depend on their values)."""
    self, indices = vals[0], vals[1]
    dim, shapes, masks, warned = 0, [], False, False
    for idx in indices:
        if idx is None:
            dim += 1
            continue
        if idx.dtype not in _INDEX_DTYPES:
            raise IndexError("tensors used as indices must be long, int, byte or bool tensors")
        if idx.dtype == torch.uint8:
            warnings.warn(
                "indexing with dtype torch.uint8 is now deprecated, please use a dtype torch.bool instead.",
                UserWarning,
                stacklevel=4,
            )
            warned = True
        if idx.dtype in (torch.uint8, torch.bool):
            masks = True
            for j in range(idx.dim()):
                if dim + j < self.dim() and idx.shape[j] != self.shape[dim + j]:
                    raise IndexError(
                        f"The shape of the mask {list(idx.shape)} at index {j} does not match the "
                        f"shape of the indexed tensor {list(self.shape)} at index {dim + j}"
                    )
            dim += idx.dim()
        else:
            shapes.append(list(idx.shape))
            dim += 1
    if dim > self.dim():
        raise IndexError(f"too many indices for tensor of dimension {self.dim()} (got {dim})")
    if not masks and len(shapes) > 1:
        try:
            torch.broadcast_shapes(*shapes)
        except RuntimeError:
            raise IndexError(
                "shape mismatch: indexing tensors could not be broadcast together with shapes "
                + ", ".join(str(s) for s in shapes)
            ) from None
    return warned


def _index_fill(vals: list) -> None:
    self, value = vals[0], vals[3]
    if not self.is_complex() and (
        isinstance(value, complex) or (isinstance(value, torch.Tensor) and value.is_complex())
    ):
        raise RuntimeError("index_fill_(): Converting complex Scalar to non-complex type is not supported")


def _complex_parts(vals: list) -> None:
    """torch.complex / torch.polar: both parts of one floating dtype, in CPU's words (ScalarType names)."""
    a, b = vals[0], vals[1]
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype != b.dtype:
        raise RuntimeError(
            f"Expected object of scalar type {_SCALAR_NAMES.get(a.dtype, a.dtype)} but got scalar "
            f"type {_SCALAR_NAMES.get(b.dtype, b.dtype)} for second argument"
        )


def _addcdiv(vals: list) -> None:
    """addcdiv's meta function refuses integer division (its CPU kernel does too); the tiers would compute it."""
    t1, t2 = vals[1], vals[2]
    if (
        isinstance(t1, torch.Tensor)
        and isinstance(t2, torch.Tensor)
        and not t1.is_floating_point()
        and not t1.is_complex()
        and not t2.is_floating_point()
        and not t2.is_complex()
    ):
        raise RuntimeError(
            "Integer division with addcdiv is no longer supported, and in a future release addcdiv will perform a "
            "true division of tensor1 and tensor2. The historic addcdiv behavior can be implemented as "
            "(input + value * torch.trunc(tensor1 / tensor2)).to(input.dtype) for integer inputs and as "
            "(input + value * tensor1 / tensor2) for float inputs. The future addcdiv behavior is just the latter "
            "implementation: (input + value * tensor1 / tensor2), for all dtypes."
        )


_DIGITS = {torch.float64: 53, torch.float32: 24, torch.float16: 11, torch.bfloat16: 8}
_TYPE_NAMES = {
    torch.float64: "double",
    torch.float32: "float",
    torch.float16: "c10::Half",
    torch.bfloat16: "c10::BFloat16",
    torch.int64: "long int",
    torch.int32: "int",
    torch.int16: "short int",
    torch.int8: "signed char",
    torch.uint8: "unsigned char",
    torch.bool: "bool",
}


def _bounds(dtype: torch.dtype) -> tuple[float, float]:
    if dtype.is_floating_point:
        info = torch.finfo(dtype)
        return float(info.min), float(info.max)
    if dtype == torch.bool:
        return 0, 1
    if dtype == torch.uint64:
        return 0, 2**63 - 1
    iinfo = torch.iinfo(dtype)
    return iinfo.min, iinfo.max


def _from_to_in_range(frm: int, to_inc: int, dtype: torch.dtype) -> bool:
    """ATen's check_from_to_in_range: an error outside the dtype, a warning outside its exact integers
    (returns whether it warned)."""
    lo, hi = _bounds(dtype)
    name = _TYPE_NAMES.get(dtype, str(dtype).replace("torch.", ""))
    for value, what in ((frm, "from"), (to_inc, "to - 1")):
        if not lo <= value <= hi:
            raise RuntimeError(f"{what} is out of bounds for {name}")
    digits = _DIGITS.get(dtype)
    warned = False
    if digits is not None:
        for value, what in ((frm, "from"), (to_inc, "to - 1")):
            if not -(1 << digits) <= value <= (1 << digits):
                warned = True
                warnings.warn(
                    f"{what} is out of bounds [-(2^{digits}), 2^{digits}]. Due to precision limitations "
                    f"{name} can support discrete uniform distribution only within this range. This warning "
                    f"will become an error in version 1.7 release, please fix the code in advance",
                    UserWarning,
                    stacklevel=4,
                )
    return warned


def _random_from(vals: list) -> bool:
    """random_(from, to): ATen checks the range against the dtype before drawing (its kernel, not its meta)."""
    self, frm = vals[0], vals[1]
    if self.is_complex():
        raise RuntimeError("check_random_bounds handles only integral, floating-point and boolean types")
    to = vals[2] if len(vals) > 2 else None
    if to is not None:
        if frm >= to:
            raise RuntimeError(f"random_ expects 'from' to be less than 'to', but got from={frm} >= to={to}")
        return _from_to_in_range(frm, to - 1, self.dtype)
    if frm != -(2**63):
        digits = _DIGITS.get(self.dtype)
        to_inc = min(1 << digits, 2**63 - 1) if digits is not None else int(_bounds(self.dtype)[1])
        warned = _from_to_in_range(frm, to_inc, self.dtype)
        if frm >= to_inc:
            raise RuntimeError(
                f"random_ expects 'from' casted to dtype to be less than 'to_inc' casted to dtype, "
                f"but got from={frm} > to_inc={to_inc}"
            )
        return warned
    return False


def _random_to(vals: list) -> bool:
    return _random_from([vals[0], 0, vals[1]])


def _uniform(vals: list) -> bool:
    """uniform_'s range (ATen checks it in its kernel). Returns True: the check reads float arguments, which
    the C++ fast path does not key its plans on, so these calls stay off it."""
    self = vals[0]
    frm = vals[1] if len(vals) > 1 else 0.0
    to = vals[2] if len(vals) > 2 else 1.0
    if self.is_complex() or not self.is_floating_point():
        return True
    lo, hi = _bounds(self.dtype)
    name = _TYPE_NAMES.get(self.dtype, str(self.dtype))
    for value, what in ((frm, "from"), (to, "to")):
        if not lo <= value <= hi:
            raise RuntimeError(f"{what} is out of bounds for {name}")
    if frm > to:
        raise RuntimeError(f"uniform_ expects to return a [from, to) range, but found from={frm} > to={to}")
    if to - frm > hi:
        raise RuntimeError(
            f"uniform_ expects to-from <= std::numeric_limits<{str(self.dtype).replace('torch.', '')}"
            f">::max(), but found to={to} and from={frm} which result in to-from to exceed the limit"
        )
    return True


def _histc(vals: list) -> bool:
    """histc's bins and range (ATen checks them in its CPU kernel, not in the meta function). Returns True:
    it reads float arguments, so these calls stay off the fast path."""
    bins = vals[1] if len(vals) > 1 else 100
    lo = vals[2] if len(vals) > 2 else 0
    hi = vals[3] if len(vals) > 3 else 0
    if bins <= 0:
        raise RuntimeError(f"torch.histogram(): bins must be > 0, but got {bins} for dimension 0")
    if lo > hi:
        raise RuntimeError("torch.histc: max must be larger than min")
    if not (math.isfinite(lo) and math.isfinite(hi)) and not (math.isinf(lo) and lo == hi):
        raise RuntimeError(f"torch.histc: range of [{_g(lo)}, {_g(hi)}] is not finite")
    return True


def _g(x) -> str:
    """A number as ATen prints it in this message: 1, 0.5, nan, -inf."""
    return str(int(x)) if isinstance(x, float) and x.is_integer() else str(x)


_WARNED_ONCE: set = set()


def _warn_once(message: str) -> None:
    """TORCH_WARN_ONCE: once per program, unless torch.set_warn_always(True)."""
    if torch.is_warn_always_enabled() or message not in _WARNED_ONCE:
        _WARNED_ONCE.add(message)
        warnings.warn(message, UserWarning, stacklevel=5)


def _non_contiguous_note(what: str) -> str:
    return (
        f"torch.searchsorted(): {what} tensor is non-contiguous, this will lower the performance due to extra "
        f"data copy when converting non-contiguous tensor to contiguous, please use contiguous {what} tensor if "
        "possible. This message will only appear once per program."
    )


def _bucketization(boundaries_at: int, input_at: int | None) -> Callable:
    """searchsorted/bucketize warn (once) about non-contiguous operands, as ATen's BucketizationUtils does
    before copying them. Returns whether it warned."""

    def check(vals: list) -> bool:
        warned = False
        x = vals[input_at] if input_at is not None else None
        b = vals[boundaries_at]
        if boundaries_at == 0 and len(vals) > 5 and (vals[4] is not None or vals[5] is not None):
            _search_options(b, vals[3], vals[4], vals[5])
            warned = True  # a string and a sorter's values: nothing the fast path keys on, so never committed
        # ATen's shape checks (bucketize's and searchsorted_pre_check), which the host plugin's kernel and the
        # decomposition would not make: a silently wrong result otherwise
        if isinstance(b, torch.Tensor) and b.dim() != 1:
            if boundaries_at == 1:
                raise RuntimeError(f"boundaries tensor must be 1 dimension, but got dim({b.dim()})")
            if not isinstance(x, torch.Tensor):
                raise RuntimeError(
                    "torch.searchsorted(): input value can be a scalar only when boundaries tensor dimension is 1, "
                    f"but we got boundaries tensor dim({b.dim()}) and input value's dim(0) numel(1)"
                )
            if b.dim() != x.dim() or b.shape[:-1] != x.shape[:-1]:
                raise RuntimeError(
                    "torch.searchsorted(): boundaries tensor should be 1 dimension or the first N-1 dimensions of "
                    f"boundaries tensor and input value tensor must match, but we got boundaries tensor "
                    f"{list(b.shape)} and input value tensor {list(x.shape)}"
                )
        if isinstance(x, torch.Tensor) and not x.is_contiguous():
            _warn_once(_non_contiguous_note("input value"))
            warned = True
        if isinstance(b, torch.Tensor) and not b.is_contiguous():
            _warn_once(_non_contiguous_note("boundary"))
            warned = True
        return warned

    return check


def _search_options(boundaries: torch.Tensor, right: bool, side: str | None, sorter: torch.Tensor | None) -> None:
    """searchsorted's side and sorter checks (ATen's searchsorted_pre_check, its words, its order); the
    sorter's values are checked where it is used (the kernel, the decomposition)."""
    if side is not None and side not in ("left", "right"):
        raise RuntimeError(f"torch.searchsorted(): side can only be 'left' or 'right' but got {side}")
    if side == "left" and right:
        raise RuntimeError(
            "torch.searchsorted(): side and right can't be set to opposites, got side of left while right was True"
        )
    if sorter is None:
        return
    if sorter.device != boundaries.device:
        raise RuntimeError(
            "torch.searchsorted(): sorter and boundary tensors should have same device type, but got sorter tensor "
            f"device type {sorter.device} and input value tensor device type {boundaries.device}"
        )
    if sorter.shape != boundaries.shape:
        raise RuntimeError(
            "torch.searchsorted(): boundary and sorter must have the same size, but got boundary tensor "
            f"{list(boundaries.shape)}and got sorter tensor {list(sorter.shape)}"
        )
    if sorter.dtype != torch.int64:
        name = scalar_type_name(sorter.dtype)
        raise RuntimeError(f"torch.searchsorted(): sorter must be a tensor of long dtype but got dtype {name}")


_SCALAR_TYPE_NAMES = {
    torch.float32: "Float",
    torch.float64: "Double",
    torch.float16: "Half",
    torch.bfloat16: "BFloat16",
    torch.int64: "Long",
    torch.int32: "Int",
    torch.int16: "Short",
    torch.int8: "Char",
    torch.uint8: "Byte",
    torch.bool: "Bool",
    torch.complex32: "ComplexHalf",
    torch.complex64: "ComplexFloat",
    torch.complex128: "ComplexDouble",
    torch.uint16: "UInt16",
    torch.uint32: "UInt32",
    torch.uint64: "UInt64",
    torch.float8_e5m2: "Float8_e5m2",
    torch.float8_e4m3fn: "Float8_e4m3fn",
    torch.float8_e5m2fnuz: "Float8_e5m2fnuz",
    torch.float8_e4m3fnuz: "Float8_e4m3fnuz",
}


def scalar_type_name(dtype: torch.dtype) -> str:
    """ATen's name of a dtype in its messages (c10::ScalarType: Float, Long, ComplexFloat, ...)."""
    return _SCALAR_TYPE_NAMES.get(dtype, str(dtype).replace("torch.", ""))


def _std_at(i: int) -> Callable:
    """normal's std: a number must be >= 0; a tensor's elements too (one host read, as on CUDA). A number
    is a float argument, which the fast path does not key on: such calls stay off it (returns True)."""

    def check(vals: list) -> bool:
        std = vals[i]
        if isinstance(std, torch.Tensor):
            if std.is_complex():
                raise RuntimeError("normal expects standard deviation to be non-complex")
            if std.numel() and bool((std < 0).any()):
                raise RuntimeError("normal expects all elements of std >= 0.0")
            return False
        if std is not None and std < 0:
            raise RuntimeError(f"normal expects std >= 0.0, but found std {std}")
        return True

    return check


def _embedding(vals: list) -> None:
    indices = vals[1]
    if indices.dtype not in (torch.int64, torch.int32):
        raise RuntimeError(
            f"Expected tensor for argument #1 'indices' to have one of the following scalar types: "
            f"Long, Int; but got {indices.type()} instead (while checking arguments for embedding)"
        )


def _multi_margin_loss(vals: list) -> None:
    x, target = vals[0], vals[1]
    nframe = 1 if x.dim() <= 1 else x.shape[0]
    if target.dim() > 1 or target.numel() != nframe:
        raise RuntimeError(
            f"multi_margin_loss: target tensor should be 1-D with size equal to the number of input "
            f"samples (batch size). Expected target size [{nframe}], but got {list(target.shape)}. "
            f"Input has shape {list(x.shape)}."
        )


_SCALAR_NAMES = {torch.float32: "Float", torch.float64: "Double", torch.float16: "Half", torch.bfloat16: "BFloat16"}


def _nll_weight(vals: list) -> None:
    """nll_loss's CPU kernel refuses a class weight of another dtype than the input, even for empty tensors."""
    x, weight = vals[0], vals[2] if len(vals) > 2 else None
    if isinstance(weight, torch.Tensor) and weight.dtype != x.dtype:
        raise RuntimeError(
            f"expected scalar type {_SCALAR_NAMES.get(x.dtype, x.dtype)} but found "
            f"{_SCALAR_NAMES.get(weight.dtype, weight.dtype)}"
        )


_CHECKS: dict = {
    aten.complex.default: _complex_parts,
    aten.polar.default: _complex_parts,
    aten.index_fill.int_Scalar: _index_fill,
    aten.index_fill_.int_Scalar: _index_fill,
    aten.index_fill.int_Tensor: _index_fill,
    aten.index_fill_.int_Tensor: _index_fill,
    aten.embedding.default: _embedding,
    aten.multi_margin_loss.default: _multi_margin_loss,
    aten.nll_loss_forward.default: _nll_weight,
    aten.nll_loss2d_forward.default: _nll_weight,
    getattr(aten.random_, "from"): _random_from,
    getattr(aten.random, "from"): _random_from,
    aten.random_.to: _random_to,
    aten.random.to: _random_to,
    aten.uniform_.default: _uniform,
    aten.uniform.default: _uniform,
    aten.histc.default: _histc,
    aten.histc.out: _histc,
    aten.searchsorted.Tensor: _bucketization(0, 1),
    aten.searchsorted.Scalar: _bucketization(0, None),
    aten.bucketize.Tensor: _bucketization(1, 0),
    aten.bucketize.Scalar: _bucketization(1, None),
    aten.normal_.default: _std_at(2),
    aten.normal.Tensor_float: _std_at(1),
    aten.normal.Tensor_float_out: _std_at(1),
    aten.normal.float_Tensor: _std_at(1),
    aten.normal.float_Tensor_out: _std_at(1),
    aten.normal.Tensor_Tensor: _std_at(1),
    aten.normal.Tensor_Tensor_out: _std_at(1),
    aten.normal.float_float: _std_at(1),
    aten.normal.float_float_out: _std_at(1),
    aten.addcdiv.default: _addcdiv,
    aten.addcdiv.out: _addcdiv,
    aten.addcdiv_.default: _addcdiv,
    aten.index.Tensor: _indexing,
    aten._unsafe_index.Tensor: _indexing,
    aten.index_put.default: _indexing,
    aten.index_put_.default: _indexing,
    aten._index_put_impl_.default: _indexing,
    aten._unsafe_index_put.default: _indexing,
    aten.arange.start_step: _arange_size,
    aten.max.default: _whole("max"),
    aten.min.default: _whole("min"),
    aten.max.dim: _over_dims("max", wrap=True),
    aten.min.dim: _over_dims("min", wrap=True),
    aten.amax.default: _over_dims("amax", wrap=False),
    aten.amin.default: _over_dims("amin", wrap=False),
    aten.abs_.default: _abs_inplace,
    aten.nonzero_static.default: _nonzero_static,
    aten.nonzero_static.out: _nonzero_static,
    aten.heaviside.default: _heaviside,
    aten.heaviside_.default: _heaviside,
    aten.median.dim: _at_dim("median", 1),
    aten.nanmedian.dim: _at_dim("median", 1),  # ATen names it median() too
    aten.mode.default: _at_dim("mode", 1),
    aten.kthvalue.default: _at_dim("kthvalue", 2),
    aten.var.correction: _std_var("var"),
    aten.std.correction: _std_var("std"),
    aten.var_mean.correction: _std_var("var_mean"),
    aten.std_mean.correction: _std_var("std_mean"),
    aten.argmax.default: _arg_extreme("argmax"),
    aten.argmin.default: _arg_extreme("argmin"),
}


def precheck_for(func) -> Callable | None:
    """The check to run on an op's normalized arguments before any tier, or None. A check raises what PyTorch
    raises; it returns True where it warned or judged a float argument (the dispatcher then keeps the call
    off the fast path, which would not warn again and does not key its plans on floats)."""
    return _CHECKS.get(func)
