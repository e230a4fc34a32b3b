"""Precision alignment: where does a backend's result part from the reference?

The article's section 4.4 workflow, as one call: `fl.align(model, inputs)`
runs the model on a backend and on a reference (native CPU float32 by
default, or another fl backend) from the same weights and seed, and reports

1. forward: every submodule's output, compared (max abs, max rel, cosine);
2. backward: every parameter's gradient (mean abs diff, relative norm of the
   difference, max rel), ranked, with the first divergent layer named;
3. the same in the backend's autocast dtype (from its capability table);
4. training: N steps of the same optimizer on a tiny fixed batch, both
   sides, the two loss curves and their difference.

Every figure gets a verdict against tolerances on the relative error (the
article: <= 1e-3 usually fine, > 1e-2 suspect). Dropout is switched off in
both runs: two devices' random streams never match, and alignment is about
arithmetic. Same seed, same report."""

from __future__ import annotations

import contextlib
import copy
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch
from torch import nn

from .optrace import OpDiff, OpTrace, compare_traces
from .report import Report
from .runtime import REGISTRY

OK, CHECK, SUSPECT = "ok", "check", "suspect"


def verdict(rel: float, tolerances: tuple[float, float]) -> str:
    fine, suspect = tolerances
    if rel != rel or rel > suspect:  # NaN is suspect
        return SUSPECT
    return OK if rel <= fine else CHECK


@dataclass
class ModuleDiff:
    module: str
    kind: str
    max_abs: float
    max_rel: float
    cosine: float
    verdict: str


@dataclass
class ParamDiff:
    param: str
    mean_abs: float
    rel_norm: float
    max_rel: float
    verdict: str


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

    def to_json(self, **kw) -> str:
        return json.dumps(self.to_dict(), **kw)

    def render(self, n: int = 12) -> str:
        fine, suspect = self.tolerances
        lines = [f"alignment of {self.backend} against {self.reference} (seed {self.seed}; ok <= {fine:g}, "
                 f"suspect > {suspect:g}): {self.verdict.upper()}"]
        for m in self.modes:
            lines.append(f"[{m.mode}] output rel err {m.output_rel:.2e}; first divergent module: "
                         f"{m.first_divergent_module or 'none'}; first divergent parameter: "
                         f"{m.first_divergent_param or 'none'}")
            if m.ops_matched:
                first = m.first_divergent_op
                lines.append(f"  first divergent op ({m.ops_matched} ops matched): "
                             f"{first.describe() if first else 'none'}")
            w = max([len(x.module) for x in m.forward] + [6])
            lines.append(f"  {'module':<{w}}  {'kind':<14} {'max abs':>9} {'max rel':>9} {'cosine':>9}  verdict")
            for x in m.forward[:n]:
                lines.append(f"  {x.module:<{w}}  {x.kind:<14} {x.max_abs:>9.2e} {x.max_rel:>9.2e} "
                             f"{x.cosine:>9.6f}  {x.verdict}")
            if len(m.forward) > n:
                lines.append(f"  ... {len(m.forward) - n} more modules")
            ranked = sorted(m.backward, key=lambda p: -p.rel_norm)[: max(n // 2, 3)]
            if ranked:
                w = max(len(p.param) for p in ranked)
                lines.append(f"  {'gradient (worst first)':<{w}}  {'mean abs':>9} {'rel norm':>9} {'max rel':>9}  "
                             f"verdict")
                for p in ranked:
                    lines.append(f"  {p.param:<{w}}  {p.mean_abs:>9.2e} {p.rel_norm:>9.2e} {p.max_rel:>9.2e}  "
                                 f"{p.verdict}")
        if self.training:
            t = self.training
            lines.append(f"[training] {t.steps} steps: final loss {t.losses[-1]:.6g} vs {t.reference_losses[-1]:.6g}, "
                         f"max rel diff {max(t.rel_diff):.2e}: {t.verdict}")
        return "\n".join(lines)



# -- running both sides ------------------------------------------------------------


def _first_tensor(x):
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


def _to(x, device):
    if isinstance(x, torch.Tensor):
        return x.to(device)
    if isinstance(x, (list, tuple)):
        return type(x)(_to(v, device) for v in x)
    if isinstance(x, dict):
        return {k: _to(v, device) for k, v in x.items()}
    return x


def _no_dropout(model: nn.Module) -> None:
    for m in model.modules():
        if isinstance(m, nn.modules.dropout._DropoutNd):
            m.p = 0.0
        if isinstance(m, nn.MultiheadAttention):
            m.dropout = 0.0


def _default_loss(output, target):
    out = _first_tensor(output)
    if target is None:
        # a fixed random projection of the output: unlike mean(out ** 2), whose gradient vanishes
        # behind a final normalisation layer (and leaves only rounding noise to compare), it gives
        # every parameter a well-conditioned gradient
        gen = torch.Generator().manual_seed(1234)
        weights = torch.randn(out.shape, generator=gen).to(out.device)
        return (out.float() * weights).sum() / max(out.numel(), 1)
    return nn.functional.mse_loss(out.float(), target.float()) if target.is_floating_point() else \
        nn.functional.cross_entropy(out.float(), target)


def _run(model, inputs, target, device, loss_fn, amp_dtype, seed, trace: OpTrace | None = None):
    torch.manual_seed(seed)
    outs: dict[str, torch.Tensor] = {}
    order: list[str] = []
    hooks = []
    for name, mod in model.named_modules():
        if name == "":
            continue

        def hook(mod, inp, out, name=name):
            t = _first_tensor(out)
            if t is not None and t.is_floating_point() and name not in outs:
                outs[name] = t.detach().to("cpu", torch.float64)
                order.append(name)

        hooks.append(mod.register_forward_hook(hook))
    try:
        x = _to(inputs, device)
        device_type = torch.device(device).type
        with trace.recording(model) if trace is not None else contextlib.nullcontext():
            if amp_dtype is not None:
                with torch.autocast(device_type, dtype=amp_dtype):
                    output = model(*x) if isinstance(x, tuple) else model(x)
            else:
                output = model(*x) if isinstance(x, tuple) else model(x)
            loss = loss_fn(output, _to(target, device) if target is not None else None)
            loss.backward()
    finally:
        for h in hooks:
            h.remove()
    grads = {n: p.grad.detach().to("cpu", torch.float64) for n, p in model.named_parameters() if p.grad is not None}
    final = _first_tensor(output).detach().to("cpu", torch.float64)
    return outs, order, grads, final, float(loss.detach().to("cpu"))


def _rel(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float, float]:
    if a.shape != b.shape:
        return float("inf"), float("inf"), float("nan")
    if b.numel() == 0:
        return 0.0, 0.0, 1.0
    diff = (a - b).abs()
    max_abs = diff.max().item()
    scale = max(b.abs().max().item(), 1e-12)
    cos = torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), dim=0, eps=1e-30).item()
    return max_abs, max_abs / scale, cos


def _compare(mode, dev_run, ref_run, model, tolerances, traces=None) -> ModeResult:
    d_outs, d_order, d_grads, d_final, _ = dev_run
    r_outs, _r_order, r_grads, r_final, _ = ref_run
    kinds = {n: type(m).__name__ for n, m in model.named_modules()}
    forward = []
    for name in d_order:
        if name not in r_outs:
            continue
        a, r, c = _rel(d_outs[name], r_outs[name])
        forward.append(ModuleDiff(name, kinds.get(name, "?"), a, r, c, verdict(r, tolerances)))
    backward = []
    for name, g in d_grads.items():
        ref = r_grads.get(name)
        if ref is None:
            continue
        diff = g - ref
        rel_norm = (diff.norm() / max(ref.norm().item(), 1e-30)).item()
        max_rel = (diff.abs().max() / max(ref.abs().max().item(), 1e-30)).item() if ref.numel() else 0.0
        backward.append(ParamDiff(name, diff.abs().mean().item() if diff.numel() else 0.0, rel_norm, max_rel,
                                  verdict(rel_norm, tolerances)))
    first_mod = next((m.module for m in forward if m.verdict != OK), None)
    param_order = [n for n, _ in model.named_parameters()]
    bad = {p.param for p in backward if p.verdict != OK}
    first_param = next((n for n in param_order if n in bad), None)
    result = ModeResult(mode, forward, backward, _rel(d_final, r_final)[1], first_mod, first_param)
    if traces is not None:
        result.ops, result.ops_matched = compare_traces(traces[0], traces[1], tolerances[0])
    return result


def align(model: nn.Module, inputs, target: torch.Tensor | None = None, *, backend: str | None = None,
          reference: str = "cpu", loss_fn: Callable | None = None, steps: int = 20, lr: float = 1e-2,
          optimizer: Callable | None = None, tolerances: tuple[float, float] = (1e-3, 1e-2),
          amp: bool = True, seed: int = 0, ops: bool = True) -> AlignmentReport:
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
    report = AlignmentReport(dev_backend.name, ref_label, tuple(tolerances), seed)

    def fresh(device):
        m = copy.deepcopy(base).to(device)
        m.zero_grad(set_to_none=True)
        return m

    modes: list[tuple[str, torch.dtype | None]] = [("float32", None)]
    if amp:
        from .amp import autocast_dtype

        chosen = autocast_dtype(dev_backend.name)
        if chosen is not None:
            modes.append((str(chosen).replace("torch.", ""), chosen))
    for mode, amp_dtype in modes:
        m_dev, m_ref = fresh(dev), fresh(ref_dev)
        traces = (OpTrace(), OpTrace()) if ops and amp_dtype is None else None
        dev_run = _run(m_dev, inputs, target, dev, loss_fn, amp_dtype, seed, traces[0] if traces else None)
        ref_run = _run(m_ref, inputs, target, ref_dev, loss_fn, None, seed, traces[1] if traces else None)
        report.modes.append(_compare(mode, dev_run, ref_run, m_dev, tolerances, traces))
        del traces
    if steps > 0:
        curves = []
        for device in (dev, ref_dev):
            torch.manual_seed(seed)
            m = fresh(device)
            opt = make_opt(m.parameters())
            losses = []
            for _ in range(steps):
                opt.zero_grad(set_to_none=True)
                x = _to(inputs, device)
                out = m(*x) if isinstance(x, tuple) else m(x)
                loss = loss_fn(out, _to(target, device) if target is not None else None)
                loss.backward()
                opt.step()
                losses.append(float(loss.detach().to("cpu")))
            curves.append(losses)
        rel = [abs(a - b) / max(abs(b), 1e-12) for a, b in zip(curves[0], curves[1], strict=True)]
        report.training = TrainingResult(steps, curves[0], curves[1], rel, verdict(max(rel), tolerances))
    return report
