"""Host-to-device transfers that overlap with compute (see runtime/async_copy.py)."""

from __future__ import annotations

import torch

from .runtime import REGISTRY


def non_blocking_to(t: torch.Tensor, device: torch.device | str | None = None) -> torch.Tensor:
    """`t.pin_memory().to(device, non_blocking=True)`: returns at once on devices
    with async copies; the bytes are guaranteed in place before any op reads
    them. device defaults to the current fl device."""
    target = torch.device(device) if device is not None else REGISTRY.device(None).torch_device
    if t.device.type != "cpu":
        return t.to(target, non_blocking=True)
    src = t if t.is_pinned() else t.pin_memory()
    return src.to(target, non_blocking=True)
