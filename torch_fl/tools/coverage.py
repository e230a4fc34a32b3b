"""Operator coverage: `torch-fl coverage` and `fl.coverage()` (one name, one run), and the path table.

`coverage()` (what `torch-fl coverage` runs; `fl.coverage`): for each op of
PyTorch's own test database (OpInfo), run its sample inputs on an fl backend
and on the CPU, forward and (where the op supports autograd) backward,
compare, and record which path every aten call took.
`model_coverage(model, inputs)` does the same bookkeeping for a real model's
forward and backward: the Torch-FL article's "operator coverage list".

Ops whose outputs are unspecified (empty, empty_like...) or random (rand_like,
bernoulli, dropout...) are compared by shape and dtype only. Results are
appended op by op to a JSON-lines state file when one is given, so long runs
resume where they stopped (the CLI runs chunks in child processes, so an op
that kills the process is recorded as a crash and the run goes on).

`path_table()` (`fl.path_table`, the capability explorer's grid) runs nothing:
for each op (every op some backend has a kernel for, plus any you name) and
dtype, the first path the dispatcher would take -- native, decomposition, jit,
fallback -- or "none" when no path exists (CPU fallback switched off)."""

from __future__ import annotations

import contextlib
import fnmatch
import functools
import json
import os
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from ..dispatch import facts, resolve, resolve_op, tensors_in
from ..progress import Reporter
from ..progress import start as start_progress
from ..rendering import Report
from ..runtime import REGISTRY, SETTINGS, Backend, config, events, mask_to_names
from .checker.samples import base_name, candidate_opinfos

if TYPE_CHECKING:
    from torch.testing._internal.opinfo.core import OpInfo

UNSPECIFIED = ("empty", "empty_like", "new_empty", "new_empty_strided", "empty_strided", "empty_permuted")
RANDOM = (
    "bernoulli",
    "normal",
    "rand_like",
    "randn_like",
    "randint_like",
    "uniform",
    "multinomial",
    "cauchy",
    "exponential",
    "geometric",
    "log_normal",
    "nn.functional.dropout",
    "nn.functional.dropout2d",
    "nn.functional.dropout3d",
    "nn.functional.alpha_dropout",
    "nn.functional.feature_alpha_dropout",
    "nn.functional.rrelu",
    "randint",
    "rand",
    "randn",
    "poisson",
    "nn.functional.fractional_max_pool2d",
    "nn.functional.fractional_max_pool3d",
)


@dataclass
class OpResult:
    op: str  # OpInfo name (plus variant)
    status: str  # pass | fail | skip | crash
    forward: str  # pass | fail | skip
    backward: str  # pass | fail | skip | n/a
    reason: str = ""
    samples: int = 0
    paths: dict[str, int] = field(default_factory=dict)  # path -> aten calls (all depths)
    fallback_ops: list[str] = field(default_factory=list)
    seconds: float = 0.0


@dataclass
class CoverageReport(Report):
    backend: str
    dtype: str
    cpu_fallback: bool
    results: list[OpResult] = field(default_factory=list)

    def summary(self) -> dict:
        ran = [r for r in self.results if r.status != "skip"]
        fwd = [r for r in ran if r.forward != "skip"]
        bwd = [r for r in ran if r.backward in ("pass", "fail")]
        on_device = [r for r in fwd if r.forward == "pass" and not r.paths.get("fallback")]
        return {
            "backend": self.backend,
            "dtype": self.dtype,
            "cpu_fallback": self.cpu_fallback,
            "ops": len(self.results),
            "ran": len(ran),
            "forward_pass": sum(r.forward == "pass" for r in fwd),
            "forward_total": len(fwd),
            "backward_pass": sum(r.backward == "pass" for r in bwd),
            "backward_total": len(bwd),
            "forward_on_device": len(on_device),
            "crashes": sum(r.status == "crash" for r in self.results),
            "skipped": sum(r.status == "skip" for r in self.results),
        }

    def failures(self) -> list[OpResult]:
        return [r for r in self.results if r.status in ("fail", "crash")]

    def to_dict(self) -> dict:
        return {"summary": self.summary(), "results": [asdict(r) for r in self.results]}

    def to_json(self, **kw: Any) -> str:
        return json.dumps(self.to_dict(), **kw)

    def render(self, failures: int = 25) -> str:
        s = self.summary()

        def pct(a: int, b: int) -> str:
            return f"{100.0 * a / b:.1f} %" if b else "-"

        lines = [
            f"coverage of {s['backend']} ({s['dtype']}, CPU fallback {'on' if s['cpu_fallback'] else 'off'}): "
            f"{s['ops']} OpInfo ops, {s['skipped']} skipped",
            f"  forward  {s['forward_pass']}/{s['forward_total']} pass "
            f"({pct(s['forward_pass'], s['forward_total'])}); without any CPU fallback call: "
            f"{s['forward_on_device']} "
            f"({pct(s['forward_on_device'], s['forward_total'])})",
            f"  backward {s['backward_pass']}/{s['backward_total']} pass "
            f"({pct(s['backward_pass'], s['backward_total'])}); crashes {s['crashes']}",
        ]
        for r in self.failures()[:failures]:
            lines.append(f"  FAIL {r.op}: {r.reason}")
        if len(self.failures()) > failures:
            lines.append(f"  ... {len(self.failures()) - failures} more failures")
        return "\n".join(lines)


def _op_db() -> list[OpInfo]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torch.testing._internal.common_methods_invocations import op_db
    return op_db


def opinfo_names(pattern: str = "*") -> list[str]:
    return [_name(i) for i in _op_db() if fnmatch.fnmatch(i.name, pattern) or fnmatch.fnmatch(_name(i), pattern)]


def _first_line(e: BaseException) -> str:
    """The message's first line, shortened; for a decomposition that failed deep down, the op
    that was called and the innermost op that had no path (the one a kernel or decomposition is
    missing for)."""
    msg = str(e).splitlines()[0] if str(e) else ""
    marker = "its decomposition needs "
    if marker in msg:
        return msg.split(" cannot run", 1)[0][:120] + " ... innermost: " + msg.rsplit(marker, 1)[1][:260]
    return msg[:300]


def _name(info: OpInfo) -> str:
    return info.name + (f".{info.variant_test_name}" if info.variant_test_name else "")


# positional arguments PyTorch itself requires to be CPU tensors ("tensor_split expected
# tensor_indices_or_sections to be on cpu"): a user passes them on the CPU, so the run does too
_CPU_ARGS = {"tensor_split": (1,)}


def _to_fl(v: Any, device: torch.device) -> Any:
    if isinstance(v, torch.Tensor):
        t = _with_storage(v, device) if _partial_view(v) else v.detach().to(device)
        return t.requires_grad_(v.requires_grad) if t.is_floating_point() or t.is_complex() else t
    if isinstance(v, (list, tuple)):
        return type(v)(_to_fl(x, device) for x in v)
    if isinstance(v, dict):
        return {k: _to_fl(x, device) for k, x in v.items()}
    return v


def _partial_view(t: torch.Tensor) -> bool:
    """A strided view that sees part of its storage (as_strided's partial_views samples: base[5:15]).
    `.to(device)` copies only what the view sees, as on CUDA; ops that address the storage itself
    (as_strided with a storage_offset) need the rest too."""
    if t.layout != torch.strided or t.is_conj() or t.is_neg() or t._base is None:
        return False
    return t.untyped_storage().nbytes() > t.numel() * t.element_size()


def _with_storage(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """t on `device` as the same view (sizes, strides, offset) of a copy of its whole storage, as a
    sample made on the device directly would be."""
    n = t.untyped_storage().nbytes() // t.element_size()
    whole = torch.empty(0, dtype=t.dtype).set_(t.untyped_storage(), 0, (n,), (1,))
    return whole.detach().to(device).as_strided(t.shape, t.stride(), t.storage_offset()).detach()


# Ops whose vectors are defined up to sign (each singular or eigen vector may be negated, and PyTorch
# documents that implementations may differ): LAPACK builds pick different signs (OpenBLAS here, MKL
# in PyTorch's wheel), and so do torch_fl's decompositions. Per op: output index -> the dim along
# which each vector runs (-2: the columns of a (..., n, k) matrix, -1: its rows). Before comparing,
# each vector of the device's output takes the sign that agrees with the CPU's (the sign of their
# dot product), so a wrong vector still differs; the vectors full_matrices adds to complete a basis
# (any basis of the null space is right) are rotated onto the CPU's, so they agree exactly when they
# span the same space. The backward loss sees these outputs' magnitudes, which do not depend on the
# signs. The eigen/singular values are compared as they are.
SIGN_FREE_VECTORS: dict[str, dict[int, int]] = {
    "linalg.eigh": {1: -2},
    "linalg.svd": {0: -2, 2: -1},
    "svd": {0: -2, 2: -2},
}
# randomised low-rank factorisations: compared by magnitude (their vectors come from random projections)
_SIGN_FREE = {"svd_lowrank", "pca_lowrank"}


def align_vectors(x: torch.Tensor, like: torch.Tensor, dim: int, k: int | None) -> torch.Tensor:
    """x's vectors (along `dim`) matched to `like`'s: each of the first `k` negated where its dot
    product with `like`'s is negative; the vectors past `k` (what full_matrices adds to complete a
    basis: any orthonormal basis of the null space is right) rotated onto `like`'s by the orthogonal
    Procrustes rotation, so they agree exactly when they span the same space."""
    if x.shape != like.shape or not x.is_floating_point() or x.dim() < 2:
        return x
    xc, lc = (x, like) if dim == -2 else (x.mT, like.mT)  # vectors as columns
    k = xc.shape[-1] if k is None else min(k, xc.shape[-1])
    xd, ld = xc.double(), lc.double()
    head = xd[..., :k] * torch.where((xd[..., :k] * ld[..., :k]).sum(-2, keepdim=True) < 0, -1.0, 1.0)
    tail = xd[..., k:]
    if tail.shape[-1]:
        u, _, vh = torch.linalg.svd(tail.mT @ ld[..., k:])
        tail = tail @ (u @ vh)
    out = torch.cat([head, tail], -1).to(x.dtype)
    return out if dim == -2 else out.mT


def _sign_aligned(a: Any, b: Any, name: str) -> Any:
    """`a`'s outputs with the vectors of `b`'s signs (and completion bases), for SIGN_FREE_VECTORS."""
    dims = SIGN_FREE_VECTORS.get(name)
    if not dims or not isinstance(a, (list, tuple)) or not isinstance(b, (list, tuple)):
        return a
    values = b[1] if name in ("linalg.svd", "svd") and isinstance(b[1], torch.Tensor) else None
    k = values.shape[-1] if values is not None and values.dim() else None
    out = list(a)
    for i, dim in dims.items():
        if i < len(out) and isinstance(out[i], torch.Tensor) and isinstance(b[i], torch.Tensor):
            out[i] = align_vectors(out[i].detach().cpu(), b[i].detach().cpu(), dim, k)
    return type(a)(out) if not hasattr(a, "_fields") else type(a)(*out)


def _compare(a: Any, b: Any, shape_only: bool, sign_free: bool = False) -> str | None:
    ta, tb = list(tensors_in(a)), list(tensors_in(b))
    if len(ta) != len(tb):
        return f"{len(ta)} output tensors, CPU gives {len(tb)}"
    for x, y in zip(ta, tb, strict=True):
        x = x.detach().cpu()
        if y.numel() == 0 and x.numel() > 0:
            continue  # PyTorch's CPU kernel leaves this output empty (batch norm's saves in eval): unspecified
        if x.shape != y.shape or x.dtype != y.dtype:
            return f"output {tuple(x.shape)} {x.dtype}, CPU gives {tuple(y.shape)} {y.dtype}"
        if shape_only:
            continue
        if sign_free and x.is_floating_point():
            x, y = x.abs(), y.abs()
        try:
            torch.testing.assert_close(
                x.resolve_conj().resolve_neg(),
                y.detach().resolve_conj().resolve_neg(),
                rtol=1e-4,
                atol=1e-5,
                equal_nan=True,
                check_device=False,
            )
        except AssertionError as e:
            lines = [ln.strip() for ln in str(e).splitlines() if "Greatest" in ln or "Mismatched" in ln]
            return "values differ: " + "; ".join(lines[:2])
    if not isinstance(a, (torch.Tensor, list, tuple, dict)) and a != b:
        return f"result {a!r}, CPU gives {b!r}"
    return None


def _as64(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        if v.dtype in (torch.float32, torch.float16, torch.bfloat16):
            return v.detach().double().requires_grad_(v.requires_grad)
        return v
    if isinstance(v, (list, tuple)):
        return type(v)(_as64(x) for x in v)
    if isinstance(v, dict):
        return {k: _as64(x) for k, x in v.items()}
    return v


def _arbitrate(
    fl_vals: Sequence[torch.Tensor | None],
    cpu_vals: Sequence[torch.Tensor | None],
    ref_vals: Sequence[torch.Tensor | None],
) -> bool:
    """fp32 results of two correct implementations can differ past a fixed
    tolerance where the op is ill-conditioned (a layer norm over one element:
    1/sqrt(eps) amplifies rounding). Then float64 decides: the device passes
    when it is no further from the float64 result than native CPU is."""
    for a, b, r in zip(fl_vals, cpu_vals, ref_vals, strict=True):
        if a is None or b is None or r is None:
            if (a is None) != (b is None):
                return False
            continue
        dtype = a.dtype
        rounded = _real_pairs(r.detach().cpu().to(dtype)).double()  # float64's answer as the dtype holds it
        a, b, r = (_real_pairs(x.detach().cpu()).double() for x in (a, b, r))
        if a.shape != r.shape:
            return False
        if not r.numel():
            continue
        cpu_broken = (b.isnan() & ~r.isnan()) | (b.isinf() & rounded.isfinite())
        if bool(cpu_broken.any()):
            # CPU's own result is NaN/inf where float64's is finite: it is no reference there, so the
            # device is held to float64 itself, at 10x the tolerance torch.testing uses for its dtype
            if not _close_to_float64(a, r, rounded, dtype):
                return False
            continue
        scale = max(r.abs().max().item(), 1.0)
        err_fl = (a - r).abs().nan_to_num(0.0).max().item()
        err_cpu = (b - r).abs().nan_to_num(0.0).max().item()
        if err_fl > 2 * err_cpu + 1e-5 * scale:
            return False
    return True


def _close_to_float64(a: torch.Tensor, r: torch.Tensor, rounded: torch.Tensor, dtype: torch.dtype) -> bool:
    """a within 10x torch.testing's tolerance for `dtype` of the float64 result r; where r overflows
    the dtype (`rounded` is inf), a must be that inf."""
    from torch.testing._comparison import default_tolerances

    rtol, atol = default_tolerances(dtype)
    over = rounded.isinf() & r.isfinite()
    if not bool((a[over] == rounded[over]).all()):
        return False
    finite = r.isfinite() & ~over
    if not bool(a[finite].isfinite().all()):
        return False
    return bool(((a - r).abs()[finite] <= 10 * (atol + rtol * r.abs()[finite])).all())


def _real_pairs(t: torch.Tensor) -> torch.Tensor:
    """A complex tensor as its (real, imaginary) pairs; a real one as it is."""
    return torch.view_as_real(t.resolve_conj().resolve_neg()) if t.is_complex() else t


def _loss_grads(
    out: Any, leaves: list[torch.Tensor], sign_free: bool | set[int] = False
) -> list[torch.Tensor | None] | None:
    """Gradients of a fixed random projection of the outputs. `sign_free`: True, or the indices of the
    outputs whose magnitudes the loss sees instead (outputs defined up to sign)."""
    items = list(out) if isinstance(out, (list, tuple)) else [out]
    outs = []
    for i, item in enumerate(items):
        for o in tensors_in(item):
            if o.requires_grad and (o.is_floating_point() or o.is_complex()):
                o = _real_pairs(o)
                outs.append(o.abs() if sign_free is True or (sign_free and i in sign_free) else o)
    if not outs or not leaves:
        return None
    gen = torch.Generator().manual_seed(0)
    total = sum((o * torch.randn(o.shape, generator=gen).to(o.device)).sum() for o in outs)
    assert isinstance(total, torch.Tensor), "a sum of one or more tensors"
    grads = torch.autograd.grad(total, leaves, allow_unused=True)
    return [g for g in grads]


def run_one(info: OpInfo, backend: str, dtype: torch.dtype = torch.float32, samples: int = 4) -> OpResult:
    name = _name(info)
    t0 = time.perf_counter()
    try:
        if dtype not in info.supported_dtypes("cpu"):
            return OpResult(name, "skip", "skip", "skip", f"no {dtype} samples on CPU")
    except Exception as e:  # noqa: BLE001
        return OpResult(name, "skip", "skip", "skip", f"OpInfo: {type(e).__name__}")
    device = REGISTRY.get(backend).devices[0].torch_device
    grad = info.supports_autograd and dtype.is_floating_point
    shape_only = info.name in UNSPECIFIED or info.name in RANDOM
    paths: dict[str, int] = {}
    fallback_ops: set[str] = set()

    def listen(e: events.OpEvent) -> None:
        paths[e.path] = paths.get(e.path, 0) + 1
        if e.path == "fallback":
            fallback_ops.add(e.op)

    result = OpResult(name, "pass", "pass", "pending" if grad else "n/a")
    backward_checked = 0
    try:
        sample_list = list(info.sample_inputs("cpu", dtype, requires_grad=grad))[:samples]
    except Exception as e:  # noqa: BLE001
        return OpResult(name, "skip", "skip", "skip", f"sample inputs: {type(e).__name__}: {e}"[:200])
    events.add_listener(listen)
    try:
        for sample in sample_list:
            args = [sample.input, *sample.args]
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    torch.manual_seed(0)
                    expected = info.op(*args, **sample.kwargs)
            except Exception:  # noqa: BLE001 - a sample CPU rejects is not a test
                continue
            # dropout inside attention samples makes values random too
            random_sample = (
                shape_only
                or bool(sample.kwargs.get("dropout_p"))
                or (sample.kwargs.get("training") is True and "attention" in info.name)
            )
            fl_args, fl_kwargs = _to_fl(args, device), _to_fl(sample.kwargs, device)
            if "device" in fl_kwargs and torch.device(fl_kwargs["device"]).type == "cpu":
                fl_kwargs["device"] = device  # factory samples name the device: on this run, fl
            for i in _CPU_ARGS.get(info.name, ()):  # arguments PyTorch requires on the CPU stay there
                if i < len(fl_args):
                    fl_args = type(fl_args)([*fl_args[:i], args[i], *fl_args[i + 1 :]])
            result.samples += 1
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    torch.manual_seed(0)
                    got = info.op(*fl_args, **fl_kwargs)
            except Exception as e:  # noqa: BLE001
                result.forward = "fail"
                result.reason = f"forward raised {type(e).__name__}: {_first_line(e)}"
                break
            sign_free = True if info.name in _SIGN_FREE else set(SIGN_FREE_VECTORS.get(info.name, ()))
            try:
                problem = _compare(
                    _sign_aligned(got, expected, info.name), expected, random_sample, info.name in _SIGN_FREE
                )
            except Exception as e:  # noqa: BLE001 - reading the result back failed
                problem = f"reading the result raised {type(e).__name__}: {str(e).splitlines()[0][:200]}"
            if problem and problem.startswith("values differ"):
                try:
                    ref = info.op(*_as64(args), **_as64(sample.kwargs))
                    if _arbitrate(
                        list(tensors_in(_sign_aligned(got, ref, info.name))),
                        list(tensors_in(_sign_aligned(expected, ref, info.name))),
                        list(tensors_in(ref)),
                    ):
                        problem = None
                except Exception:  # noqa: BLE001 - no float64 reference: the fp32 verdict stands
                    pass
            if problem:
                result.forward = "fail"
                result.reason = f"forward: {problem}"
                break
            if grad and result.backward == "pending" and not random_sample:
                cpu_leaves = [t for t in tensors_in(args) if t.requires_grad]
                fl_leaves = [t for t in tensors_in(fl_args) if t.requires_grad]
                try:
                    g_cpu = _loss_grads(expected, cpu_leaves, sign_free)
                except Exception:  # noqa: BLE001
                    g_cpu = None
                if g_cpu is None:
                    continue
                try:
                    g_fl = _loss_grads(got, fl_leaves, sign_free)
                except Exception as e:  # noqa: BLE001
                    result.backward = "fail"
                    first = str(e).splitlines()[0][:300] if str(e) else ""
                    result.reason = f"backward raised {type(e).__name__}: {first}"
                    continue
                problem = None
                for a, b in zip(g_fl or [], g_cpu, strict=False):
                    if (a is None) != (b is None):
                        problem = "a gradient is None on one side only"
                        break
                    if a is not None:
                        problem = _compare(a, b, False)
                        if problem:
                            break
                if problem and problem.startswith("values differ"):
                    try:
                        args64 = _as64(args)
                        kw64 = _as64(sample.kwargs)
                        out64 = info.op(*args64, **kw64)
                        leaves64 = [t for t in tensors_in((args64, kw64)) if t.requires_grad]
                        g64 = _loss_grads(out64, leaves64, sign_free)
                        assert g_fl is not None, "the values that differ are g_fl's gradients"
                        if g64 is not None and _arbitrate(g_fl, g_cpu, g64):
                            problem = None
                    except Exception:  # noqa: BLE001
                        pass
                if problem:
                    result.backward, result.reason = "fail", f"backward: {problem}"
                else:
                    backward_checked += 1
    finally:
        events.remove_listener(listen)
    if result.samples == 0:
        return OpResult(name, "skip", "skip", "skip", "CPU rejected every sample")
    if result.backward == "pending":  # pass only where a gradient was actually compared
        result.backward = "pass" if backward_checked else "skip"
    result.paths = paths
    result.fallback_ops = sorted(fallback_ops)
    result.seconds = time.perf_counter() - t0
    if result.forward == "fail" or result.backward == "fail":
        result.status = "fail"
    return result


@contextlib.contextmanager
def _settings_restored() -> Iterator[None]:
    """Everything a coverage run changes for the process -- the CPU fallback
    switch and the CPU random state it seeds per sample -- is put back however
    the run ends (an OpInfo import that fails included), so the caller's later
    code runs as it did before."""
    fallback, rng = SETTINGS.cpu_fallback, torch.random.get_rng_state()
    try:
        yield
    finally:
        SETTINGS.cpu_fallback = fallback
        torch.random.set_rng_state(rng)


def _finished_ops(state_file: str | None) -> dict[str, OpResult]:
    """The ops a previous run recorded in the state file (a rerun skips them)."""
    done: dict[str, OpResult] = {}
    if state_file and os.path.exists(state_file):
        with open(state_file) as f:
            for line in f:
                if line.strip():
                    r = OpResult(**json.loads(line))
                    done[r.op] = r
    return done


def coverage(
    backend: str | None = None,
    ops: str | list[str] = "*",
    dtype: torch.dtype = torch.float32,
    samples: int = 4,
    cpu_fallback: bool | None = None,
    state_file: str | None = None,
    progress: bool | Reporter = True,
    on_begin: Callable[[str], None] | None = None,
) -> CoverageReport:
    """OpInfo coverage of a backend (`torch-fl coverage`). ops: globs over OpInfo names, comma-separated
    ("matrix_exp,linalg.eigh,as_strided*"), or a list of names. state_file: JSON
    lines of finished ops; a rerun skips them. progress: each op shown as it ends (torch_fl.progress: lines
    in a terminal, a bar in a notebook), False for none; on_begin(name) is called before each op runs (the
    CLI's parent process learns from it which op took a crashed worker down)."""
    aten_names = [o for o in (ops.split(",") if isinstance(ops, str) else ops) if "::" in o]
    if aten_names:
        raise ValueError(
            f"coverage() runs OpInfo names or globs (mm, nn.functional.gelu, 'linalg.*'), not operator "
            f"names such as {aten_names[0]!r}; the path each operator takes per dtype, without running "
            f"it, is path_table(backend, ops=[...]) (fl.path_table)"
        )
    b = REGISTRY.get(backend) if backend else REGISTRY.ensure()
    with _settings_restored():
        if cpu_fallback is not None:
            SETTINGS.cpu_fallback = config.parse_bool(cpu_fallback, "cpu_fallback")
        report = CoverageReport(b.name, str(dtype).replace("torch.", ""), SETTINGS.cpu_fallback)
        done = _finished_ops(state_file)
        globs = ops.split(",") if isinstance(ops, str) else []
        infos = [
            i
            for i in _op_db()
            if (
                _name(i) in ops
                if isinstance(ops, list)
                else any(fnmatch.fnmatch(i.name, g) or fnmatch.fnmatch(_name(i), g) for g in globs)
            )
        ]
        shown = start_progress(f"coverage on {b.name}", len(infos), progress)
        try:
            for k, info in enumerate(infos):
                name = _name(info)
                if on_begin:
                    on_begin(name)
                if name in done:
                    report.results.append(done[name])
                    continue
                r = run_one(info, b.name, dtype, samples)
                report.results.append(r)
                shown.update(
                    k + 1,
                    f"{name}: {r.status}" + (f" ({r.reason[:80]})" if r.reason else ""),
                    failed=r.status in ("fail", "crash"),
                )
                if state_file:
                    with open(state_file, "a") as f:
                        f.write(json.dumps(asdict(r)) + "\n")
        finally:
            shown.close()
    return report


def model_coverage(model: torch.nn.Module, inputs: Any, backends: list[str] | None = None) -> dict[str, dict]:
    """Every aten op a model uses in forward and backward, per backend: the
    path each took, calls, kernel launches and time. The model is copied to
    each backend; `inputs` (a tensor or tuple) live on the CPU."""
    import copy

    from .profiler import profile

    out = {}
    for name in backends or sorted(REGISTRY.backends):
        device = REGISTRY.get(name).devices[0].torch_device
        m = copy.deepcopy(model).to(device)
        x = _to_fl(inputs if isinstance(inputs, tuple) else (inputs,), device)
        with profile(label=name) as prof:
            y = m(*x)
            first = next(iter(tensors_in(y)))
            first.float().sum().backward()
        out[name] = {
            s.op: {"path": s.path, "calls": s.calls + s.nested_calls, "kernels": s.kernels, "ms": s.total_s * 1e3}
            for s in prof.ops()
        }
    return out


# -- the path table ---------------------------------------------------------------------------------------------


DTYPES = ("float32", "float64", "float16", "bfloat16", "int64", "int32", "bool")
MARKS = {"native": "N", "decomposition": "D", "jit": "J", "fallback": "F", "none": "-", "view": "V", "undefined": "."}
UNDEFINED = "undefined"  # PyTorch itself has no CPU kernel for the op in this dtype: no path to judge


@dataclass
class PathTable(Report):
    """Per op and dtype, the first path the dispatcher would take on one backend (`path_table`)."""

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
        return {
            op: r
            for op, r in self.rows.items()
            if t in op.lower() and (path is None or path in [v for d, v in r.items() if d not in self.host_dtypes])
        }

    def to_dict(self) -> dict:
        return {"backend": self.backend, "dtypes": list(self.dtypes), "rows": self.rows, "counts": self.counts()}

    def to_json(self, **kw: Any) -> str:
        return json.dumps(self.to_dict(), **kw)

    def render(self, text: str = "", path: str | None = None, limit: int = 40) -> str:
        rows = self.filter(text, path)
        w = max([len(op) for op in rows] + [10])
        lines = [
            f"{self.backend}: {len(self.rows)} ops; N native, D decomposition, J jit, F CPU fallback, - none, "
            ". not defined by PyTorch for the dtype"
            + (f" (the device has no {', '.join(self.host_dtypes)}: F throughout)" if self.host_dtypes else ""),
            f"{'op':<{w}}  " + " ".join(f"{d:>8}" for d in self.dtypes),
        ]
        for op, r in list(rows.items())[:limit]:
            lines.append(f"{op:<{w}}  " + " ".join(f"{MARKS.get(r.get(d, 'none'), '?'):>8}" for d in self.dtypes))
        if len(rows) > limit:
            lines.append(f"... {len(rows) - limit} more")
        return "\n".join(lines)


def all_kernel_ops(backend: Backend | None = None) -> list[str]:
    """The ops a path table lists: every op the bundled host plugin or an emulator has a kernel for, and
    `backend`'s own. Not other real devices' plugins: whether this machine has an OpenCL driver (or a vendor's
    plugin) must not change the table of another backend."""
    REGISTRY.discover()
    ops: set[str] = set()
    for b in REGISTRY.backends.values():
        if b.name == "cpu" or b.plugin.emulated or b is backend:
            ops.update(b.plugin.kernels)
    return sorted(ops)


def path_table(backend: str | None = None, ops: list[str] | None = None, dtypes: tuple[str, ...] = DTYPES) -> PathTable:
    """The dispatcher's plan for each op and dtype on a backend (default: current): which path each would
    take, without running anything (coverage() runs the ops)."""
    b = REGISTRY.get(backend) if backend else REGISTRY.ensure()
    computed = {n for d in b.devices for n in mask_to_names(d.props.dtypes)}
    out = PathTable(b.name, tuple(dtypes), host_dtypes=tuple(d for d in dtypes if d not in computed))
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
