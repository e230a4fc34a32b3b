"""Op coverage: which path each op takes on a backend, per dtype.

The capability explorer's table, as data: for each op (every op some
backend has a kernel for, plus any you name) and dtype, the first path the
dispatcher would take — native, decomposition, jit, fallback — or "none"
when no path exists (CPU fallback switched off)."""

from __future__ import annotations

import functools
import json
import warnings
from dataclasses import dataclass, field

import torch

from .rendering import Report
from .runtime import REGISTRY

DTYPES = ("float32", "float64", "float16", "bfloat16", "int64", "int32", "bool")
MARKS = {"native": "N", "decomposition": "D", "jit": "J", "fallback": "F", "none": "-", "view": "V",
         "undefined": "."}
UNDEFINED = "undefined"  # PyTorch itself has no CPU kernel for the op in this dtype: no path to judge


@dataclass
class Coverage(Report):
    backend: str
    dtypes: tuple[str, ...]
    rows: dict[str, dict[str, str]] = field(default_factory=dict)  # op -> dtype -> path
    # dtypes no device of the backend computes in: every op in them ends on the CPU fallback, even where
    # the dispatcher first decomposes it (its parts then fall back), so they are marked F
    host_dtypes: tuple[str, ...] = ()

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for per_dtype in self.rows.values():
            for path in per_dtype.values():
                out[path] = out.get(path, 0) + 1
        return out

    def filter(self, text: str = "", path: str | None = None) -> dict[str, dict[str, str]]:
        """Rows whose op name contains `text` and (if given) that take `path` in some dtype the device
        computes in (in the others every op falls back)."""
        t = text.lower()
        return {op: r for op, r in self.rows.items()
                if t in op.lower() and (path is None or path in [v for d, v in r.items() if d not in self.host_dtypes])}

    def to_dict(self) -> dict:
        return {"backend": self.backend, "dtypes": list(self.dtypes), "rows": self.rows, "counts": self.counts()}

    def to_json(self, **kw) -> str:
        return json.dumps(self.to_dict(), **kw)

    def render(self, text: str = "", path: str | None = None, limit: int = 40) -> str:
        rows = self.filter(text, path)
        w = max([len(op) for op in rows] + [10])
        lines = [f"{self.backend}: {len(self.rows)} ops; N native, D decomposition, J jit, F CPU fallback, - none, "
                 ". not defined by PyTorch for the dtype"
                 + (f" (the device has no {', '.join(self.host_dtypes)}: F throughout)" if self.host_dtypes else ""),
                 f"{'op':<{w}}  " + " ".join(f"{d:>8}" for d in self.dtypes)]
        for op, r in list(rows.items())[:limit]:
            lines.append(f"{op:<{w}}  " + " ".join(f"{MARKS.get(r.get(d, 'none'), '?'):>8}" for d in self.dtypes))
        if len(rows) > limit:
            lines.append(f"... {len(rows) - limit} more")
        return "\n".join(lines)



def all_kernel_ops(backend=None) -> list[str]:
    """The ops a coverage table lists: every op the bundled host plugin or an emulator has a kernel for, and
    `backend`'s own. Not other real devices' plugins: whether this machine has an OpenCL driver (or a vendor's
    plugin) must not change the table of another backend."""
    REGISTRY.discover()
    ops: set[str] = set()
    for b in REGISTRY.backends.values():
        if b.name == "cpu" or b.plugin.emulated or b is backend:
            ops.update(b.plugin.kernels)
    return sorted(ops)


def coverage(backend: str | None = None, ops: list[str] | None = None,
             dtypes: tuple[str, ...] = DTYPES) -> Coverage:
    """The dispatcher's plan for each op and dtype on a backend (default: current)."""
    from .dispatch import facts, resolve, resolve_op
    from .runtime import mask_to_names

    b = REGISTRY.get(backend) if backend else REGISTRY.ensure()
    computed = {n for d in b.devices for n in mask_to_names(d.props.dtypes)}
    out = Coverage(b.name, tuple(dtypes), host_dtypes=tuple(d for d in dtypes if d not in computed))
    for name in ops or all_kernel_ops(b):
        try:
            f = facts(resolve_op(name))
        except (ValueError, RuntimeError):
            continue
        row = {}
        defined = pytorch_dtypes(f.name)
        for d in dtypes:
            dt = getattr(torch, d)
            if defined is not None and dt not in defined:
                row[d] = UNDEFINED
                continue
            plan = b.plans.get((f.func, (dt,))) or resolve(f, b, (dt,))
            row[d] = "view" if f.is_view else "fallback" if d in out.host_dtypes else (plan.first or "none")
        out.rows[f.name] = row
    return out


@functools.lru_cache(maxsize=1)
def _opinfos() -> tuple[list, dict[str, set]]:
    """PyTorch's OpInfo database and, per OpInfo name, the dtypes its CPU kernels take (its test suite's
    record of what each op supports); empty where this PyTorch build ships no test utilities."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from torch.testing._internal.common_methods_invocations import op_db
    except Exception:  # noqa: BLE001 - a build without the test utilities: nothing is known, nothing marked
        return [], {}
    return op_db, {info.name: set(info.supported_dtypes("cpu")) for info in op_db}


@functools.cache
def pytorch_dtypes(op: str) -> frozenset | None:
    """The dtypes PyTorch defines `op` for on the CPU, from the OpInfos that exercise it (their union:
    aten::convolution is conv1d's, conv2d's and conv_transpose2d's); a backward op takes its forward's.
    None where no OpInfo covers the op: unknown, so the grid shows the dispatcher's plan. Why ask: a grid
    that says "decomposition" for a convolution of bools claims a path PyTorch itself does not have."""
    from .check.samples import base_name, candidate_opinfos

    op_db, by_name = _opinfos()
    if not by_name or not op.startswith("aten::"):
        return None
    infos = candidate_opinfos(op, op_db)
    stem = base_name(op).rstrip("_")
    if not infos and stem.endswith("_backward"):
        infos = candidate_opinfos("aten::" + stem[: -len("_backward")], op_db)
    if not infos:
        return None
    return frozenset().union(*(by_name[i.name] for i in infos))
