"""Python kernels PyTorch's dispatcher calls are never compiled by Dynamo.

Inside a `torch.compile`d function, Dynamo's frame hook sees every Python frame
that starts, also those PyTorch's C++ dispatcher starts for a kernel registered
from Python. torch's own Python kernels live in directories Dynamo skips;
torch_fl's do not, so an op that runs eagerly inside a compiled region (the op
after a graph break, `.item()` for an `if`) would have torch_fl's dispatcher,
plugin calls and cffi casts traced, guarded and compiled as if they were the
user's code: slow, and a warning or an error where cffi cannot be traced.
Marking a kernel's code object "skip, recursively" tells Dynamo to run it and
everything it calls as plain Python, the way it runs torch's own kernels."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

F = TypeVar("F", bound=Callable)

try:  # PyTorch's C frame-evaluation hook (present in every build with Dynamo)
    from torch._C._dynamo.eval_frame import _FrameAction, _FrameExecStrategy, set_code_exec_strategy
except ImportError:  # a build without Dynamo: nothing can trace the kernels
    set_code_exec_strategy = None  # type: ignore[assignment]  # the check in not_traced


def not_traced(fn: F) -> F:
    """fn (a Python kernel) run by Dynamo as plain Python, with every call it makes; returns fn."""
    code = getattr(getattr(fn, "__func__", fn), "__code__", None)
    if code is not None and set_code_exec_strategy is not None:
        set_code_exec_strategy(code, _FrameExecStrategy(_FrameAction.SKIP, _FrameAction.SKIP))
    return fn


__all__ = ["not_traced"]
