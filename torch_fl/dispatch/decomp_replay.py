"""Decomposition plans: a call the dispatcher serves by a decomposition, recorded once per signature as a
kernel graph the C++ core replays for later calls of that signature (csrc/fl_decomp_plans.cpp).

Why: on narrow chips (minimal, ascend) addmm, gelu, log_softmax, nll_loss and their backwards are
decompositions, a few cheap kernels behind 200-300 us of Python each (torch._refs and the dispatcher): a small
training step spends most of its time there. Replayed, such a call costs its kernels and the copies of its results.

How: the second call of a signature (the first is when its sub-ops' plans settle) is served as usual, then
run again on private copies of its tensors while a kernel graph records (runtime.graph), its counts taken back.
Where the recording is replayable (only kernels, on one device: no host transfer, CPU fallback or random
numbers) and took the tiers the call took, the graph, its static buffers (the copies, every intermediate, the
results) and what the call counted are handed to the C++ core under the call's fast-path key. A later call
with that key replays the kernels, which read its tensors in place (an input some kernel writes into is
copied into its static input first: the caller's tensor must not see the write), and copies the results out
into fresh tensors or its out= tensors, counting what Python counted. A signature whose recording failed is not
recorded again (until the dispatcher's plans are forgotten).

A plan's key fixes every value of the call but its tensors' contents, floats and numbers given as 0-dim CPU
tensors included (a decomposition may bake them into its kernels: leaky_relu's slope, layer_norm's eps,
mul's scalar). Never committed: a tensor list, a complex number, an op that draws random numbers, an input
with gaps between its elements (inputs are copied as the span of their bytes: dense or expanded ones) or a
result that is not dense; nor a call whose buffers exceed MAX_BYTES (a big model must not pin memory per
signature)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..runtime import (
    DECOMPOSITION,
    NATIVE,
    NOT_HANDLED,
    KernelGraph,
    abi,
    copy_on_device,
    core,
    events,
    is_dense,
    is_fl,
    new_tensor,
    recording,
)
from . import jit_replay

MAX_BYTES = 1 << 20  # the most the static buffers of one plan may hold
_ONCE, _NEVER = 1, 2  # a signature served once (the next call records), or whose recording failed
_SEEN_MAX = 4096  # signatures remembered per plan


def _plain(t: torch.Tensor, dev) -> bool:
    """An fl tensor the plan can copy as numel * itemsize bytes from its data pointer, with no flags to carry."""
    return (
        is_fl(t)
        and t.device == dev.torch_device
        and is_dense(t)
        and not t.is_conj()
        and not t.is_neg()
        and t.dim() <= abi.MAX_DIMS
    )


def _input(t: torch.Tensor, dev) -> bool:
    """An fl tensor a plan can take as an input: dense, or expanded (a stride-0 dim: BERT's token-type ids are
    an expanded buffer), whose elements lie in the span of bytes the plan copies, with no gaps between them
    (a slice of a bigger tensor would copy what it skips)."""
    return (
        is_fl(t)
        and t.device == dev.torch_device
        and (is_dense(t) or (all(st >= 0 for st in t.stride()) and _span(t) <= t.numel()))
        and not t.is_conj()
        and not t.is_neg()
        and t.dim() <= abi.MAX_DIMS
    )


def _span(t: torch.Tensor) -> int:
    """The elements from t's first to its last, in memory (its numel when dense; fewer when expanded)."""
    if t.numel() == 0:
        return 0
    return 1 + sum((n - 1) * st for n, st in zip(t.shape, t.stride(), strict=True))


def _keyed(v, dev, tensor_arg: bool) -> bool:
    """A value the C++ key and its values fix (fl_fallback.cpp's KeyBuilder): a dense or expanded fl tensor, a
    number given as a 0-dim CPU tensor (its value is in the key), or a value the key holds (ints, bools, floats,
    int lists, strings, dtypes, None). Not a complex number, a Python number standing for a tensor argument or
    a list of tensors."""
    if tensor_arg and not isinstance(v, torch.Tensor) and v is not None:
        return False
    if isinstance(v, torch.Tensor):
        return _number(v) or _input(v, dev)
    if isinstance(v, (list, tuple)):
        return all(type(x) in (int, bool) for x in v)
    return v is None or type(v) in (int, bool, float, str, torch.dtype)


def _number(t: torch.Tensor) -> bool:
    """A number given as a 0-dim CPU tensor (a Python scalar promoted by the op's caller): the key holds its
    value, so the plan does not read it."""
    return t.device.type == "cpu" and t.dim() == 0


def _nbytes(t: torch.Tensor) -> int:
    """The bytes a plan copies for t: the span of its elements (numel * itemsize for a dense tensor)."""
    return _span(t) * t.element_size()


def _copy_bytes(dev, dst: torch.Tensor, src: torch.Tensor) -> None:
    """src's bytes into dst (the same layout), with the plugin's device copy, outside any recording."""
    n = _nbytes(src)
    if n:
        copy_on_device(dev, dst.data_ptr(), src.data_ptr(), n)


def first_call(
    f,
    ff,
    dev,
    vals: list,
    ins: Sequence[int],
    outs_at: Sequence[int] | None,
    run: Callable[[list], Any],
    seen: dict,
) -> Any:
    """Serve a call of f (its functional op ff on vals[ins]; outs_at: where an out= call's outputs are) with
    run (ff's plan) as the dispatcher would, then run it again on copies of its tensors while a kernel graph
    records, and commit the recording as f's decomposition plan for the call's signature when it is
    replayable and took the tiers the call took. seen: the signatures ff's dispatcher plan has met (forgotten
    with it, when a setting changes). Returns ff's result, or NOT_HANDLED when the call is not one a plan could
    serve: the caller serves it as usual."""
    name = f.func.name()
    if (
        events.STATE.recording is not None
        or events.STATE.listeners
        or jit_replay.CAPTURE.calls is not None
        or torch.Tag.nondeterministic_seeded in ff.func.tags
        or not all(_keyed(v, dev, t) for v, t in zip(vals, f.tensor_arg, strict=True))
        or sum(_nbytes(v) for v in vals if isinstance(v, torch.Tensor)) > MAX_BYTES
        or not _second(seen, f, vals)
        or not core.lib().fl_core_fast_can_commit(name.encode())
    ):
        return NOT_HANDLED
    fvals = [vals[i] for i in ins]
    counts = dev.backend.own_counts
    core.drain_counts()
    before = dict(counts)
    result = run(fvals)  # this call, as it would be served without plans
    core.drain_counts()
    served = Counter({k: n - before.get(k, 0) for k, n in counts.items() if n != before.get(k, 0)})
    if ff.n_returns == 1:
        results: tuple = (result,)
    elif ff.n_returns > 1 and isinstance(result, (tuple, list)):
        results = tuple(result)
    else:  # no returns: nothing a plan could hand back
        return result
    if not (all(_plain(r, dev) for r in results) and _record(f, dev, vals, ins, outs_at, run, served, results)):
        _never(seen, f, vals)  # a signature whose recording failed is not recorded again (each try runs the call twice)
    return result


def _record(f, dev, vals: list, ins, outs_at, run, served: Counter, results: tuple) -> bool:
    """The recording run on copies of the call's tensors, committed when it took the tiers the call took
    (served: what the call counted) and gave results of the same layouts. Its own counts are taken back: the
    user made one call. Returns whether the core kept the plan."""
    fvals = [vals[i] for i in ins]
    clones: list[torch.Tensor] = []
    cvals: list = []
    for v in fvals:
        if isinstance(v, torch.Tensor) and not _number(v):
            c = new_tensor(dev, v.shape, v.dtype, v.stride())
            _copy_bytes(dev, c, v)
            clones.append(c)
            cvals.append(c)
        else:
            cvals.append(v)
    k0 = events.STATE.kernels
    try:
        with recording() as rec:
            rec.strict = True
            recorded = run(cvals)
    except (NotImplementedError, RuntimeError):  # the call was served: a failing second run means no plan
        return False
    finally:  # the recording's counts and kernels are not the user's calls
        for op, path in rec.counted:
            events.uncount(dev.backend, op, path)
        events.STATE.kernels = k0
    recorded = (recorded,) if len(results) == 1 else tuple(recorded)
    if not _same_tiers(served, Counter(rec.counted)) or [_layout(r) for r in recorded] != [_layout(r) for r in results]:
        return False
    keep = _buffers(rec, clones, recorded, dev)
    outs = [vals[i] for i in outs_at] if outs_at is not None else None
    if keep is None or (outs is not None and not _fits(outs, recorded)):
        return False
    nbytes = sum(s.nbytes() for s in keep)
    if nbytes > MAX_BYTES:
        return False
    sources = [i for i, v in zip(ins, fvals, strict=True) if isinstance(v, torch.Tensor) and not _number(v)]
    graph = KernelGraph(
        rec,
        [(c.data_ptr(), _nbytes(c)) for c in clones],
        [(r.data_ptr(), _nbytes(r)) for r in recorded],
        counted=False,
    )
    graph.bind_inputs()  # replays read the call's tensors in place where no kernel writes into them
    if outs_at is None:
        output_src = [-1] * len(recorded)
        returns = [-1 - k for k in range(len(recorded))]
    else:
        output_src = list(outs_at)
        returns = list(outs_at) if f.n_returns else []
    # the fresh results are written by the kernels where they are (the call's own tensors, which the kernels
    # read too, e.g. an in-place op's self, stay copies)
    graph.bind_outputs([k for k, src in enumerate(output_src) if src < 0])
    counted = [key for key, n in served.items() for _ in range(n)]
    return _commit(f.func.name(), dev, graph, sources, output_src, recorded, returns, counted, keep, nbytes)


def _layout(t) -> tuple:
    return (tuple(t.shape), t.stride(), t.dtype) if isinstance(t, torch.Tensor) else (type(t),)


def _same_tiers(served: Counter, recorded: Counter) -> bool:
    """The recording took the tiers the call took: the same ops served by the same paths, except that a
    recording fills zero_ with fill_ (a kernel) where the call used the plugin's mem_set (the same zero bytes)."""
    extra = recorded - served
    fills = extra.pop(_FILL, 0)
    return not extra and not (served - recorded) and fills <= recorded[_ZERO]


_FILL = ("aten::fill_.Scalar", NATIVE)
_ZERO = ("aten::zero_", DECOMPOSITION)


def _second(seen: dict, f, vals: list) -> bool:
    """Whether a call of this signature was served before and may be recorded: only the second call records.
    The first call of a signature is when the plans of its sub-ops settle (a first run may teach a sub-op a
    better path: dispatch.plan's _learn), and a plan replays the kernels and counts of the call it recorded."""
    try:
        key = _key(f, vals)
        state = seen.get(key)
        if state is None:
            if len(seen) >= _SEEN_MAX:
                seen.clear()
            seen[key] = _ONCE
    except (TypeError, RuntimeError):  # an unhashable value, a number item() cannot read: no plan takes it
        return False
    return state == _ONCE


def _never(seen: dict, f, vals: list) -> None:
    try:
        seen[_key(f, vals)] = _NEVER
    except (TypeError, RuntimeError):
        pass


def _key(f, vals: list) -> tuple:
    return (f.func, *(_sig(v) for v in vals))


def _sig(v):
    if isinstance(v, torch.Tensor):
        if _number(v):
            return (v.dtype, v.item())
        return (tuple(v.shape), v.stride(), v.dtype)
    return tuple(v) if isinstance(v, list) else v


def _buffers(rec, clones: list, results: tuple, dev) -> list | None:
    """The storages a plan of this recording keeps (the recorder's, the copies, the results), or None when it
    cannot be replayed: a reason, no kernel, another device, or results the core cannot copy out (not plain
    fl tensors, sharing memory with an input copy or with each other)."""
    if rec.reason is not None or not rec.steps or rec.device is not dev:
        return None
    taken = {c.untyped_storage().data_ptr() for c in clones}
    for r in results:
        if not isinstance(r, torch.Tensor) or not _plain(r, dev) or r.numel() == 0:
            return None
        base = r.untyped_storage().data_ptr()
        if base in taken:
            return None
        taken.add(base)
    seen: dict[int, Any] = {}
    for s in [x for x in rec.keep if isinstance(x, torch.UntypedStorage)] + [
        t.untyped_storage() for t in (*clones, *results)
    ]:
        seen.setdefault(s.data_ptr(), s)
    return list(seen.values())


def _fits(outs: list, results: tuple) -> bool:
    """Each out= tensor takes its result as a plain copy of bytes: one plain fl tensor per result, of its
    shape, dtype and strides (what the dispatcher would then copy or adopt)."""
    if len(outs) != len(results):
        return False
    return all(
        isinstance(o, torch.Tensor)
        and o.dtype == r.dtype
        and o.shape == r.shape
        and (o.stride() == r.stride() or o.numel() <= 1)
        and o.untyped_storage().data_ptr() not in {x.untyped_storage().data_ptr() for x in outs if x is not o}
        for o, r in zip(outs, results, strict=True)
    )


def _commit(name: str, dev, graph: KernelGraph, sources, output_src, results, returns, counted, keep, nbytes) -> bool:
    """Hand the plan to the C++ core (fl_core.h, fl_core_decomp_plan_t): it owns the graph from here on."""
    new = core.ffi.new
    layouts = [
        {"data": core.ffi.NULL, "offset": 0, "dtype": 0, "ndim": r.dim(), "sizes": list(r.shape), "strides": r.stride()}
        for r in results
    ]
    slots = [core.count_slot(dev.backend, op, path) for op, path in counted]
    arrays = {
        "name": new("char[]", name.encode()),
        "inputs": new("int32_t[]", list(sources) or [0]),
        "output_src": new("int32_t[]", output_src),
        "output_layouts": new("fl_tensor_t[]", layouts),
        "output_dtypes": new("int32_t[]", [core.scalar_type_code(r.dtype) for r in results]),
        "returns": new("int32_t[]", returns or [0]),
        "slots": new("int64_t[]", slots or [0]),
        "keep": new("void *[]", [core.ffi.cast("void *", s._cdata) for s in keep]),
    }
    plan = new(
        "fl_core_decomp_plan_t *",
        {
            **arrays,
            "device": dev.index,
            "graph": graph.release(),
            "n_inputs": len(sources),
            "n_outputs": len(results),
            "n_returns": len(returns),
            "n_slots": len(slots),
            "n_keep": len(keep),
            "nbytes": nbytes,
        },
    )
    return bool(core.lib().fl_core_decomp_commit(plan))  # copies what plan points at; takes the graph, kept or not
