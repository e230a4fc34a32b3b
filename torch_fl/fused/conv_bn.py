"""`fl::conv_bn_relu`: convolution -> inference batch norm -> ReLU in one op.

A backend whose plugin has a kernel for it (the ascend emulator) runs one
kernel; every other backend, and the CPU, runs the three aten ops it stands
for (its decomposition). torch.compile's `conv_bn` pass rewrites inference
graphs into it (compile/passes/conv_bn.py); `conv_bn_relu(conv, bn, x)` calls it
directly. Its `.out` overload writes into a given tensor, channels-last
included (the `layout` pass).

Inference only: batch norm uses its running statistics, and the op has no
autograd formula (a tensor that requires grad raises, naming the unfused
route). This module defines the `fl` operator namespace (the other fused ops
and the compiler's add to it)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..dispatch import autocast_kernel
from ..runtime import not_traced

_lib = torch.library.Library("fl", "DEF")
_lib.define(
    "conv_bn_relu(Tensor input, Tensor weight, Tensor? bias, Tensor? bn_weight, Tensor? bn_bias, "
    "Tensor running_mean, Tensor running_var, float eps, int[] stride, int[] padding, int[] dilation, "
    "int groups) -> Tensor"
)
# The same into a given tensor: torch.compile's layout pass passes a channels-last one (compile/passes/layout.py).
_lib.define(
    "conv_bn_relu.out(Tensor input, Tensor weight, Tensor? bias, Tensor? bn_weight, Tensor? bn_bias, "
    "Tensor running_mean, Tensor running_var, float eps, int[] stride, int[] padding, int[] dilation, "
    "int groups, *, Tensor(a!) out) -> Tensor(a!)"
)


def _reference(
    input, weight, bias, bn_weight, bn_bias, running_mean, running_var, eps, stride, padding, dilation, groups
):
    conv = F.conv2d if input.dim() == 4 else F.conv1d
    y = conv(input, weight, bias, stride, padding, dilation, groups)
    y = F.batch_norm(y, running_mean, running_var, bn_weight, bn_bias, False, 0.0, eps)
    return F.relu(y)


def _meta(input, weight, bias, bn_weight, bn_bias, running_mean, running_var, eps, stride, padding, dilation, groups):
    conv = F.conv2d if input.dim() == 4 else F.conv1d
    return torch.empty_like(
        conv(input, weight, bias, stride, padding, dilation, groups), memory_format=torch.contiguous_format
    )


def _no_grad_wanted(*args):
    if torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
        raise RuntimeError(
            "fl::conv_bn_relu is an inference kernel and has no backward; call it under "
            "torch.no_grad() / inference_mode(), or run the modules unfused for training"
        )


def _autograd(*args):
    _no_grad_wanted(*args)
    with torch._C._AutoDispatchBelowAutograd():
        return torch.ops.fl.conv_bn_relu.default(*args)


def _reference_out(*args, out):
    return out.copy_(_reference(*args))


def _meta_out(*args, out):
    return out


def _autograd_out(*args, out):
    _no_grad_wanted(*args, out)
    with torch._C._AutoDispatchBelowAutograd():
        return torch.ops.fl.conv_bn_relu.out(*args, out=out)


_lib.impl("conv_bn_relu", not_traced(_reference), "CPU")
_lib.impl("conv_bn_relu", not_traced(_meta), "Meta")
_lib.impl("conv_bn_relu", not_traced(_autograd), "Autograd")
_lib.impl("conv_bn_relu.out", not_traced(_reference_out), "CPU")
_lib.impl("conv_bn_relu.out", not_traced(_meta_out), "Meta")
_lib.impl("conv_bn_relu.out", not_traced(_autograd_out), "Autograd")

conv_bn_relu_op = torch.ops.fl.conv_bn_relu.default


def _decomposition(*args, **kwargs):
    return _reference(*args, **kwargs)


def register_decompositions(table: dict) -> None:
    """Backends without a native kernel run the three aten ops."""
    table[conv_bn_relu_op] = _decomposition


def conv_bn_relu(conv: nn.Conv2d | nn.Conv1d, bn: nn.BatchNorm2d | nn.BatchNorm1d, x: torch.Tensor) -> torch.Tensor:
    """relu(bn(conv(x))) with bn in inference mode, as one op."""
    if bn.running_mean is None or bn.running_var is None:
        raise ValueError("conv_bn_relu needs a batch norm with running statistics (track_running_stats=True)")
    if isinstance(conv.padding, str):
        raise ValueError(f"conv_bn_relu needs numeric padding, not padding={conv.padding!r}")
    return conv_bn_relu_op(
        x,
        conv.weight,
        conv.bias,
        bn.weight,
        bn.bias,
        bn.running_mean,
        bn.running_var,
        float(bn.eps),
        list(conv.stride),
        list(conv.padding),
        list(conv.dilation),
        conv.groups,
    )


# Under torch.autocast("fl") the op casts as a convolution does: in the autocast dtype.
_lib.impl("conv_bn_relu", not_traced(autocast_kernel(conv_bn_relu_op, "lower")), "AutocastPrivateUse1")
