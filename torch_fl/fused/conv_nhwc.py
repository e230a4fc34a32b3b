"""`fl::conv2d_nhwc`: a 2-D convolution whose output is channels-last (NHWC),
whatever its input's layout, and `fl::conv2d_nhwc_backward`, its gradients with
the input's gradient channels-last.

Why an op of its own: aten's convolution on a PrivateUse1 tensor has a fake
rule that picks contiguous_format whatever the input (_ConvBackend.Overrideable),
so a traced graph can never say that a convolution writes NHWC. This op's fake
implementation says so: traced with fake tensors (Dynamo, AOTAutograd, the
`layout` pass of backend="fl", which puts it in the aten graphs of devices that
prefer channels-last), its output and its input gradient carry channels-last
strides, and the graph's metadata is what runs.

A backend whose plugin has a kernel named `fl::conv2d_nhwc` runs it; every other
backend runs the decomposition: the device's convolution into a channels-last
buffer through `aten::convolution.out` (one kernel where the plugin's
convolution declares FL_KERNEL_ANY_OUT_LAYOUT, else the kernel and a copy), the
weight converted to channels-last first unless it already is. The backward's
decomposition is `aten::convolution_backward.out` the same way. On the CPU (and
for meta tensors) the references run: F.conv2d, then the channels-last copy.

Gradients: input, weight and bias, once: the backward op has no backward, and
a double backward (create_graph=True through it) raises rather than leave a
gradient silently missing.
The backward op returns three tensors; an output whose `output_mask` entry is
False is an empty tensor, never uninitialized memory."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from ..dispatch import autocast_kernel
from ..runtime import not_traced

_lib = torch.library.Library("fl", "FRAGMENT")  # the namespace is conv_bn.py's
_lib.define(
    "conv2d_nhwc(Tensor input, Tensor weight, Tensor? bias, int[2] stride, int[2] padding, int[2] dilation, "
    "int groups) -> Tensor"
)
_lib.define(
    "conv2d_nhwc_backward(Tensor grad, Tensor input, Tensor weight, int[]? bias_sizes, int[2] stride, "
    "int[2] padding, int[2] dilation, int groups, bool[3] output_mask) -> (Tensor, Tensor, Tensor)"
)

aten = torch.ops.aten
CL = torch.channels_last


def _check(input: torch.Tensor, weight: torch.Tensor, groups: int, op: str = "fl::conv2d_nhwc") -> None:
    torch._check(
        input.dim() == 4 and weight.dim() == 4,
        lambda: (
            f"{op} takes a 4-D input (N, C, H, W) and a 4-D weight (O, C/groups, kH, kW), got "
            f"{input.dim()}-D and {weight.dim()}-D; use F.conv1d / F.conv3d for other ranks"
        ),
    )
    torch._check(
        groups > 0 and input.shape[1] == weight.shape[1] * groups,
        lambda: (
            f"{op}: the input has {input.shape[1]} channels, the weight expects {weight.shape[1]} x {groups} group(s)"
        ),
    )


def _out_shape(
    input: torch.Tensor, weight: torch.Tensor, stride: Sequence[int], padding: Sequence[int], dilation: Sequence[int]
) -> tuple:
    """The output's (N, O, H', W') of a 2-D convolution (not transposed); a kernel larger than the padded input
    is refused, as F.conv2d refuses it (the fake implementation runs before any kernel: a plugin's kernel
    would otherwise be handed an empty output)."""
    ext, padded_hw = [], [input.shape[2 + i] + 2 * padding[i] for i in range(2)]
    for i in range(2):
        padded, reach = padded_hw[i], dilation[i] * (weight.shape[2 + i] - 1) + 1
        torch._check(
            padded >= reach,
            lambda: (
                f"fl::conv2d_nhwc: the padded input {padded_hw} is smaller than the kernel "
                f"{list(weight.shape[2:])} with dilation {list(dilation)}; pad the input or use a smaller kernel"
            ),
        )
        ext.append((padded - reach) // stride[i] + 1)
    return (input.shape[0], weight.shape[0], *ext)


def _reference(input, weight, bias, stride, padding, dilation, groups):
    _check(input, weight, groups)
    return F.conv2d(input, weight, bias, stride, padding, dilation, groups).contiguous(memory_format=CL)


def _fake(input, weight, bias, stride, padding, dilation, groups):
    _check(input, weight, groups)
    shape = _out_shape(input, weight, stride, padding, dilation)
    return torch.empty(shape, dtype=input.dtype, device=input.device, memory_format=CL)


def _decomposition(input, weight, bias, stride, padding, dilation, groups):
    _check(input, weight, groups)
    out = torch.empty(
        _out_shape(input, weight, stride, padding, dilation), dtype=input.dtype, device=input.device, memory_format=CL
    )
    w = weight.contiguous(memory_format=CL)  # itself when it already is (a cached channels-last weight)
    return aten.convolution.out(input, w, bias, stride, padding, dilation, False, [0, 0], groups, out=out)


def _masked(grads, mask):
    """The backward's three results, an empty tensor where the mask says no gradient."""
    return tuple(g if on else g.new_empty((0,)) for g, on in zip(grads, mask, strict=True))


def _check_backward(input, weight, bias_sizes, groups, mask) -> None:
    _check(input, weight, groups, "fl::conv2d_nhwc_backward")
    torch._check(
        not mask[2] or bias_sizes is not None,
        lambda: "fl::conv2d_nhwc_backward: output_mask asks for the bias gradient but bias_sizes is None",
    )


def _reference_backward(grad, input, weight, bias_sizes, stride, padding, dilation, groups, mask):
    _check_backward(input, weight, bias_sizes, groups, mask)
    gi, gw, gb = aten.convolution_backward(
        grad, input, weight, bias_sizes, stride, padding, dilation, False, [0, 0], groups, mask
    )
    empty = grad.new_empty((0,))
    return (
        gi.contiguous(memory_format=CL) if mask[0] else empty,
        gw if mask[1] else empty.clone(),
        gb if mask[2] else empty.clone(),
    )


def _fake_backward(grad, input, weight, bias_sizes, stride, padding, dilation, groups, mask):
    _check_backward(input, weight, bias_sizes, groups, mask)
    gi = (
        torch.empty(input.shape, dtype=grad.dtype, device=grad.device, memory_format=CL)
        if mask[0]
        else grad.new_empty((0,))
    )
    gw = grad.new_empty(weight.shape) if mask[1] else grad.new_empty((0,))
    gb = grad.new_empty((bias_sizes[0],)) if mask[2] and bias_sizes else grad.new_empty((0,))
    return gi, gw, gb


def _decomposition_backward(grad, input, weight, bias_sizes, stride, padding, dilation, groups, mask):
    _check_backward(input, weight, bias_sizes, groups, mask)
    gi = torch.empty(input.shape, dtype=grad.dtype, device=grad.device, memory_format=CL)
    gw = torch.empty(weight.shape, dtype=grad.dtype, device=grad.device)
    gb = torch.empty(bias_sizes[0] if bias_sizes else 0, dtype=grad.dtype, device=grad.device)
    out = aten.convolution_backward.out(
        grad, input, weight, bias_sizes, stride, padding, dilation, False, [0, 0], groups, mask,
        out0=gi, out1=gw, out2=gb,
    )  # fmt: skip
    return _masked(out, mask)


conv2d_nhwc_op = torch.ops.fl.conv2d_nhwc.default
conv2d_nhwc_backward_op = torch.ops.fl.conv2d_nhwc_backward.default


class _Conv2dNHWCFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input, weight, bias, stride, padding, dilation, groups):
        with torch._C._AutoDispatchBelowAutograd():
            out = conv2d_nhwc_op(input, weight, bias, stride, padding, dilation, groups)
        ctx.save_for_backward(input, weight)
        ctx.cfg = (None if bias is None else list(bias.shape), stride, padding, dilation, groups)
        return out

    @staticmethod
    def backward(ctx, grad):
        input, weight = ctx.saved_tensors
        bias_sizes, stride, padding, dilation, groups = ctx.cfg
        wanted = ctx.needs_input_grad
        mask = [wanted[0], wanted[1], bias_sizes is not None and wanted[2]]
        grads = conv2d_nhwc_backward_op(grad, input, weight, bias_sizes, stride, padding, dilation, groups, mask)
        return (*(g if on else None for g, on in zip(grads, mask, strict=True)), None, None, None, None)


def _autograd(input, weight, bias, stride, padding, dilation, groups):
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (input, weight, bias)):
        return _Conv2dNHWCFn.apply(input, weight, bias, stride, padding, dilation, groups)
    with torch._C._AutoDispatchBelowAutograd():  # a compiled graph's call (grad mode off): no Function bookkeeping
        return conv2d_nhwc_op(input, weight, bias, stride, padding, dilation, groups)


def _autograd_backward(grad, input, weight, bias_sizes, stride, padding, dilation, groups, mask):
    if torch.is_grad_enabled() and any(t.requires_grad for t in (grad, input, weight)):
        raise RuntimeError(
            "fl::conv2d_nhwc_backward has no backward (a second derivative of fl::conv2d_nhwc); call it under "
            "torch.no_grad(), or use F.conv2d where double backward is needed"
        )
    with torch._C._AutoDispatchBelowAutograd():
        return conv2d_nhwc_backward_op(grad, input, weight, bias_sizes, stride, padding, dilation, groups, mask)


not_traced(_Conv2dNHWCFn.forward)
not_traced(_Conv2dNHWCFn.backward)
_lib.impl("conv2d_nhwc", not_traced(_reference), "CPU")
_lib.impl("conv2d_nhwc", not_traced(_autograd), "Autograd")
_lib.impl("conv2d_nhwc_backward", not_traced(_reference_backward), "CPU")
_lib.impl("conv2d_nhwc_backward", not_traced(_autograd_backward), "Autograd")
torch.library.register_fake("fl::conv2d_nhwc", _fake, lib=_lib)
torch.library.register_fake("fl::conv2d_nhwc_backward", _fake_backward, lib=_lib)
# Under torch.autocast("fl") it casts as a convolution does: in the autocast dtype.
_lib.impl("conv2d_nhwc", not_traced(autocast_kernel(conv2d_nhwc_op, "lower")), "AutocastPrivateUse1")


def register_decompositions(table: dict) -> None:
    """Backends without a kernel of that name: the device's convolution (and its backward) into NHWC buffers."""
    table[conv2d_nhwc_op] = _decomposition
    table[conv2d_nhwc_backward_op] = _decomposition_backward


def _pair(v: int | Sequence[int], name: str) -> list[int]:
    if isinstance(v, int):
        return [v, v]
    if isinstance(v, str) or len(v) != 2:
        raise ValueError(f"conv2d_nhwc: {name}={v!r}; give an int or two ints (numeric padding, not 'same')")
    return [int(x) for x in v]


def conv2d_nhwc(
    input: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    stride: int | Sequence[int] = 1,
    padding: int | Sequence[int] = 0,
    dilation: int | Sequence[int] = 1,
    groups: int = 1,
) -> torch.Tensor:
    """F.conv2d's values in a channels-last output (`fl::conv2d_nhwc`), differentiable."""
    return conv2d_nhwc_op(
        input,
        weight,
        bias,
        _pair(stride, "stride"),
        _pair(padding, "padding"),
        _pair(dilation, "dilation"),
        int(groups),
    )
