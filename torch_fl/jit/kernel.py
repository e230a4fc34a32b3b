"""A generated kernel from source to call: compiled through the plugin's
jit_compile (timed, failures remembered with the compiler's message for
fl.explain), kept in memory per argument signature, and run through the
runtime's one native-kernel call. Each generator's kernel class derives from
Kernel and says how to describe a call and generate its source."""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from typing import Any

import torch

from ..errors import KernelError
from ..runtime import abi, events, ffi, output_layouts, run_native
from .render import DTYPES, Unsupported, language

STATS = {"compiled": 0, "memory_hits": 0, "compile_s": 0.0, "failures": 0}


def fresh_layouts(f, vals):
    """The layouts (shape, strides, dtype) of an op's results, from its meta function, when every
    one is a fresh tensor in a dtype the generated C can store; else None (not for the JIT)."""
    layouts = output_layouts(f, vals)
    if not layouts or any(not isinstance(lay, tuple) or len(lay) != 3 or lay[2] not in DTYPES for lay in layouts):
        return None
    return layouts


class Entry:
    """A compiled kernel as the runtime calls it: a host function (fn), or for a device JIT the
    plugin's jit_launch with the handle jit_build gave (valid on one device)."""

    __slots__ = ("fn", "handle", "launch", "replays")

    def __init__(self, fn, handle=None, launch=None):
        self.fn, self.handle, self.launch = fn, handle, launch
        # whether the C++ fast path may replay a call of it (a generator says no for a kernel that can fail
        # midway: an in-place call it fails would have written part of its output before Python reran it)
        self.replays = False


def key(sig: Any, dev: Any) -> Any:
    """A kernel cache key: a device JIT's handle is valid on one device, host C on all of them."""
    return (sig, dev.local) if dev.plugin.jit_builds else sig


def generate_for(dev: Any, gen: Callable[[], tuple[str, str]]) -> tuple[str, str]:
    """gen() -> (source, symbol), generated in the language the device's plugin compiles."""
    with language(dev.plugin.jit_target):
        return gen()


_WRAPPED_DTYPE = {bool: torch.bool, int: torch.int64, float: torch.float64}


def wrap_numbers(f, vals) -> list:
    """A Python number where the schema says Tensor (PyTorch hands a backend its wrapped-number tensors,
    such as the 2 of `x % 2`, as Python numbers) becomes the 0-dim CPU tensor it stood for, so the
    generated kernel reads it as a scalar argument instead of baking its value in."""
    out = list(vals)
    for i, v in enumerate(vals):
        if type(v) in _WRAPPED_DTYPE and f.tensor_arg[i]:
            out[i] = torch.tensor(v, dtype=_WRAPPED_DTYPE[type(v)])
    return out


class Kernel:
    """The JIT tier for one (op, dtype) on one backend: compiles a kernel per argument signature at
    first use (kernel_for), then runs it through the native path. Subclasses are called like a tier:
    kernel(f, dev, vals) -> the result, or NOT_HANDLED."""

    def __init__(self, backend, f, dtype):
        self.backend, self.f, self.dtype = backend, f, dtype
        self.kernels: dict = {}
        self.out_dtype = dtype

    def kernel_for(self, f, dev, sig, gen):
        """The compiled kernel for a signature: compiled once (gen() -> source, symbol), then from
        memory; None when it could not be generated or compiled (the next tier serves the call)."""
        sig = key(sig, dev)
        if sig in self.kernels:
            STATS["memory_hits"] += 1
        else:
            self.kernels[sig] = self.compile_with(f, dev, gen)
        return self.kernels[sig]

    def compile_with(self, f, dev, gen):
        """Generate (gen() -> source, symbol), compile through the plugin, time it; None if either fails."""
        t0 = time.perf_counter()
        try:
            src, symbol = generate_for(dev, gen)
        except Unsupported:
            return None
        except Exception:  # noqa: BLE001 - a trace that fails means no JIT kernel for this call
            return None
        return compile_source(f.name, dev, src, symbol, t0)


def run(f: Any, entry: Any, dev: Any, vals: list, site: dict | None = None) -> Any:
    """Run a generated pointwise kernel through the native path (with site: its marshalling recorded
    there, as run_native does). Its only failure status is FL_ERR_INVALID for an integer division by
    zero, which PyTorch reports as ZeroDivisionError."""
    try:
        return run_native(f, entry, dev, vals, site=site)
    except KernelError as e:
        if e.status == abi.FL_ERR_INVALID:
            raise RuntimeError("ZeroDivisionError") from None
        raise


def compile_source(name: str, dev: Any, src: str, symbol: str, t0: float | None = None, *, warn: bool = True):
    """Compile generated C through the plugin's jit_compile: the kernel entry, or None when the
    compile fails (with a warning naming the op and the plugin's message, unless warn=False).
    The time since t0 (default: now) is recorded as JIT compile time, apart from run time."""
    t0 = time.perf_counter() if t0 is None else t0
    plugin = dev.plugin
    if plugin.jit_builds:
        out = ffi.new("void **")
        status = plugin.table.jit_build(dev.local, src.encode(), symbol.encode(), out)
    else:
        out = ffi.new("fl_kernel_fn*")
        status = plugin.table.jit_compile(src.encode(), symbol.encode(), out)
    seconds = time.perf_counter() - t0
    STATS["compile_s"] += seconds
    if events.STATE.listeners:
        events.emit(events.OpEvent(name, dev.backend.name, "jit-compile", seconds, 0, 0, events.NESTING.depth, t0))
    if status != abi.FL_OK:
        STATS["failures"] += 1
        FAILURES[(dev.backend.name, name)] = " ".join((plugin.last_error() or "compile failed").split())
        if warn:
            warnings.warn(
                f"torch_fl JIT: no kernel for {name} on {dev.backend.name}: "
                f"{plugin.last_error() or 'compile failed'}; using the next tier",
                RuntimeWarning,
                stacklevel=3,
            )
        return None
    STATS["compiled"] += 1
    if plugin.jit_builds:
        return Entry(ffi.NULL, out[0], plugin.table.jit_launch)
    return Entry(out[0])


FAILURES: dict[tuple[str, str], str] = {}


def compile_failure(backend: str, op: str) -> str | None:
    """The plugin's message from the last failed JIT compile of `op` on a
    backend (None if none failed): the dispatcher reports it instead of
    listing a kernel that does not exist."""
    return FAILURES.get((backend, op))
