"""The JIT tier's seam. A later stage generates and compiles kernels for ops a
backend lacks; until a backend offers a JIT kernel for an op, lookup returns
None and the dispatcher moves on to the CPU fallback."""

from __future__ import annotations

from typing import Any


def lookup(backend: Any, facts: Any, dtypes: tuple) -> Any:
    """A callable `(facts, device, values) -> result` for this op, or None."""
    return None
