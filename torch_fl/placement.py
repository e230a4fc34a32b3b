"""Where the user's objects live: `fl.move` and `fl.non_blocking_to`, and the fl objects a workload uses
from outside, moved to another backend and back.

`fl.move(obj, device)` puts a module, tensor or optimizer on a device (switching backends mid-session);
`fl.non_blocking_to(t)` copies a host tensor to the device without waiting (runtime/async_copy.py makes the
copy safe). The bytes themselves move through the runtime (runtime/transfers.py).

A comparison of backends runs one workload on each. A workload usually closes
over a model and inputs made before (`lambda: model(x).sum().backward()`, a
notebook cell naming `model` and `x`); run as they are, its ops run wherever
those already live, whatever backend is current. So compare_backends finds
what the workload names (its closure, the globals its code names, or a
notebook's names), moves each fl object to the backend of the run, and puts
everything back afterwards: modules move in place (fl.move), tensors are
copied and the name is rebound to the copy for the run."""

from __future__ import annotations

import types
from collections.abc import Callable, Iterable
from typing import Any

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


def code_names(code: types.CodeType) -> set[str]:
    """Every global name a code object and the code nested in it (lambdas, comprehensions) refer to."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= code_names(const)
    return names


def _on_fl(obj: Any) -> torch.device | None:
    """The fl device obj lives on, or None (not fl, or split over several devices)."""
    if isinstance(obj, torch.Tensor):
        devices = {obj.device}
    elif isinstance(obj, torch.nn.Module):
        devices = {t.device for t in [*obj.parameters(), *obj.buffers()]}
    elif isinstance(obj, torch.optim.Optimizer):
        devices = {p.device for g in obj.param_groups for p in g["params"]}
    else:
        return None
    only = next(iter(devices)) if len(devices) == 1 else None
    return only if only is not None and only.type == "fl" else None


class Slot:
    """Where a used object is bound (a dict entry or a closure cell), and the device it started on."""

    def __init__(self, name: str, get: Callable[[], Any], put: Callable[[Any], None]) -> None:
        self.name, self._get, self._put = name, get, put
        self.original = get()
        self.home = _on_fl(self.original)

    def place(self, device: torch.device) -> None:
        obj = self.original
        if isinstance(obj, torch.Tensor):
            if obj.device != device:
                moved = obj.detach().to(device).requires_grad_(obj.requires_grad)
                self._put(moved)
        else:
            move(obj, device)

    def restore(self) -> None:
        if isinstance(self.original, torch.Tensor):
            self._put(self.original)
        else:
            move(self.original, self.home)


def _dict_slot(d: dict, name: str) -> Slot:
    return Slot(name, lambda: d[name], lambda v: d.__setitem__(name, v))


def _cell_slot(name: str, cell: Any) -> Slot:
    def put(v: Any) -> None:
        cell.cell_contents = v

    return Slot(name, lambda: cell.cell_contents, put)


def used_slots(fn: Callable, namespace: dict | None = None, names: Iterable[str] = ()) -> list[Slot]:
    """The fl objects fn uses from outside: its closure cells, the globals its code names, and `names` looked
    up in `namespace` (for code that is not a Python function, such as a notebook cell)."""
    found: list[Slot] = []
    code = getattr(fn, "__code__", None)
    if code is not None:
        for name, cell in zip(code.co_freevars, fn.__closure__ or (), strict=False):
            try:
                cell.cell_contents  # noqa: B018 (an empty cell raises)
            except ValueError:
                continue
            found.append(_cell_slot(name, cell))
        scope = getattr(fn, "__globals__", {})
        found += [_dict_slot(scope, n) for n in sorted(code_names(code)) if n in scope]
    if namespace is not None:
        found += [_dict_slot(namespace, n) for n in sorted(set(names)) if n in namespace]
    return [s for s in found if s.home is not None]


class placed:
    """`with placed(slots) as place:` then `place(device)` before each run; everything goes back at exit."""

    def __init__(self, slots: list[Slot]) -> None:
        self.slots = slots

    def __enter__(self) -> Callable[[torch.device], None]:
        return self._place

    def _place(self, device: torch.device) -> None:
        for s in self.slots:
            s.place(device)

    def __exit__(self, *exc: Any) -> None:
        for s in self.slots:
            s.restore()
