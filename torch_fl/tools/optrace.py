"""Every aten op of a forward and backward pass, with the module it belongs to:
what `fl.align` compares op by op to name the first op where two runs part.

Module-level comparison says *which layer*; it cannot say which op, and it
sees nothing of the backward but parameter gradients. An `OpTrace` records,
below autograd (a TorchDispatchMode), each op's outputs, and attributes it to
a module: in the forward by a stack of module hooks; in the backward by the
autograd node executing it, which a TorchFunctionMode tagged with the module
that created it (nodes made inside C++ composite ops are untagged and take
the module of the backward op before them).

Two traces of the same model are matched op by op on (phase, module, op,
output shapes, n-th such op in that module), so a backend that calls different ops for the
same module (a fused attention kernel where the CPU composes matmul and
softmax) leaves those ops unmatched without shifting the others."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from .numerics import BAND

aten = torch.ops.aten
_TAG = "fl_optrace_module"
_SKIP = {
    aten.detach.default,
    aten.view.default,
    aten._unsafe_view.default,
    aten.t.default,
    aten.transpose.int,
    aten.expand.default,
    aten.permute.default,
    aten.alias.default,
}


@dataclass
class OpRecord:
    index: int
    phase: str  # "forward" or "backward"
    module: str
    op: str
    ordinal: int  # the n-th call of this op with outputs of these shapes in this module and phase
    outputs: list[torch.Tensor]  # floating outputs, on the CPU
    inputs: list | None = None  # arguments (tensors on the CPU), for branch ops only
    decider: Decider | None = None
    input_scale: float = 0.0  # the smallest (non-zero) of its floating inputs' largest |value|

    @property
    def key(self) -> tuple:
        return self.phase, self.module, self.op, self.shapes, self.ordinal

    @property
    def shapes(self) -> tuple:
        return tuple(tuple(t.shape) for t in self.outputs)


@dataclass(frozen=True)
class Decider:
    """Where an op's result switches: an input compared with a threshold (an argument, or a
    constant), or, for max pooling, the indices of the picked window maxima (an argument, or -1:
    the op's second output)."""

    input: int | None = None
    threshold_arg: int | None = None
    threshold: float = 0.0
    indices: int | None = None


# ops whose result switches at a threshold: two runs can take different sides of it where the
# deciding input is within rounding of it
BRANCH_INPUTS: dict = {
    aten.relu.default: Decider(input=0),
    aten.relu_.default: Decider(input=0),
    aten.threshold.default: Decider(input=0, threshold_arg=1),
    aten.threshold_backward.default: Decider(input=1, threshold_arg=2),
    aten.max_pool2d_with_indices.default: Decider(indices=-1),
    aten.max_pool2d_with_indices_backward.default: Decider(indices=7),
}


def _float_tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value] if value.is_floating_point() or value.is_complex() else []
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _float_tensors(v)]
    return []


def _all_tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _all_tensors(v)]
    return []


class _Tagger(TorchFunctionMode):
    """Tags each autograd node made by a torch function with the module running it."""

    def __init__(self, trace: OpTrace) -> None:
        super().__init__()
        self.trace = trace

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        module = self.trace.current_module()
        for t in _all_tensors(out):
            node = t.grad_fn
            # metadata is a dict property at run time; torch's stub declares a method
            if node is not None and _TAG not in node.metadata:  # type: ignore[operator]
                node.metadata[_TAG] = module  # type: ignore[index]
        return out


class _Recorder(TorchDispatchMode):
    def __init__(self, trace: OpTrace) -> None:
        super().__init__()
        self.trace = trace

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if func not in _SKIP:
            self.trace.add(func, args, out)
        return out


@dataclass
class OpTrace:
    """The ops of one run; use `with trace.recording(model): ...` around forward and backward."""

    records: list[OpRecord] = field(default_factory=list)
    _stack: list[str] = field(default_factory=list)
    _counts: dict = field(default_factory=dict)
    _last_backward_module: str = "?"

    def current_module(self) -> str:
        return self._stack[-1] if self._stack else ""

    def add(self, func: Any, args: tuple, out: Any) -> None:
        node = torch._C._current_autograd_node()
        if node is None:
            phase, module = "forward", self.current_module()
        else:
            phase = "backward"
            # a dict property at run time; torch's stub declares a method
            module = node.metadata.get(_TAG, self._last_backward_module)  # type: ignore[attr-defined]
            self._last_backward_module = module
        op = str(func)
        outputs = [t.detach().to("cpu", copy=True) for t in _float_tensors(out)]
        count_key = (phase, module, op, tuple(tuple(t.shape) for t in outputs))
        n = self._counts.get(count_key, 0)
        self._counts[count_key] = n + 1
        inputs, decider = None, BRANCH_INPUTS.get(func)
        if decider is not None:
            inputs = [a.detach().to("cpu", copy=True) if isinstance(a, torch.Tensor) else a for a in args]
            if decider.indices == -1:
                inputs.append(out[1].detach().cpu())  # the indices it picked
        scale = min((x for x in (_scale(t) for t in _float_tensors(list(args))) if x > 0), default=0.0)
        self.records.append(OpRecord(len(self.records), phase, module, op, n, outputs, inputs, decider, scale))

    @contextlib.contextmanager
    def recording(self, model: nn.Module) -> Iterator[OpTrace]:
        def enter(module: nn.Module, args: Any, name: str) -> None:
            self._stack.append(name)

        def leave(module: nn.Module, args: Any, output: Any) -> None:
            if self._stack:
                self._stack.pop()

        hooks = []
        for name, mod in model.named_modules():
            if name:
                hooks.append(mod.register_forward_pre_hook(lambda m, a, name=name: enter(m, a, name)))
                hooks.append(mod.register_forward_hook(leave))
        try:
            with _Tagger(self), _Recorder(self):
                yield self
        finally:
            for h in hooks:
                h.remove()


@dataclass
class OpDiff:
    """One op whose output differs between the two runs beyond the tolerance."""

    phase: str
    module: str
    op: str
    ordinal: int
    max_rel: float
    note: str = ""  # a diagnosis, e.g. a rounding-level branch flip

    def describe(self) -> str:
        where = self.module or "(top level)"
        text = f"{self.phase} {self.op} in {where} (max rel {self.max_rel:.2e})"
        return text + (f": {self.note}" if self.note else "")


def _scale(t: torch.Tensor) -> float:
    if t.numel() == 0:
        return 0.0
    t = t.detach()
    if t.is_complex():
        t = torch.view_as_real(t.resolve_conj())
    return float(t.abs().amax().double().nan_to_num(0.0, 0.0, 0.0).cpu())


def _rel(a: torch.Tensor, b: torch.Tensor, floor: float = 0.0) -> float:
    if a.shape != b.shape:
        return math.inf
    if b.numel() == 0:
        return 0.0
    a, b = a.double(), b.double()
    if a.is_complex():
        a, b = torch.view_as_real(a), torch.view_as_real(b)
    diff = (a - b).abs()
    diff = torch.where(a.isnan() & b.isnan(), torch.zeros_like(diff), diff.nan_to_num(math.inf))
    return diff.max().item() / max(b.abs().nan_to_num(0, 0, 0).max().item(), floor, 1e-30)


def branch_note(dev: OpRecord, ref: OpRecord, band: float = BAND) -> str:
    """Why a branch op's outputs differ: the elements where the two runs took different sides, and
    whether the deciding input was within rounding of the threshold there."""
    d = dev.decider
    if d is None or dev.inputs is None or ref.inputs is None:
        return ""
    if d.indices is not None:
        a, b = dev.inputs[d.indices], ref.inputs[d.indices]
        n = int((a != b).sum()) if isinstance(a, torch.Tensor) and a.shape == b.shape else 0
        return (
            f"the two runs picked a different window maximum at {n} position(s): a near tie, decided by rounding"
            if n
            else ""
        )
    assert d.input is not None, "a decider without indices names its deciding input (the tables above)"
    x_dev, x_ref = dev.inputs[d.input], ref.inputs[d.input]
    t = float(ref.inputs[d.threshold_arg]) if d.threshold_arg is not None else d.threshold
    if not isinstance(x_dev, torch.Tensor) or x_dev.shape != x_ref.shape:
        return ""
    flips = (x_dev > t) != (x_ref > t)
    n = int(flips.sum())
    if not n:
        return ""
    distance = torch.maximum((x_ref.double() - t).abs(), (x_dev.double() - t).abs())  # both runs' values
    margin, scale = distance[flips].max().item(), max((x_ref.double() - t).abs().max().item(), 1e-30)
    verdict = (
        "a rounding-level branch flip, not a kernel fault (float32 rounding picks the side, on any "
        "backend; torch_fl.tools.numerics compares against float64 with the branch matched)"
        if margin <= band * scale
        else "beyond rounding: a real difference"
    )
    return (
        f"{n} element(s) on different sides of the threshold {t:g}; the deciding input is at most "
        f"{margin:.2e} from it in either run (its scale {scale:.2e}): {verdict}"
    )


CANCELLATION = 1e-3  # an output is judged against its own scale, but never below this fraction of its inputs'


def compare_traces(dev: OpTrace, ref: OpTrace, tolerance: float) -> tuple[list[OpDiff], int]:
    """The ops (in the device run's order) whose outputs differ by more than `tolerance`, and how many
    ops matched. An output's error is relative to its own scale, but never to less than
    CANCELLATION of its smallest input's scale: a sum that cancels to ~0 (the gradient of a key
    projection's bias, which softmax removes) holds rounding noise of its inputs' size on any
    implementation. (The smallest input: in a product, such as a gradient times an activation, the
    output scales with every factor, and no one factor's scale bounds it from below.)"""
    by_key = {r.key: r for r in ref.records}
    diffs, matched = [], 0
    for rec in dev.records:
        other = by_key.get(rec.key)
        if other is None or len(other.outputs) != len(rec.outputs):
            continue
        matched += 1
        floor = CANCELLATION * max(rec.input_scale, other.input_scale)
        worst = max((_rel(a, b, floor) for a, b in zip(rec.outputs, other.outputs, strict=True)), default=0.0)
        if worst > tolerance:
            fwd_dev, fwd_ref = _deciding_forward(rec, dev), _deciding_forward(other, ref)
            note = (
                branch_note(fwd_dev, fwd_ref)
                if fwd_dev is not None and fwd_ref is not None
                else branch_note(rec, other)
            )
            diffs.append(OpDiff(rec.phase, rec.module, rec.op, rec.ordinal, worst, note))
    return diffs, matched


def _deciding_forward(rec: OpRecord, trace: OpTrace) -> OpRecord | None:
    """For ReLU's backward (threshold_backward, which reads ReLU's output, where the sign of a
    negative input is gone): the forward ReLU of the same module whose output it read, which still
    has the input that decided."""
    if rec.op != "aten.threshold_backward.default" or rec.inputs is None:
        return None
    result = rec.inputs[1]
    for fwd in trace.records:
        if (
            fwd.phase == "forward"
            and fwd.module == rec.module
            and fwd.decider is not None
            and fwd.decider.input is not None
            and fwd.outputs
            and fwd.outputs[0].shape == result.shape
            and torch.equal(fwd.outputs[0], result)
        ):
            return fwd
    return None
