"""What backend="fl" did to a model: plain data with renderings.

Dynamo hands the backend one graph per compiled frame (a graph break ends one
and starts another; a failed guard compiles the frame again). AOTAutograd turns
each into aten graphs: a forward and a backward graph when a gradient is
needed, one inference graph otherwise. The report follows that shape: per
Dynamo graph, its aten graphs, each with the patterns the passes found (where,
which ops, what replaced them, or why they were kept). `measure` adds kernel
launches and time of the same call eager vs compiled.

Graphs are recorded per process as they are compiled (`GRAPHS`); a report for
one model is the subset whose frames belong to it (`FusionReport.of`)."""

from __future__ import annotations

import inspect
import json
import os
import sys
import types
import weakref
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch

from ..rendering import Report


@dataclass
class Pattern:
    """One match: what it was, in which graph, where, what replaced it (or why it was kept)."""

    pattern: str
    graph: str  # "captured" (Dynamo's graph), "forward", "backward" or "inference"
    where: str  # the module path (nn_module_stack) or the node name
    replaced: list[str]
    replacement: str
    applied: bool = True
    note: str = ""


@dataclass
class AtenGraph:
    """One graph the passes ran on ("captured": Dynamo's, before AOTAutograd), op counts before and after."""

    kind: str
    ops_before: int
    ops_after: int
    patterns: list[Pattern] = field(default_factory=list)


@dataclass
class DynamoGraph:
    """One graph Dynamo handed to the backend (one frame, one compilation of it)."""

    compile_id: str  # Dynamo's "frame/attempt": an attempt above 0 is a recompilation
    frame: str
    filename: str
    backend: str
    passes: list[str]
    graph_break: str | None  # Dynamo's reason when this graph ended at a graph break
    dynamic: bool = False  # compiled with symbolic sizes: new lengths reuse it instead of recompiling
    aten_graphs: list[AtenGraph] = field(default_factory=list)
    modules: list = field(default_factory=list, repr=False)  # weak references to the nn.Modules of the frame
    replay: Any = None  # compile.replay.ReplayStatus (None with options={"replay": False}): replayed, or why not
    runtime: Any = None  # compile.lean.LeanPlan (None with options={"lean": False}): which runtime calls the graphs

    @property
    def frame_id(self) -> str:
        return self.compile_id.split("/")[0]

    @property
    def attempt(self) -> int:
        tail = self.compile_id.split("/")[-1]
        return int(tail) if tail.isdigit() else 0


@dataclass(repr=True)
class Measurement(Report):
    """Kernel launches (fl.profile's count), CPU-fallback calls and best-of-n wall
    time of one call, eager (`before`) vs compiled (`after`), on one backend."""

    backend: str
    workload: str  # "forward" or "forward+backward"
    kernels_before: int
    kernels_after: int
    seconds_before: float
    seconds_after: float
    fallbacks_before: int = 0
    fallbacks_after: int = 0

    @property
    def kernel_ratio(self) -> float:
        return self.kernels_after / self.kernels_before if self.kernels_before else 1.0

    def render(self) -> str:
        fb = (
            f", CPU fallbacks {self.fallbacks_before} -> {self.fallbacks_after}"
            if self.fallbacks_before or self.fallbacks_after
            else ""
        )
        return (
            f"{self.workload} on '{self.backend}': kernels {self.kernels_before} -> {self.kernels_after} "
            f"({(1 - self.kernel_ratio) * 100:.0f}% fewer), time {self.seconds_before * 1e3:.2f} ms -> "
            f"{self.seconds_after * 1e3:.2f} ms{fb}"
        )


GRAPHS: list[DynamoGraph] = []  # every graph compiled with backend="fl" in this process
_MEASURED: list[tuple[weakref.ref, Measurement]] = []  # (model, measurement) from measure()


def add_measurement(model: Any, m: Measurement) -> None:
    _MEASURED.append((weakref.ref(model), m))


_GAVE_UP_BEFORE: dict[str, int] = {}  # Dynamo's give-up counts at the last forget(): the report names later ones


def forget() -> None:
    GRAPHS.clear()
    _MEASURED.clear()
    _GAVE_UP_BEFORE.clear()
    _GAVE_UP_BEFORE.update(_gave_up_counts())


def _gave_up_counts() -> dict[str, int]:
    from torch._dynamo.utils import counters

    return dict(counters["unimplemented"])


def gave_up() -> list[str]:
    """Why Dynamo ran frames eagerly, capturing no graph (its "unimplemented" counter: an nn.LSTM without
    allow_rnn, ...), since the last forget(), process-wide: what a report with no graph can say instead of
    nothing. Each reason's first line, with its first hint."""
    out = []
    for key, n in _gave_up_counts().items():
        if n <= _GAVE_UP_BEFORE.get(key, 0):
            continue
        lines = [ln.strip() for ln in str(key).splitlines() if ln.strip()]
        hint = next((ln for ln in lines if ln.startswith("Hint:")), None)
        out.append(lines[0] + (f" ({hint})" if hint else "") if lines else str(key))
    return out


def frame_modules() -> list:
    """Weak references to the nn.Modules among the locals of the frame Dynamo is
    compiling (`self` of a forward, `fn` of torch.compile's module wrapper): how a
    graph is tied to the model it came from. Read from Dynamo's `_compile` frame on
    the call stack; an empty list where a future Dynamo names it differently."""
    f: types.FrameType | None = sys._getframe(1)
    while f is not None:
        frame = f.f_locals.get("frame") if f.f_code.co_name == "_compile" else None
        if frame is not None and hasattr(frame, "f_locals"):
            return [weakref.ref(v) for v in frame.f_locals.values() if isinstance(v, torch.nn.Module)]
        f = f.f_back
    return []


@dataclass
class FusionReport(Report):
    """Dynamo graphs of a model compiled with backend="fl", their aten graphs'
    patterns, and the measurements `measure` took of it."""

    graphs: list[DynamoGraph] = field(default_factory=list)
    measurements: list[Measurement] = field(default_factory=list)

    @classmethod
    def of(cls, compiled: Any) -> FusionReport:
        """The graphs Dynamo compiled from frames of the model (the torch.compile
        result or the model itself) or of any of its submodules; for a compiled
        function, the graphs from its source file."""
        target = getattr(compiled, "_orig_mod", compiled)
        if isinstance(target, torch.nn.Module):
            ids = {id(m) for m in target.modules()}
            graphs = [g for g in GRAPHS if any(r() is not None and id(r()) in ids for r in g.modules)]
            return cls(graphs, [m for r, m in _MEASURED if r() is target])
        code = getattr(inspect.unwrap(target), "__code__", None)
        filename = os.path.realpath(code.co_filename) if code is not None else None
        return cls(
            [g for g in GRAPHS if g.filename and os.path.realpath(g.filename) == filename],
            [m for r, m in _MEASURED if r() is target],
        )

    @property
    def graph_count(self) -> int:
        return len(self.graphs)

    @property
    def graph_breaks(self) -> list[str]:
        return [g.graph_break for g in self.graphs if g.graph_break]

    @property
    def recompilations(self) -> int:
        """Graphs compiled again for a frame this report already has (a guard failed: new shapes, dtypes, ...)."""
        first: dict[str, int] = {}
        for g in self.graphs:
            first[g.frame_id] = min(first.get(g.frame_id, g.attempt), g.attempt)
        return len({g.compile_id for g in self.graphs if g.attempt > first[g.frame_id]})

    @property
    def dynamic(self) -> bool:
        """Whether any graph was compiled with symbolic sizes (Dynamo does so after a size changes once)."""
        return any(g.dynamic for g in self.graphs)

    def patterns(self, applied: bool | None = True) -> list[Pattern]:
        """Every pattern of every graph (applied ones by default; None: all; False: the kept ones)."""
        return [
            p for g in self.graphs for a in g.aten_graphs for p in a.patterns if applied is None or p.applied == applied
        ]

    def counts(self) -> dict[str, int]:
        """Applied patterns by kind."""
        out: dict[str, int] = {}
        for p in self.patterns():
            out[p.pattern] = out.get(p.pattern, 0) + 1
        return out

    def rows(self) -> list[dict]:
        """One row per pattern: the data behind the table and the figures."""
        return [
            {"compile_id": g.compile_id, "backend": g.backend, **asdict(p)}
            for g in self.graphs
            for a in g.aten_graphs
            for p in a.patterns
        ]

    def to_dict(self) -> dict:
        graphs = []
        for g in self.graphs:
            d = asdict(replace(g, modules=[], runtime=None))  # a LeanPlan holds compiled callables: its line instead
            d.pop("modules")
            d["runtime"] = g.runtime.describe() if g.runtime is not None else None
            graphs.append(d)
        return {
            "graph_count": self.graph_count,
            "graph_breaks": self.graph_breaks,
            "recompilations": self.recompilations,
            "dynamic": self.dynamic,
            "graphs": graphs,
            "measurements": [asdict(m) for m in self.measurements],
        }

    def to_json(self, **kw: Any) -> str:
        return json.dumps(self.to_dict(), **kw)

    def table(self) -> str:
        if not self.graphs:
            reasons = gave_up()
            if not reasons:
                return "backend='fl': no graph compiled yet (call the compiled model once)"
            return "\n".join(
                [
                    "backend='fl': no graph compiled from this model: not called yet, or Dynamo ran it eagerly.",
                    "Dynamo captured no graph from frame(s) of this process (any model's, since it started or "
                    "torch_fl.compile.reset()), because:",
                    *(f"  - {r}" for r in reasons),
                ]
            )
        lines = [
            f"backend='fl': {self.graph_count} graph(s), {len(self.graph_breaks)} graph break(s), "
            f"{self.recompilations} recompilation(s)" + (", dynamic shapes" if self.dynamic else "")
        ]
        for m in self.measurements:
            lines.append("  " + m.render())
        for g in self.graphs:
            lines.append(
                f"graph {g.compile_id} ({g.frame}) on '{g.backend}'"
                + (", dynamic shapes" if g.dynamic else "")
                + (f", ended by a graph break: {g.graph_break.splitlines()[0]}" if g.graph_break else "")
            )
            for a in g.aten_graphs:
                lines.append(f"  {a.kind}: {a.ops_before} -> {a.ops_after} ops")
                for p in a.patterns:
                    mark = "fused" if p.applied else "kept "
                    lines.append(
                        f"    {mark} {p.pattern} at {p.where}: {' + '.join(p.replaced)} -> {p.replacement}"
                        + (f" ({p.note})" if p.note else "")
                    )
            if g.replay is not None:
                lines.append(f"  replay: {g.replay}")
            if g.runtime is not None:
                lines.append(f"  runtime: {g.runtime.describe()}")
        return "\n".join(lines)

    def render(self) -> str:
        return self.table()
