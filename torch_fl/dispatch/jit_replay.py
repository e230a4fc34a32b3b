"""JIT calls on the C++ core's fast path: a call the JIT tier served with one generated kernel on the op's own
arguments is committed like a native call (runtime.native.commit, counted under "jit"), so later calls of its
signature replay the kernel without entering Python.

Two cases commit. The plan's first path is the JIT: the kernel call is the op's call. Or the first path is a
decomposition that reduced to the op's own JIT kernel (on narrow chips most pointwise ops: torch._refs' sin
is prims.sin, which calls aten::sin again, served by the JIT): the decomposition's run is watched, and only a
run whose whole work was that one kernel call on the very arguments it was given, its result returned as is,
is committed. A replay must do what Python would do, so nothing commits where the signature (the C++ key:
op, tensor layouts, every non-float value) does not fix the work: a plain float is baked into the generated
source (only a wrapped number is read per call), and a decomposition may branch on any number it is given."""

from __future__ import annotations

import threading

import torch

from ..runtime import core, events


class Capture(threading.local):
    """The JIT calls made on this thread while a decomposition that may reduce to them runs (None: nobody
    watches): (op, its arguments, the recorded site, its result) each."""

    calls: list | None = None


CAPTURE = Capture()


def replays(plan) -> bool:
    """The plan's JIT kernel records what a replay needs (the pointwise generator's do)."""
    return plan.jit is not None and getattr(plan.jit, "replays", False)


def work() -> tuple:
    """What the device was asked to do so far, by every route: kernels Python called, bytes copied, and the
    calls the C++ fast paths served (native and JIT plans, decomposition plans, the CPU fallback's, its device
    copies)."""
    lib = core.lib()
    return (
        events.STATE.kernels,
        events.STATE.bytes_copied,
        lib.fl_core_fast_hits(),
        lib.fl_core_decomp_hits(),
        lib.fl_fallback_hits(),
        lib.fl_fallback_copies(),
    )


def numberless(f, vals: list) -> bool:
    """No number the kernel would read per call (a float, a wrapped number): a decomposition may choose its
    work by one, so only a call without any is worth watching."""
    for i, v in enumerate(vals):
        if isinstance(v, float) or (isinstance(v, torch.Tensor) and v.device.type != "fl"):
            return False
        if isinstance(v, int) and f.tensor_arg[i]:  # bool too
            return False
    return True


def watch() -> tuple:
    """Start watching a decomposition: the C++ fast path steps aside until runtime.native.sync_fast_path()
    (the op's own call inside it, a committed signature, would otherwise be served where nobody sees its
    arguments); what the device did so far (work())."""
    core.lib().fl_core_fast_enable(0)
    return work()


def replayable(site: dict, decomposed: bool) -> bool:
    """Whether replaying the recorded JIT call is what Python would do on every call of its signature: each
    number the kernel gets per call is a wrapped number it reads from args (a plain float would be patched
    into a kernel that baked the first call's value into its source); after a decomposition, no number at
    all (the decomposition could have chosen its work by it)."""
    patches = site["patches"]
    if decomposed:
        return not patches
    return all(kind & 1 for _, _, kind in patches)


def _same_tensor(a, b) -> bool:
    """The same tensor: the object itself, or another one over the same memory with the same layout (the
    result a decomposition hands back crosses PyTorch's dispatcher as a new alias of the kernel's output)."""
    if a is b:
        return True
    return (
        isinstance(a, torch.Tensor)
        and isinstance(b, torch.Tensor)
        and a.device == b.device
        and a.dtype == b.dtype
        and a.data_ptr() == b.data_ptr()
        and a.shape == b.shape
        and a.stride() == b.stride()
        and a.is_conj() == b.is_conj()
        and a.is_neg() == b.is_neg()
    )


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return _same_tensor(a, b)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def reduced(func, vals: list, result, calls: list, before: tuple) -> dict | None:
    """The site of the one JIT call a decomposition of func on vals reduced to, or None: the run made exactly
    one call (one kernel, nothing copied, nothing served elsewhere), of func on the same arguments, and
    returned its result."""
    if len(calls) != 1:
        return None
    op, inner, site, out = calls[0]
    if op is not func or not _same_tensor(out, result) or len(inner) != len(vals):
        return None
    if not all(_same(a, b) for a, b in zip(inner, vals, strict=True)):
        return None
    after = work()
    if after != (before[0] + 1, *before[1:]):
        return None
    return site


def into(site: dict, outs: list) -> dict:
    """The site of a functional JIT call, as its out= form writes it: into the given outputs (which have the
    fresh outputs' layouts: dispatch.plan's _writes_in_place said so)."""
    return dict(site, outs=list(outs), out_src=[("given", j) for j in range(len(outs))])
