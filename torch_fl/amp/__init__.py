"""Mixed precision on fl devices, with the dtype chosen from the capability table.

`torch.autocast("fl")` needs autocast kernels for the fl device's dispatch key
(AutocastPrivateUse1), which PyTorch does not register for an out-of-tree
backend; without them every op under autocast fails. policy.py registers a
fall-through for all ops and, for the ops CUDA autocasts, kernels with CUDA's
policy: matmul/convolution-like ops run in the autocast dtype, numerically
sensitive ops (losses, norms, exp/log, softmax, sums) in float32, and
multi-input ops (cat, stack, addcmul ...) in their widest input dtype.

`fl.autocast()` picks the dtype from the current backend's capability table:
bf16 where fp16 is missing, fp16 only where the device declares it stable,
no autocast (float32) when neither; `keep_float32(model, nn.LayerNorm)` pins
module types to float32 (the Torch-FL article's pitfall 1); `GradScaler` is PyTorch's
for the fl device."""

from __future__ import annotations

import functools

import torch
from torch import nn

from ..dispatch import tensor_map
from ..runtime import REGISTRY, FlDeviceModule
from .policy import FLOAT32, LOWER, PROMOTE, register


def autocast_dtype(backend: str | None = None) -> torch.dtype | None:
    """The dtype the capability table chooses, None for "stay in float32"."""
    b = REGISTRY.get(backend) if backend else REGISTRY.ensure()
    name = b.capabilities.amp_dtype
    return None if name == "float32" else getattr(torch, name)


def autocast(enabled: bool = True, dtype: torch.dtype | None = None, cache_enabled: bool | None = None):
    """torch.autocast("fl") with the dtype the current backend's capability
    table chooses (override with dtype=). Asking for a dtype the device does not
    compute in raises, naming the ones it does."""
    chosen = dtype if dtype is not None else autocast_dtype()
    if chosen is None or not enabled:
        return torch.autocast("fl", enabled=False)
    supported = FlDeviceModule.get_amp_supported_dtype()
    if chosen not in supported:
        raise ValueError(
            f"backend {REGISTRY.ensure().name!r} does not compute in {chosen} under autocast; "
            f"it supports {', '.join(str(d) for d in supported)}"
        )
    return torch.autocast("fl", dtype=chosen, cache_enabled=cache_enabled)


def keep_float32(model: nn.Module, *types: type[nn.Module]) -> list[nn.Module]:
    """Run every submodule of the given types in float32 under autocast
    (default: the norm layers), casting their floating inputs up and leaving
    their outputs float32. Returns the modules it changed."""
    types = types or (nn.LayerNorm, nn.GroupNorm, nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)
    changed = []
    for module in model.modules():
        if isinstance(module, types) and not getattr(module, "_fl_keep_float32", False):
            original = module.forward

            def forward(*args, _original=original, **kwargs):
                if not torch.is_autocast_enabled("fl"):
                    return _original(*args, **kwargs)
                up = functools.partial(tensor_map, lambda t: t.float() if t.is_floating_point() else t)
                with torch.autocast("fl", enabled=False):
                    return _original(*up(args), **{k: up(v) for k, v in kwargs.items()})

            module.forward = forward
            vars(module)["_fl_keep_float32"] = True  # a plain attribute (nn.Module types its attributes as tensors)
            changed.append(module)
    return changed


class GradScaler(torch.amp.GradScaler):
    """torch.amp.GradScaler for the fl device (loss scaling for float16)."""

    def __init__(
        self,
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        enabled: bool = True,
    ) -> None:
        super().__init__(
            "fl",
            init_scale=init_scale,
            growth_factor=growth_factor,
            backoff_factor=backoff_factor,
            growth_interval=growth_interval,
            enabled=enabled,
        )


__all__ = ["FLOAT32", "LOWER", "PROMOTE", "GradScaler", "autocast", "autocast_dtype", "keep_float32", "register"]
