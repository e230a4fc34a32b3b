"""Precision alignment: where does a backend's result part from the reference?

The Torch-FL article's section 4.4 workflow, as one call: `fl.align(model, inputs)`
runs the model on a backend and on a reference (native CPU float32 by
default, or another fl backend) from the same weights and seed, and reports

1. forward: every submodule's output, compared (max abs, max rel, cosine);
2. backward: every parameter's gradient (mean abs diff, relative norm of the
   difference, max rel), ranked, with the first divergent layer named;
3. the same in the backend's autocast dtype (from its capability table);
4. training: N steps of the same optimizer on a tiny fixed batch, both
   sides, the two loss curves and their difference.

Verdicts follow the project's one numerical rule (numerics.py): float64 is
the truth, and a module output or gradient is ok where the backend's error
against float64 is within 10x native CPU's own error on the same tensor
(native float32; in the autocast mode native CPU autocast in the same
dtype), each relative to the scale of its kind of tensor (so a quantity that
is zero by construction, a conv bias before batch norm, holds only noise and
never decides); "check" within 1000x, "suspect" beyond. The training curve
is judged the same way against a float64 run. The columns still show the
backend against the reference. The op trace, and an autocast dtype the
CPU's autocast lacks, keep the Torch-FL article's tolerances on the relative
difference (<= 1e-3 usually fine, > 1e-2 suspect).
Dropout is switched off in every run: two devices' random streams never
match, and alignment is about arithmetic. Same seed, same report."""

from __future__ import annotations

import contextlib
import copy
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

from ..rendering import Report
from ..runtime import REGISTRY
from .numerics import FLOOR, LIMIT, SCALE_FLOOR, Float64Comparison, compare_with_float64
from .optrace import OpDiff, OpTrace, compare_traces

OK, CHECK, SUSPECT = "ok", "check", "suspect"
CHECK_LIMIT = 100 * LIMIT  # beyond LIMIT and within this many times native float32's error: "check"
RULE = (
    f"error against float64 within {LIMIT:g}x native CPU's (float32, or autocast in the same dtype) on the same "
    f"tensor is ok, "
    f"within {CHECK_LIMIT:g}x check, beyond suspect; every relative figure is taken against at least "
    f"{SCALE_FLOOR:g} of the largest tensor of its kind, ratios floored at {FLOOR:g}"
)


def verdict(rel: float, tolerances: tuple[float, float]) -> str:
    """The Torch-FL article's tolerances on a relative difference (the autocast mode and the op trace)."""
    fine, suspect = tolerances
    if rel != rel or rel > suspect:  # NaN is suspect
        return SUSPECT
    return OK if rel <= fine else CHECK


def verdict_vs_native(ratio: float) -> str:
    """The project's rule: the error against float64 over native float32's (numerics.py)."""
    if ratio != ratio or ratio > CHECK_LIMIT:
        return SUSPECT
    return OK if ratio <= LIMIT else CHECK


@dataclass
class ModuleDiff:
    module: str
    kind: str
    max_abs: float
    max_rel: float
    cosine: float
    verdict: str
    vs_native: float | None = None  # error against float64 / native float32's (float32 mode)


@dataclass
class ParamDiff:
    param: str
    mean_abs: float
    rel_norm: float
    max_rel: float
    verdict: str
    vs_native: float | None = None


@dataclass
class ModeResult:
    mode: str  # "float32" or the autocast dtype's name
    forward: list[ModuleDiff]
    backward: list[ParamDiff]
    output_rel: float
    first_divergent_module: str | None
    first_divergent_param: str | None
    ops: list[OpDiff] = field(default_factory=list)  # ops beyond the ok tolerance, in execution order
    ops_matched: int = 0  # ops of the backend's run matched with a reference op (0: no op trace)

    @property
    def first_divergent_op(self) -> OpDiff | None:
        return self.ops[0] if self.ops else None

    def worst(self) -> str:
        verdicts = [m.verdict for m in self.forward] + [p.verdict for p in self.backward]
        return SUSPECT if SUSPECT in verdicts else (CHECK if CHECK in verdicts else OK)


@dataclass
class TrainingResult:
    steps: int
    losses: list[float]
    reference_losses: list[float]
    rel_diff: list[float]
    verdict: str
    float64_losses: list[float] = field(default_factory=list)
    vs_native: float | None = None  # the curve's error against float64 over native float32's


@dataclass
class AlignmentReport(Report):
    backend: str
    reference: str
    tolerances: tuple[float, float]
    seed: int
    modes: list[ModeResult] = field(default_factory=list)
    training: TrainingResult | None = None

    @property
    def verdict(self) -> str:
        verdicts = [m.worst() for m in self.modes[:1]] + ([self.training.verdict] if self.training else [])
        return SUSPECT if SUSPECT in verdicts else (CHECK if CHECK in verdicts else OK)

    @property
    def first_divergent_layer(self) -> str | None:
        """The first module (in execution order) whose float32 output is not ok; when every output is,
        the module of the first op that is not (in the backward: a gradient that parts there)."""
        if not self.modes:
            return None
        m = self.modes[0]
        if m.first_divergent_module is not None or m.first_divergent_op is None:
            return m.first_divergent_module
        return m.first_divergent_op.module or None

    @property
    def first_divergent_op(self) -> OpDiff | None:
        """The first aten op (forward, then backward, in execution order) whose float32 output is not
        ok, with a diagnosis where one applies (e.g. a rounding-level ReLU flip)."""
        return self.modes[0].first_divergent_op if self.modes else None

    def to_dict(self) -> dict:
        d = asdict(self)
        d["verdict"] = self.verdict
        d["first_divergent_layer"] = self.first_divergent_layer
        op = self.first_divergent_op
        d["first_divergent_op"] = asdict(op) if op else None
        return d

    def to_json(self, **kw: Any) -> str:
        return json.dumps(self.to_dict(), **kw)

    def render(self, n: int = 12) -> str:
        fine, suspect = self.tolerances
        lines = [
            f"alignment of {self.backend} against {self.reference} (seed {self.seed}): {self.verdict.upper()}",
            f"rule: {RULE} (where no ratio is shown: relative difference ok <= {fine:g}, suspect > {suspect:g})",
        ]
        for m in self.modes:
            lines.append(
                f"[{m.mode}] output rel err {m.output_rel:.2e}; first divergent module: "
                f"{m.first_divergent_module or 'none'}; first divergent parameter: "
                f"{m.first_divergent_param or 'none'}"
            )
            if m.ops_matched:
                first = m.first_divergent_op
                lines.append(
                    f"  first divergent op ({m.ops_matched} ops matched): {first.describe() if first else 'none'}"
                )
            w = max([len(x.module) for x in m.forward] + [6])
            lines.append(
                f"  {'module':<{w}}  {'kind':<14} {'max abs':>9} {'max rel':>9} {'cosine':>9} {'x native':>9}  verdict"
            )
            for x in m.forward[:n]:
                lines.append(
                    f"  {x.module:<{w}}  {x.kind:<14} {x.max_abs:>9.2e} {x.max_rel:>9.2e} "
                    f"{x.cosine:>9.6f} {_ratio(x.vs_native):>9}  {x.verdict}"
                )
            if len(m.forward) > n:
                lines.append(f"  ... {len(m.forward) - n} more modules")
            ranked = sorted(m.backward, key=lambda p: (-(p.vs_native or 0.0), -p.rel_norm))[: max(n // 2, 3)]
            if ranked:
                w = max(len(p.param) for p in ranked)
                lines.append(
                    f"  {'gradient (worst first)':<{w}}  {'mean abs':>9} {'rel norm':>9} {'max rel':>9} "
                    f"{'x native':>9}  verdict"
                )
                for p in ranked:
                    lines.append(
                        f"  {p.param:<{w}}  {p.mean_abs:>9.2e} {p.rel_norm:>9.2e} {p.max_rel:>9.2e} "
                        f"{_ratio(p.vs_native):>9}  {p.verdict}"
                    )
        if self.training:
            t = self.training
            lines.append(
                f"[training] {t.steps} steps: final loss {t.losses[-1]:.6g} vs {t.reference_losses[-1]:.6g} "
                f"(float64 {t.float64_losses[-1]:.6g}), max rel diff {max(t.rel_diff):.2e}, error vs "
                f"float64 {_ratio(t.vs_native)} native float32's: {t.verdict}"
            )
        return "\n".join(lines)


def _ratio(r: float | None) -> str:
    return "-" if r is None else f"{r:.3g}x"


# one run of the model (_run): each module's first output and the order the modules ran in, each
# parameter's gradient, the model's output (all on the CPU in float64), and the loss
_RunResult = tuple[dict[str, torch.Tensor], list[str], dict[str, torch.Tensor], torch.Tensor, float]


# -- running both sides ------------------------------------------------------------


def _first_tensor(x: Any) -> torch.Tensor | None:
    if isinstance(x, torch.Tensor):
        return x
    if isinstance(x, (list, tuple)):
        for v in x:
            t = _first_tensor(v)
            if t is not None:
                return t
    if isinstance(x, dict):
        for v in x.values():
            t = _first_tensor(v)
            if t is not None:
                return t
    return None


def _output_tensor(output: Any) -> torch.Tensor:
    """The model output's first tensor, which the default loss and the final comparison use."""
    t = _first_tensor(output)
    if t is None:
        raise TypeError(
            f"fl.align: the model returned {type(output).__name__} with no tensor in it; alignment compares the "
            "model's output, so return a tensor (or a tuple, list or dict holding one)"
        )
    return t


def _to(x: Any, device: torch.device | str, dtype: torch.dtype | None = None) -> Any:
    """x on device; with dtype, its floating-point tensors in that dtype (the float64 reference)."""
    if isinstance(x, torch.Tensor):
        x = x.to(device)
        return x.to(dtype) if dtype is not None and x.is_floating_point() else x
    if isinstance(x, (list, tuple)):
        return type(x)(_to(v, device, dtype) for v in x)
    if isinstance(x, dict):
        return {k: _to(v, device, dtype) for k, v in x.items()}
    return x


def _wide(t: torch.Tensor) -> torch.Tensor:
    """float32 at least: float64 stays float64 (the reference must not round to float32)."""
    return t if t.dtype == torch.float64 else t.float()


def _no_dropout(model: nn.Module) -> None:
    for m in model.modules():
        if isinstance(m, nn.modules.dropout._DropoutNd):
            m.p = 0.0
        if isinstance(m, nn.MultiheadAttention):
            m.dropout = 0.0


def _default_loss(output: Any, target: torch.Tensor | None) -> torch.Tensor:
    out = _output_tensor(output)
    if target is None:
        # a fixed random projection of the output: unlike mean(out ** 2), whose gradient vanishes
        # behind a final normalisation layer (and leaves only rounding noise to compare), it gives
        # every parameter a well-conditioned gradient
        gen = torch.Generator().manual_seed(1234)
        weights = torch.randn(out.shape, generator=gen).to(out.device, _wide(out).dtype)
        return (_wide(out) * weights).sum() / max(out.numel(), 1)
    return (
        nn.functional.mse_loss(_wide(out), target.to(_wide(out).dtype))
        if target.is_floating_point()
        else nn.functional.cross_entropy(_wide(out), target)
    )


def _run(
    model: nn.Module,
    inputs: Any,
    target: torch.Tensor | None,
    device: torch.device | str,
    loss_fn: Callable[[Any, torch.Tensor | None], torch.Tensor],
    amp_dtype: torch.dtype | None,
    seed: int,
    trace: OpTrace | None = None,
    dtype: torch.dtype | None = None,
) -> _RunResult:
    torch.manual_seed(seed)
    outs: dict[str, torch.Tensor] = {}
    order: list[str] = []
    hooks = []
    for name, mod in model.named_modules():
        if name == "":
            continue

        def hook(mod: nn.Module, inp: tuple[Any, ...], out: Any, name: str = name) -> None:
            t = _first_tensor(out)
            if t is not None and t.is_floating_point() and name not in outs:
                outs[name] = t.detach().to("cpu", torch.float64)
                order.append(name)

        hooks.append(mod.register_forward_hook(hook))
    try:
        x = _to(inputs, device, dtype)
        device_type = torch.device(device).type
        with trace.recording(model) if trace is not None else contextlib.nullcontext():
            if amp_dtype is not None:
                with torch.autocast(device_type, dtype=amp_dtype):
                    output = model(*x) if isinstance(x, tuple) else model(x)
            else:
                output = model(*x) if isinstance(x, tuple) else model(x)
            loss = loss_fn(output, _to(target, device, dtype) if target is not None else None)
            loss.backward()
    finally:
        for h in hooks:
            h.remove()
    grads = {n: p.grad.detach().to("cpu", torch.float64) for n, p in model.named_parameters() if p.grad is not None}
    final = _output_tensor(output).detach().to("cpu", torch.float64)
    return outs, order, grads, final, float(loss.detach().to("cpu"))


def _rel(a: torch.Tensor, b: torch.Tensor, floor: float = 0.0) -> tuple[float, float, float]:
    if a.shape != b.shape:
        return float("inf"), float("inf"), float("nan")
    if b.numel() == 0:
        return 0.0, 0.0, 1.0
    diff = (a - b).abs()
    max_abs = diff.max().item()
    scale = max(b.abs().max().item(), floor, 1e-12)
    cos = torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), dim=0, eps=1e-30).item()
    return max_abs, max_abs / scale, cos


def _judge(
    base: nn.Module,
    inputs: Any,
    target: torch.Tensor | None,
    device: torch.device,
    loss_fn: Callable[[Any, torch.Tensor | None], torch.Tensor],
    seed: int,
    amp_dtype: torch.dtype | None = None,
) -> Float64Comparison | None:
    """The run on the backend and natively on the CPU (both under autocast to amp_dtype, if given), each
    against float64 (numerics.py). None where native CPU autocast does not take amp_dtype."""

    def run(where: torch.device | str, dtype: torch.dtype) -> dict[str, dict[str, torch.Tensor]]:
        wide = dtype == torch.float64
        m = copy.deepcopy(base).to(device=where, dtype=torch.float64 if wide else torch.float32)
        m.zero_grad(set_to_none=True)
        outs, _order, grads, _final, _loss = _run(
            m, inputs, target, where, loss_fn, None if wide else amp_dtype, seed, dtype=torch.float64 if wide else None
        )
        return {"output": outs, "grad": grads}

    try:
        return compare_with_float64(run, device)
    except RuntimeError:
        if amp_dtype is None:
            raise
        return None  # this torch's CPU autocast lacks the dtype: the tolerances judge that mode


def _compare(
    mode: str,
    dev_run: _RunResult,
    ref_run: _RunResult,
    model: nn.Module,
    tolerances: tuple[float, float],
    traces: tuple[OpTrace, OpTrace] | None = None,
    judge: Float64Comparison | None = None,
) -> ModeResult:
    d_outs, d_order, d_grads, d_final, _ = dev_run
    r_outs, _r_order, r_grads, r_final, _ = ref_run
    kinds = {n: type(m).__name__ for n, m in model.named_modules()}
    # relative figures are taken against at least SCALE_FLOOR of the largest tensor of their kind: a gradient
    # that is zero by construction (a conv bias before batch norm) holds rounding noise, which divided by its
    # own ~0 scale would read as an error of 100 %
    out_floor = SCALE_FLOOR * max((t.abs().max().item() for t in r_outs.values() if t.numel()), default=0.0)
    norm_floor = SCALE_FLOOR * max((g.norm().item() for g in r_grads.values()), default=0.0)
    max_floor = SCALE_FLOOR * max((g.abs().max().item() for g in r_grads.values() if g.numel()), default=0.0)
    forward = []
    for name in d_order:
        if name not in r_outs:
            continue
        a, r, c = _rel(d_outs[name], r_outs[name], out_floor)
        ratio = judge.per_tensor.get(f"output.{name}") if judge is not None else None
        forward.append(
            ModuleDiff(
                name,
                kinds.get(name, "?"),
                a,
                r,
                c,
                verdict(r, tolerances) if ratio is None else verdict_vs_native(ratio),
                ratio,
            )
        )
    backward = []
    for name, g in d_grads.items():
        ref = r_grads.get(name)
        if ref is None:
            continue
        diff = g - ref
        rel_norm = (diff.norm() / max(ref.norm().item(), norm_floor, 1e-30)).item()
        max_rel = (diff.abs().max() / max(ref.abs().max().item(), max_floor, 1e-30)).item() if ref.numel() else 0.0
        ratio = judge.per_tensor.get(f"grad.{name}") if judge is not None else None
        backward.append(
            ParamDiff(
                name,
                diff.abs().mean().item() if diff.numel() else 0.0,
                rel_norm,
                max_rel,
                verdict(rel_norm, tolerances) if ratio is None else verdict_vs_native(ratio),
                ratio,
            )
        )
    first_mod = next((m.module for m in forward if m.verdict != OK), None)
    param_order = [n for n, _ in model.named_parameters()]
    bad = {p.param for p in backward if p.verdict != OK}
    first_param = next((n for n in param_order if n in bad), None)
    result = ModeResult(mode, forward, backward, _rel(d_final, r_final)[1], first_mod, first_param)
    if traces is not None:
        result.ops, result.ops_matched = compare_traces(traces[0], traces[1], tolerances[0])
    return result


def align(
    model: nn.Module,
    inputs: Any,
    target: torch.Tensor | None = None,
    *,
    backend: str | None = None,
    reference: str = "cpu",
    loss_fn: Callable | None = None,
    steps: int = 20,
    lr: float = 1e-2,
    optimizer: Callable | None = None,
    tolerances: tuple[float, float] = (1e-3, 1e-2),
    amp: bool = True,
    seed: int = 0,
    ops: bool = True,
) -> AlignmentReport:
    """Compare `model` on `backend` (default: the current fl backend) with
    `reference`: "cpu" (native PyTorch on the CPU, float32) or an fl backend
    name. `inputs` is a tensor or a tuple of positional inputs (on the CPU);
    `target` feeds `loss_fn(output, target)` (default: MSE for float targets,
    cross entropy for class indices, a fixed random projection of the output
    without one).
    `optimizer(params)` builds the optimizer for the training comparison
    (default SGD with `lr`); steps=0 skips it. `ops` (float32 mode) also
    traces every aten op of both runs, forward and backward, and names the
    first op whose output is not ok (`first_divergent_op`), with a diagnosis
    where one applies; it keeps both runs' op outputs in host memory while
    it compares."""
    dev_backend = REGISTRY.get(backend) if backend else REGISTRY.ensure()
    dev = dev_backend.devices[0].torch_device
    ref_dev = torch.device("cpu") if reference == "cpu" else REGISTRY.get(reference).devices[0].torch_device
    ref_label = "native CPU float32" if reference == "cpu" else f"fl backend {reference}"
    loss_fn = loss_fn or _default_loss
    make_opt = optimizer or (lambda params: torch.optim.SGD(params, lr=lr))
    base = copy.deepcopy(model).cpu().float()
    _no_dropout(base)
    fine, suspect = tolerances
    report = AlignmentReport(dev_backend.name, ref_label, (fine, suspect), seed)

    def fresh(device: torch.device) -> nn.Module:
        m = copy.deepcopy(base).to(device)
        m.zero_grad(set_to_none=True)
        return m

    modes: list[tuple[str, torch.dtype | None]] = [("float32", None)]
    if amp:
        from ..amp import autocast_dtype

        chosen = autocast_dtype(dev_backend.name)
        if chosen is not None:
            modes.append((str(chosen).replace("torch.", ""), chosen))
    for mode, amp_dtype in modes:
        m_dev, m_ref = fresh(dev), fresh(ref_dev)
        traces = (OpTrace(), OpTrace()) if ops and amp_dtype is None else None
        dev_run = _run(m_dev, inputs, target, dev, loss_fn, amp_dtype, seed, traces[0] if traces else None)
        ref_run = _run(m_ref, inputs, target, ref_dev, loss_fn, None, seed, traces[1] if traces else None)
        judge = _judge(base, inputs, target, dev, loss_fn, seed, amp_dtype)
        report.modes.append(_compare(mode, dev_run, ref_run, m_dev, tolerances, traces, judge))
        del traces
    if steps > 0:

        def curve(device: torch.device | str, dtype: torch.dtype = torch.float32) -> list[float]:
            torch.manual_seed(seed)
            m = copy.deepcopy(base).to(device=device, dtype=dtype)
            m.zero_grad(set_to_none=True)
            opt = make_opt(m.parameters())
            losses = []
            for _ in range(steps):
                opt.zero_grad(set_to_none=True)
                x = _to(inputs, device, dtype)
                out = m(*x) if isinstance(x, tuple) else m(x)
                loss = loss_fn(out, _to(target, device, dtype) if target is not None else None)
                loss.backward()
                opt.step()
                losses.append(float(loss.detach().to("cpu")))
            return losses

        got, ref, truth = curve(dev), curve(ref_dev), curve("cpu", torch.float64)
        native = ref if reference == "cpu" else curve("cpu")
        rel = [abs(a - b) / max(abs(b), 1e-12) for a, b in zip(got, ref, strict=True)]
        scale = max(max(abs(v) for v in truth), 1e-30)
        err = lambda c: max(abs(a - b) for a, b in zip(c, truth, strict=True)) / scale  # noqa: E731
        ratio = max(err(got), FLOOR) / max(err(native), FLOOR)
        report.training = TrainingResult(steps, got, ref, rel, verdict_vs_native(ratio), truth, ratio)
    return report
