"""What fusion did to a model, per backend: plain data with renderings.

A `GraphReport` is one captured graph (one backend, one train/eval mode):
the patterns found (module path, what was replaced, what replaced it, or why
it was kept), the backend's performance hints, and, once `measure` has run,
kernel launches and time before vs after, in total and per pattern. A
`FusionReport` holds the graph reports of a compiled model."""

from __future__ import annotations

import html
import json
from dataclasses import asdict, dataclass, field

from .passes import Record


@dataclass
class PatternCost:
    kernels_before: int = 0
    kernels_after: int = 0
    seconds_before: float = 0.0
    seconds_after: float = 0.0


@dataclass
class Measurement:
    """Kernel launches (fl.profile's count) and best-of-n wall time of one call,
    unfused vs fused; `per_pattern` splits the forward by pattern."""

    workload: str  # "forward" or "forward+backward"
    kernels_before: int
    kernels_after: int
    seconds_before: float
    seconds_after: float
    per_pattern: dict[int, PatternCost] = field(default_factory=dict)
    fallbacks_before: int = 0  # op calls served by the CPU fallback
    fallbacks_after: int = 0

    @property
    def kernel_ratio(self) -> float:
        return self.kernels_after / self.kernels_before if self.kernels_before else 1.0


@dataclass
class GraphReport:
    backend: str
    training: bool
    passes: list[str]
    records: list[Record] = field(default_factory=list)
    hints: list[str] = field(default_factory=list)
    fallback: str | None = None  # why the model runs eagerly, when capture failed
    measurement: Measurement | None = None

    @property
    def mode(self) -> str:
        return "train" if self.training else "eval"

    @property
    def applied(self) -> list[Record]:
        return [r for r in self.records if r.applied]

    def counts(self) -> dict[str, int]:
        """Patterns rewritten, by kind."""
        out: dict[str, int] = {}
        for r in self.applied:
            out[r.pattern] = out.get(r.pattern, 0) + 1
        return out

    def to_dict(self) -> dict:
        d = asdict(self)
        for r in d["records"]:
            r["nodes"] = sorted(r["nodes"])
        return d

    def render(self) -> str:
        head = f"fusion on '{self.backend}' ({self.mode}), passes: {', '.join(self.passes) or 'none'}"
        if self.fallback:
            return f"{head}\n  capture failed, running eagerly: {self.fallback}"
        lines = [head]
        m = self.measurement
        if m is not None:
            lines.append(f"  {m.workload}: kernels {m.kernels_before} -> {m.kernels_after} "
                         f"({(1 - m.kernel_ratio) * 100:.0f}% fewer), time {m.seconds_before * 1e3:.2f} ms -> "
                         f"{m.seconds_after * 1e3:.2f} ms"
                         + (f", CPU fallbacks {m.fallbacks_before} -> {m.fallbacks_after}"
                            if m.fallbacks_before or m.fallbacks_after else ""))
        rows = [("pattern", "where", "replaced", "by", "kernels")]
        for i, r in enumerate(self.records):
            cost = m.per_pattern.get(i) if m is not None else None
            k = f"{cost.kernels_before} -> {cost.kernels_after}" if cost else ""
            by = r.replacement if r.applied else f"kept: {r.note or r.replacement}"
            rows.append((r.pattern, _short(r.path, 40), _short(" + ".join(r.replaced), 36), _short(by, 60), k))
        if len(rows) > 1:
            widths = [max(len(row[c]) for row in rows) for c in range(5)]
            for row in rows:
                lines.append("  " + "  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())
        else:
            lines.append("  no pattern found")
        for h in self.hints:
            lines.append(f"  {h}")
        return "\n".join(lines)

    __str__ = render


def _short(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 3] + "..."


class FusionReport:
    """Every graph a compiled model captured, with what fusion did in each."""

    def __init__(self) -> None:
        self.graphs: list[GraphReport] = []

    def latest(self, backend: str | None = None, training: bool | None = None) -> GraphReport | None:
        for g in reversed(self.graphs):
            if (backend is None or g.backend == backend) and (training is None or g.training == training):
                return g
        return None

    @property
    def records(self) -> list[Record]:
        g = self.latest()
        return g.records if g else []

    @property
    def hints(self) -> list[str]:
        return [h for g in self.graphs for h in g.hints]

    def rows(self) -> list[dict]:
        """One row per pattern and graph: the data behind table() and the figures."""
        out = []
        for g in self.graphs:
            m = g.measurement
            for i, r in enumerate(g.records):
                cost = m.per_pattern.get(i) if m else None
                out.append({"backend": g.backend, "mode": g.mode, "pattern": r.pattern, "path": r.path,
                            "replaced": r.replaced, "replacement": r.replacement, "applied": r.applied,
                            "note": r.note,
                            "kernels_before": cost.kernels_before if cost else None,
                            "kernels_after": cost.kernels_after if cost else None,
                            "ms_before": cost.seconds_before * 1e3 if cost else None,
                            "ms_after": cost.seconds_after * 1e3 if cost else None})
        return out

    def to_dict(self) -> dict:
        return {"graphs": [g.to_dict() for g in self.graphs]}

    def to_json(self, **kw) -> str:
        return json.dumps(self.to_dict(), **kw)

    def table(self) -> str:
        return "\n\n".join(g.render() for g in self.graphs) or "no graph captured yet (call the model once)"

    render = table
    __str__ = table

    def __repr__(self) -> str:
        return f"<FusionReport: {len(self.graphs)} graph(s), {sum(len(g.applied) for g in self.graphs)} fusions>"

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict:
        return {"text/plain": self.table(), "text/html": "<pre>" + html.escape(self.table()) + "</pre>"}
