"""A lean runtime for the simplest training graphs AOTAutograd compiles.

AOTAutograd runs each compiled forward and backward inside its own runtime: an
autograd.Function with code for every case it supports (input mutations written
back to the caller's tensors, outputs that alias inputs rebuilt as views,
tensor subclasses, functionalized RNG, effect tokens, symbolic sizes saved for
the backward, autocast switched off around the graph, ...). A graph that needs
none of it pays for the checks anyway: about 20 us a forward and 50 us a
backward on this project's 2-core machine, more than the replayed kernels of a
small model's step (bench/bench_small.py, docs/benchmarks.md).

For a graph whose metadata says it needs none of that, `LeanRuntime` runs the
same compiled forward and backward through one small autograd.Function: the
forward's outputs split into the user's outputs, the tensors saved for the
backward and the sizes saved for it (symbolic sizes), the backward's results
returned as the input gradients. What AOTAutograd does on that path that
matters for such a graph is kept: saved views detached and saved with the
version-counter check (an in-place change of a saved tensor still raises), the
same tensors saved without it, outputs that do not require grad marked
non-differentiable, outputs that view an intermediate handed out as plain
tensors, gradients coerced to the strides the backward graph was traced with,
inputs whose gradient is statically None detached, the version counters of
inputs the graph writes (batch norm's running statistics) bumped, Dynamo's
dynamic-dimension hints on outputs and saved tensors, the determinism check, a
clear error on a double backward, and Dynamo kept out of the backward.

Anything else (an input mutation AOTAutograd writes back after the graph, an
aliased output, a subclass, autocast at compile time, saved-tensor hooks, a
parameter held by the graph module, a metadata field this torch version names
differently, compiled autograd at call time) keeps the graph on AOTAutograd's
runtime; the report's `runtime:` line names the reason. Inference graphs stay on
it: its inference wrapper costs about 1 us a call here (measured beside a direct
call: the bench MLP's 52.4 vs 53.4 us), not worth a second path. The forward calls before
the first backward run on AOTAutograd's runtime, since AOTAutograd compiles the
backward graph (of static sizes) lazily, at its first use."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx as fx

from .passes.fxnodes import outputs

AOT = "AOTAutograd's"


class LeanPlan:
    """One Dynamo graph's compiled forward and backward, and what the metadata says the runtime must do."""

    def __init__(self) -> None:
        self.reason: str | None = "not compiled yet"  # why the graph runs on AOTAutograd's runtime; None: lean
        self.fw: Callable | None = None
        self.bw: Callable | None = None
        self.n_outputs = 0
        self.vc = slice(0)  # the forward outputs saved with the version-counter check
        self.novc = slice(0)  # ... and without (AOTAutograd's no_vc_check slice)
        self.symints = slice(0)  # sizes the backward needs (symbolic sizes), after the saved tensors
        self.bump: tuple[int, ...] = ()  # inputs the graph writes (batch norm's buffers): version counters bumped
        self.dynamic_saved: dict = {}  # saved tensor -> its dynamic dims, marked for Dynamo (as AOTAutograd does)
        self.dynamic_outputs: tuple[tuple[int, set], ...] = ()  # output -> its dynamic dims, marked likewise
        self.non_diff: tuple[int, ...] = ()  # outputs marked non-differentiable
        # outputs that are views of an intermediate (a reshaped matmul): handed out as plain tensors, as
        # AOTAutograd does (aten._unsafe_view), since an autograd.Function's view output would be one of its input
        self.unsafe_views: tuple[int, ...] = ()
        self.tangents: tuple[tuple[int, Any], ...] = ()  # (output index, traced memory format) per backward tangent
        self.detach: tuple[int, ...] = ()  # inputs whose gradient is None: detached (AOTAutograd does too)
        self.nondeterministic = False  # traced with deterministic algorithms off
        self.input_info: Sequence[Any] = ()

    def __repr__(self) -> str:  # a report's repr shows the line, not the compiled callables
        return f"LeanPlan({self.describe()!r})"

    @property
    def ready(self) -> bool:
        return self.reason is None and self.bw is not None

    def describe(self) -> str:
        """The report's `runtime:` line."""
        if self.reason is None:
            if self.bw is None:
                return f"{AOT} until the first backward compiles the backward graph, then lean"
            return "lean (torch_fl's autograd.Function calls the compiled forward and backward directly)"
        return f"{AOT}: {self.reason}"

    # -- compile time ------------------------------------------------------------------

    def refuse(self, reason: str) -> None:
        if self.reason is None or self.reason == "not compiled yet":
            self.reason = reason

    def check_graph(self, gm: fx.GraphModule, example_inputs: Sequence[Any]) -> None:
        """Dynamo's graph, before AOTAutograd: what the runtime receives must be AOTAutograd's flat inputs."""
        self.reason = None
        if any(True for _ in gm.parameters()) or any(True for _ in gm.buffers()):
            self.refuse("the graph module holds parameters or buffers (AOTAutograd passes them itself)")
        for i, a in enumerate(example_inputs):
            plain = type(a) in (torch.Tensor, torch.nn.Parameter) or isinstance(a, torch._subclasses.FakeTensor)
            if not plain and not isinstance(a, (int, torch.SymInt)):
                self.refuse(f"input {i} is a {type(a).__name__}, not a plain tensor or a size")
                break
        if torch._C._is_any_autocast_enabled():
            self.refuse("autocast is on (AOTAutograd's runtime switches it off around the graph)")
        hooks = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
        if hooks is None or hooks(True) is not None:
            self.refuse("saved-tensor hooks are active (or this torch cannot say whether)")

    def set_forward(self, fw: Callable, gm: fx.GraphModule, meta: Any, n_inputs: int) -> None:
        """The forward compiler's turn: AOTAutograd's metadata (TracingContext.fw_metadata) for this graph."""
        if self.reason is not None:
            return
        reason = _forward_reason(meta, n_inputs)
        if reason is None and len([n for n in gm.graph.nodes if n.op == "placeholder"]) != n_inputs:
            reason = "the compiled graph's inputs are not the Dynamo graph's inputs"
        if reason is not None:
            self.refuse(reason)
            return
        try:
            self._read_forward(fw, meta)
        except (AttributeError, TypeError) as e:  # another torch version's metadata: refuse, never fail the compile
            self.fw = None
            self.refuse(f"this torch's AOTAutograd metadata differs ({type(e).__name__}: {e})")

    def _read_forward(self, fw: Callable, meta: Any) -> None:
        grads = [i for i, o in enumerate(meta.output_info) if getattr(o, "requires_grad_for_backward", o.requires_grad)]
        formats = [getattr(m, "memory_format", None) for m in meta.subclass_tangent_meta]
        if len(formats) != len(grads) or len(meta.traced_tangents) != len(grads) or None in formats:
            self.refuse("the backward's tangents are not the outputs' gradients")
            return
        self.fw = fw
        self.n_outputs = meta.num_outputs
        self.vc = meta.tensors_saved_for_backwards_with_vc_check_slice
        self.novc = meta.tensors_saved_for_backwards_no_vc_check_slice
        self.symints = meta.symints_saved_for_backwards_slice
        self.bump = tuple(meta.mutated_graph_handled_indices_seen_by_autograd)
        self.dynamic_saved = dict(getattr(meta, "dynamic_saved_tensors_idxs", None) or {})
        if meta.dynamic_outputs:
            self.dynamic_outputs = tuple((i, o.dynamic_dims) for i, o in enumerate(meta.output_info) if o.dynamic_dims)
        self.non_diff = tuple(i for i, o in enumerate(meta.output_info) if not o.requires_grad)
        self.unsafe_views = tuple(
            i for i, o in enumerate(meta.output_info) if o.output_type.name == "unsafe_view_alias"
        )
        self.tangents = tuple(zip(grads, formats, strict=True))
        self.nondeterministic = meta.deterministic is False
        self.input_info = meta.input_info

    def set_backward(self, bw: Callable, gm: fx.GraphModule) -> None:
        """The backward compiler's turn (at the first backward): the lean path is ready."""
        if self.reason is not None or self.fw is None:
            return
        grads = outputs(gm.graph)
        if len(grads) != len(self.input_info):
            self.refuse("the backward graph's outputs are not one gradient per input")
            return
        self.detach = tuple(
            i
            for i, (g, info) in enumerate(zip(grads, self.input_info, strict=True))
            if g is None and info.requires_grad and not info.is_leaf
        )
        self.bw = bw


def _forward_reason(meta: Any, n_inputs: int) -> str | None:
    """Why AOTAutograd's runtime must run this training graph, or None: the lean runtime can."""
    if meta is None:
        return "no AOTAutograd metadata"
    try:
        from torch._functorch._aot_autograd.schemas import MutationType, OutputType, PlainTensorMeta

        if len(meta.input_info) != n_inputs:
            return "AOTAutograd deduplicated or rewrote the graph's inputs"
        # an input written inside the graph (batch norm's running statistics) needs only its version counter
        # bumped; one AOTAutograd writes back after the graph, or whose sizes or strides change, needs its runtime
        in_graph = MutationType.MUTATED_IN_GRAPH
        mutated = [
            i
            for i, info in enumerate(meta.input_info)
            if (info.mutates_data or info.mutates_metadata)
            and (info.mutation_type != in_graph or info.mutates_metadata or info.mutates_storage_metadata)
        ]
        if mutated or meta.num_mutated_inp_runtime_indices:
            return f"the graph mutates its input(s) {mutated} in a way AOTAutograd's runtime replays"
        for i, o in enumerate(meta.output_info):
            if o.output_type not in (OutputType.non_alias, OutputType.unsafe_view_alias):
                return f"output {i} aliases an input or another output ({o.output_type.name})"
            if not issubclass(o.raw_type, torch.Tensor):
                return f"output {i} is a {o.raw_type.__name__}, not a tensor"
        if meta.num_intermediate_bases or meta.num_forward_returns != meta.num_outputs:
            return "outputs are views of intermediates"
        if meta.tokens or meta.num_backward_tokens:
            return "the graph has effect tokens"
        if meta.is_rng_op_functionalized or getattr(meta, "num_graphsafe_rng_states", 0):
            return "the graph's random ops are functionalized"
        if meta.grad_enabled_mutation is not None:
            return "the graph switches grad mode"
        if not all(isinstance(m, PlainTensorMeta) for m in meta.subclass_inp_meta):
            return "tensor subclasses among the inputs"
        if meta.indices_of_inputs_that_requires_grad_with_mutations_in_bw:
            return "the backward mutates inputs"
        if getattr(meta, "num_opaque_objects_saved_for_bw", 0):
            return "the backward needs objects saved by the forward"
        if not isinstance(meta.symints_saved_for_backwards_slice, slice):
            return "no slice of saved sizes"
        if not all(isinstance(m, PlainTensorMeta) for m in meta.subclass_tangent_meta):
            return "tensor subclasses among the tangents"
        for kind in ("with", "no"):
            if not isinstance(getattr(meta, f"tensors_saved_for_backwards_{kind}_vc_check_slice"), slice):
                return f"no {kind}-version-check slice of saved tensors"
    except (AttributeError, ImportError, TypeError) as e:  # another torch version's metadata
        return f"this torch's AOTAutograd metadata differs ({type(e).__name__}: {e})"
    return None


def _coerce(grad: Any, fmt: Any) -> Any:
    """A gradient in the layout the backward graph was traced with (AOTAutograd's
    coerce_to_expected_memory_format): `sum().backward()` hands an expanded gradient, for one."""
    if not isinstance(grad, torch.Tensor):
        return grad
    if fmt.memory_format is not None:
        return grad.contiguous(memory_format=fmt.memory_format)  # the same tensor where it already is
    if grad.shape == fmt.size and grad.stride() == tuple(fmt.stride):
        return grad
    out = torch.empty_strided(fmt.size, fmt.stride, dtype=grad.dtype, device=grad.device)
    out.copy_(grad)
    return out


class _NoDoubleBackward(torch.autograd.Function):
    """backward(create_graph=True): the gradients are computed, connected to the graph, and differentiating
    them again raises (AOTAutograd's CompiledFunctionBackward does the same)."""

    @staticmethod
    def forward(ctx: Any, bw: Callable, anchor: torch.Tensor | None, *args: Any) -> Any:
        return tuple(bw(list(args)))

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> Any:
        raise RuntimeError(
            "torch.compile(backend='fl') does not support a double backward through a compiled graph (nor does "
            "AOTAutograd): differentiate the model uncompiled, or compile the function that computes the gradient"
        )


def _forward(ctx: Any, plan: LeanPlan, *args: Any) -> Any:
    fw = plan.fw
    assert fw is not None, "a lean plan runs only with its forward compiled"
    outs = fw(list(args))
    vc = [t.detach() if t._is_view() else t for t in outs[plan.vc]]
    no_vc = [t.detach() if t._is_view() else t for t in outs[plan.novc]]
    for i, dims in plan.dynamic_saved.items():  # indices over both lists, as in AOTAutograd
        _mark_dynamic(vc[i] if i < len(vc) else no_vc[i - len(vc)], dims)
    ctx.save_for_backward(*vc)
    ctx.no_vc = no_vc
    ctx.symints = outs[plan.symints]
    ctx.plan = plan
    user = list(outs[: plan.n_outputs])
    for i in plan.unsafe_views:
        if user[i]._is_view():  # a replay's outputs never are; the graph run normally may return one
            user[i] = torch.ops.aten._unsafe_view(user[i], user[i].shape)
    if plan.non_diff:
        ctx.mark_non_differentiable(*(user[i] for i in plan.non_diff))
        ctx._materialize_non_diff_grads = False
    return tuple(user)


def _backward(ctx: Any, *grads: Any) -> Any:
    plan: LeanPlan = ctx.plan
    if plan.nondeterministic and torch.are_deterministic_algorithms_enabled():
        raise RuntimeError(
            "This compiled backward function is being run with torch.use_deterministic_algorithms(True), but "
            "it was previously generated during the forward function while "
            "torch.use_deterministic_algorithms(False) was set."
        )
    args = [*ctx.symints, *ctx.saved_tensors, *ctx.no_vc, *(_coerce(grads[i], fmt) for i, fmt in plan.tangents)]
    bw = plan.bw
    assert bw is not None, "a lean plan runs only with its backward compiled"
    if torch.is_grad_enabled():  # create_graph=True
        # nothing here may require grad (saved tensors are detached, the gradient may be a constant): an
        # anchor that does keeps the results connected, so that differentiating them raises (AOTAutograd's way)
        wired = any(isinstance(t, torch.Tensor) and t.requires_grad for t in args)
        anchor = None if wired else torch.empty(0, requires_grad=True)
        return (None, *_NoDoubleBackward.apply(bw, anchor, *args))
    return (None, *bw(args))


_FUNCTION: type[torch.autograd.Function] | None = None


def _lean_function() -> type[torch.autograd.Function]:
    """The autograd.Function, made at the first lean call: its backward is wrapped in torch._dynamo.disable
    (a backward called inside a compiled region must not be traced, as AOTAutograd's is not), and importing
    torch._dynamo when torch_fl is imported would cost about a second."""
    global _FUNCTION
    if _FUNCTION is None:

        class _LeanFunction(torch.autograd.Function):
            forward = staticmethod(_forward)
            backward = staticmethod(
                torch._dynamo.disable(_backward, reason="the compiled backward runs eagerly, as AOTAutograd's")
            )

        _FUNCTION = _LeanFunction
    return _FUNCTION


class LeanRuntime:
    """The callable Dynamo calls for one compiled graph: the lean path once the plan is ready, else
    AOTAutograd's own runtime (`aot`), whose results are the same."""

    def __init__(self, aot: Callable, plan: LeanPlan):
        self.aot = aot
        self.plan = plan
        self.__wrapped__ = aot  # what AOTAutograd's own wrappers expose (serialize, named_parameters)
        for name in ("zero_grad", "named_parameters", "named_buffers", "serialize"):
            if hasattr(aot, name):
                setattr(self, name, getattr(aot, name))

    def __call__(self, *args: Any) -> Any:
        plan = self.plan
        if plan.ready and not _compiled_autograd():
            if plan.detach:
                args = tuple(a.detach() if i in plan.detach else a for i, a in enumerate(args))
            out = list(_lean_function().apply(plan, *args))
            for i in plan.bump:  # after the Function, as AOTAutograd's runtime wrapper does
                torch.autograd.graph.increment_version(args[i])
            for i, dims in plan.dynamic_outputs:
                _mark_dynamic(out[i], dims)
            return out
        return self.aot(*args)


def _mark_dynamic(t: torch.Tensor, dims: set) -> None:
    """Dynamo's unguarded hint that these dims of t came out dynamic (AOTAutograd's
    mark_dynamo_propagated_dynamic_indices): a graph t flows into after a graph break keeps them dynamic."""
    had = getattr(t, "_dynamo_propagated_dynamic_indices", None)
    t._dynamo_propagated_dynamic_indices = had | dims if had is not None else set(dims)  # type: ignore[attr-defined]


def _compiled_autograd() -> bool:
    """torch._dynamo.compiled_autograd on: it traces AOTAutograd's backward itself (leave it that)."""
    ca = torch._dynamo.compiled_autograd
    return bool(getattr(ca, "compiled_autograd_enabled", False) or getattr(ca, "in_compiled_autograd_region", False))
