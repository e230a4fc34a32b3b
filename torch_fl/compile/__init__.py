"""`fl.compile(model)`: graph capture plus fusion passes chosen from the active
backend's capability table (the article's section 3.3: a model that runs at
half speed on a new chip usually lacks graph optimisation, not silicon).

    compiled = fl.compile(model)                 # every pass
    compiled = fl.compile(model, passes={"layout": False})
    out = compiled(x)                            # captured on first call, per backend and train/eval mode
    print(compiled.fusion_report)                # what was fused, where, and what replaced it
    compiled.measure(x)                          # kernels and time before vs after, per pattern

Passes (each switchable here or with FL_FUSION_DISABLE=name,name; FL_COMPILE=0
runs every compiled model eagerly): conv_bn, attention, qkv, add_norm, linear_act,
pointwise, layout.
A model that cannot be captured runs eagerly, with a warning that says why."""

from __future__ import annotations

import contextlib
import os
import time
import warnings
from collections.abc import Iterable, Mapping

import torch
import torch.fx as fx
from torch import nn

from ..runtime import REGISTRY, config, device_of, events, is_fl
from . import capture
from . import passes as _passes
from .passes import PASSES, Record
from .report import FusionReport, GraphReport, Measurement, PatternCost

__all__ = ["CompileWarning", "CompiledModel", "FusionReport", "GraphReport", "PASSES", "PerformanceHint", "compile",
           "disabled"]


_DISABLED = [0]


@contextlib.contextmanager
def disabled():
    """Inside the block every compiled model runs its original, unfused modules
    (what `%%fl_profile --fusion` and `compare_backends(..., fusion=True)` use
    to measure the same code with and without fusion)."""
    _DISABLED[0] += 1
    try:
        yield
    finally:
        _DISABLED[0] -= 1


class CompileWarning(UserWarning):
    """fl.compile could not capture a model (or run a pass) and fell back to eager code."""


class PerformanceHint(UserWarning):
    """The active backend lacks a kernel that would make a recognised pattern faster."""


def _enabled_passes(passes: Mapping[str, bool] | Iterable[str] | None) -> list[str]:
    names = list(PASSES)
    if passes is None:
        chosen = dict.fromkeys(names, True)
    elif isinstance(passes, Mapping):
        unknown = [p for p in passes if p not in PASSES]
        if unknown:
            raise ValueError(f"unknown fusion pass(es) {unknown}; the passes are {names}")
        chosen = {n: bool(passes.get(n, True)) for n in names}
    elif isinstance(passes, str):
        raise TypeError(f"passes={passes!r}: give a list of pass names or a dict {{name: bool}}, e.g. "
                        f"passes=[{passes!r}]")
    else:
        wanted = list(passes)
        unknown = [p for p in wanted if p not in PASSES]
        if unknown:
            raise ValueError(f"unknown fusion pass(es) {unknown}; the passes are {names}")
        chosen = {n: n in wanted for n in names}
    env = os.environ.get("FL_FUSION_DISABLE", "")
    for name in filter(None, (s.strip() for s in env.split(","))):
        if name not in PASSES:
            raise ValueError(f"FL_FUSION_DISABLE names an unknown pass {name!r}; the passes are {names}")
        chosen[name] = False
    return [n for n in names if chosen[n]]


def _backend_of(values) -> tuple[str, dict, int, bool]:
    """(name, kernels, device features, native) of the backend the call's tensors live on."""
    for v in values:
        if is_fl(v):
            dev = device_of(v)
            return dev.backend.name, dev.backend.plugin.kernels, dev.props.features, False
    # native PyTorch tensors: PyTorch's own SDPA kernels serve attention; no fused conv kernel
    return "native", dict.fromkeys(_passes.SDPA_KERNELS), 0, True


class _Entry:
    __slots__ = ("gm", "unfused", "report")

    def __init__(self, gm, unfused, report):
        self.gm, self.unfused, self.report = gm, unfused, report


class CompiledModel(nn.Module):
    """The user's model (as `.model`, parameters shared) run through captured,
    fused graphs: one per backend, train/eval state and call signature."""

    def __init__(self, model: nn.Module, passes: list[str], leaf_modules: tuple = ()):
        super().__init__()
        self.model = model
        self.passes = passes
        self.leaf_modules = tuple(leaf_modules)
        self.fusion_report = FusionReport()
        self._graphs: dict = {}

    # -- calling ---------------------------------------------------------------------
    def forward(self, *args, **kwargs):
        if _DISABLED[0] or not config.env_bool("FL_COMPILE", True):
            return self.model(*args, **kwargs)
        entry, tensors = self._entry(args, kwargs)
        if entry.gm is None:
            return self.model(*args, **kwargs)
        if entry.report.backend == "native":
            return entry.gm(*tensors)
        with _no_mha_fastpath():  # on fl that path is one fused CPU op: a CPU fallback, not device kernels
            return entry.gm(*tensors)

    def _entry(self, args, kwargs):
        try:
            names, values = capture.bind(self.model, args, kwargs)
        except TypeError as e:
            raise TypeError(f"fl.compile: {e}") from None
        tensors = [v for v in values if isinstance(v, torch.Tensor)]
        backend, kernels, features, native = _backend_of(tensors)
        modes = tuple(m.training for m in self.model.modules())
        sig = tuple(("T",) if isinstance(v, torch.Tensor) else (repr(v),) for v in values)
        key = (backend, modes, tuple(names), sig)
        entry = self._graphs.get(key)
        if entry is None:
            entry = self._graphs[key] = self._build(names, values, backend, kernels, features, native)
        return entry, tensors

    def _build(self, names, values, backend, kernels, features, native) -> _Entry:
        report = GraphReport(backend, self.model.training, list(self.passes))
        self.fusion_report.graphs.append(report)
        try:
            unfused = capture.capture(self.model, names, values, self.leaf_modules)
            gm = capture.capture(self.model, names, values, self.leaf_modules)
        except Exception as e:  # noqa: BLE001 - any capture failure means: run the model as it is
            report.fallback = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            warnings.warn(f"fl.compile could not capture {type(self.model).__name__} ({report.fallback}); running it "
                          f"eagerly, unfused. Make the failing submodule a leaf with "
                          f"fl.compile(model, leaf_modules=(ThatModule,)) to capture the rest.", CompileWarning,
                          stacklevel=4)
            return _Entry(None, None, report)
        ctx = _passes.Context(gm, backend, kernels, features)
        for name in self.passes:
            try:
                PASSES[name](ctx)
            except Exception as e:  # noqa: BLE001 - a pass that fails leaves the graph as the last good pass did
                gm = capture.capture(self.model, names, values, self.leaf_modules)
                ctx = _passes.Context(gm, backend, kernels, features, ctx.records, ctx.hints)
                ctx.records.append(Record(name, "(model)", [], "pass failed", False, f"{type(e).__name__}: {e}"))
                warnings.warn(f"fl.compile: pass {name!r} failed ({type(e).__name__}: {e}); the graph is used "
                              f"without it", CompileWarning, stacklevel=4)
                break
        gm.graph.lint()
        gm.recompile()
        report.records, report.hints = ctx.records, [] if native else ctx.hints
        for h in report.hints:
            warnings.warn(h, PerformanceHint, stacklevel=4)
        return _Entry(gm, unfused, report)

    # -- measuring -------------------------------------------------------------------
    def measure(self, *args, backward: bool | None = None, repeat: int = 3, **kwargs) -> GraphReport:
        """Kernel launches and best-of-`repeat` time of one call, unfused (the
        captured graph with no pass: the model's own ops) vs fused, in total
        and per pattern (forward). backward=True (default: in training mode)
        also runs backward of the outputs' sum. Stored in the graph's report.
        Both runs have PyTorch's MultiheadAttention fast path switched off (as
        compiled graphs on fl always do): that path is one fused CPU op no
        plugin implements, so on fl it is a CPU fallback, not device kernels."""
        entry, tensors = self._entry(args, kwargs)
        if entry.gm is None:
            raise RuntimeError(f"nothing to measure: the model was not captured ({entry.report.fallback})")
        backward = self.model.training if backward is None else backward
        with _no_mha_fastpath():  # the unfused ops on the device, not one CPU-fallback op
            before = _cost(entry.unfused, tensors, backward, repeat)
            after = _cost(entry.gm, tensors, backward, repeat)
            per = _per_pattern(entry, tensors)
        m = Measurement("forward+backward" if backward else "forward", before[0], after[0], before[1], after[1], per,
                        before[2], after[2])
        entry.report.measurement = m
        return entry.report


@contextlib.contextmanager
def _no_mha_fastpath():
    fast = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        yield
    finally:
        torch.backends.mha.set_fastpath_enabled(fast)


def _sync() -> None:
    if REGISTRY.current is not None:
        torch.fl.synchronize()


def _run(gm, tensors, backward: bool):
    """One call; with backward, a training step as PyTorch's default loop runs it: gradients set to None
    first (optimizer.zero_grad()), so backward writes them instead of adding into the last step's."""
    if backward:
        for p in gm.parameters():
            p.grad = None
    out = gm(*tensors)
    if backward:
        outs = [o for o in (out if isinstance(out, (tuple, list)) else [out])
                if isinstance(o, torch.Tensor) and o.requires_grad]
        if outs:
            sum(o.sum() for o in outs).backward()
    return out


def _cost(gm, tensors, backward: bool, repeat: int) -> tuple[int, float, int]:
    from ..profiler import profile

    grad = torch.enable_grad() if backward else torch.no_grad()
    with grad:
        _run(gm, tensors, backward)  # warm-up: JIT compiles, folded weights, plans
        with profile() as p:
            _run(gm, tensors, backward)
        best = float("inf")
        for _ in range(repeat):
            _sync()
            t0 = time.perf_counter()
            _run(gm, tensors, backward)
            _sync()
            best = min(best, time.perf_counter() - t0)
    fallbacks = sum(s.paths.get("fallback", 0) for s in p.ops())
    return p.kernels, best, fallbacks


class _Timed(fx.Interpreter):
    """Runs a graph node by node, charging kernel launches and time to the pattern each node belongs to."""

    def __init__(self, gm, owner):
        super().__init__(gm)
        self.owner = owner  # node -> pattern index
        self.cost: dict[int, list] = {}

    def run_node(self, n):
        idx = self.owner(n)
        if idx is None:
            return super().run_node(n)
        k0, t0 = events.kernel_count(), time.perf_counter()
        out = super().run_node(n)
        _sync()
        c = self.cost.setdefault(idx, [0, 0.0])
        c[0] += events.kernel_count() - k0
        c[1] += time.perf_counter() - t0
        return out


def _per_pattern(entry: _Entry, tensors) -> dict[int, PatternCost]:
    records = entry.report.records
    by_name = {}
    for i, r in enumerate(records):
        if r.applied:
            for name in r.nodes:
                by_name[name] = i
    with torch.no_grad():
        before = _Timed(entry.unfused, lambda n: by_name.get(n.name))
        before.run(*tensors)
        after = _Timed(entry.gm, lambda n: n.meta.get("fusion_record"))
        after.run(*tensors)
    out = {}
    for i, r in enumerate(records):
        if r.applied:
            b, a = before.cost.get(i, [0, 0.0]), after.cost.get(i, [0, 0.0])
            out[i] = PatternCost(b[0], a[0], b[1], a[1])
    return out


def compile(model: nn.Module, *, passes: Mapping[str, bool] | Iterable[str] | None = None,  # noqa: A001
            leaf_modules: Iterable[type] = ()) -> CompiledModel:
    """The model with its graph captured and fused for the backend its inputs live on.

    passes: which passes run (all by default): a list of names, or {name: bool}
    to switch some off; FL_FUSION_DISABLE=name,name switches passes off too.
    leaf_modules: module types kept as opaque calls (for submodules whose
    forward cannot be traced: data-dependent control flow)."""
    if isinstance(model, CompiledModel):
        raise TypeError("this model is already compiled; compile the original (compiled.model) to change passes")
    if not isinstance(model, nn.Module):
        raise TypeError(f"fl.compile takes an nn.Module, not {type(model).__name__}; wrap a function in a Module")
    leaves = tuple(leaf_modules)
    bad = [t for t in leaves if not (isinstance(t, type) and issubclass(t, nn.Module))]
    if bad:
        raise TypeError(f"leaf_modules must be nn.Module subclasses, got {bad}")
    return CompiledModel(model, _enabled_passes(passes), leaves)
