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


Movable = torch.nn.Module | torch.Tensor | torch.optim.Optimizer


def move(obj: Movable, device: torch.device | str | None = None) -> Movable:
    """obj on `device` (default: the current fl device), for switching backends
    mid-session: a Module moves in place (tied parameters stay tied) and is
    returned; a Tensor's copy is returned; an Optimizer's state tensors move in
    place, so an optimizer made before the switch keeps training the moved model
    (0-dim state such as Adam's `step` stays where PyTorch keeps it, on the CPU)."""
    target = torch.device(device) if device is not None else REGISTRY.device(None).torch_device
    if isinstance(obj, torch.nn.Module):
        return obj.to(target)
    if isinstance(obj, torch.Tensor):
        return obj.to(target)
    if isinstance(obj, torch.optim.Optimizer):
        for state in obj.state.values():
            for k, v in list(state.items()):
                if isinstance(v, torch.Tensor) and v.dim() > 0:
                    state[k] = v.to(target)
        return obj
    raise TypeError(f"fl.move takes an nn.Module, a Tensor or an Optimizer, not {type(obj).__name__}")
