"""`fl.watch(model, optimizer)`: what each training step cost on the device, step by step, while it runs.

A profile looks at one block after the fact; a training loop wants the trend:
does the loss fall, how many kernels and CPU fallbacks does a step take, how
many bytes cross between host and device, does device memory grow. A watch
reads the counters torch_fl keeps anyway (kernels launched, bytes copied,
per-(op, path) calls, the caching pool's figures), so it adds no listener and
the C++ fast path stays on: the loop runs as it would unwatched. A step ends at
`optimizer.step()` (a post hook), or at `watch.step()` without an optimizer;
`watch(loss)` records the step's loss and returns it (`watch(loss).backward()`).
Callbacks in `watch.listeners` get each finished step (the notebook's live view,
`torch_fl.notebook.WatchView`, is one)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ..rendering import Report
from ..runtime import REGISTRY, events


@dataclass
class StepRecord:
    step: int
    loss: float | None
    seconds: float
    kernels: int
    copied_bytes: int
    paths: dict[str, int]  # path -> op calls this step
    fallback_ops: dict[str, int]  # op -> calls that ran on the CPU fallback this step
    allocated: int  # device bytes held by live tensors at the step's end (the backend's devices)
    peak: int  # the most any device held so far (torch.fl.max_memory_allocated: a watch does not reset it)


@dataclass
class Watch(Report):
    """The steps of a training loop on a backend (`fl.watch`)."""

    backend: str
    steps: list[StepRecord] = field(default_factory=list)
    listeners: list[Callable[[StepRecord], None]] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        self._loss: float | None = None
        self._loss_tensor: torch.Tensor | None = None  # the loss handed to __call__ this step
        self._hooks: list = []
        self._mark()

    # -- what the loop calls --------------------------------------------------
    def __call__(self, loss: torch.Tensor) -> torch.Tensor:
        """Record this step's loss (read when the step ends) and hand it back: `watch(loss).backward()`."""
        self._loss_tensor = loss
        return loss

    def step(self) -> StepRecord:
        """End the current step (an optimizer's post hook does it when the watch has one)."""
        b = REGISTRY.get(self.backend)
        counts = dict(b.counts)
        paths: dict[str, int] = {}
        fallback_ops: dict[str, int] = {}
        for (op, path), n in counts.items():
            d = n - self._counts.get((op, path), 0)
            if d > 0:
                paths[path] = paths.get(path, 0) + d
                if path == events.FALLBACK:
                    fallback_ops[op] = fallback_ops.get(op, 0) + d
        loss = self._loss_tensor
        value = float(loss.detach().float().cpu()) if isinstance(loss, torch.Tensor) else None
        self._loss_tensor = None
        devices = b.devices
        rec = StepRecord(
            len(self.steps) + 1,
            value,
            time.perf_counter() - self._t0,
            events.kernel_count() - self._kernels,
            events.bytes_moved() - self._bytes,
            paths,
            fallback_ops,
            sum(d.allocated for d in devices),
            max((d.peak for d in devices), default=0),
        )
        self.steps.append(rec)
        for listener in list(self.listeners):
            listener(rec)
        self._mark()
        return rec

    def close(self) -> None:
        """Remove the optimizer hook (the steps recorded stay)."""
        for h in self._hooks:
            h.remove()
        self._hooks.clear()

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _mark(self) -> None:
        b = REGISTRY.get(self.backend)
        self._counts = dict(b.counts)
        self._kernels = events.kernel_count()
        self._bytes = events.bytes_moved()
        self._t0 = time.perf_counter()

    # -- the report -------------------------------------------------------------
    def to_dict(self) -> dict:
        return {"backend": self.backend, "steps": [vars(s) for s in self.steps]}

    def render(self, n: int = 10) -> str:
        lines = [
            f"fl.watch on {self.backend}: {len(self.steps)} steps",
            f"{'step':>5} {'loss':>11} {'ms':>9} {'kernels':>8} {'fallbacks':>9} {'copied':>10} "
            f"{'allocated':>10} {'peak':>10}",
        ]
        for s in self.steps[-n:] if n else []:
            loss = f"{s.loss:.5g}" if s.loss is not None else "-"
            sizes = " ".join(f"{human_bytes(v):>10}" for v in (s.copied_bytes, s.allocated, s.peak))
            lines.append(
                f"{s.step:>5} {loss:>11} {s.seconds * 1e3:>9.1f} {s.kernels:>8} "
                f"{sum(s.fallback_ops.values()):>9} {sizes}"
            )
        if self.steps:
            last = self.steps[-1]
            lines.append(
                "last step's op calls by path: " + ", ".join(f"{p} {k}" for p, k in sorted(last.paths.items()))
            )
            if last.fallback_ops:
                lines.append(
                    "on the CPU fallback: " + ", ".join(f"{op} x{k}" for op, k in sorted(last.fallback_ops.items()))
                )
        return "\n".join(lines)


def human_bytes(n: int) -> str:
    """Bytes in the unit that reads best (B, KiB, MiB, GiB)."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def watch(
    model: torch.nn.Module | None = None, optimizer: torch.optim.Optimizer | None = None, backend: str | None = None
) -> Watch:
    """Watch a training loop step by step on `backend` (default: the backend the model's parameters live on,
    else the current one). With an optimizer, each `optimizer.step()` ends a step; else call `watch.step()`."""
    name = backend
    if name is None and model is not None:
        p = next((p for p in model.parameters() if p.device.type == "fl"), None)
        if p is not None:
            name = REGISTRY.device(p.device.index).backend.name
    w = Watch(name or REGISTRY.ensure().name)
    if optimizer is not None:

        def after_step(*_: Any) -> None:
            w.step()

        w._hooks.append(optimizer.register_step_post_hook(after_step))
    return w
