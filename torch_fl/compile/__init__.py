"""`fl.compile(model)`: `torch.compile(model, backend="fl")` with torch_fl's
defaults, plus the report and measurement of what the fusion passes did.

The article's point (section 3.3): a model that runs at half speed on a new
chip usually lacks graph optimisation, not silicon. PyTorch's own engine does
the capture (Dynamo: keyword arguments, graph breaks, guards and
recompilation; AOTAutograd: forward and backward aten graphs), the "fl"
backend rewrites those graphs with the kernels the active backend's capability
table declares (torch_fl/compile/dynamo.py; the passes: compile/passes/). This
module adds only what a user of `torch.compile` would otherwise have to write:

    compiled = fl.compile(model)                         # torch.compile(model, backend="fl")
    compiled = fl.compile(model, passes={"layout": False})
    out = compiled(input_ids=ids, attention_mask=mask)   # captured on first call, like torch.compile
    print(fl.fusion_report(compiled))                    # graphs, breaks, recompilations, patterns
    fl.measure_compiled(compiled, x)                     # kernels and time eager vs compiled

`disabled()` runs every compiled model eagerly inside a block (PyTorch's
`torch.compiler.set_stance("force_eager")`): how `%%fl_profile --fusion` and
`compare_backends(..., fusion=True)` measure the same code with and without
fusion. FL_COMPILE=0 makes `fl.compile` return the model itself."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import torch

from ..runtime import REGISTRY, config
from . import dynamo
from .dynamo import reset
from .graph_report import AtenGraph, DynamoGraph, FusionReport, Measurement, Pattern, add_measurement
from .passes import PASS_NAMES, enabled_passes

__all__ = ["AtenGraph", "DynamoGraph", "FusionReport", "Measurement", "PASS_NAMES", "Pattern", "compile",
           "disabled", "fusion_report", "measure", "reset"]


def compile(model: Callable, *, passes: Mapping[str, bool] | Iterable[str] | None = None,  # noqa: A001
            dynamic: bool | None = None, fullgraph: bool = False, replay: bool = False) -> Callable:
    """`torch.compile(model, backend="fl")` with a pass selection.

    passes: which fusion passes run (all by default): a list of names, or
    {name: bool} to switch some off; FL_FUSION_DISABLE=name,name switches passes
    off on top. dynamic and fullgraph are torch.compile's: dynamic=None lets
    Dynamo compile sizes symbolically once a size changes (one recompilation,
    then none); fullgraph=True makes a graph break an error. replay=True records
    each aten graph whose ops are all plugin kernel calls once and replays its
    kernel list without per-op Python (compile/replay.py)."""
    if isinstance(model, torch._dynamo.eval_frame.OptimizedModule):
        raise TypeError("this model is already compiled; compile the original (compiled._orig_mod) to change "
                        "passes")
    if not callable(model):
        raise TypeError(f"fl.compile takes an nn.Module or a function, not {type(model).__name__}")
    chosen = enabled_passes(passes)
    if not config.env_bool("FL_COMPILE", True):
        return model
    return torch.compile(model, backend=dynamo.backend(chosen, replay=replay), dynamic=dynamic, fullgraph=fullgraph)


def fusion_report(compiled: Any) -> FusionReport:
    """What backend="fl" did to a model compiled with `fl.compile` or
    `torch.compile(backend="fl")` (either result, or the model itself): its
    Dynamo graphs, graph breaks with Dynamo's reasons, recompilations, and per
    aten graph the patterns fused (where, what, by which kernel) or kept (why);
    plus what `measure` recorded for it."""
    return FusionReport.of(compiled)


@contextlib.contextmanager
def disabled() -> Iterator[None]:
    """Inside the block every torch.compile'd function and model runs eagerly."""
    with torch.compiler.set_stance("force_eager"):
        yield


def _sync() -> None:
    if REGISTRY.current is not None:
        torch.fl.synchronize()


def _run(fn: Callable, args: tuple, kwargs: dict, params: list, backward: bool) -> Any:
    """One call; with backward, a training step as PyTorch's default loop runs it: gradients set to None
    first (optimizer.zero_grad()), so backward writes them instead of adding into the last step's."""
    if backward:
        for p in params:
            p.grad = None
    out = fn(*args, **kwargs)
    if backward:
        outs = [o for o in _tensors(out) if o.requires_grad]
        if outs:
            sum(o.float().sum() for o in outs).backward()
    return out


def _tensors(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, Mapping):
        return [t for v in out.values() for t in _tensors(v)]
    if isinstance(out, (tuple, list)):
        return [t for v in out for t in _tensors(v)]
    return [t for v in getattr(out, "__dict__", {}).values() for t in _tensors(v)]  # ModelOutput-like


def _cost(fn: Callable, args: tuple, kwargs: dict, params: list, backward: bool,
          repeat: int) -> tuple[int, float, int]:
    from ..profiler import profile

    grad = torch.enable_grad() if backward else torch.no_grad()
    with grad:
        _run(fn, args, kwargs, params, backward)  # warm-up: compilation, JIT kernels, folded weights, plans
        with profile() as p:
            _run(fn, args, kwargs, params, backward)
        best = float("inf")
        for _ in range(repeat):
            _sync()
            t0 = time.perf_counter()
            _run(fn, args, kwargs, params, backward)
            _sync()
            best = min(best, time.perf_counter() - t0)
    fallbacks = sum(s.paths.get("fallback", 0) for s in p.ops())
    return p.kernels, best, fallbacks


def measure(compiled: Callable, *args: Any, backward: bool | None = None, repeat: int = 3,
            **kwargs: Any) -> Measurement:
    """Kernel launches (fl.profile's count), CPU-fallback calls and best-of-`repeat`
    time of one call, eager vs compiled, on the current backend. backward=True
    (default: when the model is in training mode) also runs backward of the
    outputs' sum, gradients reset first as zero_grad() does. Kept in the model's
    fusion report (`measurements`)."""
    model = getattr(compiled, "_orig_mod", compiled)
    params = list(model.parameters()) if isinstance(model, torch.nn.Module) else []
    if backward is None:
        backward = bool(getattr(model, "training", False)) and torch.is_grad_enabled()
    with disabled():
        before = _cost(compiled, args, kwargs, params, backward, repeat)
    after = _cost(compiled, args, kwargs, params, backward, repeat)
    name = REGISTRY.current.name if REGISTRY.current is not None else "native"
    m = Measurement(name, "forward+backward" if backward else "forward", before[0], after[0], before[1], after[1],
                    before[2], after[2])
    add_measurement(model, m)
    return m
