"""`torch-fl doctor`'s model check: does a backend train a real model the way
native CPU PyTorch does?

Two float32 runs of a correct model never agree bit for bit (summation order),
so the fl run and a native CPU float32 run of the same weights and batch are
both judged against a float64 CPU run, and the fl backend passes when its error
is within 1e-4 or no worse than twice native CPU's own. Errors are relative to
the tensor's scale: max |x - x64| / max |x64| for the output, and for the
gradients the norm of the difference over the norm of the float64 gradients,
all parameters together (one parameter whose true gradient is nearly zero
would otherwise show pure rounding noise as a huge relative error).

1. forward+backward in train mode, with a fixed random projection of the
   output as the loss (a well-scaled gradient whatever the output's values);
2. training: `steps` SGD steps on one fixed batch with the model's own loss.
   The loss must go down on the device; its curve is shown beside native
   CPU's and float64's but not judged step by step: a small-batch ResNet-50 in
   train mode (batch norm over a handful of values per channel) is chaotic
   enough that native float32 itself drifts some percent from float64 within
   three steps. `fl.align(model, inputs, steps=20)` judges a loss curve.

The CPU runs do not depend on the backend, so `reference()` computes them once
and `check_model()` compares each backend with them."""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from ..progress import Reporter
from ..progress import start as start_progress
from ..rendering import Report
from ..runtime import REGISTRY, FlDeviceModule, using_backend

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
FLOOR = 1e-4  # float32 agreement that always passes, whatever native CPU's own error
RULE = (
    "OK when the output and gradient errors are within max(1e-4, 2x native CPU's) and the loss goes down; "
    "the loss curve is shown beside native's and float64's, not judged step by step"
)


@dataclass
class Case:
    """A model to check: how to build it, its batch, its target and loss."""

    label: str
    make: Callable[[], nn.Module]
    inputs: torch.Tensor
    target: torch.Tensor
    loss_fn: LossFn
    steps: int = 3
    lr: float = 3e-3


@dataclass
class Run:
    """One run of a case on one device and dtype: first forward+backward
    (eval mode), then the loss of each training step (train mode)."""

    output: torch.Tensor
    grads: dict[str, torch.Tensor]
    losses: list[float]
    seconds: float
    grads_on_device: bool = True


@dataclass
class Reference:
    """The CPU runs every backend is compared with: float64 and float32."""

    case: Case
    model: nn.Module
    float64: Run
    native: Run


@dataclass
class ModelCheck(Report):
    """How a backend's run compares with native CPU's, both against float64."""

    label: str
    shape: tuple
    steps: int
    output_err: float
    native_output_err: float
    grad_err: float
    native_grad_err: float
    losses: list[float]
    native_losses: list[float]
    float64_losses: list[float]
    grads_on_device: bool
    seconds: float
    native_seconds: float
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def render(self) -> str:
        def curve(losses: list[float]) -> str:
            return " -> ".join(f"{v:.4f}" for v in losses) or "-"

        verdict = "OK" if self.ok else "MISMATCH: " + "; ".join(self.problems)
        return "\n".join(
            [
                f"  {self.label} {self.shape}, train mode; errors against a float64 CPU run, relative to the tensor's "
                f"scale (fl | native CPU float32):",
                f"    forward+backward: output {self.output_err:.1e} | {self.native_output_err:.1e}, gradients "
                f"{self.grad_err:.1e} | {self.native_grad_err:.1e}; gradients on the fl device: "
                f"{'yes' if self.grads_on_device else 'NO'}",
                f"    training, {self.steps} SGD steps on one batch, loss: fl {curve(self.losses)} | native "
                f"{curve(self.native_losses)} | float64 {curve(self.float64_losses)}",
                f"    rule: {RULE}",
                *(f"    note: {n}" for n in self.notes),
                f"    {verdict}; {self.seconds:.2f}s on fl vs {self.native_seconds:.2f}s native CPU",
            ]
        )

    @property
    def notes(self) -> list[str]:
        """What the loss curve shows that the verdict does not judge: the fl curve far further from
        float64's than native CPU's is, or rising where native's does not (said, never hidden)."""
        out: list[str] = []
        if not self.losses or len(self.losses) != len(self.float64_losses) or not self.native_losses:
            return out
        f64 = self.float64_losses[-1]
        dev = abs(self.losses[-1] - f64) / max(abs(f64), 1e-12)
        native = abs(self.native_losses[-1] - f64) / max(abs(f64), 1e-12)
        if dev > max(0.01, 2 * native):
            out.append(f"the final loss is {dev:.1%} from float64's (native CPU float32: {native:.1%})")
        rose = [k + 1 for k in range(1, len(self.losses)) if self.losses[k] > self.losses[k - 1]]
        native_rose = any(b > a for a, b in zip(self.native_losses, self.native_losses[1:], strict=False))
        if rose and not native_rose:
            out.append(f"the fl loss rose at step {', '.join(map(str, rose))} where native CPU's did not")
        if out:
            out[-1] += (
                "; a few steps of a train-mode model on one small batch can diverge between correct float32 "
                "runs, so this is shown, not judged: fl.align(model, inputs, steps=20) judges a loss curve"
            )
        return out


def rel_err(value: torch.Tensor, ref: torch.Tensor) -> float:
    """max |value - ref| / max |ref|: the error relative to the tensor's scale."""
    value, ref = value.detach().cpu().double(), ref.detach().cpu().double()
    if not ref.numel():
        return 0.0
    return (value - ref).abs().max().item() / max(ref.abs().max().item(), 1e-30)


def run_case(case: Case, model: nn.Module, device: torch.device | str, dtype: torch.dtype) -> Run:
    """The case on one device in one dtype, from a copy of `model`'s weights."""
    m = copy.deepcopy(model).to(device=device, dtype=dtype)
    x = case.inputs.to(device=device, dtype=dtype)
    y = case.target.to(device=device, dtype=dtype if case.target.is_floating_point() else case.target.dtype)
    t0 = time.perf_counter()
    m.train()
    out = m(x)
    projection = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    (out * projection.to(out)).sum().backward()
    raw_grads = {n: p.grad for n, p in m.named_parameters()}
    on_device = all(g is not None and g.device.type == torch.device(device).type for g in raw_grads.values())
    output = out.detach().cpu()
    grads = {n: g.detach().cpu() for n, g in raw_grads.items() if g is not None}
    opt = torch.optim.SGD(m.parameters(), lr=case.lr, momentum=0.9)
    losses = []
    for _ in range(case.steps):
        opt.zero_grad()
        loss = case.loss_fn(m(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    if torch.device(device).type == "fl":
        FlDeviceModule.synchronize()
    return Run(output, grads, losses, time.perf_counter() - t0, on_device)


def reference(case: Case) -> Reference:
    """The float64 and float32 CPU runs of a case (the same weights for every backend)."""
    torch.manual_seed(0)
    model = case.make()
    return Reference(
        case, model, run_case(case, model, "cpu", torch.float64), run_case(case, model, "cpu", torch.float32)
    )


def grad_err(grads: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> float:
    """||g - g64|| / ||g64|| over all parameters together; inf if one has no gradient."""
    if any(n not in grads for n in ref):
        return float("inf")
    diff = sum(((grads[n].double() - g.double()) ** 2).sum().item() for n, g in ref.items())
    scale = sum((g.double() ** 2).sum().item() for g in ref.values())
    return (diff / max(scale, 1e-300)) ** 0.5


def check_model(ref: Reference, device: torch.device | str) -> ModelCheck:
    """The case on an fl device, judged against the float64 run beside native CPU float32."""
    run = run_case(ref.case, ref.model, device, torch.float32)
    f64, native = ref.float64, ref.native
    check = ModelCheck(
        ref.case.label,
        tuple(ref.case.inputs.shape),
        ref.case.steps,
        rel_err(run.output, f64.output),
        rel_err(native.output, f64.output),
        grad_err(run.grads, f64.grads),
        grad_err(native.grads, f64.grads),
        run.losses,
        native.losses,
        f64.losses,
        run.grads_on_device,
        run.seconds,
        native.seconds,
    )
    check.problems = _problems(check)
    return check


@dataclass
class DoctorReport(Report):
    """Every case on every backend, judged as `check_model` judges one (what `torch-fl doctor` prints)."""

    checks: dict[str, list[ModelCheck]]  # backend -> one check per case

    @property
    def ok(self) -> bool:
        return all(c.ok for cs in self.checks.values() for c in cs)

    def render(self) -> str:
        lines = []
        for backend, cs in self.checks.items():
            lines.append(f"backend {backend}:")
            lines += [c.render() for c in cs]
        failures = sum(not c.ok for cs in self.checks.values() for c in cs)
        lines.append("doctor: all backends OK" if not failures else f"doctor: {failures} check(s) FAILED")
        return "\n".join(lines)


def run_doctor(
    backends: list[str] | None = None,
    full: bool = False,
    progress: bool | Reporter = True,
    cases: list[Case] | None = None,
) -> DoctorReport:
    """`torch-fl doctor`'s model checks as a Python call: the CPU references once, then each case (default:
    ResNet-50 and a Transformer encoder, at the Torch-FL article's sizes when `full`) on each backend (default: every
    available one). Minutes of work, so each step is shown as it ends (torch_fl.progress: lines in a
    terminal, a bar in a notebook); progress=False for none."""
    names = backends or REGISTRY.available()
    cases = cases or default_cases(full)
    shown = start_progress("doctor", len(cases) * (1 + len(names)), progress)
    step = 0
    report = DoctorReport({})
    try:
        refs = []
        for case in cases:
            refs.append(reference(case))
            step += 1
            shown.update(step, f"{case.label}: CPU float64 and float32 reference runs")
        for name in names:
            with using_backend(name):
                for ref in refs:
                    check = check_model(ref, REGISTRY.device(None).torch_device)
                    report.checks.setdefault(name, []).append(check)
                    step += 1
                    shown.update(
                        step,
                        f"{check.label} on {name}: {'OK' if check.ok else 'MISMATCH'} ({check.seconds:.1f}s)",
                        failed=not check.ok,
                    )
    finally:
        shown.close()
    return report


def _problems(c: ModelCheck) -> list[str]:
    out = []
    if not c.grads_on_device:
        out.append("gradients are not on the fl device")
    for what, err, native in (
        ("output", c.output_err, c.native_output_err),
        ("gradient", c.grad_err, c.native_grad_err),
    ):
        if not err <= max(FLOOR, 2 * native):  # NaN fails too
            out.append(f"{what} error {err:.1e} is above {max(FLOOR, 2 * native):.1e} (1e-4 or twice native's)")
    if len(c.losses) > 1 and not c.losses[-1] < c.losses[0]:  # NaN fails too
        out.append(f"the loss did not go down ({c.losses[0]:.4f} -> {c.losses[-1]:.4f})")
    return out


def default_cases(full: bool = False) -> list[Case]:
    """ResNet-50 and a Transformer encoder; `full` uses the Torch-FL article's sizes (section 4.2)."""
    from .zoo import resnet50, transformer_encoder

    g = torch.Generator().manual_seed(0)
    if full:
        images, seq = torch.randn(8, 3, 224, 224, generator=g), torch.randn(16, 128, 512, generator=g)
        return [
            Case("ResNet-50", lambda: resnet50(), images, torch.arange(8) * 97 % 1000, nn.functional.cross_entropy),
            Case(
                "TransformerEncoder",
                lambda: transformer_encoder(512, 8, 6, dropout=0.0),
                seq,
                torch.randn(16, 128, 512, generator=g),
                nn.functional.mse_loss,
            ),
        ]
    images, seq = torch.randn(2, 3, 64, 64, generator=g), torch.randn(4, 32, 128, generator=g)
    return [
        Case("ResNet-50", lambda: resnet50(num_classes=10), images, torch.tensor([3, 7]), nn.functional.cross_entropy),
        Case(
            "TransformerEncoder",
            lambda: transformer_encoder(128, 8, 2, dropout=0.0, dim_feedforward=256),
            seq,
            torch.randn(4, 32, 128, generator=g),
            nn.functional.mse_loss,
        ),
    ]


__all__ = [
    "Case",
    "DoctorReport",
    "ModelCheck",
    "Reference",
    "Run",
    "check_model",
    "default_cases",
    "grad_err",
    "reference",
    "rel_err",
    "run_case",
    "run_doctor",
]
