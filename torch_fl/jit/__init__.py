"""The JIT tier: kernels generated for ops a backend lacks, compiled by its plugin.

Four generators describe a computation as C (render.py holds the C they share:
types, loads and stores, constants, the prelude, and `walk`, the one strided
loop all of them run, fl_kernel_util.h's fl_walk_t): pointwise ops (pointwise_kernels.py,
one expression per element from the op's traced graph), reductions
(reduce.py), gather and scatter (index.py), and ops along one dim: scans,
sorting, order statistics (rows.py). Each returns a kernel (kernel.py) that
the dispatcher calls like a tier; a kernel compiles per argument signature
through the plugin's jit_compile and runs through the runtime's native-kernel
call. Nothing here imports the dispatcher."""

from __future__ import annotations

from typing import Any

from . import index, pointwise_kernels, reduce, rows
from .kernel import (
    STATS,
    Entry,
    Kernel,
    compile_failure,
    compile_source,
    fresh_layouts,
    generate_for,
    key,
    run,
    wrap_numbers,
)
from .pointwise_kernels import generate
from .render import DTYPES, Unsupported, dtype_code

REDUCTIONS = reduce.OPS  # the reductions (aten and prims) the JIT generates kernels for


def lookup(backend: Any, facts: Any, dtypes: tuple) -> Any:
    """A JIT kernel for an op (facts: the dispatcher's OpFacts) on a backend in these dtypes, or None:
    a reduction, gather/scatter, an along-a-dim op or a pointwise op in a supported dtype, on a
    backend whose plugin compiles host C (jit_compile) or has a device JIT in a language the
    generators emit (OpenCL C)."""
    if not backend.plugin.jit_target:
        return None
    if (
        backend.devices
        and dtypes
        and not all((backend.devices[0].props.dtypes >> dtype_code(d)) & 1 for d in dtypes if d in DTYPES)
    ):
        return None
    if facts.func in reduce.OPS:
        return reduce.lookup(backend, facts, dtypes)
    if facts.func in index.SERVED:
        return index.lookup(backend, facts, dtypes)
    if facts.func in rows.OPS:
        return rows.lookup(backend, facts, dtypes)
    return pointwise_kernels.lookup(backend, facts, dtypes)


__all__ = [
    "DTYPES",
    "REDUCTIONS",
    "STATS",
    "Entry",
    "Kernel",
    "Unsupported",
    "compile_failure",
    "compile_source",
    "dtype_code",
    "fresh_layouts",
    "generate",
    "generate_for",
    "key",
    "lookup",
    "run",
    "wrap_numbers",
]
