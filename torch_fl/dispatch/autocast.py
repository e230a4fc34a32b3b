"""The kernel torch.autocast("fl") runs for an op (the AutocastPrivateUse1 key):
CUDA autocast's casting policy, then the op. torch_fl/amp/policy.py registers it for
the aten ops; the fused fl:: ops register it for themselves."""

from __future__ import annotations

import functools

import torch

# the key is in PyTorch's C++ enum but missing from its type stub
_KEYSET = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastPrivateUse1)  # type: ignore[attr-defined]


def tensor_map(fn, v):
    """fn applied to each tensor in v (nested lists and tuples kept)."""
    if isinstance(v, torch.Tensor):
        return fn(v)
    if isinstance(v, (list, tuple)):
        return type(v)(tensor_map(fn, x) for x in v)
    return v


def tensors_in(v):
    """The tensors in v (nested lists, tuples and dict values)."""
    if isinstance(v, torch.Tensor):
        yield v
    elif isinstance(v, (list, tuple)):
        for x in v:
            yield from tensors_in(x)
    elif isinstance(v, dict):
        for x in v.values():
            yield from tensors_in(x)


def autocast_kernel(op, policy: str):
    """op's kernel for the AutocastPrivateUse1 key: its floating fl tensors cast by CUDA autocast's
    policy ("lower": the autocast dtype, "fp32": half types to float32, "promote": the widest input
    dtype), then op itself with autocast excluded. amp.register() puts it on the aten ops CUDA
    autocasts; torch_fl's fused ops put it on themselves, with the policy of the ops they fuse."""

    def lower(t):
        if t.is_floating_point() and t.dtype != torch.float64 and t.device.type == "fl":
            return t.to(torch.get_autocast_dtype("fl"))
        return t

    def fp32(t):
        if t.is_floating_point() and t.dtype in (torch.float16, torch.bfloat16) and t.device.type == "fl":
            return t.float()
        return t

    def run(*args, **kwargs):
        if policy == "promote":
            floats = [t.dtype for t in tensors_in((args, kwargs)) if t.is_floating_point()]
            widest = functools.reduce(torch.promote_types, floats) if floats else None

            def cast(t):
                return t.to(widest) if widest is not None and t.is_floating_point() else t
        else:
            cast = lower if policy == "lower" else fp32
        args, kwargs = tensor_map(cast, args), {k: tensor_map(cast, v) for k, v in kwargs.items()}
        with torch._C._ExcludeDispatchKeyGuard(_KEYSET):
            return op(*args, **kwargs)

    return run
