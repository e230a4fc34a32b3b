"""Runs one plugin kernel on recorded calls and compares with PyTorch on CPU.

The kernel is called directly (the dispatcher's native tier, no fallback):
each CPU argument is copied to the device with its exact strides and offset,
the kernel runs, and every output (and every argument the op mutates) comes
back and is compared with the same call on CPU. Each call is also tried with
non-contiguous copies of its tensors (same values, strided storage)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import torch

from ...dispatch import OpFacts, facts, tensor_map
from ...runtime import NOT_HANDLED, Device, base_ptr, fl_to_cpu, is_fl, output_layouts, run_native, span
from .samples import Call, snapshot

if TYPE_CHECKING:
    from .guarded import GuardedMemory

TOL = {torch.float32: 1e-4, torch.float64: 1e-10, torch.float16: 1e-2, torch.bfloat16: 2e-2}
# ops whose own contract limits precision: fused attention's logsumexp is float32 for every input
# dtype, so a float64 backward that recomputes softmax from it is good to ~1e-7 at best
TOL_FLOOR = {"aten::_scaled_dot_product_fused_attention_overrideable_backward": 1e-6}
# ops whose outputs PyTorch defines by the input's layout: det/slogdet return the LU of A^T when A is
# contiguous, of A otherwise; their non-contiguous variant is compared with CPU on the same layout
SAME_LAYOUT_REFERENCE = {"aten::_linalg_det", "aten::_linalg_slogdet"}
# ops whose result depends on the input's memory layout, not only its values (as_strided_scatter
# writes through the strides of self's clone): the non-contiguous variant has another answer
LAYOUT_DEPENDENT = {"aten::as_strided_scatter"}
# ops that return values and the indices they came from, where PyTorch leaves the order of equal values
# unspecified (an unstable sort, topk, an order statistic): output 1 is checked as indices that pick output
# 0's values out of the input along dim, not position by position (a right kernel may break ties otherwise)
TIED_INDICES = {
    "aten::sort": "dim",
    "aten::sort.stable": "dim",
    "aten::topk": "dim",
    "aten::kthvalue": "dim",
    "aten::median.dim": "dim",
    "aten::nanmedian.dim": "dim",
    "aten::mode": "dim",
}


def _tie_free_indices(f: OpFacts, vals: Sequence[Any], results: Sequence[Any], expects: Sequence[Any]) -> bool:
    """Whether this call's index output may break ties its own way (TIED_INDICES; sort.stable with
    stable=True promises PyTorch's order and is compared exactly)."""
    if f.name not in TIED_INDICES or len(results) < 2 or len(expects) < 2:
        return False
    names = f.arg_names
    return not ("stable" in names and vals[names.index("stable")] is True)


def _check_indices(
    f: OpFacts,
    vals: Sequence[Any],
    values: torch.Tensor,
    indices: torch.Tensor,
    expected: torch.Tensor,
    what: str,
    out: Outcome,
) -> None:
    """The kernel's indices (output 1) must be in range and pick its values (output 0) out of the input
    along dim; its values were compared with PyTorch's already."""
    if indices.shape != expected.shape or indices.dtype != expected.dtype:
        out.failures.append(
            f"{what}: got {tuple(indices.shape)} {indices.dtype}, expected {tuple(expected.shape)} {expected.dtype}"
        )
        return
    x = fl_to_cpu(vals[0]).clone()
    if x.dim() == 0 or indices.numel() == 0:
        return
    dim = vals[f.arg_names.index(TIED_INDICES[f.name])] % x.dim()
    keep = indices.dim() == x.dim()
    idx, got = (indices, values) if keep else (indices.unsqueeze(dim), values.unsqueeze(dim))
    if ((idx < 0) | (idx >= x.shape[dim])).any():
        out.failures.append(f"{what}: indices out of range for dim {dim} of size {x.shape[dim]}")
        return
    picked = torch.gather(x, dim, idx)
    same = (picked == got) | (picked.isnan() & got.isnan()) if got.is_floating_point() else picked == got
    if not bool(same.all()):
        out.failures.append(
            f"{what}: {int((~same).sum())} of {same.numel()} indices do not point at the value returned beside them"
        )


def to_device(dev: Device, t: torch.Tensor, guard: GuardedMemory | None = None) -> torch.Tensor:
    """t on the device with its sizes, strides and storage offset (the storage span is copied); with
    guard (a guarded.GuardedMemory), in a block with canary zones around the span."""
    lo, hi = span(t)
    item = t.element_size()
    # casts: a real tensor's storage offset is an int (a SymInt only while tracing, which the checker never does)
    if guard is not None:
        out = guard.empty(dev, t.shape, t.stride(), cast(int, t.storage_offset()), t.dtype)
    else:
        buf = torch.empty(max(hi, lo, 1) * item, dtype=torch.uint8, device=dev.torch_device)
        out = torch.empty(0, dtype=t.dtype, device=dev.torch_device)
        out.set_(buf.untyped_storage(), t.storage_offset(), t.shape, t.stride())
    if hi > lo and t.numel():
        host = torch.as_strided(t, (hi - lo,), (1,), lo).contiguous()
        start = out.data_ptr() - out.storage_offset() * item + (out.storage_offset() - t.storage_offset() + lo) * item
        dev.copy_h2d(cast(int, start), host.data_ptr(), (hi - lo) * item)
    return out


def noncontiguous(t: torch.Tensor) -> torch.Tensor:
    """The same values in storage with gaps: every dim strided by 2 in a larger buffer."""
    if t.dim() == 0 or t.numel() == 0:
        return t
    big = torch.zeros([2 * s for s in t.shape], dtype=t.dtype)
    view = big[tuple(slice(None, None, 2) for _ in t.shape)]
    view.copy_(t)
    return view


@dataclass
class Outcome:
    compared: int = 0
    declined: int = 0
    failures: list[str] = field(default_factory=list)
    max_err: float = 0.0


def _compare(actual: torch.Tensor, expected: torch.Tensor, what: str, out: Outcome, tol_floor: float = 0.0) -> None:
    if expected.numel() == 0 and actual.numel() > 0:
        return  # PyTorch's CPU kernel left this output empty (e.g. batch norm's save_mean in eval): unspecified
    if (
        actual.is_complex()
        and expected.is_complex()
        and actual.dtype == expected.dtype
        and actual.shape == expected.shape
    ):  # compare (real, imaginary) pairs at the real dtype's tolerance
        actual = torch.view_as_real(actual.resolve_conj().resolve_neg())
        expected = torch.view_as_real(expected.resolve_conj().resolve_neg())
    tol = max(TOL.get(expected.dtype, 1e-4), tol_floor)
    if (
        actual.shape == expected.shape
        and actual.dtype != expected.dtype
        and actual.is_floating_point()
        and expected.is_floating_point()
    ):
        # the runtime allocates outputs with the meta function's dtype, which for some auxiliary
        # outputs (layer norm's mean/rstd of half inputs) is float32 where CPU keeps the input's
        actual, expected = actual.double(), expected.to(actual.dtype).double()
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        out.failures.append(
            f"{what}: got {tuple(actual.shape)} {actual.dtype}, expected {tuple(expected.shape)} {expected.dtype}"
        )
        return
    if expected.numel() == 0:
        return
    if not expected.is_floating_point():
        bad = (actual != expected).sum().item()
        if bad:
            out.failures.append(f"{what}: {bad} of {expected.numel()} values differ")
        return
    a, e = actual.double(), expected.double()
    nan_a, nan_e = a.isnan(), e.isnan()
    if not torch.equal(nan_a, nan_e):
        out.failures.append(f"{what}: NaN where PyTorch has none or the reverse ({int((nan_a ^ nan_e).sum())} values)")
        return
    finite = ~nan_e
    inf_mismatch = (a.isinf() | e.isinf()) & finite & (a != e)
    if inf_mismatch.any():
        out.failures.append(f"{what}: infinities differ at {int(inf_mismatch.sum())} values")
        return
    ok = finite & ~e.isinf()
    if not ok.any():
        return
    scale = max(e[ok].abs().max().item(), 1.0)
    err = (a[ok] - e[ok]).abs().max().item() / scale
    out.max_err = max(out.max_err, err)
    if not err <= tol:
        out.failures.append(f"{what}: max error {err:.2e} of scale {scale:.3g} (tolerance {tol:g})")


def _check_random(name: str, results: Sequence[Any], expected_shapes: Sequence[Any], out: Outcome) -> None:
    """Seeded random ops: PyTorch's values are not the plugin's; check what must hold."""
    for i, (r, e) in enumerate(zip(results, expected_shapes, strict=False)):
        if not isinstance(e, torch.Tensor):
            continue
        # (CPU gives a zero-size dropout a float mask where the meta function says bool)
        if not isinstance(r, torch.Tensor) or r.shape != e.shape or (r.dtype != e.dtype and e.numel()):
            out.failures.append(f"{name} output {i}: shape/dtype differ from PyTorch's")
            continue
        if r.is_floating_point() and not torch.isfinite(r.double()).all():
            out.failures.append(f"{name} output {i}: non-finite random values")


# kernel: the plugin's kernel-table entry for the op (runtime.plugin.KernelEntry, which torch_fl.runtime does
# not export), handed to run_native as it is
def run_calls(
    dev: Device, kernel: Any, calls: Iterable[Call], variants: bool = True, guard: GuardedMemory | None = None
) -> Outcome:
    """Runs the kernel on each recorded call (and a non-contiguous variant) and compares with
    PyTorch CPU. With `guard` (a guarded.GuardedMemory), a write outside any tensor's span is
    a failure naming the tensor and how many bytes it went past."""
    out = Outcome()
    for func, args, kwargs in calls:
        f = facts(func)
        random = torch.Tag.nondeterministic_seeded in func.tags
        tries = [("", args, kwargs)]
        if (
            variants
            and f.name not in LAYOUT_DEPENDENT
            and any(isinstance(a, torch.Tensor) and a.dim() > 0 and a.numel() > 0 for a in _flat(args))
        ):
            tries.append((" (non-contiguous inputs)", tensor_map(lambda t: noncontiguous(snapshot(t)), args), kwargs))
        for label, a, kw in tries:
            # PyTorch on CPU sees the recorded layouts (some of its kernels assume the contiguous
            # inputs autograd gives them); the kernel sees the variant: same values either way
            cpu_args = tensor_map(snapshot, a if f.name in SAME_LAYOUT_REFERENCE else args)
            try:
                expected = func(*cpu_args, **kw)
            except Exception:
                reference = _REFERENCES.get(func)
                if reference is None:
                    continue
                cpu_args = tensor_map(snapshot, args)
                expected = reference(*cpu_args, **kw)
            dev_args = tensor_map(lambda t: to_device(dev, t, guard), tensor_map(snapshot, a))
            # keyword tensors (searchsorted's sorter, segment_reduce's lengths) go to the device too
            dev_kw = {k: tensor_map(lambda t: to_device(dev, t, guard), tensor_map(snapshot, v)) for k, v in kw.items()}
            vals = f.normalize(dev_args, dev_kw)
            result = run_native(f, kernel, dev, vals, _guarded_outputs(f, dev, vals, guard))
            if result is NOT_HANDLED:
                out.declined += 1
                continue
            out.compared += 1
            results = result if isinstance(result, tuple) else (result,)
            if guard is not None:
                out.failures += _guard_failures(guard, dev_args, dev_kw, results, f"{_shape_of(args)}{label}")
            expects = expected if isinstance(expected, tuple) else (expected,)
            shape = _shape_of(args)
            if random:
                _check_random(f.name, results, expects, out)
            else:
                tied = _tie_free_indices(f, vals, results, expects)
                for i, (r, e) in enumerate(zip(results, expects, strict=False)):
                    if isinstance(e, torch.Tensor):
                        if not isinstance(r, torch.Tensor):
                            out.failures.append(f"{shape}{label}: output {i} missing")
                        elif tied and i == 1 and isinstance(results[0], torch.Tensor):
                            _check_indices(
                                f,
                                vals,
                                fl_to_cpu(results[0]).clone(),
                                fl_to_cpu(r).clone(),
                                e,
                                f"{shape}{label} output {i}",
                                out,
                            )
                        else:
                            _compare(
                                fl_to_cpu(r).clone(), e, f"{shape}{label} output {i}", out, TOL_FLOOR.get(f.name, 0.0)
                            )
                for idx in f.mutable:
                    if idx < len(vals) and is_fl(vals[idx]) and not random:
                        _compare(fl_to_cpu(vals[idx]).clone(), cpu_args[idx], f"{shape}{label} mutated arg {idx}", out)
            if len(out.failures) >= 3:
                return out
    return out


def _guarded_outputs(f: OpFacts, dev: Device, vals: list[Any], guard: GuardedMemory | None) -> list[Any] | None:
    """The outputs the kernel writes, allocated guarded (None: let the native path allocate them)."""
    if guard is None:
        return None
    layouts = output_layouts(f, vals) if any(a is None for a in f.ret_alias) else ()
    if layouts is None:
        return None
    outs = []
    for r, a in enumerate(f.ret_alias):
        if a is not None:
            outs.append(vals[a])
            continue
        lay = layouts[r]
        if lay is None or not isinstance(lay, tuple) or len(lay) != 3 or not isinstance(lay[2], torch.dtype):
            return None  # an undefined or non-tensor return: the native path handles those
        outs.append(guard.empty(dev, lay[0], lay[1], 0, lay[2]))
    return outs


def _guard_failures(
    guard: GuardedMemory, dev_args: Iterable[Any], dev_kw: dict[str, Any], results: Iterable[Any], what: str
) -> list[str]:
    """One message per tensor the kernel wrote outside of (inputs, keyword tensors, outputs)."""
    named = [(f"input {i}", t) for i, t in enumerate(_flat(dev_args)) if is_fl(t)]
    named += [(f"argument {k}", t) for k, v in dev_kw.items() for t in _flat([v]) if is_fl(t)]
    named += [(f"output {i}", t) for i, t in enumerate(_flat(results)) if is_fl(t)]
    failures, seen = [], set()
    for name, t in named:
        key = (base_ptr(t), span(t))
        if key in seen:  # an in-place op's output is its input
            continue
        seen.add(key)
        damage = guard.damage(t)
        if damage:
            failures.append(
                f"{what}: the kernel wrote {damage} of {name} (shape {tuple(t.shape)}, {t.dtype}): out-of-bounds write"
            )
    return failures


def _references() -> dict:
    """Ops whose CPU kernel refuses to run (PyTorch leaves the overrideable fused
    attention to devices): torch_fl's own composition of aten ops is the truth."""
    from ... import fused
    from ...dispatch import sdpa_backward, sdpa_forward

    aten = torch.ops.aten
    table: dict = {
        aten._scaled_dot_product_fused_attention_overrideable.default: sdpa_forward,
        aten._scaled_dot_product_fused_attention_overrideable_backward.default: sdpa_backward,
    }
    fused.register_decompositions(table)
    return table


_REFERENCES = _references()


def _flat(v: Iterable[Any]) -> Iterator[Any]:
    for x in v:
        if isinstance(x, (list, tuple)):
            yield from _flat(x)
        else:
            yield x


def _shape_of(args: Iterable[Any]) -> str:
    shapes = [tuple(a.shape) for a in _flat(args) if isinstance(a, torch.Tensor)]
    return "inputs " + ", ".join(str(s) for s in shapes[:3]) + ("..." if len(shapes) > 3 else "")
