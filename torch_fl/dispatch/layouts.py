"""Memory formats of results where PyTorch's CPU kernels choose one the meta functions do not.

Output layouts come from PyTorch's meta functions, and for a convolution on a PrivateUse1 device those pick a
contiguous result whatever the input (`_ConvBackend.Overrideable`). PyTorch's CPU (and CUDA) kernels keep a
channels-last input channels-last: a convolution whose input or weight is channels-last gives a channels-last
output, input gradient and weight gradient; the reflection and replication pads and some pooling ops keep their
input's format. A
model converted with .to(memory_format=torch.channels_last) must stay so on fl, so for these ops the result is
laid out as CPU lays it out (one copy, only where the formats differ)."""

from __future__ import annotations

from collections.abc import Callable

import torch

aten = torch.ops.aten
_FORMATS = {4: torch.channels_last, 5: torch.channels_last_3d}


def channels_last_of(t) -> torch.memory_format | None:
    """t's channels-last format, where t is laid out that way and not also contiguous (PyTorch's
    suggest_memory_format for the cases that differ)."""
    if not isinstance(t, torch.Tensor):
        return None
    fmt = _FORMATS.get(t.dim())
    if fmt is None or t.is_contiguous() or not t.is_contiguous(memory_format=fmt):
        return None
    return fmt


def _conv(input_at: int, weight_at: int, results: tuple) -> Callable:
    def rule(vals):
        return channels_last_of(vals[input_at]) or channels_last_of(vals[weight_at]), results

    return rule


def _like(arg_at: int, results: tuple = (0,)) -> Callable:
    def rule(vals):
        return channels_last_of(vals[arg_at]), results

    return rule


RULES: dict = {aten.convolution.default: _conv(0, 1, (0,)), aten.convolution_backward.default: _conv(1, 2, (0, 1))}
for _name in (
    "reflection_pad1d",
    "reflection_pad2d",
    "reflection_pad3d",
    "replication_pad1d",
    "replication_pad2d",
    "replication_pad3d",
):
    RULES[getattr(aten, _name).default] = _like(0)
    RULES[getattr(aten, _name + "_backward").default] = _like(1)
# pooling CPU keeps channels-last (a device that decomposes it into views and sums would not): 2-D average and
# adaptive average pooling, 3-D max pooling with its indices (CPU's 3-D average pooling gives contiguous)
RULES[aten.avg_pool2d.default] = _like(0)
RULES[aten._adaptive_avg_pool2d.default] = _like(0)
RULES[aten.max_pool3d_with_indices.default] = _like(0, (0, 1))


def rule_for(func) -> Callable | None:
    return RULES.get(func)


def wanted(f, vals) -> tuple | None:
    """(memory format, indices of the results it applies to) where CPU lays this call's results out
    channels-last, else None."""
    fmt, results = f.layout_rule(vals)
    return (fmt, results) if fmt is not None else None


def apply(want: tuple, result):
    """The result (a tensor or a tuple of them) with the wanted results in the wanted memory format."""
    fmt, results = want
    rank = 4 if fmt is torch.channels_last else 5

    def fix(t):
        if isinstance(t, torch.Tensor) and t.dim() == rank and not t.is_contiguous(memory_format=fmt):
            return t.contiguous(memory_format=fmt)
        return t

    if isinstance(result, torch.Tensor):
        return fix(result)
    return tuple(fix(t) if i in results else t for i, t in enumerate(result))
