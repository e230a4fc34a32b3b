"""Errors against float64, fairly measured: the yardstick for "is this backend precise?".

The project's rule: a device may differ from native float32 CPU, but its
error against the float64 truth may not be much larger than native float32's
(10x). Measured naively, that rule breaks on any network with ReLU or max
pooling, whatever the backend: a pre-activation within rounding of zero
(1e-7 of the tensor's scale) takes one branch in float32 and the other in
float64, and the gradient of that element changes by O(1). Native float32
does this too (the Torch-FL article's Transformer with seed 4: native float32 CPU's
gradients are 1.2e-2 away from float64, the rocm backend's 8e-7; with seed 0
the other way round). Such a flip says nothing about a kernel's precision.

So the float64 reference here is run once per float32 run it judges and
takes, at every branch point, the branch that float32 run took, where (and
only where) the float64 value is within rounding of the branch (`BAND` of
the tensor's scale). Every other difference is measured as it is. A kernel
that branches wrongly by more than rounding is not excused: its flips fall
outside the band, are counted in `unmatched_flips`, and its error shows.

Branch points covered (a table, `BRANCHES`): relu / relu_ / threshold
(ReLU's mask) and max_pool2d_with_indices (which element of a window is the
maximum). Smooth functions (GELU, SiLU, softmax, ...) need nothing.

    cmp = compare_with_float64(run, "fl")   # run(device, dtype) -> {name: tensor}
    cmp.device_error, cmp.native_error, cmp.ratio, cmp.flips"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten

SCALE_FLOOR = 1e-3  # a tensor's scale is never taken below this fraction of the largest of its kind
BAND = 1e-4  # a float64 value this close to a branch (relative to its tensor's scale) is within rounding
FLOOR = 1e-6  # errors below this (relative) are rounding noise of an exact result: ratios use it as a floor
LIMIT = 10.0  # the project's bound: a device's error may be at most this many times native float32's


def scaled_error(got: torch.Tensor, ref: torch.Tensor, scale_floor: float = 0.0) -> float:
    """max |got - ref| / max |ref|: the error relative to the tensor's own scale (never below
    `scale_floor`)."""
    got, ref = got.detach().cpu().double(), ref.detach().cpu().double()
    if got.shape != ref.shape:
        return math.inf
    if ref.numel() == 0:
        return 0.0
    if got.is_complex() or ref.is_complex():
        got, ref = torch.view_as_real(got.resolve_conj()), torch.view_as_real(ref.resolve_conj())
    diff = (got - ref).abs()
    both_nan = got.isnan() & ref.isnan()
    diff = torch.where(both_nan, torch.zeros_like(diff), diff.nan_to_num(math.inf))
    scale = max(_scale(ref), scale_floor)
    return diff.max().item() / max(scale, 1e-30)


def _scale(t: torch.Tensor) -> float:
    t = t.detach()
    if t.is_complex():
        t = torch.view_as_real(t.resolve_conj())
    return t.abs().double().nan_to_num(0.0, 0.0, 0.0).max().item() if t.numel() else 0.0


# -- branch points ------------------------------------------------------------------


def _relu_decision(args: Sequence[Any], out: Any) -> torch.Tensor:
    return args[0] > 0


def _relu_margin(args: Sequence[Any], out: Any) -> torch.Tensor:
    return args[0]


def _relu_replay(args: Sequence[Any], out: Any, taken: torch.Tensor) -> torch.Tensor:
    """Take `taken` (True: on): 0 where off, where on the float64 magnitude (never 0, so ReLU's
    backward, which reads the output, passes the gradient)."""
    x = args[0]
    on = torch.maximum(x.abs(), torch.full_like(x, torch.finfo(x.dtype).tiny))
    return torch.where(taken, on, torch.zeros_like(x))


def _threshold_decision(args: Sequence[Any], out: Any) -> torch.Tensor:
    return args[0] > args[1]


def _threshold_margin(args: Sequence[Any], out: Any) -> torch.Tensor:
    return args[0] - args[1]


def _threshold_replay(args: Sequence[Any], out: Any, taken: torch.Tensor) -> torch.Tensor:
    x, value = args[0], args[2]
    return torch.where(taken, x, torch.full_like(x, value))


def _pool_decision(args: Sequence[Any], out: Any) -> torch.Tensor:
    return out[1]


def _pool_margin(args: Sequence[Any], out: Any) -> None:
    """How far float64's window maximum is above each element (0 at the maximum itself)."""
    return None


def _pool_replay(args: Sequence[Any], out: Any, taken: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The window maximum at the index float32 picked."""
    values = out[0]
    picked = args[0].flatten(-2).gather(-1, taken.flatten(-2)).view_as(values)
    return picked, taken.clone()


@dataclass(frozen=True)
class Branch:
    """How one op branches: `decide(args, out)` is the decision per output element; `margin(args,
    out)` the signed distance of each element from the branch (None: judged by `replay`'s values);
    `replay(args, out, decision)` the op's output with that decision taken."""

    decide: Callable
    margin: Callable
    replay: Callable


BRANCHES: dict = {
    aten.relu.default: Branch(_relu_decision, _relu_margin, _relu_replay),
    aten.relu_.default: Branch(_relu_decision, _relu_margin, _relu_replay),
    aten.threshold.default: Branch(_threshold_decision, _threshold_margin, _threshold_replay),
    aten.max_pool2d_with_indices.default: Branch(_pool_decision, _pool_margin, _pool_replay),
}


def _call(func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> tuple[Any, tuple]:
    """The op's output, and its inputs as they were before it ran (in-place ops overwrite them)."""
    before = args
    if func._schema.is_mutable:
        before = tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)
    return func(*args, **kwargs), before


@dataclass
class BranchRecord:
    op: str
    decision: torch.Tensor  # on the CPU


class BranchRecorder(TorchDispatchMode):
    """Records every branch decision of a run, in call order."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[BranchRecord] = []

    def __torch_dispatch__(
        self, func: torch._ops.OpOverload, types: Any, args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        kwargs = kwargs or {}
        branch = BRANCHES.get(func)
        if branch is None:
            return func(*args, **kwargs)
        out, before = _call(func, args, kwargs)
        self.records.append(BranchRecord(str(func), branch.decide(before, out).detach().cpu()))
        return out


class BranchReplayer(TorchDispatchMode):
    """Runs the float64 reference taking the recorded run's decision wherever float64's value is
    within rounding of the branch (`band` of the tensor's scale); counts the decisions it took
    (`matched`) and the flips further from the branch, which it leaves (`unmatched`)."""

    def __init__(self, decisions: list[BranchRecord], band: float = BAND) -> None:
        super().__init__()
        self.decisions = decisions
        self.band = band
        self.k = 0
        self.matched = 0
        self.unmatched = 0
        self.misaligned = False

    def __torch_dispatch__(
        self, func: torch._ops.OpOverload, types: Any, args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        kwargs = kwargs or {}
        branch = BRANCHES.get(func)
        if branch is None:
            return func(*args, **kwargs)
        out, before = _call(func, args, kwargs)
        k, self.k = self.k, self.k + 1
        if k >= len(self.decisions) or self.decisions[k].op != str(func):
            self.misaligned = True
            return out
        mine = branch.decide(before, out)
        taken = self.decisions[k].decision.to(mine.device)
        if mine.shape != taken.shape:
            self.misaligned = True
            return out
        flips = mine != taken
        if not bool(flips.any()):
            return out
        margin = branch.margin(before, out)
        if margin is not None:
            near = margin.abs() <= self.band * max(margin.abs().max().item(), 1e-300)
            forced = branch.replay(before, out, torch.where(flips & near, taken, mine))
        else:  # judged by value: the recorded run's pick is within the band of float64's
            alt = branch.replay(before, out, taken)
            scale = max(before[0].abs().max().item(), 1e-300)
            near = (alt[0] - out[0]).abs() <= self.band * scale
            forced = branch.replay(before, out, torch.where(flips & near, taken, mine))
        self.matched += int((flips & near).sum())
        self.unmatched += int((flips & ~near).sum())
        if func is aten.relu_.default:
            return args[0].copy_(forced)
        return forced


# -- comparing one run with float64 --------------------------------------------------


def _flatten(result: Any, prefix: str = "") -> dict[str, torch.Tensor]:
    if isinstance(result, torch.Tensor):
        return {prefix or "out": result}
    out: dict[str, torch.Tensor] = {}
    items = result.items() if isinstance(result, dict) else enumerate(result)
    for k, v in items:
        name = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, (torch.Tensor, dict, list, tuple)):
            out.update(_flatten(v, name))
    return out


@dataclass
class RunErrors:
    """One float32 run against its float64 reference."""

    errors: dict[str, float]
    flips: int  # branch decisions the reference took from this run (rounding-level flips)
    unmatched_flips: int  # flips further than rounding from the branch: left as they are
    aligned: bool  # the reference saw the same sequence of branch points

    @property
    def worst(self) -> float:
        return max(self.errors.values(), default=0.0)

    @property
    def worst_name(self) -> str | None:
        return max(self.errors, key=lambda k: self.errors[k]) if self.errors else None


@dataclass
class Recorded:
    """One run's tensors (on the CPU) and the branch decisions it took."""

    outputs: dict[str, torch.Tensor]
    decisions: list[BranchRecord]


def record(run: Callable, device: Any, dtype: torch.dtype = torch.float32) -> Recorded:
    """`run(device, dtype)` returns a tensor or a (nested) dict/list of tensors (None allowed)."""
    with BranchRecorder() as rec:
        out = _flatten(run(device, dtype))
    return Recorded({k: v.detach().cpu() for k, v in out.items()}, rec.records)


def _same_decisions(a: list[BranchRecord], b: list[BranchRecord]) -> bool:
    return len(a) == len(b) and all(
        x.op == y.op and x.decision.shape == y.decision.shape and torch.equal(x.decision, y.decision)
        for x, y in zip(a, b, strict=True)
    )


class Float64Reference:
    """The float64 CPU run of `run`, taking the branch decisions of the float32 run it judges.
    Runs that took the same decisions share one reference run (a backend-independent baseline
    is computed once and reused for every backend)."""

    def __init__(self, run: Callable, band: float = BAND) -> None:
        self.run = run
        self.band = band
        self._cache: list[tuple[list[BranchRecord], dict[str, torch.Tensor], tuple[int, int, bool]]] = []

    def outputs_for(self, decisions: list[BranchRecord]) -> tuple[dict[str, torch.Tensor], tuple[int, int, bool]]:
        for known, outputs, stats in self._cache:
            if _same_decisions(known, decisions):
                return outputs, stats
        with BranchReplayer(decisions, self.band) as rep:
            outputs = {k: v.detach().cpu() for k, v in _flatten(self.run("cpu", torch.float64)).items()}
        stats = (rep.matched, rep.unmatched, not rep.misaligned and rep.k == len(decisions))
        self._cache.append((decisions, outputs, stats))
        return outputs, stats

    def against(self, rec: Recorded) -> RunErrors:
        ref, (matched, unmatched, aligned) = self.outputs_for(rec.decisions)
        got = rec.outputs
        # a tensor only one side has (a gradient that is None on the other) is an infinite error
        floors = _scale_floors(ref)
        errors = {
            k: scaled_error(got[k], ref[k], floors[_kind(k)]) if k in ref and k in got else math.inf
            for k in {*got, *ref}
        }
        return RunErrors(errors, matched, unmatched, aligned)


def run_against_float64(
    run: Callable, device: Any, dtype: torch.dtype = torch.float32, band: float = BAND
) -> RunErrors:
    """`run(device, dtype)` once on `device` in `dtype` (recording its branches) and once on the
    CPU in float64 (taking them), compared tensor by tensor."""
    return Float64Reference(run, band).against(record(run, device, dtype))


def _kind(name: str) -> str:
    return name.split(".", 1)[0]


def _scale_floors(ref: dict[str, torch.Tensor]) -> dict[str, float]:
    """Per kind of tensor (the name up to its first dot: "grad", "output", ...), SCALE_FLOOR of the
    largest scale among them. An analytically zero gradient (a key projection's bias, which softmax
    cancels) holds only rounding noise: divided by its own ~0 scale, the noise would look like an
    error of 1e9; against the gradients around it, it is what it is, negligible."""
    floors: dict[str, float] = {}
    for k, v in ref.items():
        floors[_kind(k)] = max(floors.get(_kind(k), 0.0), _scale(v) * SCALE_FLOOR)
    return floors


@dataclass
class Float64Comparison:
    """A device run and a native float32 CPU run, each against the float64 truth."""

    device: RunErrors
    native: RunErrors
    limit: float = LIMIT
    floor: float = FLOOR
    per_tensor: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.per_tensor:
            self.per_tensor = {
                k: max(e, self.floor) / max(self.native.errors.get(k, 0.0), self.floor)
                for k, e in self.device.errors.items()
            }

    @property
    def device_error(self) -> float:
        return self.device.worst

    @property
    def native_error(self) -> float:
        return self.native.worst

    @property
    def ratio(self) -> float:
        """The worst, over tensors, of the device's error over native float32's on the same tensor
        (each floored at `floor`, below which both are rounding noise)."""
        return max(self.per_tensor.values(), default=1.0)

    @property
    def ok(self) -> bool:
        return self.ratio <= self.limit and self.device.unmatched_flips == 0 and self.device.aligned

    def summary(self) -> str:
        return (
            f"error vs float64 {self.device_error:.1e} (native float32 {self.native_error:.1e}, ratio "
            f"{self.ratio:.2g}); rounding-level branch flips matched: device {self.device.flips}, native "
            f"{self.native.flips}"
            + (f"; {self.device.unmatched_flips} flips beyond rounding" if self.device.unmatched_flips else "")
        )


def compare_with_float64(
    run: Callable, device: Any, *, band: float = BAND, limit: float = LIMIT, floor: float = FLOOR
) -> Float64Comparison:
    """`run(device, dtype)` on `device` in float32 and natively on the CPU in float32, each
    against its own branch-matched float64 CPU reference (see the module docstring)."""
    reference = Float64Reference(run, band)
    dev = reference.against(record(run, device))
    nat = reference.against(record(run, "cpu"))
    return Float64Comparison(dev, nat, limit, floor)
