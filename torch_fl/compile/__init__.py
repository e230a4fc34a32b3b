"""`fl.compile(model)`: `torch.compile(model, backend="fl")` with torch_fl's
defaults, plus the report of what the fusion passes did.

The Torch-FL article's point (section 3.3): a model that runs at half speed on a new
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

(`fl.measure_compiled`, which counts kernels eager vs compiled with the profiler, is a tool:
torch_fl/tools/profiler.py.)

`disabled()` runs every compiled model eagerly inside a block (PyTorch's
`torch.compiler.set_stance("force_eager")`): how `%%fl_profile --fusion` and
`compare_backends(..., fusion=True)` measure the same code with and without
fusion. FL_COMPILE=0 makes `fl.compile` return the model itself."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import torch

from ..runtime import config
from . import dynamo
from .dynamo import reset
from .graph_report import AtenGraph, DynamoGraph, FusionReport, Measurement, Pattern, add_measurement
from .passes import PASS_NAMES, enabled_passes

__all__ = [
    "AtenGraph",
    "DynamoGraph",
    "FusionReport",
    "Measurement",
    "PASS_NAMES",
    "Pattern",
    "add_measurement",
    "compile",
    "disabled",
    "fusion_report",
    "reset",
]


def compile(
    model: Callable,
    *,
    passes: Mapping[str, bool] | Iterable[str] | None = None,  # noqa: A001
    dynamic: bool | None = None,
    fullgraph: bool = False,
    replay: bool | None = None,
    lean: bool = True,
) -> Callable:
    """`torch.compile(model, backend="fl")` with a pass selection.

    passes: which fusion passes run (all by default): a list of names, or
    {name: bool} to switch some off; FL_FUSION_DISABLE=name,name switches passes
    off on top. dynamic and fullgraph are torch.compile's: dynamic=None lets
    Dynamo compile sizes symbolically once a size changes (one recompilation,
    then none); fullgraph=True makes a graph break an error. replay: each aten
    graph whose ops are all plugin kernel calls is recorded once and its kernel
    list replayed without per-op Python (compile/replay.py); by default (None)
    where its buffers stay under compile.replay.AUTO_MAX_BYTES, True at any size,
    False never. lean: a training graph whose AOTAutograd metadata is simple (no
    input mutation written back after the graph, no aliased output, no tensor
    subclass) runs through compile/lean.py's autograd.Function instead of
    AOTAutograd's runtime; False keeps AOTAutograd's for every graph."""
    if isinstance(model, torch._dynamo.eval_frame.OptimizedModule):
        raise TypeError("this model is already compiled; compile the original (compiled._orig_mod) to change passes")
    if not callable(model):
        raise TypeError(f"fl.compile takes an nn.Module or a function, not {type(model).__name__}")
    chosen = enabled_passes(passes)
    if not config.env_bool("FL_COMPILE", True):
        return model
    chosen_backend = dynamo.backend(chosen, replay=replay, lean=lean)
    return torch.compile(model, backend=chosen_backend, dynamic=dynamic, fullgraph=fullgraph)


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
