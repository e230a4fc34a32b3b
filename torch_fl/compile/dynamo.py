"""`torch.compile(model, backend="fl")`: the fusion passes on PyTorch's own graph capture.

Dynamo captures the model's Python (keyword arguments, graph breaks and
recompilations handled by PyTorch, not by torch_fl); AOTAutograd turns each
captured graph into aten graphs: a forward and a backward graph when a gradient
is needed, one inference graph otherwise. This backend rewrites those aten
graphs with the kernels the active fl backend's capability table declares,
then runs them on fl: every op of the rewritten graph goes through the usual
dispatch (native kernel, decomposition, JIT kernel, CPU fallback), so a graph
that no pass touched runs exactly the kernels eager PyTorch would.

Why aten graphs: the backward graph exists only there, so a pass can put the
backend's fused backward kernel where eager autograd would run a chain of ops;
and aten ops are what a plugin implements, so a match names the kernels it
replaces. Some passes rewrite Dynamo's graph instead, before AOTAutograd; the
passes, one module each, and their order are in compile/passes/ (its
`__init__.py` lists them). This module is the plumbing: the backend entry
point, AOTAutograd's compilers, the record of each graph for the report.

Graph replay is on by default: each aten graph whose ops are all plugin kernel
calls is recorded once as a kernel list and replayed without per-op Python
(compile/replay.py); the report's `replay:` line says whether, or why not. By
default a graph whose buffers would pin more than replay.AUTO_MAX_BYTES of
device memory is not recorded (at that size the kernels, not the host, set the
time); `options={"replay": True}` records any size, `False` none.

`fusion_report(compiled)` returns what happened to a model compiled with
backend="fl": per Dynamo graph, its aten graphs (forward/backward/inference)
with the patterns fused (where, what, by what), graph breaks with Dynamo's
reasons, recompilations.

The backend reads the runtime's registry (the current backend and its
capabilities), the `fl::` ops torch_fl registers with PyTorch, and
the dispatcher's exported SDPA compositions (the math route with `attention` off)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
import torch.fx as fx

from ..runtime import REGISTRY
from .graph_report import GRAPHS, AtenGraph, DynamoGraph, FusionReport, Pattern, forget, frame_modules
from .lean import LeanPlan, LeanRuntime
from .passes import PassContext, enabled_passes, run_aten, run_captured
from .passes.fxnodes import outputs
from .replay import AUTO_MAX_BYTES, ReplayStatus, replayable


def _count_ops(gm: fx.GraphModule) -> int:
    return sum(n.op in ("call_function", "call_module") for n in gm.graph.nodes)


def _aten_compiler(
    kind: str,
    record: DynamoGraph,
    kernels: set,
    passes: list[str],
    replay: bool | None,
    shared: dict,
    plan: LeanPlan | None,
) -> Callable:
    def compile_aten(gm: fx.GraphModule, example_inputs: list) -> Callable:
        fn = _compile_aten(gm, example_inputs)
        if plan is not None:
            if kind == "forward":
                meta = getattr(torch._guards.TracingContext.try_get(), "fw_metadata", None)
                plan.set_forward(fn, gm, meta, len(example_inputs))
            elif kind == "backward":
                plan.set_backward(fn, gm)
            else:
                plan.refuse("an inference graph (its wrapper costs about 1 us a call)")
        return fn

    def _compile_aten(gm: fx.GraphModule, example_inputs: list) -> Callable:
        from functorch.compile import make_boxed_func

        before = _count_ops(gm)
        names = [a.name if isinstance(a, fx.Node) else None for a in outputs(gm.graph)]  # before any pass renames
        ctx = PassContext(gm, kind, record.backend, kernels, [], shared, names)
        run_aten(ctx, passes)
        gm.graph.lint()
        gm.recompile()
        record.aten_graphs.append(AtenGraph(kind, before, _count_ops(gm), ctx.patterns))
        if replay is not False:
            return replayable(make_boxed_func(gm.forward), record.replay, kind, bounded=replay is None)
        return make_boxed_func(gm.forward)

    return compile_aten


def _symbolic(v) -> bool:
    return isinstance(v, torch.SymInt) or (
        isinstance(v, torch.Tensor) and any(isinstance(d, torch.SymInt) for d in v.shape)
    )


def reset() -> None:
    """Forget the recorded graphs and measurements, and Dynamo's compiled code (torch._dynamo.reset())."""
    forget()
    torch._dynamo.reset()


def fusion_report(compiled: Any) -> FusionReport:
    """The report for a model compiled with backend="fl" (see FusionReport.of)."""
    return FusionReport.of(compiled)


def compile_graph(
    gm: fx.GraphModule, example_inputs: list, passes: list[str], replay: bool | None = None, lean: bool = True
) -> Callable:
    """One Dynamo graph through AOTAutograd, its aten graphs through the passes (replay: each aten graph
    recorded and replayed as a kernel list where it can be, compile.replay; None: where its buffers stay
    under replay.AUTO_MAX_BYTES, True: any size, False: never; lean: a training graph with simple metadata
    run by compile.lean's runtime instead of AOTAutograd's)."""
    backend = REGISTRY.ensure().name
    kernels = set(REGISTRY.get(backend).capabilities.kernels)
    reason = getattr(gm, "compile_subgraph_reason", None)
    frame = reason.user_stack[-1] if reason is not None and reason.user_stack else None
    record = DynamoGraph(
        str(gm.meta.get("dynamo_compile_id", "?")),
        frame.name if frame else "?",
        frame.filename if frame else "",
        backend,
        list(passes),
        reason.reason if reason is not None and reason.graph_break else None,
        dynamic=any(_symbolic(n.meta.get("example_value")) for n in gm.graph.nodes if n.op == "placeholder"),
        modules=frame_modules(),
        replay=ReplayStatus() if replay is not False else None,
    )
    plan = LeanPlan() if lean else None
    if plan is not None:
        plan.check_graph(gm, example_inputs)
        record.runtime = plan
    wrapper = record.filename.replace(os.sep, "/").endswith("_dynamo/external_utils.py")
    if (wrapper or record.frame in ("forward", "_call_impl")) and record.modules:
        module = record.modules[0]()  # torch.compile(module)'s wrapper frame or a bare forward: name the model
        record.frame = f"{type(module).__name__}.forward" if module is not None else record.frame
    GRAPHS.append(record)
    try:
        compiled = _through_aot(gm, example_inputs, record, kernels, passes, replay, plan)
    except BaseException:
        # no graph came of it: Dynamo restarts its analysis (symbolic sizes it must specialize, a scalar it
        # tensorifies) and hands the frame over again, or the error reaches the user; either way the report
        # must not list a graph that never ran
        GRAPHS[:] = [g for g in GRAPHS if g is not record]
        raise
    if plan is None or plan.reason is not None:
        return compiled
    return LeanRuntime(compiled, plan)


def _through_aot(
    gm: fx.GraphModule,
    example_inputs: list,
    record: DynamoGraph,
    kernels: set,
    passes: list[str],
    replay: bool | None,
    plan: LeanPlan | None,
) -> Callable:
    from functorch.compile import min_cut_rematerialization_partition
    from torch._dynamo.backends.common import aot_autograd

    captured: list[Pattern] = []
    before = _count_ops(gm)
    run_captured(gm, kernels, captured, passes)
    if captured:
        gm.graph.lint()
        gm.recompile()
        record.aten_graphs.append(AtenGraph("captured", before, _count_ops(gm), captured))
    shared: dict = {}  # one Dynamo graph's: its forward's passes leave word for its backward's
    return aot_autograd(
        fw_compiler=_aten_compiler("forward", record, kernels, passes, replay, shared, plan),
        bw_compiler=_aten_compiler("backward", record, kernels, passes, replay, shared, plan),
        inference_compiler=_aten_compiler("inference", record, kernels, passes, replay, shared, plan),
        partition_fn=min_cut_rematerialization_partition,
        keep_inference_input_mutations=True,
    )(gm, example_inputs)


def fl_backend(gm: fx.GraphModule, example_inputs: list, **kwargs: Any) -> Callable:
    """The Dynamo backend named "fl" (entry point group `torch_dynamo_backends`):
    `torch.compile(model, backend="fl", options={"passes": {...}, "replay": False, "lean": False})`."""
    options = dict(kwargs.pop("options", None) or {})
    passes = enabled_passes(options.pop("passes", None))
    replay = _replay_option(options.pop("replay", None))
    lean = _lean_option(options.pop("lean", True))
    if options or kwargs:
        raise TypeError(
            "backend='fl' takes options={'passes': ..., 'replay': ..., 'lean': ...} only, not "
            f"{sorted({**options, **kwargs})}"
        )
    return compile_graph(gm, example_inputs, passes, replay, lean)


def _lean_option(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    raise TypeError(
        f"backend='fl': lean must be True (the default: simple training graphs run by torch_fl's lean runtime) "
        f"or False (AOTAutograd's runtime for every graph), not {value!r}"
    )


def _replay_option(value: Any) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    raise TypeError(
        f"backend='fl': replay must be True (replay graphs of any size), False (never) or None (the default: "
        f"graphs whose buffers stay under {AUTO_MAX_BYTES >> 20} MiB), not {value!r}"
    )


def backend(
    passes: Mapping[str, bool] | Iterable[str] | None = None, replay: bool | None = None, lean: bool = True
) -> Callable:
    """A backend callable with a fixed pass selection: torch.compile(m, backend=backend({"conv_bn": False}));
    replay: the aten graphs recorded and replayed where they can be (compile.replay; None: up to
    replay.AUTO_MAX_BYTES of buffers, True: any size, False: never); lean: simple training graphs run by
    compile.lean's runtime (False: AOTAutograd's runtime for all)."""
    chosen = enabled_passes(passes)
    replay = _replay_option(replay)
    lean = _lean_option(lean)

    def fl_with_passes(gm: fx.GraphModule, example_inputs: list, **kwargs: Any) -> Callable:
        return compile_graph(gm, example_inputs, chosen, replay, lean)

    return fl_with_passes
