"""The CPU fallback, the last tier: the op's fl tensors are copied to the host
(views of one host copy where they share an allocation, so the CPU kernel sees
the same aliasing), PyTorch's CPU kernel runs, and what the op wrote or returned
is copied back to the device. On a host-accessible device the host copies are
zero-copy views of device memory."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..runtime import (
    FALLBACK,
    base_ptr,
    core,
    cpu_into_fl,
    cpu_to_new_fl,
    device_of,
    events,
    fl_to_cpu,
    is_fl,
    iter_tensors,
    map_tensors,
    native,
    span,
)
from .decompositions import host_kernel
from .rng import host_generator


def _shared_mirrors(dev, vals) -> dict[int, torch.Tensor]:
    """Host copies of fl tensors that share an allocation, as views of ONE host
    copy of it: the CPU kernel then sees the same aliasing the device memory
    has (x[1:].add_(x[:-1]) must fail as it does on CPU, not silently read a
    stale copy)."""
    by_base: dict[int, list] = {}
    for t in iter_tensors(vals):
        if t.device.type == "fl" and t.numel():
            by_base.setdefault(base_ptr(t), []).append(t)
    out: dict[int, torch.Tensor] = {}
    for base, views in by_base.items():
        if len(views) < 2:
            continue
        spans = [span(t) for t in views]
        lo = min(a * t.element_size() for (a, _), t in zip(spans, views, strict=True)) // 16 * 16
        hi = max(b * t.element_size() for (_, b), t in zip(spans, views, strict=True))
        staging = torch.empty(hi - lo, dtype=torch.uint8)
        dev.copy_d2h(staging.data_ptr(), base + lo, hi - lo)
        events.STATE.bytes_copied += hi - lo
        for t in views:
            item = t.element_size()
            typed = staging[: (hi - lo) // item * item].view(t.dtype)
            out[id(t)] = typed.as_strided(t.shape, t.stride(), (t.storage_offset() * item - lo) // item)
    return out


def run_fallback(f, dev, vals):
    mirrors: dict[int, torch.Tensor] = {} if dev.host_accessible else _shared_mirrors(dev, vals)

    def host(t):
        if t.device.type == "fl":
            if device_of(t) is not dev:
                raise RuntimeError(f"{f.name}: tensor on {t.device} mixed with {dev.torch_device}")
            c = mirrors.get(id(t))
            if c is None:
                c = mirrors[id(t)] = fl_to_cpu(t)
            return c
        return t

    cpu_vals = map_tensors(host, vals)
    for i in f.mutable:  # an out= tensor the CPU kernel may resize: a resizable host copy, not a view
        if f.kwarg_only[i] and dev.host_accessible:
            cpu_vals[i] = map_tensors(lambda t: t.clone(), [cpu_vals[i]])[0]
    if f.generator_at is not None:
        gen = host_generator(dev)  # inside a call given an fl generator (dispatch.rng)
        if gen is not None:
            cpu_vals[f.generator_at] = gen
    host = host_kernel(f.func)  # an op the CPU has no kernel for (the fused RNN cells): torch_fl's
    out = f.call(cpu_vals) if host is None else f.call_decomposition(host, cpu_vals)
    # write back what the op mutated (zero-copy views on host-accessible devices need nothing)
    for i in f.mutable:
        pairs = [(vals[i], cpu_vals[i])]
        if isinstance(vals[i], (list, tuple)):  # Tensor(a!)[]: _foreach_*_, _amp_foreach_non_finite_check_and_unscale_
            pairs = list(zip(vals[i], cpu_vals[i], strict=True))
        for fl_t, cpu_t in pairs:
            if not is_fl(fl_t):
                continue
            if tuple(cpu_t.shape) != tuple(fl_t.shape) or cpu_t.stride() != fl_t.stride():
                replace_storage(fl_t, cpu_to_new_fl(dev, cpu_t))  # an out= tensor the op resized
            elif not dev.host_accessible or f.kwarg_only[i]:
                cpu_into_fl(fl_t, cpu_t)
    if f.n_returns == 0:
        return None
    outs = (out,) if f.n_returns == 1 else tuple(out)
    results = []
    for r, o in enumerate(outs):
        a = f.ret_alias[r]
        if a is not None and is_fl(vals[a]):
            results.append(vals[a])
        elif isinstance(o, torch.Tensor):
            results.append(cpu_to_new_fl(dev, o))
        elif isinstance(o, (list, tuple)):
            results.append(type(o)(cpu_to_new_fl(dev, x) if isinstance(x, torch.Tensor) else x for x in o))
        else:
            results.append(o)
    return results[0] if f.n_returns == 1 else tuple(results)


def replace_storage(t: torch.Tensor, new: torch.Tensor) -> None:
    """Give t new's storage and metadata in place (an out= tensor an op resized)."""
    t.set_(new.untyped_storage(), new.storage_offset(), new.shape, new.stride())


# -- the C++ fast path of this tier ---------------------------------------------------------------
# A call served here is committed to the C++ core (csrc/fl_cpu_fallback.cpp), which serves later calls with the
# same signature (its fast-path key: op, each tensor's device, dtype, sizes, strides and aliasing, every
# argument but floats) without Python: host copies through the plugin, the CPU kernel, the copies back.


def commit(f, dev, count_as: str, vals: list, result, twin: tuple | None = None, arrived=None) -> None:
    """Teach the C++ core the call of f just served by the CPU kernel, on its normalized values vals.
    twin: (functional facts, argument indices, out= indices) where Python ran the functional op and copied
    its results into the out= tensors; arrived: (facts, indices of f's arguments among its own, the index it
    returns) where the call arrived as another op (aten::_copy_from, served as copy_). Only calls a replay
    gives the same bytes for: no random numbers (the fallback draws from the device's generator's host
    twin), no host arguments torch_fl moves first, no layout torch_fl changes afterwards (channels-last),
    single tensors written, results that are tensors or plain numbers. torch_fl's own argument checks
    (dispatch.argcheck) judge nothing the key leaves out, or the caller does not commit (they warned or judged
    a float), as for the native fast path."""
    if not native.FAST.enabled:
        return
    served = twin[0] if twin is not None else f
    for facts in (f, served):
        if (
            facts.generator_at is not None
            or facts.host_args is not None
            or facts.layout_rule is not None
            or torch.Tag.nondeterministic_seeded in facts.func.tags
        ):
            return
    outs = (result,) if served.n_returns == 1 else tuple(result) if served.n_returns else ()
    if any(isinstance(o, (list, tuple)) for o in outs):
        return
    call = None
    ins: Sequence[int]
    writes: Sequence[int]
    if twin is not None:  # the functional op, its results copied into the out= tensors f returns
        _, ins, writes_out = twin
        if any(a is None for a in f.ret_alias):
            return
        writes, rets = (), list(f.ret_alias)
    else:
        ins, writes_out = range(len(vals)), ()
        writes = [i for i in f.mutable if isinstance(vals[i], torch.Tensor)]
        if len(writes) != len(f.mutable):
            return
        rets = [a if a is not None and is_fl(vals[a]) else -1 - j for j, a in enumerate(f.ret_alias)]
    name = f.func.name()
    if arrived is not None:
        arrived_f, ins, ret = arrived
        call, name = f.func.name(), arrived_f.func.name()
        writes, rets = [ins[i] for i in writes], [ret]
    elif twin is not None:
        call = twin[0].func.name()
    elif host_kernel(f.func) is not None:
        call = host_kernel(f.func).name()
    new = core.ffi.new
    lists = {"inputs": ins, "writes": writes, "outs": writes_out, "returns": rets}
    keep = {
        "name": new("char[]", name.encode()),
        "call": new("char[]", call.encode()) if call else core.ffi.NULL,
        **{field: new("int32_t[]", list(a) or [0]) for field, a in lists.items()},
    }
    plan = new(
        "fl_fallback_plan_t *",
        {
            **keep,
            **{"n_" + field: len(a) for field, a in lists.items()},
            "device": dev.index,
            "slot": core.count_slot(dev.backend, count_as, FALLBACK),
        },
    )
    core.lib().fl_fallback_commit(plan)  # copies what plan points at (keep lives until then)


def set_device_only(depth: int) -> None:
    """Tell the C++ fast path this thread is (depth > 0) or is no longer inside a decomposition that must
    stay on the device, where no CPU kernel may serve a sub-op."""
    core.lib().fl_fallback_device_only(depth)
