"""`with torch_fl.profile() as prof:` — what each op cost and which path it took.

The dispatcher reports every op call to listeners (torch_fl/runtime/events.py); with
no listener it only bumps a per-(op, path) counter, so an idle profiler costs
nothing (bench/bench_profiler.py measures both). A profile keeps the events
of its block and derives the views the Torch-FL article asks for: per-op totals with
the path taken and the kernel launches it cost (a decomposition into six
kernels counts six), the ops that fell back to the CPU and what they cost in
time and copied bytes, time by path, device memory, a side-by-side
comparison of two runs, and a Chrome trace that chrome://tracing, Perfetto
and torch.profiler's viewers open. `measure_compiled` (fl.measure_compiled)
counts one call of a compiled model eager vs compiled the same way and keeps
the result in the model's fusion report."""

from __future__ import annotations

import contextlib
import html
import json
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from .. import dispatch
from ..compile import Measurement, add_measurement, disabled
from ..errors import FlError
from ..placement import placed, used_slots
from ..rendering import Report
from ..runtime import FALLBACK, REGISTRY, DeviceClock, FlDeviceModule, OpEvent, events, using_backend


@dataclass
class OpStats:
    """One op (aten overload) on one backend, over a profile. Calls made by
    the user's code (depth 0) are counted in `calls`; the same op reached
    inside another op's decomposition is counted in `nested_calls`.

    Both times cover every call, at any depth, so self time never exceeds
    total time: `total_s` is inclusive (a call inside another call of the
    same op is not counted twice), `self_s` excludes the sub-ops."""

    op: str
    backend: str
    calls: int = 0
    nested_calls: int = 0
    total_s: float = 0.0  # inclusive time of every call not inside a call of the same op
    self_s: float = 0.0  # time not spent in sub-ops, at any depth
    kernels: int = 0  # kernel launches of the depth-0 calls, their sub-ops included
    bytes_copied: int = 0
    paths: dict[str, int] = field(default_factory=dict)
    comm_bytes: int = 0  # collectives (torch_fl.distributed): message bytes on this rank
    timed_calls: int = 0  # the calls total_s covers

    @property
    def is_collective(self) -> bool:
        return any(p.startswith("comm-") for p in self.paths)

    @property
    def mean_us(self) -> float:
        return self.total_s / self.timed_calls * 1e6 if self.timed_calls else 0.0

    @property
    def calls_text(self) -> str:
        """`calls` for a table: "2+5" when 5 more calls came from inside other ops."""
        return f"{self.calls}+{self.nested_calls}" if self.nested_calls else str(self.calls)

    @property
    def path(self) -> str:
        """The path most calls took (several when a kernel declines some calls)."""
        if not self.paths:
            return "-"
        ranked = sorted(self.paths.items(), key=lambda kv: -kv[1])
        return ranked[0][0] if len(ranked) == 1 else "/".join(p for p, _ in ranked)


@dataclass
class MemoryStats:
    device: str
    backend: str
    allocated_start: int
    allocated_end: int
    peak: int
    pool_hits: int
    pool_misses: int


class Profile(Report):
    """The result of a profiled block; plain data with views and renderings."""

    def __init__(self, events: list[OpEvent], wall_s: float, memory: list[MemoryStats], label: str = ""):
        self.events = events
        self.wall_s = wall_s
        self.memory = memory
        self.label = label
        self._ops: dict[tuple[str, str], OpStats] | None = None

    # -- views ------------------------------------------------------------------
    def ops(self) -> list[OpStats]:
        if self._ops is None:
            self._ops = _aggregate(self.events)
        return list(self._ops.values())

    def top(self, n: int = 20, by: str = "total_s") -> list[OpStats]:
        """The n ops that cost most (by total_s, self_s, calls, kernels or bytes_copied)."""
        key = by if by != "time" else "total_s"
        return sorted(self.ops(), key=lambda s: -getattr(s, key))[:n]

    def fallbacks(self) -> list[OpStats]:
        """Ops that ran on the CPU fallback (at any depth), costliest first."""
        return sorted((s for s in self.ops() if s.paths.get(FALLBACK)), key=lambda s: -s.self_s)

    def time_by_path(self) -> dict[str, float]:
        """Self time per path: where the block's time went."""
        out: dict[str, float] = {}
        for s in self.ops():
            share = sum(s.paths.values()) or 1
            for p, n in s.paths.items():
                out[p] = out.get(p, 0.0) + s.self_s * n / share
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))

    @property
    def kernels(self) -> int:
        return sum(e.kernels for e in self.events if e.depth == 0)

    @property
    def bytes_copied(self) -> int:
        return sum(e.bytes_copied for e in self.events if e.depth == 0)

    @property
    def op_calls(self) -> int:
        return sum(1 for e in self.events if e.depth == 0)

    def collectives(self) -> list[OpStats]:
        """torch.distributed collectives on the fl process group (c10d::all_reduce,
        ...), costliest first: calls, the path (comm-plugin, comm-relay,
        comm-gloo), message bytes (`comm_bytes`) and host<->device bytes the
        relay staged (`bytes_copied`)."""
        return sorted((s for s in self.ops() if s.is_collective), key=lambda s: -s.total_s)

    @property
    def comm_bytes(self) -> int:
        return sum(getattr(e, "comm_bytes", 0) for e in self.events if e.depth == 0)

    def collectives_table(self) -> str:
        rows = self.collectives()
        w = max([len(s.op) for s in rows] + [10])
        lines = [
            f"{'collective':<{w}}  {'backend':<8} {'path':<11} {'calls':>6} {'total ms':>9} {'bytes':>10} "
            f"{'staged':>10}"
        ]
        for s in rows:
            lines.append(
                f"{s.op:<{w}}  {s.backend:<8} {s.path:<11} {s.calls:>6} {s.total_s * 1e3:>9.3f} "
                f"{_fmt_bytes(s.comm_bytes):>10} {_fmt_bytes(s.bytes_copied):>10}"
            )
        return "\n".join(lines)

    def compare(self, other: Profile, names: tuple[str, str] | None = None) -> Comparison:
        return Comparison(self, other, names or (self.label or "a", other.label or "b"))

    # -- export -----------------------------------------------------------------
    def to_dict(self) -> dict:
        return {
            "label": self.label,
            "wall_s": self.wall_s,
            "op_calls": self.op_calls,
            "kernels": self.kernels,
            "bytes_copied": self.bytes_copied,
            "comm_bytes": self.comm_bytes,
            "time_by_path": self.time_by_path(),
            "ops": [dict(asdict(s), mean_us=s.mean_us, path=s.path) for s in self.top(len(self.ops()))],
            "memory": [asdict(m) for m in self.memory],
        }

    def to_json(self, **kw: Any) -> str:
        return json.dumps(self.to_dict(), **kw)

    def chrome_trace(self) -> dict:
        """torch.profiler's trace format: complete events ("ph": "X") in microseconds."""
        if not self.events:
            return {"traceEvents": [], "displayTimeUnit": "ms"}
        t0 = min(e.start for e in self.events)
        out = []
        for e in self.events:
            out.append(
                {
                    "name": e.op,
                    "cat": e.path,
                    "ph": "X",
                    "ts": (e.start - t0) * 1e6,
                    "dur": e.seconds * 1e6,
                    "pid": f"fl {e.backend}",
                    "tid": 0,
                    "args": {"path": e.path, "kernels": e.kernels, "bytes_copied": e.bytes_copied, "depth": e.depth},
                }
            )
        return {"traceEvents": out, "displayTimeUnit": "ms"}

    def export_chrome_trace(self, path: str) -> str:
        with open(path, "w") as f:
            json.dump(self.chrome_trace(), f)
        return path

    # -- rendering --------------------------------------------------------------
    def table(self, n: int = 20, by: str = "total_s") -> str:
        rows = self.top(n, by)
        w = max([len(s.op) for s in rows] + [10])
        pw = max([len(s.path) for s in rows] + [14])
        lines = [
            f"{'op':<{w}}  {'backend':<8} {'path':<{pw}} {'calls':>9} {'total ms':>9} {'mean us':>9} "
            f"{'self ms':>8} {'kernels':>7} {'copied':>10}"
        ]
        for s in rows:
            lines.append(
                f"{s.op:<{w}}  {s.backend:<8} {s.path:<{pw}} {s.calls_text:>9} {s.total_s * 1e3:>9.3f} "
                f"{s.mean_us:>9.1f} {s.self_s * 1e3:>8.3f} {s.kernels:>7} {_fmt_bytes(s.bytes_copied):>10}"
            )
        return "\n".join(lines)

    def render(self, n: int = 20) -> str:
        head = (
            f"fl profile{' ' + self.label if self.label else ''}: {self.op_calls} op calls, {self.kernels} kernel "
            f"launches, {_fmt_bytes(self.bytes_copied)} copied host<->device, {self.wall_s * 1e3:.1f} ms wall"
        )
        paths = ", ".join(f"{p} {t * 1e3:.1f} ms" for p, t in self.time_by_path().items())
        lines = [head, f"time by path: {paths or '-'}", self.table(n)]
        fb = self.fallbacks()
        if fb:
            lines.append(
                "CPU fallbacks: "
                + ", ".join(
                    f"{s.op} ({sum(s.paths.values())} calls, {s.self_s * 1e3:.2f} ms, {_fmt_bytes(s.bytes_copied)})"
                    for s in fb[:10]
                )
            )
        coll = self.collectives()
        if coll:
            lines.append(
                "collectives: "
                + ", ".join(
                    f"{s.op} ({s.calls} calls, {s.path}, {_fmt_bytes(s.comm_bytes)}, {s.total_s * 1e3:.2f} ms)"
                    for s in coll[:10]
                )
            )
        for m in self.memory:
            lines.append(
                f"memory {m.device} ({m.backend}): {_fmt_bytes(m.allocated_start)} -> "
                f"{_fmt_bytes(m.allocated_end)}, peak {_fmt_bytes(m.peak)}, pool hits {m.pool_hits}, "
                f"misses {m.pool_misses}"
            )
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<fl Profile {self.label or ''} {self.op_calls} calls, {self.kernels} kernels>"

    def html(self, n: int = 20) -> str:
        """The head line and the n costliest ops as an HTML table."""
        rows = "".join(
            f"<tr><td>{html.escape(s.op)}</td><td>{s.backend}</td><td>{s.path}</td><td>{s.calls}</td>"
            f"<td>{s.total_s * 1e3:.3f}</td><td>{s.mean_us:.1f}</td><td>{s.kernels}</td>"
            f"<td>{_fmt_bytes(s.bytes_copied)}</td></tr>"
            for s in self.top(n)
        )
        head = html.escape(self.render(0).split("\n")[0])
        return (
            f"<b>{head}</b><table><tr><th>op</th><th>backend</th><th>path</th><th>calls</th>"
            f"<th>total ms</th><th>mean us</th><th>kernels</th><th>copied</th></tr>{rows}</table>"
        )


class Comparison(Report):
    """The same workload on two backends, op by op: calls, kernels and time."""

    def __init__(self, a: Profile, b: Profile, names: tuple[str, str], unfused: Comparison | None = None):
        self.a, self.b, self.names = a, b, names
        self.unfused = unfused  # the workload run eagerly (compilation off): compare_backends(fusion=True)

    def rows(self) -> list[dict]:
        ops_a = {s.op: s for s in _merge_backends(self.a.ops())}
        ops_b = {s.op: s for s in _merge_backends(self.b.ops())}
        out = []
        for op in sorted(set(ops_a) | set(ops_b)):
            sa, sb = ops_a.get(op), ops_b.get(op)
            out.append(
                {
                    "op": op,
                    "calls": (sa.calls if sa else 0, sb.calls if sb else 0),
                    "path": (sa.path if sa else "-", sb.path if sb else "-"),
                    "kernels": (sa.kernels if sa else 0, sb.kernels if sb else 0),
                    "ms": ((sa.total_s if sa else 0.0) * 1e3, (sb.total_s if sb else 0.0) * 1e3),
                }
            )
        return sorted(out, key=lambda r: -max(r["ms"]))

    def to_dict(self) -> dict:
        out = {
            "names": list(self.names),
            "kernels": [self.a.kernels, self.b.kernels],
            "wall_s": [self.a.wall_s, self.b.wall_s],
            "rows": self.rows(),
        }
        if self.unfused is not None:
            out["kernels_unfused"] = [self.unfused.a.kernels, self.unfused.b.kernels]
            out["wall_s_unfused"] = [self.unfused.a.wall_s, self.unfused.b.wall_s]
        return out

    def render(self, n: int = 25) -> str:
        a, b = self.names
        rows = self.rows()[:n]
        w = max([len(r["op"]) for r in rows] + [10])
        # every number column is named after its backend: "kernels rocm", "ms minimal"
        longest = max(len(a), len(b))
        pw = max(16, 5 + longest)
        kw, mw = 8 + longest, max(9, 3 + longest)
        lines = [
            f"{a} vs {b}: kernels {self.a.kernels} vs {self.b.kernels}, wall {self.a.wall_s * 1e3:.1f} ms vs "
            f"{self.b.wall_s * 1e3:.1f} ms",
            *(
                [
                    f"{a} vs {b} without fusion {self.unfused.a.kernels} vs {self.unfused.b.kernels} kernels, "
                    f"with fusion {self.a.kernels} vs {self.b.kernels}"
                ]
                if self.unfused is not None
                else []
            ),
            f"{'op':<{w}}  {'path ' + a:<{pw}} {'path ' + b:<{pw}} {'kernels ' + a:>{kw}} "
            f"{'kernels ' + b:>{kw}} {'ms ' + a:>{mw}} {'ms ' + b:>{mw}}",
        ]
        for r in rows:
            lines.append(
                f"{r['op']:<{w}}  {r['path'][0]:<{pw}} {r['path'][1]:<{pw}} "
                f"{r['kernels'][0]:>{kw}} {r['kernels'][1]:>{kw}} {r['ms'][0]:>{mw}.3f} {r['ms'][1]:>{mw}.3f}"
            )
        return "\n".join(lines)

    def html(self, n: int = 25) -> str:
        """The head lines and the n costliest ops as an HTML table, a column pair per quantity (the text
        form wraps every row in a notebook's output area)."""
        a, b = (html.escape(x) for x in self.names)
        head = "<br>".join(html.escape(line) for line in self.render(0).split("\n")[:-1])
        rows = "".join(
            f"<tr><td>{html.escape(r['op'])}</td><td>{r['path'][0]}</td><td>{r['path'][1]}</td>"
            f"<td>{r['kernels'][0]}</td><td>{r['kernels'][1]}</td><td>{r['ms'][0]:.3f}</td><td>{r['ms'][1]:.3f}</td></tr>"
            for r in self.rows()[:n]
        )
        return (
            f"<b>{head}</b><table><tr><th>op</th><th>path {a}</th><th>path {b}</th><th>kernels {a}</th>"
            f"<th>kernels {b}</th><th>ms {a}</th><th>ms {b}</th></tr>{rows}</table>"
        )


# -- recording -------------------------------------------------------------------


class profile:  # noqa: N801 - used as `with fl.profile() as prof`, like torch.profiler.profile
    """Records every fl op in the block; `prof` is the Profile afterwards.

    record_functions=True also opens a torch.profiler range per fl op
    ("fl::aten::mm [native]"), so a surrounding torch.profiler.profile shows
    torch_fl's paths in its own trace."""

    def __init__(self, label: str = "", record_functions: bool = False):
        self.label = label
        self.record_functions = record_functions
        self.result: Profile | None = None
        self._events: list[OpEvent] = []

    def _listen(self, event: OpEvent) -> None:
        self._events.append(event)

    def __enter__(self) -> Profile:
        FlDeviceModule.synchronize() if REGISTRY.current is not None else None
        self._mem0 = {d.index: (d.allocated, d.pool_hits, d.pool_misses) for d in REGISTRY.devices}
        self._peak0 = {d.index: d.peak for d in REGISTRY.devices}
        for d in REGISTRY.devices:
            d.peak = d.allocated
        self._ctx = contextlib.ExitStack()
        if self.record_functions:
            self._ctx.enter_context(_record_function_ranges())
        events.add_listener(self._listen)
        # an asynchronous device's ops are timed on the device (runtime/clock.py), not by the host clock
        dev = REGISTRY.current_device if REGISTRY.current is not None else None
        self._clock = DeviceClock(dev) if dev is not None and dev.props.async_kernels else None
        self._outer_clock = events.STATE.device_clock
        if self._clock is not None:
            events.STATE.device_clock = self._clock.mark
        self._t0 = time.perf_counter()
        self.result = Profile(self._events, 0.0, [], self.label)
        return self.result

    def __exit__(self, *exc: object) -> None:
        for d in REGISTRY.devices:
            try:
                d.plugin.table.synchronize(d.local) if d.plugin.optional.get("synchronize") else None
            except Exception:  # noqa: BLE001 - a profile must not mask the block's own error
                pass
        wall = time.perf_counter() - self._t0
        events.remove_listener(self._listen)
        events.STATE.device_clock = self._outer_clock
        if self._clock is not None:
            self._clock.resolve(self._events)
        self._ctx.close()
        memory = []
        used = {e.backend for e in self._events}
        for d in REGISTRY.devices:
            a0, h0, m0 = self._mem0.get(d.index, (0, 0, 0))
            if d.backend.name in used or d.allocated != a0:
                memory.append(
                    MemoryStats(
                        str(d.torch_device),
                        d.backend.name,
                        a0,
                        d.allocated,
                        d.peak,
                        d.pool_hits - h0,
                        d.pool_misses - m0,
                    )
                )
            d.peak = max(d.peak, self._peak0.get(d.index, 0))
        assert self.result is not None
        self.result.wall_s = wall
        self.result.memory = memory


def compare_backends(
    fn: Callable[[], object],
    a: str,
    b: str,
    *,
    warmup: int = 1,
    fusion: bool = False,
    namespace: dict | None = None,
    names: Iterable[str] = (),
) -> Comparison:
    """Runs fn on backend a, then on b (each after `warmup` unprofiled runs), and compares them op by op.

    The fl tensors, modules and optimizers fn uses from outside (its closure and the globals it names; for
    code that is not a Python function, such as a notebook cell, `names` looked up in `namespace`) are
    moved to each backend for its run and put back afterwards, so each column is what ran on that backend.
    An op that still ran elsewhere (a tensor fn reaches another way, inside a list say), or a run in which
    no op ran on its backend, is an error naming where the ops ran, never a table.

    fusion=True also runs fn with compilation switched off (torch.compile'd and
    fl.compile'd code inside fn runs eagerly): `.unfused` holds that
    comparison, and the kernel counts with and without fusion are shown."""
    runs: dict[bool, list[Profile]] = {True: [], False: []}
    modes = (True, False) if fusion else (True,)
    with placed(used_slots(fn, namespace, names)) as place:
        for name in (a, b):
            with using_backend(name):
                place(REGISTRY.device(None).torch_device)
                for fused in modes:
                    with contextlib.nullcontext() if fused else disabled():
                        for _ in range(warmup):
                            fn()
                        with profile(label=name) as p:
                            fn()
                    _check_ran_on(p, name)
                    runs[fused].append(p)
    unfused = Comparison(runs[False][0], runs[False][1], (a, b)) if fusion else None
    return Comparison(runs[True][0], runs[True][1], (a, b), unfused)


def _check_ran_on(p: Profile, name: str) -> None:
    """A comparison column must hold what ran on its backend."""
    where: dict[str, int] = {}
    for s in p.ops():
        where[s.backend] = where.get(s.backend, 0) + s.calls + s.nested_calls
    elsewhere = {k: v for k, v in where.items() if k != name}
    if elsewhere or not where:
        ran = ", ".join(f"{n} calls on {k}" for k, n in sorted(where.items())) or "no fl op at all"
        raise FlError(
            f"compare_backends: the run on '{name}' is not a run on {name}: {ran}. The workload reaches fl tensors "
            f"that live on another backend in a way the comparison cannot move (inside a list, a dict or an "
            f"object's attribute), or makes none. Name the model, optimizer and inputs directly in the function "
            f"(lambda: model(x).sum().backward()), or make them inside it"
        )


@contextlib.contextmanager
def _record_function_ranges() -> Iterator[None]:
    original = dispatch.dispatch

    def ranged(func: Any, args: Any, kwargs: Any) -> Any:
        with torch.profiler.record_function(f"fl::{dispatch.op_name(func)}"):
            return original(func, args, kwargs)

    dispatch.set_dispatch(ranged)
    try:
        yield
    finally:
        dispatch.set_dispatch(None)


# -- eager vs compiled ------------------------------------------------------------


def _sync() -> None:
    if REGISTRY.current is not None:
        FlDeviceModule.synchronize()


def _call(fn: Callable, args: tuple, kwargs: dict, params: list, backward: bool) -> Any:
    """One call; with backward, a training step as PyTorch's default loop runs it: gradients set to None
    first (optimizer.zero_grad()), so backward writes them instead of adding into the last step's."""
    if backward:
        for p in params:
            p.grad = None
    out = fn(*args, **kwargs)
    if backward:
        outs = [o for o in _tensors(out) if o.requires_grad]
        if outs:
            total = sum(o.float().sum() for o in outs)
            assert isinstance(total, torch.Tensor), "a sum of one or more tensors"
            total.backward()
    return out


def _tensors(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, Mapping):
        return [t for v in out.values() for t in _tensors(v)]
    if isinstance(out, (tuple, list)):
        return [t for v in out for t in _tensors(v)]
    return [t for v in getattr(out, "__dict__", {}).values() for t in _tensors(v)]  # ModelOutput-like


def _compiled_cost(
    fn: Callable, args: tuple, kwargs: dict, params: list, backward: bool, repeat: int
) -> tuple[int, float, int]:
    grad = torch.enable_grad() if backward else torch.no_grad()
    with grad:
        _call(fn, args, kwargs, params, backward)  # warm-up: compilation, JIT kernels, folded weights, plans
        with profile() as p:
            _call(fn, args, kwargs, params, backward)
        best = float("inf")
        for _ in range(repeat):
            _sync()
            t0 = time.perf_counter()
            _call(fn, args, kwargs, params, backward)
            _sync()
            best = min(best, time.perf_counter() - t0)
    fallbacks = sum(s.paths.get("fallback", 0) for s in p.ops())
    return p.kernels, best, fallbacks


def measure_compiled(
    compiled: Callable, *args: Any, backward: bool | None = None, repeat: int = 3, **kwargs: Any
) -> Measurement:
    """Kernel launches (fl.profile's count), CPU-fallback calls and best-of-`repeat`
    time of one call, eager vs compiled, on the current backend. backward=True
    (default: when the model is in training mode) also runs backward of the
    outputs' sum, gradients reset first as zero_grad() does. Kept in the model's
    fusion report (`measurements`)."""
    model = getattr(compiled, "_orig_mod", compiled)
    params = list(model.parameters()) if isinstance(model, torch.nn.Module) else []
    if backward is None:
        backward = bool(getattr(model, "training", False)) and torch.is_grad_enabled()
    with disabled():
        before = _compiled_cost(compiled, args, kwargs, params, backward, repeat)
    after = _compiled_cost(compiled, args, kwargs, params, backward, repeat)
    name = REGISTRY.current.name if REGISTRY.current is not None else "native"
    m = Measurement(
        name,
        "forward+backward" if backward else "forward",
        before[0],
        after[0],
        before[1],
        after[1],
        before[2],
        after[2],
    )
    add_measurement(model, m)
    return m


# -- aggregation -----------------------------------------------------------------


@dataclass
class _Call:
    """One recorded op call with the calls made inside it."""

    event: OpEvent
    children: list  # its direct sub-ops: their time is not its self time
    orphans: list  # deeper calls whose own parent was not recorded: inside it, but not subtracted


def _call_tree(events: list[OpEvent]) -> list[_Call]:
    """Events arrive when ops end, so an op's sub-ops (depth + 1) precede it:
    rebuild the calls as trees, one per depth-0 call (plus any calls left
    without a parent, e.g. when the block raised inside an op)."""
    pending: dict[int, list[_Call]] = {}
    roots: list[_Call] = []
    for e in events:
        children = pending.pop(e.depth + 1, [])
        orphans = [c for d in sorted(d for d in pending if d > e.depth + 1) for c in pending.pop(d)]
        call = _Call(e, children, orphans)
        if e.depth == 0:
            roots.append(call)
        else:
            pending.setdefault(e.depth, []).append(call)
    return roots + [c for d in sorted(pending) for c in pending[d]]


def _aggregate(events: list[OpEvent]) -> dict[tuple[str, str], OpStats]:
    """Per (op, backend) totals over every call tree of the block."""
    stats: dict[tuple[str, str], OpStats] = {}
    for root in _call_tree(events):
        _account(root, stats, frozenset())
    return stats


def _account(call: _Call, stats: dict[tuple[str, str], OpStats], enclosing: frozenset) -> None:
    e = call.event
    key = (e.op, e.backend)
    s = stats.get(key)
    if s is None:
        s = stats[key] = OpStats(e.op, e.backend)
    s.self_s += max(e.seconds - sum(c.event.seconds for c in call.children), 0.0)
    s.paths[e.path] = s.paths.get(e.path, 0) + 1
    if key not in enclosing:  # a call inside a call of the same op is already in that one's time
        s.total_s += e.seconds
        s.timed_calls += 1
    if e.depth == 0:
        s.calls += 1
        s.kernels += e.kernels
        s.bytes_copied += e.bytes_copied
        s.comm_bytes += getattr(e, "comm_bytes", 0)
    else:
        s.nested_calls += 1
        if e.path == FALLBACK:
            s.bytes_copied += e.bytes_copied
    for sub in call.children + call.orphans:
        _account(sub, stats, enclosing | {key})


def _merge_backends(ops: list[OpStats]) -> list[OpStats]:
    merged: dict[str, OpStats] = {}
    for s in ops:
        m = merged.get(s.op)
        if m is None:
            merged[s.op] = OpStats(
                s.op,
                s.backend,
                s.calls,
                s.nested_calls,
                s.total_s,
                s.self_s,
                s.kernels,
                s.bytes_copied,
                dict(s.paths),
                s.comm_bytes,
                s.timed_calls,
            )
        else:
            m.calls += s.calls
            m.nested_calls += s.nested_calls
            m.total_s += s.total_s
            m.self_s += s.self_s
            m.kernels += s.kernels
            m.bytes_copied += s.bytes_copied
            m.comm_bytes += s.comm_bytes
            m.timed_calls += s.timed_calls
            for p, n in s.paths.items():
                m.paths[p] = m.paths.get(p, 0) + n
    return list(merged.values())


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"
