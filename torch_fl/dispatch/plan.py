"""The dispatcher's tiers for one op call: every aten op on an fl tensor that
PyTorch's C++ core (runtime/csrc/) does not serve itself arrives
here, through the boxed fallback PyTorch calls for the fl (PrivateUse1) device
(dispatch.entry routes it).

For each op the path is resolved once per (op, dtypes, backend) and cached:
native plugin kernel -> decomposition (torch._decomp plus ours) -> JIT ->
CPU fallback. An out= overload (which is how PyTorch hands structured ops
such as add, mm or sum to a backend) takes the plan of its functional twin
and writes into the given outputs. A native call on an op's own arguments is
committed to the C++ core's fast path (runtime.native.commit). Views never
touch the plugin (dispatch.meta); copies between devices are explicit and
counted."""

from __future__ import annotations

import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
from torch._decomp import decomposition_table

from .. import jit
from ..errors import KernelError, KernelIndexError
from ..runtime import (
    COMPLEX_CODES,
    DECOMPOSITION,
    FALLBACK,
    JIT,
    NATIVE,
    NOT_HANDLED,
    REGISTRY,
    SETTINGS,
    TO_CODE,
    abi,
    async_copy,
    base_ptr,
    copy_unique,
    core,
    cpu_to_new_fl,
    device_of,
    dtype_name,
    events,
    is_dense,
    is_fl,
    iter_tensors,
    mask_to_names,
    native,
    native_factory,
    new_tensor,
    output_layouts,
    run_native,
)
from . import decomp_replay, jit_replay, layouts, outcheck, overlap, rng
from .decompositions import DECOMPOSITIONS, host_kernel
from .facts import OpFacts, facts
from .fallback import commit as commit_fallback
from .fallback import run_fallback, set_device_only

aten = torch.ops.aten

# -- helpers -----------------------------------------------------------------


def _device_of(name: str, vals):
    """The single fl device of an op's tensors; PyTorch's own error otherwise."""
    dev = None
    for t in iter_tensors(vals):
        if t.device.type == "fl":
            if t.layout is not torch.strided:
                raise RuntimeError(
                    f"{name}: a {t.layout} tensor on {t.device} is not supported by torch_fl (fl tensors are "
                    f"strided); keep {t.layout} tensors on the CPU and move dense ones with .to_dense() first"
                )
            d = device_of(t)
            if dev is None:
                dev = d
            elif d is not dev:
                raise RuntimeError(
                    f"Expected all tensors to be on the same device, but found at least two devices, "
                    f"{dev.torch_device} ({dev.backend.name}) and {d.torch_device} ({d.backend.name})! "
                    f"(when checking arguments for {name}). Move one with .to() first."
                )
        elif t.dim() != 0 and t.device.type != "meta":
            other = t
            first = next((x for x in iter_tensors(vals) if is_fl(x)), None)
            where = first.device if first is not None else "fl"
            raise RuntimeError(
                f"Expected all tensors to be on the same device, but found at least two devices, "
                f"{where} and {other.device}! (when checking arguments for {name}). Move the {other.device} "
                f"tensor with .to('{where}') first."
            )
    return dev


def _host_args_to_device(f: OpFacts, vals: list) -> None:
    """Index tensors (and a 0-dim value) given on the host go to the device of the op's fl tensors, as
    CUDA's indexing kernels move them (facts.HOST_ARGS)."""
    target = next((t.device for t in iter_tensors(vals) if t.device.type == "fl"), None)
    if target is None:
        return
    for i, bound in f.host_args:
        v = vals[i]
        if isinstance(v, torch.Tensor):
            if v.device.type == "cpu" and (bound is None or v.dim() == 0):
                vals[i] = v.to(target)
        elif isinstance(v, (list, tuple)) and any(isinstance(x, torch.Tensor) and x.device.type == "cpu" for x in v):
            vals[i] = type(v)(x.to(target) if isinstance(x, torch.Tensor) and x.device.type == "cpu" else x for x in v)


# -- plans ---------------------------------------------------------------------


@dataclass
class Plan:
    """The ordered paths to try for one (op, dtypes) on one backend, and why."""

    op: str
    backend: str
    dtypes: tuple
    paths: list = field(default_factory=list)
    kernel: Any = None  # NATIVE: the plugin's kernel entry
    decomposition: object = None
    jit: Any = None  # JIT: the generated kernel, called as plan.jit(f, dev, vals)
    reasons: list = field(default_factory=list)
    failed: set = field(default_factory=set)  # paths found broken at run time (a JIT compile that failed)
    learn: bool = False  # see _learn: the first decomposition run says whether another path serves the op better
    reduces: bool | None = None  # whether a watched decomposition ever reduced to the JIT kernel (jit_replay)
    seen: dict = field(default_factory=dict)  # signature -> whether it may be recorded again (decomp_replay)

    @property
    def first(self) -> str | None:
        return next((p for p in self.paths if p not in self.failed), None)


class ThreadState(threading.local):
    """Per-thread dispatcher state; class defaults make the hot-path reads cheap."""

    active: set | None = None  # ops whose decomposition is running (see decomposing)
    device_only: int = 0  # > 0 inside a decomposition that must stay on the device


TLS = ThreadState()


def _set_device_only(depth: int) -> None:
    """TLS.device_only, told to the C++ fast path of the CPU fallback too (it must not serve a sub-op there)."""
    TLS.device_only = depth
    set_device_only(depth)


def decomposing() -> set:
    s = getattr(TLS, "active", None)
    if s is None:
        s = TLS.active = set()
    return s


def decomposition_context() -> str:
    """The decompositions in progress on this thread, named (a kernel graph's recorder says where a host
    read or a CPU fallback happened: runtime.events.OP_CONTEXT)."""
    active = getattr(TLS, "active", None)
    return ("the decomposition of " + ", ".join(sorted(f.name() for f in active))) if active else ""


def resolve(f: OpFacts, backend, dtypes: tuple) -> Plan:
    plan = Plan(f.name, backend.name, tuple(dtype_name(d) for d in dtypes))
    dev_mask = backend.devices[0].props.dtypes if backend.devices else 0
    entry = backend.plugin.kernels.get(f.name)
    # a dtype, or None with code -1: the branches below test code < 0 before naming it (Any: mypy cannot follow)
    lookup: Any = dtypes[0] if dtypes else None
    code = TO_CODE.get(lookup, -1) if lookup is not None else -1
    unnamed = _without_abi_dtype(dtypes)
    if NATIVE in SETTINGS.disabled:
        plan.reasons.append("native kernels switched off")
    elif unnamed:
        plan.reasons.append(unnamed)
    elif f.is_out:
        plan.reasons.append("out= overloads are not sent to plugin kernels")
    elif entry is None:
        plan.reasons.append(f"no native kernel for {f.name} in plugin '{backend.name}'")
    elif code < 0 or not (entry.dtypes >> code) & 1 or _unserved_complex(entry, dtypes):
        what = _unserved_complex(entry, dtypes) or (dtype_name(lookup) if lookup else "?")
        plan.reasons.append(
            f"native kernel {f.name} does not serve {what} (serves {', '.join(mask_to_names(entry.dtypes))})"
        )
    elif not (dev_mask >> code) & 1:
        plan.reasons.append(f"device does not compute in {dtype_name(lookup)}")
    else:
        plan.paths.append(NATIVE)
        plan.kernel = entry
        plan.reasons.append(f"native kernel {f.name} [{dtype_name(lookup)}] in plugin '{backend.name}'")
    note = _complex_note(backend, dtypes, dev_mask)
    if note:
        plan.reasons.insert(0, note)
    if DECOMPOSITION in SETTINGS.disabled:
        plan.reasons.append("decompositions switched off")
    elif DECOMPOSITIONS.get(f.func) is not None:
        plan.paths.append(DECOMPOSITION)
        plan.decomposition = DECOMPOSITIONS[f.func]
        plan.reasons.append(f"decomposition of {f.name} into other aten ops")
    elif f.func in GENERIC:  # taken at the fl key for the plugins that have a kernel; PyTorch's for the rest
        plan.paths.append(DECOMPOSITION)
        plan.decomposition = generic_kernel(f.func)
        plan.reasons.append(f"PyTorch's generic kernel for {f.name} (CompositeExplicitAutograd: other aten ops)")
    else:
        plan.reasons.append(f"no decomposition for {f.name}")
    kernel = jit.lookup(backend, f, dtypes) if JIT not in SETTINGS.disabled and not unnamed else None
    if kernel is not None:
        plan.paths.append(JIT)
        plan.jit = kernel
        plan.reasons.append(_jit_claim(f.name))
    else:
        plan.reasons.append("no JIT kernel")
    if SETTINGS.cpu_fallback:
        plan.paths.append(FALLBACK)
        plan.reasons.append("CPU fallback (copy to host, run PyTorch's CPU kernel, copy back)")
        if (
            plan.paths[0] == DECOMPOSITION
            and JIT not in plan.paths
            and _host_can_serve(f, plan)
            and dtypes
            and not any(d in TO_CODE and (dev_mask >> TO_CODE[d]) & 1 for d in dtypes)
        ):
            _fallback_first(
                plan,
                f"the device computes in none of "
                f"{', '.join(sorted({dtype_name(d) for d in dtypes}))}, so every sub-op of the "
                f"decomposition would reach the CPU fallback, one copy round trip each",
            )
    else:
        plan.reasons.append("CPU fallback is switched off (FL_CPU_FALLBACK=0)")
    plan.learn = (
        plan.paths[:1] == [DECOMPOSITION]
        and bool(dtypes)
        and _generic_decomposition(f, plan)
        and not any(d.is_floating_point or d.is_complex for d in dtypes)
    )
    return plan


def _host_can_serve(f: OpFacts, plan: Plan) -> bool:
    """Whether PyTorch's CPU kernel may serve the whole op before its decomposition is tried, where the device
    would compute nothing of it: the CPU fallback then runs PyTorch's own kernel in one round trip, the result
    the CPU baseline computes, instead of a decomposition whose sub-ops (and theirs: torch._refs' sigmoid is
    neg, exp, add and div, each a torch._refs entry again) would each take the fallback, paying a round trip
    and the Python decomposition machinery per sub-op. The decomposition is PyTorch's, or one of torch_fl's
    that computes what the CPU kernel computes (marked `host_equivalent`: allclose, the comparisons with a
    number); torch_fl's others keep dtype-blind work on the device (zero_ as a memory fill, full_like). The op
    has a kernel the CPU dispatches to: its own, or PyTorch's generic one (CompositeExplicitAutograd: rsub,
    abs, stack), but not an "overrideable" op's, which only raises for a backend to override it; or torch_fl
    has a host kernel for it (the fused RNN cells, which only CUDA implements: decompositions.host_kernel).
    No random op: the decomposition draws from the device's generator, the fallback would use the host's."""
    if torch.Tag.nondeterministic_seeded in f.func.tags:
        return False
    if host_kernel(f.func) is not None:
        return True
    if not _generic_decomposition(f, plan):
        return False
    name = f.func.name()
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    return has(name, "CPU") or ("overrideable" not in name and has(name, "CompositeExplicitAutograd"))


def _generic_decomposition(f: OpFacts, plan: Plan) -> bool:
    """The plan's decomposition computes what the op's CPU kernel computes, only spelled in other ops:
    PyTorch's own, or one of torch_fl's marked `host_equivalent`."""
    return plan.decomposition is decomposition_table.get(f.func) or getattr(
        plan.decomposition, "host_equivalent", False
    )


def _fallback_first(plan: Plan, why: str) -> None:
    plan.paths.remove(FALLBACK)
    plan.paths.insert(0, FALLBACK)
    plan.reasons.append(f"the CPU fallback is tried before the decomposition: {why}")


def _native_calls() -> int:
    core.drain_counts()  # the C++ core's native calls: its fast path's and decomposition plans' (not JIT plans')
    return events.STATE.native_calls + core.FAST_SERVED.get(NATIVE, 0)


def _learn(f: OpFacts, plan: Plan, before: tuple) -> None:
    """After the first decomposition run of an op on exact dtypes (bool, integers; plan.learn), what it
    reached decides the op's first path from then on, with the same exact result in one call instead of a
    chain of torch._refs Python: where no native kernel served a sub-op, the op's own JIT kernel, where it
    has one (bitwise_not on bool is torch._refs' bitwise_not, then prims.bitwise_not, then the JIT kernel of
    bitwise_not itself); where no kernel of the device ran at all, the CPU kernel, where it may serve the op."""
    plan.learn = False
    kernels, natives = before
    if JIT in plan.paths:
        if _native_calls() == natives and JIT not in plan.failed:
            plan.paths.remove(JIT)
            plan.paths.insert(0, JIT)
            plan.reasons.append(
                "the JIT kernel is tried before the decomposition: its first call reached no native "
                "kernel (its sub-ops took JIT kernels or the CPU fallback), and on exact dtypes the "
                "op's own JIT kernel gives the same result"
            )
    elif FALLBACK in plan.paths and events.kernel_count() == kernels and _host_can_serve(f, plan):
        _fallback_first(
            plan,
            "its first call reached no kernel of the device (every sub-op of the decomposition "
            "took the CPU fallback), and on exact dtypes the CPU kernel gives the same result",
        )


def _jit_claim(name: str) -> str:
    return f"JIT-compiled kernel for {name}"


def _note_jit_failure(plan: Plan, f: OpFacts, backend) -> None:
    """A JIT kernel that failed to compile is said so, with the compiler's
    reason, in the plan's reasons -- which the no-path error and fl.explain
    print -- instead of being listed as if it were there."""
    why = jit.compile_failure(backend.name, f.name)
    if why is None:
        return
    plan.failed.add(JIT)
    text = f"the JIT kernel for {f.name} failed to compile: {why}"
    plan.reasons[:] = [
        text if r == _jit_claim(f.name) or r.startswith(f"the JIT kernel for {f.name} failed") else r
        for r in plan.reasons
    ]


def _without_abi_dtype(dtypes) -> str | None:
    """Why no plugin kernel, native or JIT, may serve these operands: one has a dtype the ABI has no code
    for (uint16/32/64, float8, complex32, ...), which a kernel would read as something else or not at all.
    Decompositions and the CPU fallback serve it."""
    for d in dtypes:
        if d not in TO_CODE:
            advice = "; convert with .cfloat() or .cdouble()" if d.is_complex else ""
            return (
                f"{dtype_name(d)} has no fl dtype (the plugin ABI has no code for it, so no plugin kernel "
                f"may read it{advice})"
            )
    return None


def _unserved_complex(entry, dtypes) -> str | None:
    """A complex operand dtype the kernel's mask does not name: a kernel sees complex memory only
    if it says it can read it (plugins written before complex dtypes would read it as real)."""
    for d in dtypes:
        c = TO_CODE.get(d, -1)
        if c in COMPLEX_CODES and not (entry.dtypes >> c) & 1:
            return dtype_name(d)
    return None


def _complex_note(backend, dtypes, dev_mask: int) -> str | None:
    """Why a complex operand cannot run natively on this device at all, said first."""
    cplx = [d for d in dtypes if d.is_complex]
    if not cplx or any(d not in TO_CODE for d in cplx):  # _without_abi_dtype says why
        return None
    if not any((dev_mask >> c) & 1 for c in COMPLEX_CODES):
        return f"fl backend '{backend.name}' computes in no complex dtype (its device's dtype mask has none)"
    return None


def compute(f: OpFacts, args, kwargs, arrived: tuple | None = None):
    """Serve a call of f on the fl device by the first tier of its plan that can, teaching the C++ core's
    fast paths the call where they could serve the next one. arrived: (facts of the op the call reached the
    device as, its argument index of each of f's arguments, f's returns among its own), where that is another
    op (aten::_copy_from, served as copy_): a native or JIT call is then committed under that op's key."""
    vals = f.normalize(args, kwargs)
    if f.generator_at is not None and vals[f.generator_at] is not None:
        return rng.call_with_generator(f, vals, compute)
    if f.host_args is not None:
        _host_args_to_device(f, vals)
    if async_copy.PENDING:  # an async copy may still be writing one of these tensors
        async_copy.order_for_kernels(iter_tensors(vals))
    unchecked = False
    if f.overlap is not None:
        # PyTorch's overlap checks on the user's call, before any tier; the sub-ops of a
        # decomposition are its own business (an out= wrapper copies a view into out), but a call the
        # check would refuse must not teach the fast path its signature, which a user's call could then
        # take past the check
        rule = f.overlap_rule(vals)
        if rule is not None:
            if not TLS.active:
                overlap.check(rule, f.mutable, vals)
            else:
                unchecked = not _overlap_passes(f, vals, rule)
    if not TLS.active and TLS.device_only:
        _set_device_only(0)  # no decomposition is running: nothing may keep the CPU fallback away
    # PyTorch's checks of the user's call, as the overlap rules; a check that warned (a deprecated uint8 mask,
    # a random range beyond the dtype's exact integers) keeps the call off the fast path, which would not warn.
    # Inside a decomposition the check is skipped, so nothing vouches for the signature: the fast path, which
    # never runs a check, must not learn it there either (a uniform_ inside random_'s decomposition would
    # otherwise let every later uniform_(from > to) through)
    warned = (f.precheck(vals) if not TLS.active else True) if f.precheck is not None else False
    warned = warned or unchecked
    dev = _device_of(f.name, vals)
    if dev is None:  # no fl tensor among the arguments: a factory asked for the fl device
        return _factory(f, args, kwargs)
    twin = f.functional
    if twin is not None:
        return _compute_out(f, twin, dev, vals, fast=not warned)
    plan = _plan(f, dev, vals)
    want = layouts.wanted(f, vals) if f.layout_rule is not None else None
    if want is not None:  # CPU lays the results out channels-last: not a call the fast path could replay
        return layouts.apply(want, _run_plan(f, dev, vals, plan))
    committed, stack_of, returns = arrived or (f, range(len(vals)), list(range(f.n_returns)))
    if plan.first == NATIVE and native.FAST.enabled and not warned:
        site: dict = {}
        result = _run_plan(f, dev, vals, plan, None, site)
        if site:
            native.commit(committed, f.name, site, stack_of, returns)
        return result
    if native.FAST.enabled and not warned and _jit_replays(f, plan, vals):
        site = {}
        result = _run_plan(f, dev, vals, plan, None, site)
        if site and jit_replay.replayable(site, plan.first == DECOMPOSITION):
            native.commit(committed, f.name, site, stack_of, returns, path=JIT)
        return result
    if not warned and not f.mutable and _decomp_replays(f, plan):
        result = decomp_replay.first_call(f, f, dev, vals, range(len(vals)), None, _runner(f, dev, plan), plan.seen)
        if result is not NOT_HANDLED:
            return result
    if plan.first == FALLBACK and not warned and f.handler is compute and not TLS.device_only:
        result = _run_plan(f, dev, vals, plan)  # the CPU kernel served it: the C++ core can serve the next
        commit_fallback(f, dev, f.name, vals, result)
        return result
    return _run_plan(f, dev, vals, plan)


_COPY: list = []  # (copy_'s facts, _copy_from's facts)


def copy_within(dst: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """dst.copy_(src) within one device that is no plain device memory copy (a cast, a broadcast, another
    layout): copy_'s tiers. The C++ core learns the call as the aten::_copy_from(src, dst) it arrived as: a
    native or JIT kernel's call (a cast: .to(dtype), autocast, .float()) or one the CPU kernel served
    (copy_(dst, src) on the host copies, dst written back). Not a complex-to-real cast, whose warning a
    replay would not give."""
    if not _COPY:
        _COPY.append((facts(aten.copy_.default), facts(aten._copy_from.default)))
    f, arrived = _COPY[0]
    # never learnt: a cast PyTorch warns about, or a copy its overlap check refuses (compute skips the check
    # inside a decomposition, and a user's call of that signature would then pass it unchecked)
    learn = not (src.is_complex() and not dst.is_complex()) and _overlap_passes(f, [dst, src, False])
    result = compute(f, (dst, src), {}, arrived=(arrived, (1, 0, 2), [0]) if learn else None)
    if native.FAST.enabled and not TLS.device_only and learn:
        dev = device_of(dst)
        vals = [dst, src, False]
        if _plan(f, dev, vals).first == FALLBACK:
            commit_fallback(f, dev, f.name, vals, result, arrived=(arrived, (1, 0, 2), 1))
    return result


def _overlap_passes(f: OpFacts, vals: list, rule=None) -> bool:
    """Whether PyTorch's overlap check passes the call (rule: f's overlap rule for vals, when the caller has it)."""
    if rule is None and f.overlap is not None:
        rule = f.overlap_rule(vals)
    if rule is None:
        return True
    try:
        overlap.check(rule, f.mutable, vals)
    except RuntimeError:
        return False
    return True


def _jit_replays(f: OpFacts, plan: Plan, vals: list) -> bool:
    """A call whose serving JIT kernel the C++ fast path could replay (dispatch.jit_replay): the JIT is the
    plan's first path, or its first is a decomposition that may reduce to the op's own JIT kernel (not
    while that decomposition runs: the op's call inside it is not the call the signature stands for), on a
    call without numbers (the only kind whose decomposition is watched; a call with one, mul.Scalar's, is
    left to the decomposition plans)."""
    if not jit_replay.replays(plan):
        return False
    if plan.first == JIT:
        return True
    return (
        plan.first == DECOMPOSITION
        and plan.reduces is not False
        and f.func not in decomposing()
        and jit_replay.numberless(f, vals)
    )


def _decomp_replays(f: OpFacts, plan: Plan) -> bool:
    """A call whose decomposition the C++ core could replay as a kernel graph (dispatch.decomp_replay): the
    plan's first path is a decomposition that does not reduce to the op's own JIT kernel (jit_replay commits
    that one), not while that decomposition runs, nor inside a device-only one."""
    return (
        plan.first == DECOMPOSITION
        and native.FAST.enabled
        and f.handler is compute
        and not TLS.device_only
        and f.func not in decomposing()
    )


def _runner(ff: OpFacts, dev, plan: Plan):
    return lambda vals: _run_plan(ff, dev, vals, plan)


def _plan(f: OpFacts, dev, vals) -> Plan:
    backend = dev.backend
    dtypes = tuple(t.dtype for t in iter_tensors(vals) if t.device.type == "fl")
    key = (f.func, dtypes)
    plan = backend.plans.get(key)
    if plan is None:
        plan = backend.plans[key] = resolve(f, backend, dtypes)
    return plan


def _run_plan(f: OpFacts, dev, vals, plan: Plan, outs=None, site: dict | None = None, may_decline=False):
    """Try the plan's paths in order; the first that serves the call gives the result. With outs (the
    tensors an out= call writes), a native kernel writes into them directly; with site, a native call
    records its marshalling there, and so does a JIT kernel that serves the call first or is what the
    decomposition tried first reduced to (dispatch.jit_replay)."""
    backend = dev.backend
    listening = bool(events.STATE.listeners)
    if listening:
        t0 = time.perf_counter()
        k0, b0 = events.STATE.kernels, events.STATE.bytes_copied
        events.NESTING.depth += 1
    failures: list = []
    try:
        for k, path in enumerate(plan.paths):
            first = k == 0  # no path declined the call yet
            if path == NATIVE:
                result = run_native(f, plan.kernel, dev, vals, outs, site)
            elif path == DECOMPOSITION:
                active = decomposing()
                if f.func in active:
                    continue
                # With a JIT kernel to fall back on, a functional op's decomposition must stay on
                # the device: if one of its sub-ops would need the CPU fallback, the JIT serves
                # the whole op instead (native -> decomposition -> JIT -> CPU fallback).
                strict = plan.jit is not None and not f.mutable
                # saved and restored, not counted down: an exception raised between two statements
                # (a signal's, pytest-timeout's) must not leave the thread unable to fall back for good
                device_only = TLS.device_only
                learn = plan.learn
                if learn:
                    before = (events.kernel_count(), _native_calls())
                watch = first and site is not None and jit_replay.replays(plan) and jit_replay.numberless(f, vals)
                watch = watch and plan.reduces is not False
                if watch:  # does the decomposition reduce to the op's own JIT kernel? (dispatch.jit_replay)
                    watched, jit_replay.CAPTURE.calls, work = jit_replay.CAPTURE.calls, [], jit_replay.watch()
                try:
                    active.add(f.func)
                    if strict:
                        _set_device_only(device_only + 1)
                    result = f.call_decomposition(plan.decomposition, vals)
                except NotImplementedError as e:  # a sub-op had no path: say so for this op
                    failures.append(_decomposition_needs(f, plan, e))
                    if events.STATE.recording is not None:
                        events.STATE.recording.declined(f.name)
                    continue
                finally:
                    active.discard(f.func)
                    if strict or TLS.device_only != device_only:
                        _set_device_only(device_only)
                    if watch:
                        calls, jit_replay.CAPTURE.calls = jit_replay.CAPTURE.calls, watched
                        native.sync_fast_path()
                if watch and site is not None and calls is not None and result is not NotImplemented:
                    reduced = jit_replay.reduced(f.func, vals, result, calls, work)
                    plan.reduces = bool(plan.reduces or reduced)  # never did: not watched again (slower)
                    site.update(reduced or {})
                if result is NotImplemented:  # some torch._decomp entries decline cases they do not cover
                    failures.append("its decomposition does not cover this case")
                    continue
                if learn:
                    _learn(f, plan, before)
            elif path == JIT:
                capture = jit_replay.CAPTURE.calls
                if jit_replay.replays(plan) and ((first and site is not None) or capture is not None):
                    jsite = site if first and site is not None else {}
                    result = plan.jit(f, dev, vals, jsite)
                    if jsite and jsite is not site and capture is not None:
                        capture.append((f.func, vals, jsite, result))
                else:
                    result = plan.jit(f, dev, vals)
                if result is NOT_HANDLED:
                    _note_jit_failure(plan, f, backend)
            else:
                if TLS.device_only:  # inside a decomposition that must stay on the device
                    failures.append("the CPU fallback is not used inside a device-only decomposition")
                    if events.STATE.recording is not None:
                        events.STATE.recording.declined(f.name)
                    continue
                result = run_fallback(f, dev, vals)
            if result is NOT_HANDLED:
                continue
            events.count(backend, f.name, path)
            if listening:
                _emit(f.name, backend.name, path, t0, k0, b0)
            return result
    except KernelError as e:
        if e.status == abi.FL_ERR_INVALID and f.func._schema.name in INDEX_ERROR_OPS and not isinstance(e, IndexError):
            raise KernelIndexError(str(e), e.status) from None
        raise
    finally:
        if listening:
            events.NESTING.depth -= 1
    if may_decline:
        return NOT_HANDLED
    raise _no_path_error(f, backend, plan, failures)


# ops for which PyTorch raises IndexError on an index out of range: a kernel's (or a decomposition's
# sub-op's) refusal of the call's values is raised as one (gather, scatter, index_add: RuntimeError, as CPU)
INDEX_ERROR_OPS = frozenset(
    f"aten::{n}"
    for n in (
        "index",
        "_unsafe_index",
        "index_put",
        "index_put_",
        "_index_put_impl_",
        "_unsafe_index_put",
        "index_select",
        "embedding",
        "embedding_dense_backward",  # native CPU does not check (it corrupts memory); CUDA asserts
        "take",
        "put",
        "put_",
        "index_copy",
        "index_copy_",
        "index_fill",
        "index_fill_",
        "index_reduce",
        "index_reduce_",
        "select_scatter",
    )
)


def _compute_out(f: OpFacts, twin: tuple, dev, vals, fast: bool = True):
    """An out= overload: PyTorch hands structured ops (add, mul, mm, sum, ...) to a backend this way, with
    the outputs already allocated by their meta function, and so do in-place ops (add_ is add.out into
    self). The functional twin's plan serves it: a native kernel writes straight into the outputs when
    they have the layout the functional op would give and do not partly overlap an input; otherwise the
    functional result is copied in (resizing an output, as PyTorch's out= ops do)."""
    ff, ins, outs_at = twin
    fvals = [vals[i] for i in ins]
    outs = [vals[i] for i in outs_at]
    layout = output_layouts(ff, fvals)  # once: its cache key costs as much as the lookup
    outcheck.check(f, dev, vals, outs, layout)
    if ff.layout_rule is not None:
        _fresh_outs_channels_last(ff, fvals, outs)
    plan = _plan(ff, dev, fvals)
    # a JIT kernel the fast path could replay, writing straight into the outputs (dispatch.jit_replay)
    jit_site: dict | None = {} if fast and native.FAST.enabled and _jit_replays(ff, plan, fvals) else None
    if plan.first == NATIVE and _writes_in_place(
        ff, fvals, outs, layout, plan.kernel.flags & abi.KERNEL_ANY_OUT_LAYOUT
    ):
        site: dict | None = {} if native.FAST.enabled and fast else None
        result = _run_plan(ff, dev, fvals, _native_only(plan), outs, site, may_decline=True)
        if result is not NOT_HANDLED:
            if site:
                native.commit(f, ff.name, site, ins, list(range(len(outs))), outs_at)
            return _returned(f, outs)
    if plan.first == FALLBACK and not TLS.device_only and _in_place(outs, fvals):
        # an in-place op (add_ is add.out into self) the CPU serves: its CPU kernel writes the host copy of
        # self, which goes back once, instead of a functional result written back and then copied into self
        # by copy_, itself a second fallback round trip where the device lacks the dtype
        listening = bool(events.STATE.listeners)
        if listening:
            t0, k0, b0 = time.perf_counter(), events.STATE.kernels, events.STATE.bytes_copied
            events.NESTING.depth += 1
        try:
            result = run_fallback(f, dev, vals)
            events.count(dev.backend, ff.name, FALLBACK)
            if listening:
                _emit(ff.name, dev.backend.name, FALLBACK, t0, k0, b0)
        finally:
            if listening:
                events.NESTING.depth -= 1
        if fast and f.handler is compute:
            commit_fallback(f, dev, ff.name, vals, result)
        return result
    if jit_site is not None and not _writes_in_place(ff, fvals, outs, layout):
        jit_site = None
    result = NOT_HANDLED
    if jit_site is None and fast and _decomp_replays(f, plan) and ff.func not in decomposing():
        result = decomp_replay.first_call(f, ff, dev, vals, ins, outs_at, _runner(ff, dev, plan), plan.seen)
    if result is NOT_HANDLED:
        result = _run_plan(ff, dev, fvals, plan, None, jit_site)
    results = (result,) if ff.n_returns == 1 else tuple(result)
    # the CPU kernel served it and its results fit the outputs as they are: the C++ core can serve the next
    replayable = (
        fast
        and plan.first == FALLBACK
        and f.handler is compute
        and not TLS.device_only
        and all(
            is_fl(o)
            and isinstance(r, torch.Tensor)
            and r.dtype == o.dtype
            and r.shape == o.shape
            and not overlap.has_internal_overlap(o)
            for o, r in zip(outs, results, strict=True)
        )
    )
    rule = f.overlap_rule(vals)
    for out, r in zip(outs, results, strict=True):
        _write_out(f, out, r, rule)
    if replayable:
        commit_fallback(f, dev, ff.name, vals, result, twin)
    if jit_site and jit_replay.replayable(jit_site, plan.first == DECOMPOSITION):
        site = jit_replay.into(jit_site, outs)
        native.commit(f, ff.name, site, ins, list(range(len(outs))), outs_at, path=JIT)
    return _returned(f, outs)


def _in_place(outs: list, fvals: list) -> bool:
    """Every output is one of the inputs itself (an in-place op's self): same shape, nothing to resize."""
    return bool(outs) and all(is_fl(o) and any(o is v for v in fvals) for o in outs)


def _fresh_outs_channels_last(ff: OpFacts, fvals, outs: list) -> None:
    """A structured op (replication_pad2d) reaches the device as its out= overload, with outputs PyTorch just
    allocated contiguous: where CPU would lay the result out channels-last (dispatch.layouts), a fresh output
    nobody else holds is restrided so, over the same storage."""
    want = layouts.wanted(ff, fvals)
    if want is None:
        return
    fmt, results = want
    for i in results:
        out = outs[i] if i < len(outs) else None
        if (
            not is_fl(out)
            or out._base is not None
            or out.storage_offset()
            or not out.is_contiguous()
            or out.dim() != (4 if fmt is torch.channels_last else 5)
            or torch._C._storage_Use_Count(out.untyped_storage()._cdata) != 2
        ):
            continue
        out.as_strided_(out.shape, torch.empty(out.shape, device="meta", memory_format=fmt).stride())


def _returned(f: OpFacts, outs: list):
    """What an out= overload returns: its outputs, or nothing where its schema returns () (split_copy's
    Tensor(a!)[] out: PyTorch insists on None)."""
    if f.n_returns == 0:
        return None
    return outs[0] if len(outs) == 1 else tuple(outs)


def _native_only(plan: Plan) -> Plan:
    p = plan.__dict__.get("_native_only")
    if p is None:
        p = Plan(plan.op, plan.backend, plan.dtypes, [NATIVE], plan.kernel, None, None, plan.reasons)
        plan.__dict__["_native_only"] = p
    return p


def _writes_in_place(ff: OpFacts, fvals, outs, lays, any_layout: int = 0) -> bool:
    """The outputs have exactly the layouts the functional op gives (or, for a kernel that writes any
    dense layout, such as a convolution into a channels-last buffer, dense layouts), and none partly
    overlaps an input (a pointwise kernel may write over an input of the same layout: that is what
    in-place ops are). lays: output_layouts(ff, fvals)."""
    if lays is None or len(lays) != len(outs):
        return False
    for out, lay in zip(outs, lays, strict=True):
        if not is_fl(out) or not isinstance(lay, tuple) or len(lay) != 3:
            return False
        if list(out.shape) != lay[0] or out.dtype != lay[2]:
            return False
        if out.numel() > 1 and list(out.stride()) != lay[1] and not (any_layout and is_dense(out)):
            return False
        if out.is_conj() or out.is_neg():
            return False
        base = base_ptr(out)
        for t in iter_tensors(fvals):
            if t.device.type != "fl" or not t.numel() or base_ptr(t) != base:
                continue
            same = (
                t.storage_offset() == out.storage_offset()
                and t.shape == out.shape
                and t.stride() == out.stride()
                and t.dtype == out.dtype
            )
            if not (ff.pointwise and same):
                return False
    return True


def _write_out(f: OpFacts, out: torch.Tensor, r, rule=None) -> None:
    if isinstance(out, (list, tuple)):  # a Tensor(a!)[] out (split_copy, unbind_copy): element by element
        if not isinstance(r, (list, tuple)) or len(r) != len(out):
            raise RuntimeError(
                f"{f.name}: expected {len(r) if isinstance(r, (list, tuple)) else 1} out= tensors, got {len(out)}"
            )
        for o, x in zip(out, r, strict=True):
            _write_out(f, o, x, rule)
        return
    if not isinstance(r, torch.Tensor):
        return
    if _adopt(out, r):
        return
    if out.shape != r.shape:
        if out.numel() != 0:
            warnings.warn(
                f"An output with one or more elements was resized since it had shape {list(out.shape)}, which "
                f"does not match the required output shape {list(r.shape)}. This behavior is deprecated, and in "
                f"a future PyTorch release outputs will not be resized unless they have zero elements. You can "
                f"explicitly reuse an out tensor t by resizing it, inplace, to zero elements with t.resize_(0).",
                UserWarning,
                stacklevel=3,
            )
        out.resize_(r.shape)
        if r.dim() and not r.is_contiguous() and is_dense(r):
            out.as_strided_(r.shape, r.stride())
    if overlap.has_internal_overlap(out) and not (rule is not None and rule.internal):
        copy_unique(out, r)  # an expanded out= tensor the op's CPU kernel writes into without complaint
    else:
        out.copy_(r)


def _adopt(out: torch.Tensor, r: torch.Tensor) -> bool:
    """out takes r's storage instead of a copy of it, when nobody could tell the difference: out is a fresh
    output PyTorch's structured wrapper allocated for a functional call, which no Python object had seen (the C++
    core says: fl_core_fresh_out), or has no elements (it must be resized anyway); out is the sole owner of its
    storage and r of its own (a fresh result), with the same layout. A user's out= tensor of the right size
    keeps its memory (its data_ptr), as PyTorch promises."""
    if not (is_fl(r) and is_fl(out)) or r.device != out.device or r.dtype != out.dtype:
        return False
    if out.numel() != 0 and (
        not core.lib().fl_core_fresh_out(core.pointer(base_ptr(out)))
        or out.shape != r.shape
        or (out.numel() > 1 and out.stride() != r.stride())
    ):
        return False
    if out.storage_offset():
        return False
    if out.is_conj() or out.is_neg() or r.is_conj() or r.is_neg() or out._base is not None:
        return False
    use_count = torch._C._storage_Use_Count
    if use_count(out.untyped_storage()._cdata) != 2 or use_count(r.untyped_storage()._cdata) != 2:
        return False  # (2: the tensor and the storage object asked about) another view shares it
    out.set_(r.untyped_storage(), r.storage_offset(), r.shape, r.stride())
    return True


def _no_path_error(f: OpFacts, backend, plan: Plan, failures=()) -> NotImplementedError:
    """The error of an op none of whose paths could run: a plain
    NotImplementedError (what users and PyTorch expect) that also carries the
    message without its advice (`fl_what`), so an enclosing op whose
    decomposition needed this one quotes it once and the advice comes once."""
    tried = "; ".join(list(plan.reasons) + list(failures))
    what = f"{f.name} ({', '.join(plan.dtypes) or 'no tensors'}) cannot run on fl backend '{backend.name}': {tried}"
    e = NotImplementedError(
        f"{what}. Enable the CPU fallback (FL_CPU_FALLBACK=1 or "
        f"torch_fl.set_cpu_fallback(True)) or use a backend that implements it."
    )
    e.fl_what, e.fl_op = what, (f.name, plan.dtypes)  # type: ignore[attr-defined]  # read back with getattr
    return e


def _decomposition_needs(f: OpFacts, plan: Plan, e: NotImplementedError) -> str:
    """Why a decomposition failed, for the enclosing op's message: the sub-op's
    own tiers without its advice, and only a short note when the sub-op is the
    op itself again (its other tiers are already listed)."""
    what = getattr(e, "fl_what", None)
    if what is None:
        return f"its decomposition needs {e}"
    if getattr(e, "fl_op", None) == (f.name, plan.dtypes):
        return f"its decomposition calls {f.name} ({', '.join(plan.dtypes)}) itself again"
    return f"its decomposition needs {what}"


def _emit(name, backend, path, t0, k0, b0) -> None:
    events.emit(
        events.OpEvent(
            name,
            backend,
            path,
            time.perf_counter() - t0,
            events.STATE.kernels - k0,
            events.STATE.bytes_copied - b0,
            events.NESTING.depth - 1,
            t0,
        )
    )


# -- factories: ops dispatched to the fl device without an fl tensor argument ---


def _factory(f: OpFacts, args, kwargs):
    """An op that reached the fl device with no fl tensor among its arguments: a factory asked for device
    "fl" (torch.eye, tril_indices, _efficientzerotensor, ...). A plugin kernel makes it on the device when
    there is one, else its decomposition on the device, else the host computes it and it is copied over;
    the path is reported like any op's."""
    device = kwargs.get("device")
    dev = REGISTRY.device(
        torch.device(device).index if device is not None and torch.device(device).type == "fl" else None
    )
    if not events.STATE.listeners:
        return _factory_run(f, dev, args, kwargs)[0]
    t0, k0, b0 = time.perf_counter(), events.STATE.kernels, events.STATE.bytes_copied
    events.NESTING.depth += 1
    try:
        out, path = _factory_run(f, dev, args, kwargs)
        _emit(f.name, dev.backend.name, path, t0, k0, b0)
    finally:
        events.NESTING.depth -= 1
    return out


def _factory_run(f: OpFacts, dev, args, kwargs):
    """_factory's work; returns (result, path)."""
    if f.func is aten._efficientzerotensor.default:
        # autograd's zero gradients (sgn, ...): PyTorch's CPU one has no storage (data_ptr 0);
        # on fl it is a real zero-filled tensor, made on the device with the fill_ every plugin has
        dtype = kwargs.get("dtype") or torch.get_default_dtype()
        return new_tensor(dev, list(args[0]), dtype).zero_(), NATIVE
    native_result = native_factory(f, dev, args, kwargs)
    if native_result is not None:
        return native_result, NATIVE
    if f.func in GENERIC:  # PyTorch's generic factory (empty, then an out= op torch_fl serves)
        return generic_kernel(f.func)(*args, **kwargs), DECOMPOSITION
    decomposition = DECOMPOSITIONS.get(f.func)
    active = decomposing()
    if decomposition is not None and DECOMPOSITION not in SETTINGS.disabled and f.func not in active:
        # torch.eye, tril_indices ... as device ops (arange, comparisons) rather than a host copy; all on
        # the device or not at all (a sub-op that needs the host sends the whole factory there instead)
        device_only = TLS.device_only
        try:
            active.add(f.func)
            _set_device_only(device_only + 1)
            out = decomposition(*args, **kwargs)
        except NotImplementedError:
            if not SETTINGS.cpu_fallback or device_only > 0:
                raise
        else:
            events.count(dev.backend, f.name, DECOMPOSITION)
            return out, DECOMPOSITION
        finally:
            _set_device_only(device_only)
            active.discard(f.func)
    if not SETTINGS.cpu_fallback or TLS.device_only:
        raise NotImplementedError(
            f"{f.name} has no kernel on fl backend '{dev.backend.name}' and the CPU fallback is switched off "
            f"(FL_CPU_FALLBACK=0); enable it with FL_CPU_FALLBACK=1 or torch_fl.set_cpu_fallback(True)"
        )
    if "device" in kwargs:
        kwargs = dict(kwargs, device="cpu")
    if f.generator_at is not None and rng.STATE.depth:
        vals = f.normalize(args, kwargs)
        vals[f.generator_at] = rng.host_generator(dev)
        args, kwargs = f.split(vals)
    out = f.func(*args, **kwargs)
    events.count(dev.backend, f.name, FALLBACK)
    if isinstance(out, torch.Tensor) and out.device.type == "cpu":
        return cpu_to_new_fl(dev, out), FALLBACK
    return out, FALLBACK


GENERIC: set = set()  # ops taken at the fl key whose PyTorch generic kernel serves backends without a kernel
GENERIC_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.PrivateUse2)


def generic_kernel(op):
    """PyTorch's CompositeExplicitAutograd kernel of op, reached through a backend key torch_fl leaves
    empty (PrivateUse2), where the generic kernel is what the dispatcher computes."""

    def run(*args, **kwargs):
        return op.redispatch(GENERIC_KEYS, *args, **kwargs)

    return run


def composite(f: OpFacts, args, kwargs):
    """An op PyTorch defines in terms of other ops (aten::to, reshape, ...)
    reached us below autograd: run PyTorch's own definition."""
    out = f.func.decompose(*args, **kwargs)
    if out is NotImplemented:
        return compute(f, args, kwargs)
    return out
