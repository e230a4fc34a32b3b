"""The decomposition tier's table: op -> a function computing it from other
ops. It starts from PyTorch's own (torch._decomp) and adds torch_fl's, which
keep the work on the device where PyTorch's bottom out in prims no plugin has,
go through a host round trip, or do not exist: general.py (random factories,
indexing, data-dependent sizes, search, histograms, ...), nn.py (convolution
and pooling as views and matrix products), linalg.py (factorisations from
matrix products), rnn.py (the fused LSTM/GRU cells), attention.py (the
overrideable fused-attention pair), and the small ones below. torch_fl.fused
adds the references of its own fl:: ops when it is imported."""

from __future__ import annotations

import warnings

import torch
from torch._decomp import decomposition_table

from ...runtime import DECOMPOSITION, core, device_of, mem_set_zero, native, native_factory
from ..facts import facts
from . import attention, general, linalg, nn, rnn
from .rnn import host_kernel as host_kernel  # the fused RNN cells on host tensors (dispatch.plan, .fallback)

aten = torch.ops.aten

DECOMPOSITIONS: dict = dict(decomposition_table)
# ops whose PyTorch autograd formula needs what an fl device may lack; registered at the fl autograd key
AUTOGRAD_COMPOSITIONS: dict = dict(general.AUTOGRAD_COMPOSITIONS)
attention.register(DECOMPOSITIONS)
general.register(DECOMPOSITIONS)
nn.register(DECOMPOSITIONS)
linalg.register(DECOMPOSITIONS)
rnn.register(DECOMPOSITIONS)


def _full_like(self, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    """full_like as empty_like + fill_: autograd seeds every backward with it
    (ones_like -> full_like), and fill_ is a primitive every plugin has, so
    this keeps the seed on the device instead of a host round trip."""
    out = torch.empty_like(
        self,
        dtype=dtype,
        layout=layout,
        device=device,
        pin_memory=pin_memory,
        memory_format=memory_format or torch.preserve_format,
    )
    return out.fill_(fill_value)


DECOMPOSITIONS[aten.full_like.default] = _full_like
_TORCH_ADDMM = DECOMPOSITIONS[aten.addmm.default]


def _addmm(self, mat1, mat2, *, beta=1, alpha=1):
    """addmm with the default scales as mm + add: torch._decomp's multiplies both terms by their scale
    (alpha * mm + beta * self: four kernels where two do, on a chip without addmm, for every nn.Linear).
    Multiplying by 1 changes no value, so the result is the same, bit for bit, as torch's decomposition;
    other scales and the reduced-precision dtypes (computed in float32 there) take torch's."""
    if (
        beta == 1
        and alpha == 1
        and not isinstance(beta, bool)
        and not isinstance(alpha, bool)
        and self.dtype in (torch.float32, torch.float64)
        and mat1.dtype == self.dtype
        and mat2.dtype == self.dtype
    ):
        return torch.mm(mat1, mat2) + self
    return _TORCH_ADDMM(self, mat1, mat2, beta=beta, alpha=alpha)


DECOMPOSITIONS[aten.addmm.default] = _addmm


def _zero(self):
    """zero_ as the plugin's mem_set where it has one (one byte fill, no kernel), else as fill_:
    torch._decomp's zero_ goes through zeros_like, whose generic kernel calls zero_ again. A mem_set fill
    is committed to the C++ core, which makes the same fill for later zero_ calls of the device and dtype
    (autograd's zero gradients) without Python."""
    if mem_set_zero(self):
        if native.FAST.enabled:
            dev = device_of(self)
            core.lib().fl_fallback_zero_commit(
                dev.index, core.scalar_type_code(self.dtype), core.count_slot(dev.backend, "aten::zero_", DECOMPOSITION)
            )
        return self
    return aten.fill_.Scalar(self, 0)


DECOMPOSITIONS[aten.zero_.default] = _zero


_NAN_TO_NUM = {
    op: DECOMPOSITIONS[op] for op in (aten.nan_to_num.default, aten.nan_to_num.out, aten.nan_to_num_.default)
}


def _nan_to_num_complex(self, nan, posinf, neginf):
    """ATen's nan_to_num of a complex tensor replaces in the real and imaginary parts apart; torch._refs'
    refuses complex (its isneginf does)."""
    real = torch.nan_to_num(torch.view_as_real(self), nan, posinf, neginf)
    return torch.view_as_complex(real.contiguous())


def _nan_to_num(self, nan=None, posinf=None, neginf=None):
    if self.is_complex():
        return _nan_to_num_complex(self, nan, posinf, neginf)
    return _NAN_TO_NUM[aten.nan_to_num.default](self, nan, posinf, neginf)


def _nan_to_num_out(self, nan=None, posinf=None, neginf=None, *, out):
    if not self.is_complex():
        return _NAN_TO_NUM[aten.nan_to_num.out](self, nan, posinf, neginf, out=out)
    result = _nan_to_num_complex(self, nan, posinf, neginf)
    if out.shape != result.shape:
        out.resize_(result.shape)
    return out.copy_(result)


def _nan_to_num_(self, nan=None, posinf=None, neginf=None):
    if self.is_complex():
        return self.copy_(_nan_to_num_complex(self, nan, posinf, neginf))
    return _NAN_TO_NUM[aten.nan_to_num_.default](self, nan, posinf, neginf)


DECOMPOSITIONS[aten.nan_to_num.default] = _nan_to_num
DECOMPOSITIONS[aten.nan_to_num.out] = _nan_to_num_out
DECOMPOSITIONS[aten.nan_to_num_.default] = _nan_to_num_


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
    res = native_factory(facts(aten.arange.start_step), device_of(out), (start, end, step), {"dtype": out.dtype})
    if res is None:
        raise NotImplementedError(f"aten::arange has no kernel on fl backend '{device_of(out).backend.name}'")
    if out.numel() and out.numel() != res.numel():
        warnings.warn(
            f"The number of elements in the out tensor of shape {list(out.shape)} is {out.numel()} which "
            f"does not match the computed number of elements {res.numel()}. Note that this may occur as "
            f"a result of rounding error. The out tensor will be resized to a tensor of shape "
            f"({res.numel()},).",
            UserWarning,
            stacklevel=2,
        )
    return _fill_range_out(out, res)


def _fill_range_out(out: torch.Tensor, res: torch.Tensor) -> torch.Tensor:
    """ATen's range factories (arange, range, linspace, logspace) into out=: an out= tensor of the right
    number of elements keeps its shape and layout and takes the values in its element order (a narrowed
    view is filled in place); any other is resized to the result's shape."""
    if out.numel() != res.numel():
        out.resize_(res.shape)
    return out.copy_(res.reshape(out.shape))


def _range_out(functional):
    def run(*args, out):
        return _fill_range_out(out, functional(*args, dtype=out.dtype, device=out.device))

    return run


DECOMPOSITIONS[aten.arange.out] = _arange_out
DECOMPOSITIONS[aten.arange.start_out] = _arange_out
DECOMPOSITIONS[aten.range.out] = _range_out(aten.range.step)
for _name in ("linspace", "logspace"):
    for _overload in ("", "Tensor_Tensor_", "Tensor_Scalar_", "Scalar_Tensor_"):
        _out = getattr(getattr(aten, _name), _overload + "out", None)
        _functional = getattr(getattr(aten, _name), _overload[:-1] or "default", None)
        if _out is not None and _functional is not None:
            DECOMPOSITIONS[_out] = _range_out(_functional)
DECOMPOSITIONS[aten.slice_backward.default] = _slice_backward
DECOMPOSITIONS[aten.equal.default] = _equal

_PRIMS = {
    "clone": _prims_clone,
    "copy_to": _prims_copy_to,
    "div": _prims_div,
    "mul": lambda a, b: torch.mul(a, b),
    "gt": lambda a, b: torch.gt(a, b),  # b may be a Python number
    "add": lambda a, b: torch.add(a, b),
    "sub": lambda a, b: torch.sub(a, b),
    "abs": lambda a: aten.abs.default(a),
    "signbit": lambda a: aten.signbit.default(a),
}
for _name, _fn in _PRIMS.items():
    _op = getattr(getattr(torch.ops.prims, _name, None), "default", None)
    if _op is not None:
        DECOMPOSITIONS[_op] = _fn
