"""The public functions re-exported by `torch_fl`: backends and devices, the CPU fallback switch, explain."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from .dispatch import facts, resolve, resolve_op
from .rendering import Report
from .runtime import REGISTRY, SETTINGS, CapabilityTable, config, core
from .runtime import using_backend as using_backend  # fl.using_backend, with the rest of the facade


def initialize(backend_name: str | None = "auto") -> str:
    """Pick the active backend: a name, "auto" (the most capable device), or
    None to honour FL_BACKEND / the config file. Returns the backend's name."""
    if backend_name == "auto":
        import os

        backend_name = os.environ.get("FL_BACKEND") or config.load_config().get("backend") or "auto"
    name = REGISTRY.select(backend_name).name
    _check_autograd_once()
    return name


_autograd_checked = False


def _check_autograd_once() -> None:
    global _autograd_checked
    if _autograd_checked:
        return
    _autograd_checked = True
    import warnings

    # every device has an autograd queue if the engine started after torch_fl: probe the last one
    problem = core.probe_autograd(REGISTRY.devices[-1].index)
    if problem:
        warnings.warn(problem, RuntimeWarning, stacklevel=3)


def set_backend(name: str) -> str:
    """Switch the active backend live; tensors already created stay on theirs."""
    return REGISTRY.select(name).name


def get_current_backend_name() -> str:
    return REGISTRY.ensure().name


def current_device() -> torch.device:
    return REGISTRY.device(None).torch_device


def device(backend: str | None = None, index: int = 0) -> torch.device:
    """The torch.device of a backend's local device `index` (default: current backend)."""
    b = REGISTRY.get(backend) if backend else REGISTRY.ensure()
    if not 0 <= index < len(b.devices):
        raise ValueError(f"backend {b.name!r} has {len(b.devices)} device(s); index {index} does not exist")
    return b.devices[index].torch_device


def available_backends() -> list[str]:
    return REGISTRY.available()


@dataclass
class BackendReport(Report):
    """Every plugin the loader found and what became of it."""

    entries: list

    def __iter__(self) -> Iterator[dict]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def names(self, status: str = "loaded") -> list[str]:
        return [e["name"] for e in self.entries if e["status"] == status]

    def render(self) -> str:
        """One row per plugin file: name, status, where it came from (bundled, entry point,
        FL_PLUGIN_PATH, config file) and its path; then which entry or file named it, and
        why it was rejected or shadowed."""
        lines = [f"{'name':<10} {'status':<9} {'origin':<15} path / reason"]
        for e in self.entries:
            lines.append(f"{e['name'] or '?':<10} {e['status']:<9} {e['origin']:<15} {e['path']}")
            if e.get("source"):
                lines.append(f"{'':<36}from {e['source']}")
            if e["reason"]:
                lines.append(f"{'':<36}{e['reason']}")
        return "\n".join(lines)


def list_backends() -> BackendReport:
    REGISTRY.discover()
    entries = []
    for c in REGISTRY.candidates:
        d = c.as_dict()
        b = REGISTRY.backends.get(c.name) if c.status == "loaded" and c.name is not None else None
        d["devices"] = [str(x.torch_device) for x in b.devices] if b else []
        entries.append(d)
    return BackendReport(entries)


def capabilities(backend: str | None = None) -> CapabilityTable:
    """The capability table of a backend (default: the current one)."""
    b = REGISTRY.get(backend) if backend else REGISTRY.ensure()
    return b.capabilities


def set_cpu_fallback(enabled: bool) -> None:
    """The API twin of FL_CPU_FALLBACK: off makes ops without a device path raise. Takes a bool (or
    FL_CPU_FALLBACK's words: "0", "false", ...): a non-empty string such as "false" must not mean on."""
    if not isinstance(enabled, (bool, int, str)):
        raise TypeError(f"torch_fl.set_cpu_fallback(enabled) takes True or False, not {type(enabled).__name__}")
    SETTINGS.cpu_fallback = config.parse_bool(enabled, "torch_fl.set_cpu_fallback(enabled)")


def cpu_fallback_enabled() -> bool:
    return SETTINGS.cpu_fallback


@dataclass
class Explanation(Report):
    op: str
    backend: str
    dtypes: tuple
    path: str | None
    reasons: list
    calls: dict

    def render(self) -> str:
        lines = [f"{self.op} ({', '.join(self.dtypes)}) on backend '{self.backend}': {self.path or 'NO PATH'}"]
        lines += [f"  - {r}" for r in self.reasons]
        if self.calls:
            lines.append("  calls so far: " + ", ".join(f"{p}={n}" for p, n in sorted(self.calls.items())))
        return "\n".join(lines)

    _TIERS = ("native", "decomposition", "jit", "fallback")

    def why(self) -> str:
        """One line: why the earlier tiers did not serve the op, and the tier that does."""
        if self.path in self._TIERS and len(self.reasons) == len(self._TIERS):
            return "; ".join(self.reasons[: self._TIERS.index(self.path) + 1])
        return "; ".join(self.reasons)


@dataclass
class ExplanationTable(Report):
    """One op and dtype on every backend: one row each, the path and why (`explain_all`)."""

    op: str
    dtypes: tuple
    rows: list  # Explanation per backend

    def render(self) -> str:
        w = max([len(e.backend) for e in self.rows] + [7])
        pw = max([len(e.path or "NO PATH") for e in self.rows] + [4])
        lines = [f"{self.op} ({', '.join(self.dtypes)})", f"{'backend':<{w}}  {'path':<{pw}}  why"]
        lines += [f"{e.backend:<{w}}  {e.path or 'NO PATH':<{pw}}  {e.why()}" for e in self.rows]
        return "\n".join(lines)

    def html(self) -> str:
        import html

        rows = "".join(
            f"<tr><td>{html.escape(e.backend)}</td><td><b>{html.escape(e.path or 'NO PATH')}</b></td>"
            f"<td>{html.escape(e.why())}</td></tr>"
            for e in self.rows
        )
        return (
            f"<b>{html.escape(self.op)}</b> ({html.escape(', '.join(self.dtypes))})"
            f"<table><tr><th>backend</th><th>path</th><th>why</th></tr>{rows}</table>"
        )


def explain_all(op: Any, dtype: torch.dtype | str | tuple = torch.float32) -> ExplanationTable:
    """`explain` on every available backend: one row each (what %fl_explain shows)."""
    rows = [explain(op, dtype, backend=b) for b in REGISTRY.available()]
    name, dtypes = (rows[0].op, rows[0].dtypes) if rows else (str(op), ())
    return ExplanationTable(name, dtypes, rows)


def explain(op: Any, dtype: torch.dtype | str | tuple = torch.float32, backend: str | None = None) -> Explanation:
    """Which path `op` takes on a backend for a dtype, and why.

    op: an OpOverload (torch.ops.aten.mm.default), a packet (its default
    overload), or a name such as "aten::add.Tensor" / "add.Tensor" / "mm".
    dtype: a torch.dtype, its name ("bfloat16", as a user types it in a magic
    or on the command line), or a tuple of them. A name that is no operator
    or no dtype raises ValueError; a tensor or another object where a dtype or a backend name belongs raises
    TypeError (explain describes an op's plan, not a call: fl.profile shows what a call did)."""
    if backend is not None and not isinstance(backend, str):
        raise TypeError(
            f"fl.explain: backend must be a backend name such as 'minimal', not {type(backend).__name__}; "
            "explain(op, dtype, backend) describes an op's plan per dtype, it takes no tensors (to see what a "
            "call did, run it under fl.profile())"
        )
    func = resolve_op(op)
    b = REGISTRY.get(backend) if backend else REGISTRY.ensure()
    f = facts(func)
    dtypes = tuple(_dtype(d) for d in (dtype if isinstance(dtype, tuple) else (dtype,)))
    plan = b.plans.get((func, dtypes)) or resolve(f, b, dtypes)
    path: str | None
    if f.is_view:
        path, reasons = "view", [f"{f.name} is a view: metadata only, shares the input's plugin buffer"]
    else:
        path, reasons = plan.first, plan.reasons
    calls = {p: n for (name, p), n in b.counts.items() if name == f.name}
    return Explanation(f.name, b.name, tuple(str(d).replace("torch.", "") for d in dtypes), path, reasons, calls)


def _dtype(d: torch.dtype | str) -> torch.dtype:
    if isinstance(d, torch.dtype):
        return d
    if not isinstance(d, str):
        raise TypeError(
            f"fl.explain: dtype must be a torch.dtype or its name ('float32', 'bfloat16', ...), not "
            f"{type(d).__name__}; explain takes no tensors (to see what a call did, run it under fl.profile())"
        )
    found = getattr(torch, str(d).removeprefix("torch."), None)
    if not isinstance(found, torch.dtype):
        raise ValueError(f"{d!r} is not a torch dtype (float32, bfloat16, int64, ...)")
    return found
