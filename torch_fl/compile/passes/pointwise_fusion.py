"""The `pointwise` pass: a chain of elementwise aten ops as one kernel, through the JIT tier.

In aten graphs (forward, backward, inference), a chain of elementwise ops whose
intermediates are used nowhere else becomes one call (`PointwiseKernel`), where
the backend can compile C; first, copies eager does not make (the clone a
zero-probability dropout becomes when traced) go.

The dispatcher's JIT tier compiles one aten op at a time. A chain such as
bias + GELU or add + ReLU would still launch one kernel per op and write
every intermediate to device memory, so here the whole chain is traced as
one function and handed to the same code generator (`jit.generate`): one C
loop over the output computes every op per element. The generated kernel is
run through the dispatcher's native path (`runtime.run_native`), so
outputs are allocated, broadcast and counted exactly as a vendor kernel's.

Gradients: the vector-Jacobian product of a pointwise chain is pointwise too,
so each input's gradient is one more generated kernel (inputs whose gradient
formulas are identical, as for both operands of an add, share one), followed
by a sum over broadcast dimensions where an input was broadcast.

Inputs are of the chain's floating dtype, or bool masks (dropout's backward
multiplies by one): a mask is loaded as 0 or 1, as PyTorch's type promotion
converts it, and has no gradient. Where no kernel can be made (tensors not on
fl, other mixed dtypes, a backend without `jit_compile`, a dtype the generator
does not cover), the chain runs as the original ops, with PyTorch's autograd."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
import torch.fx as fx
from torch import nn

from ... import jit
from ...runtime import JIT, NOT_HANDLED, REGISTRY, async_copy, device_of, events, is_fl
from .base import Pass, PassContext
from .fxnodes import fake_result, is_call

aten = torch.ops.aten

STATS = {"compiled": 0, "runs": 0, "eager": 0}


# -- a chain as one generated kernel: what the rewritten graph calls ---------------------


class _ChainFacts:
    """The parts of an op's facts (`dispatch.OpFacts`) that the generator and
    the native path read, for a chain that is a Python function, not an aten op."""

    mutable: list = []
    is_out = False
    pointwise = True
    ret_alias = [None]
    n_returns = 1

    def __init__(self, name: str, fn: Callable, n: int):
        self.name, self.func = name, fn
        self.arg_names = [f"x{i}" for i in range(n)]
        self.kwarg_only = [False] * n
        self.tensor_arg = [True] * n

    def call(self, vals):
        return self.func(*vals)


class PointwiseChain:
    """A traced chain: `fn(*inputs)` computes it with aten ops; kernels are
    compiled per (backend, dtype) on first use and cached."""

    def __init__(self, fn: Callable, n_inputs: int, label: str):
        self.fn, self.n, self.label = fn, n_inputs, label
        self.name = f"fl::fused_pointwise({label})"
        self._kernels: dict = {}
        self._grad_fns: dict[int, Callable] = {}

    # -- kernels -------------------------------------------------------------
    def _kernel(self, key, facts: _ChainFacts, vals, dtype, dev):
        """(kernel entry or None, generated source or None), compiled once per key."""
        key = jit.key(key, dev)
        hit = self._kernels.get(key)
        if hit is not None:
            return hit
        entry = src = None
        try:
            src, symbol = jit.generate_for(dev, lambda: jit.generate(facts, vals, dtype, masks=True))
        except Exception:  # noqa: BLE001 - an op the generator does not cover: the chain runs unfused
            src = None
        if src is not None:  # a failed compile leaves the chain unfused, without a warning
            entry = jit.compile_source(facts.name, dev, src, symbol, warn=False)
            if entry is not None:
                STATS["compiled"] += 1
        hit = self._kernels[key] = (entry, src)
        return hit

    def _grad_fn(self, i: int) -> Callable:
        fn = self._grad_fns.get(i)
        if fn is None:
            chain = self.fn

            def fn(g, *xs):
                with torch.enable_grad():
                    leaves = [x.detach().requires_grad_(k == i) for k, x in enumerate(xs)]
                    return torch.autograd.grad(chain(*leaves), leaves[i], g)[0]

            self._grad_fns[i] = fn
        return fn


def kernel_ready(tensors) -> tuple | None:
    """(device, dtype) when these tensors can run a generated kernel, else None: one floating dtype, and
    bool masks beside it."""
    if not tensors or not all(is_fl(t) for t in tensors):
        return None
    dev = device_of(tensors[0])
    dtypes = {t.dtype for t in tensors} - {torch.bool}
    if len(dtypes) != 1:
        return None
    dtype = dtypes.pop()
    if any(device_of(t) is not dev for t in tensors) or dtype not in jit.DTYPES or not dtype.is_floating_point:
        return None
    if not dev.plugin.jit_target or not (dev.props.dtypes >> jit.dtype_code(dtype)) & 1:
        return None
    if any(t.dim() > 8 for t in tensors):
        return None
    return dev, dtype


def _launch(chain: PointwiseChain, facts: _ChainFacts, key, vals, dev, dtype):
    """Runs one generated kernel on vals; None when there is none for them."""
    entry = chain._kernel(key, facts, vals, dtype, dev)[0]
    if entry is None:
        return None
    if async_copy.PENDING:
        async_copy.order_for_kernels(vals)
    listening = bool(events.STATE.listeners)
    t0, k0 = time.perf_counter(), events.STATE.kernels
    out = jit.run(facts, entry, dev, list(vals))
    if out is NOT_HANDLED:
        return None
    if listening:
        events.emit(
            events.OpEvent(
                facts.name,
                dev.backend.name,
                JIT,
                time.perf_counter() - t0,
                events.STATE.kernels - k0,
                0,
                events.NESTING.depth,
                t0,
            )
        )
    return out


class _FusedFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, chain: PointwiseChain, dev, dtype, *xs):
        facts = _ChainFacts(chain.name, chain.fn, len(xs))
        out = _launch(chain, facts, ("fwd", dev.backend.name, dtype, _masks(xs)), xs, dev, dtype)
        if out is None:
            with torch.no_grad():
                out = chain.fn(*xs)
        ctx.chain, ctx.dev, ctx.dtype = chain, dev, dtype
        ctx.save_for_backward(*xs)
        return out

    @staticmethod
    def backward(ctx, g):
        xs = ctx.saved_tensors
        chain: PointwiseChain = ctx.chain
        grads: list = [None, None, None]
        cache: dict = {}
        ready = kernel_ready([g, *xs]) is not None
        for i, x in enumerate(xs):
            if not ctx.needs_input_grad[3 + i]:
                grads.append(None)
                continue
            gi = None
            if ready:
                name = chain.name.replace("fused_pointwise", "fused_pointwise_backward")
                facts = _ChainFacts(name, chain._grad_fn(i), len(xs) + 1)
                key = ("bwd", i, ctx.dev.backend.name, ctx.dtype, _masks(xs))
                src = chain._kernel(key, facts, (g, *xs), ctx.dtype, ctx.dev)[1]
                # identical formulas (both operands of an add) share one kernel and one result
                gi = cache.get(src) if src is not None else None
                if gi is None:
                    gi = _launch(chain, facts, key, (g, *xs), ctx.dev, ctx.dtype)
                    if src is not None and gi is not None:
                        cache[src] = gi
            if gi is None:
                gi = chain._grad_fn(i)(g, *xs)
            if gi.shape != x.shape:
                gi = gi.sum_to_size(x.shape)
            grads.append(gi)
        return tuple(grads)


def _masks(xs) -> tuple:
    """Which inputs are bool masks: part of a kernel's key (its loads differ)."""
    return tuple(x.dtype is torch.bool for x in xs)


def run(chain: PointwiseChain, *xs):
    """The chain's value: one generated kernel where possible, the ops otherwise."""
    tensors = [x for x in xs if isinstance(x, torch.Tensor)]
    ready = kernel_ready(tensors) if len(tensors) == len(xs) else None
    if ready is None:
        STATS["eager"] += 1
        return chain.fn(*xs)
    STATS["runs"] += 1
    return _FusedFn.apply(chain, ready[0], ready[1], *xs)


# -- the pass: chains of elementwise ops in aten graphs -------------------------------


def _elementwise(node: fx.Node, dtype) -> bool:
    """An elementwise aten op computing `dtype` from tensors of `dtype` (and numbers, and bool masks that
    promote to it), deterministic, not in place: what one generated C loop can compute."""
    t = node.target
    if node.op != "call_function" or not isinstance(t, torch._ops.OpOverload):
        return False
    if torch.Tag.pointwise not in t.tags or torch.Tag.nondeterministic_seeded in t.tags or t._schema.is_mutable:
        return False
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor) or val.dtype != dtype:
        return False
    for a in node.all_input_nodes:
        v = a.meta.get("val")
        if not isinstance(v, torch.Tensor) or (v.dtype != dtype and not (v.dtype is torch.bool and _mask_op(node))):
            return False
    return all(not isinstance(a, (list, tuple)) for a in (*node.args, *node.kwargs.values()))


# ops whose bool operand is promoted to the result's dtype before the op, so loading it as 0/1 is exact
_MASK_OPS = {
    aten.native_dropout_backward.default,
    aten.mul.Tensor,
    aten.where.self,
    aten.add.Tensor,
    aten.sub.Tensor,
    aten.div.Tensor,
}


def _mask_op(node: fx.Node) -> bool:
    return node.target in _MASK_OPS


class PointwiseKernel(nn.Module):
    """A graph's chain of elementwise ops as one call: one generated kernel where the
    tensors allow (`run` above), else the chain's own ops."""

    def __init__(self, chain: PointwiseChain):
        super().__init__()
        self.chain = chain

    def forward(self, *xs: torch.Tensor) -> torch.Tensor:
        return run(self.chain, *xs)

    def extra_repr(self) -> str:
        return self.chain.label


def _chains(graph: fx.Graph, kernels: set | frozenset = frozenset()) -> list[list[fx.Node]]:
    """Maximal groups of elementwise nodes of one dtype, each with one result: every
    member but the last is used only inside the group. In graph order. A group of one
    is kept where `kernels` (the backend's) lacks its op: the dispatcher would run a
    decomposition into several kernels (GELU on a chip without it: five), the group one."""
    order = {n: i for i, n in enumerate(graph.nodes)}
    taken: set = set()
    found = []
    for root in reversed(list(graph.nodes)):
        val = root.meta.get("val")
        if (
            root in taken
            or not isinstance(val, torch.Tensor)
            or not val.is_floating_point()
            or not _elementwise(root, val.dtype)
        ):
            continue
        group, frontier = {root}, [root]
        while frontier:
            for a in frontier.pop().all_input_nodes:
                if (
                    a not in taken
                    and a not in group
                    and _elementwise(a, val.dtype)
                    and all(u in group for u in a.users)
                ):
                    group.add(a)
                    frontier.append(a)
        if len(group) >= 2 or (kernels and _decomposed(root, kernels)):
            taken |= group
            found.append(sorted(group, key=order.__getitem__))
    return found[::-1]


def _short(node: fx.Node) -> str:
    assert isinstance(node.target, torch._ops.OpOverload), "pointwise chains hold aten ops"
    return node.target._schema.name.split("::")[-1]


def _static(shape) -> tuple | None:
    return tuple(int(s) for s in shape) if all(isinstance(s, int) for s in shape) else None


def _identity_copy(node: fx.Node, outputs: set) -> bool:
    """aten.clone with the input's own layout whose result only functional ops read and
    the graph does not return: what PyTorch's decomposition of a dropout that drops
    nothing (p = 0, or not training) leaves in a traced graph, where eager returns the
    input itself. Removing it is exact: the graph is functional, nothing writes either."""
    layout = node.kwargs.get("memory_format", torch.preserve_format)
    if not is_call(node, aten.clone.default) or node in outputs or layout is not torch.preserve_format:
        return False
    src, val = node.args[0], node.meta.get("val")
    src_val = src.meta.get("val") if isinstance(src, fx.Node) else None
    if not isinstance(val, torch.Tensor) or not isinstance(src_val, torch.Tensor):
        return False
    strides = _static(val.stride())
    if strides is None or strides != _static(src_val.stride()):
        return False
    return all(
        u.op == "call_function" and isinstance(u.target, torch._ops.OpOverload) and not u.target._schema.is_mutable
        for u in node.users
    )


def _drop_copies(ctx: PassContext) -> None:
    graph = ctx.gm.graph
    out = next(n for n in graph.nodes if n.op == "output")
    outputs = set(out.all_input_nodes)
    for n in list(graph.nodes):
        if _identity_copy(n, outputs):
            ctx.record("identity copy", [n], "removed (eager runs no kernel for it)")
            n.replace_all_uses_with(n.args[0])
            graph.erase_node(n)


# copies: one kernel (copy_) whatever the backend, so nothing to gain from a generated one
_COPIES = {aten.clone.default, aten._to_copy.default, aten.copy.default, aten.lift_fresh_copy.default}


def _decomposed(node: fx.Node, kernels: set | frozenset) -> bool:
    """Whether the backend lacks a kernel of node's op (so one call of it is several kernels, or a round trip
    through the host), and it is not a copy."""
    name = getattr(node.target, "name", None)  # an OpOverload's: "aten::gelu", "aten::add.Tensor" (the tables')
    return callable(name) and name() not in kernels and node.target not in _COPIES


def _split_addmm(ctx: PassContext) -> None:
    """addmm(bias, x, w) with the default scales as add(mm(x, w), bias) where the backend has mm but no addmm
    (the dispatcher's decomposition makes the same two kernels, the same bits) and addmm's one user is
    elementwise: the add then joins the chain after it (bias + GELU as one kernel)."""
    if ctx.has("aten::addmm") or not ctx.has("aten::mm"):
        return
    graph = ctx.gm.graph
    for node in list(graph.nodes):
        if not is_call(node, aten.addmm.default) or node.kwargs or len(node.args) != 3:
            continue
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor) or val.dtype not in (torch.float32, torch.float64):
            continue
        user = next(iter(node.users)) if len(node.users) == 1 else None
        if user is None or not _elementwise(user, val.dtype):  # the add would stay alone: nothing gained
            continue
        bias, x, w = node.args
        with graph.inserting_before(node):
            mm = graph.call_function(aten.mm.default, (x, w))
            mm.meta["val"] = fake_result(mm)
            add = graph.call_function(aten.add.Tensor, (mm, bias))
        if mm.meta["val"] is None:
            graph.erase_node(add)
            graph.erase_node(mm)
            continue
        add.meta.update(node.meta)
        node.replace_all_uses_with(add)
        graph.erase_node(node)
        ctx.record("addmm", [node], "mm + add (no addmm kernel: the add joins the elementwise chain after it)")


def pointwise(ctx: PassContext) -> None:
    """Chains of elementwise aten ops (bias + GELU, GELU's backward formula, add + ReLU,
    scale + mask, ...) as one JIT-compiled kernel each, where the backend compiles C
    (capability table: jit). Without a JIT the ops stay, recorded with the reason.
    First, copies eager does not make go: clones that keep the layout (what a
    zero-probability dropout becomes when traced). Batch norm's write-backs are
    undone before any pass, whatever is switched on (passes/inplace.py)."""
    _drop_copies(ctx)
    jit_capable = REGISTRY.get(ctx.backend).capabilities.jit
    if jit_capable:
        _split_addmm(ctx)
    chains = _chains(ctx.gm.graph, ctx.kernels if jit_capable else frozenset())
    if not chains:
        return
    if not jit_capable:
        for group in chains:
            ctx.record(
                "elementwise chain",
                group,
                "kept",
                applied=False,
                note=f"'{ctx.backend}' cannot compile kernels (no jit_compile or device JIT): one kernel per op",
            )
        return
    graph = ctx.gm.graph
    for group in chains:
        inside = set(group)
        inputs: list[fx.Node] = []
        for n in group:
            for a in n.all_input_nodes:
                if a not in inside and a not in inputs:
                    inputs.append(a)
        sub = fx.Graph()
        env = {a: sub.placeholder(f"x{i}") for i, a in enumerate(inputs)}
        for n in group:
            env[n] = sub.node_copy(n, env.__getitem__)
        sub.output(env[group[-1]])
        label = ",".join(_short(n) for n in group)
        chain = PointwiseChain(fx.GraphModule(nn.Module(), sub), len(inputs), label)
        target = f"fl_pointwise_{sum(1 for _ in ctx.gm.named_children())}"
        ctx.gm.add_submodule(target, PointwiseKernel(chain))
        last = group[-1]
        with graph.inserting_before(last):
            new = graph.call_module(target, tuple(inputs))
        new.meta.update(last.meta)
        last.replace_all_uses_with(new)
        for n in reversed(group):
            graph.erase_node(n)
        if len(group) == 1:
            ctx.record("elementwise op", group, f"one JIT kernel (no {_short(group[0])} kernel: not decomposed)")
        else:
            ctx.record("elementwise chain", group, f"one JIT kernel ({label})")


PASS = Pass("pointwise", aten=pointwise)
