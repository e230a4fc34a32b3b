"""The `qkv` and `pointwise` passes of backend="fl" (and `layout`, from layout.py), and linear -> act ->
dropout in training, each chosen from the active backend's capability table.

  qkv         Dynamo's graph: F.linear calls reading one input (q, k, v of a
              Hugging Face / GPT-style attention, or any such group) become one
              GEMM on the concatenated weights, split into the parts. AOTAutograd
              then sees the cat and its backward (a split: views), so a training
              step runs one GEMM per direction where it ran three, and the
              three input gradients come out of one GEMM instead of three GEMMs
              and two adds. The cat costs a kernel per weight group and call;
              in inference graphs (no gradient) it is cached, keyed on the
              weights' identity, storage and version (`CachedCat`).
  pointwise   aten graphs (forward, backward, inference): a chain of elementwise
              ops whose intermediates are used nowhere else becomes one JIT
              kernel (compile/pointwise.py), where the backend can compile C.
  layout      aten inference graphs: channels-last convolutions where the table
              says the device prefers them (compile/layout.py).
  linear_act  (its training-dropout part) Dynamo's graph: F.linear -> ReLU/GELU ->
              F.dropout(p, training) as `fl::linear_act_dropout`, an op that draws
              a fresh seed per call and hands it to the backend's fl::linear_act
              kernel (dropout in the GEMM's epilogue), the backward regenerating
              the mask from the same seed. A seed baked into a graph would drop
              the same units every step; this op's seed is a tensor the forward
              graph returns and the backward graph reads.

The captured-graph functions take (gm, kernels, patterns, passes) and the aten
ones a pass context (gm, kind, backend, kernels, has, record) like dynamo.py's
own passes; dynamo.py registers them in its pass tables."""

from __future__ import annotations

import operator
import weakref
from collections.abc import Callable

import torch
import torch.fx as fx
from torch import nn

from ..runtime import REGISTRY, Sources
from . import layout, seeded  # noqa: F401 - seeded defines the fl:: ops the rewrites call
from . import pointwise as pw
from .fxnodes import activation, arg, is_call, op_name, where
from .report import Pattern

aten = torch.ops.aten
F = torch.nn.functional
LINEAR_ACT_KERNELS = ("fl::linear_act", "fl::linear_act_backward")
_KEEP_META = ("nn_module_stack", "stack_trace", "source_fn_stack")












def _linear(node) -> bool:
    return is_call(node, F.linear, torch._C._nn.linear) and len(node.args) in (2, 3) and not node.kwargs


def _val(node):
    return node.meta.get("example_value", node.meta.get("val")) if isinstance(node, fx.Node) else None


# -- linear -> activation -> dropout (training) ---------------------------------------

_ACTS = {1: "relu", 2: "gelu"}




def linear_act_dropout_captured(gm: fx.GraphModule, kernels: set, patterns: list, passes: list[str]) -> None:
    """F.linear -> ReLU / exact GELU -> F.dropout(p > 0, training=True) as
    fl::linear_act_dropout where the table has fl::linear_act and its backward (their
    dropout epilogue, a fresh seed per call). A dropout the kernel cannot take (in
    place, a p or training flag that is not a constant) is kept after a fused
    linear + activation, and the report says why. Runs before linear_act's own
    rewrite, which handles the pattern without a training dropout."""
    has = all(k in kernels for k in LINEAR_ACT_KERNELS)
    graph = gm.graph
    for lin in list(graph.nodes):
        if not _linear(lin) or len(lin.users) != 1:
            continue
        act_node = next(iter(lin.users))
        act = activation(act_node)
        if act is None or len(act_node.users) != 1:
            continue
        drop = next(iter(act_node.users))
        if not is_call(drop, F.dropout) or drop.args[0] is not act_node:
            continue
        p, training, inplace = arg(drop, 1, "p", 0.5), arg(drop, 2, "training", True), arg(drop, 3, "inplace")
        if training is False or p == 0.0:
            continue  # an identity dropout: linear_act's own rewrite takes it
        nodes = [lin, act_node, drop]
        name = f"linear+{_ACTS[act]}+dropout"
        replaced = [op_name(n) for n in nodes]
        if not has:
            patterns.append(Pattern(name, "captured", where(lin), replaced, "kept", False,
                                     f"no {LINEAR_ACT_KERNELS[0]} kernel"))
            continue
        if not isinstance(p, float) or not 0.0 < p < 1.0 or training is not True or inplace:
            patterns.append(Pattern(name, "captured", where(lin), replaced,
                                     "linear+act fused, dropout kept", False,
                                     "the dropout is in place, p is 1 or p / training is not a constant: the "
                                     "kernel's dropout epilogue scales by 1/(1-p) and needs both at compile time"))
            continue  # linear_act's rewrite then fuses the linear + activation in front of it
        x, w = lin.args[0], lin.args[1]
        b = lin.args[2] if len(lin.args) > 2 else None
        with graph.inserting_before(drop):
            call = graph.call_function(torch.ops.fl.linear_act_dropout.default, (x, w, b, act, float(p), act == 2))
            first = graph.call_function(operator.getitem, (call, 0))
        first.meta.update(drop.meta)
        call.meta.update({k: v for k, v in lin.meta.items() if k in _KEEP_META})
        drop.replace_all_uses_with(first)
        for n in (drop, act_node, lin):
            graph.erase_node(n)
        patterns.append(Pattern(name, "captured", where(lin), replaced,
                                 f"{LINEAR_ACT_KERNELS[0]} with its dropout epilogue, a fresh seed per call "
                                 f"(fl::linear_act_dropout; backward: {LINEAR_ACT_KERNELS[1]} regenerating the mask)"))


# -- qkv ------------------------------------------------------------------------------


def qkv_captured(gm: fx.GraphModule, kernels: set, patterns: list, passes: list[str]) -> None:
    """F.linear calls on the same input with weights of one in_features, dtype and
    bias-ness (q, k, v projections) as one GEMM on torch.cat of their weights (and
    biases), split into the parts. Every backend has a GEMM, so this is not a table
    choice: what it saves is kernels, not a missing kernel."""
    graph = gm.graph
    groups: dict[fx.Node, list[fx.Node]] = {}
    for n in graph.nodes:
        if _linear(n) and isinstance(n.args[0], fx.Node) and all(isinstance(a, fx.Node) for a in n.args[1:]):
            groups.setdefault(n.args[0], []).append(n)
    for x, lins in groups.items():
        ws = [_val(n.args[1]) for n in lins]
        if len(lins) < 2 or any(w is None or w.dim() != 2 for w in ws):
            continue
        first = lins[0]
        same = [n for n, w in zip(lins, ws, strict=True)
                if w.shape[1] == ws[0].shape[1] and w.dtype == ws[0].dtype and w.device == ws[0].device
                and (len(n.args) == 3) == (len(first.args) == 3)]
        order = {n: i for i, n in enumerate(graph.nodes)}
        if len(same) < 2 or any(order[a] > order[same[0]] for n in same for a in n.args[1:]):
            continue  # fewer than two, or a weight computed after the first projection: the cat cannot go first
        sizes = [int(_val(n.args[1]).shape[0]) for n in same]
        with graph.inserting_before(same[0]):
            w = graph.call_function(torch.cat, ([n.args[1] for n in same], 0))
            b = graph.call_function(torch.cat, ([n.args[2] for n in same], 0)) if len(first.args) == 3 else None
            y = graph.call_function(F.linear, (x, w, b))
            parts = graph.call_function(torch.split, (y, sizes, -1))
        for node in (w, b, y, parts):
            if node is not None:
                node.meta.update({k: v for k, v in same[0].meta.items() if k in _KEEP_META})
        for i, n in enumerate(same):
            with graph.inserting_after(parts):
                part = graph.call_function(operator.getitem, (parts, i))
            part.meta.update(n.meta)
            n.replace_all_uses_with(part)
            graph.erase_node(n)
        pattern = "QKV projections" if len(same) == 3 else f"{len(same)} projections of one input"
        patterns.append(Pattern(pattern, "captured", ", ".join(where(n) for n in same),
                                 ["linear"] * len(same),
                                 "one GEMM on the concatenated weights, split into the parts"))


class CachedCat(nn.Module):
    """torch.cat of tensors that are graph inputs (the packed QKV weights) in an
    inference graph, computed once and reused while every input is the same tensor
    object, with the same storage, not written since through any alias
    (runtime.Sources: an optimizer step, p.data.mul_(), a new .data recompute it).
    Only where no gradient flows: the cached result is not part of any autograd
    graph. The check is host-side: no kernel."""

    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim
        self._refs: list = []
        self._sources = Sources()
        self._key: tuple | None = None
        self._value: torch.Tensor | None = None

    def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
        key = self._sources.key(tensors)
        alive = len(self._refs) == len(tensors) and all(r() is t for r, t in zip(self._refs, tensors, strict=True))
        if not alive or key != self._key:
            self._value = torch.cat(tensors, self.dim)
            self._refs, self._key = [weakref.ref(t) for t in tensors], key
        return self._value


def qkv(ctx) -> None:
    """The aten side of `qkv`: in an inference graph, the concatenation of weights that
    are graph inputs is cached (CachedCat); in forward/backward graphs it stays a
    kernel per call (its gradient is needed), recorded as such."""
    graph = ctx.gm.graph
    returned = set(next(n for n in graph.nodes if n.op == "output").all_input_nodes)
    for n in list(graph.nodes):
        # a concatenation the graph returns is not cached: the caller could write into the cached tensor
        if not is_call(n, aten.cat.default) or not all(a.op == "placeholder" for a in n.args[0]) \
                or len(n.args[0]) < 2 or (ctx.kind == "inference" and n in returned):
            continue
        if ctx.kind != "inference":
            ctx.record("QKV weight concatenation", [n], "kept", applied=False,
                       note=f"a gradient is needed ({ctx.kind} graph): the weights are concatenated each call "
                            f"(one kernel; its backward is a split, no kernel)")
            continue
        target = f"fl_cached_cat_{sum(1 for _ in ctx.gm.named_children())}"
        ctx.gm.add_submodule(target, CachedCat(int(n.args[1]) if len(n.args) > 1 else 0))
        with graph.inserting_before(n):
            new = graph.call_module(target, tuple(n.args[0]))
        new.meta.update(n.meta)
        n.replace_all_uses_with(new)
        graph.erase_node(n)
        ctx.record("QKV weight concatenation", [n], "cached across calls while the weights are unchanged")


# -- pointwise chains ----------------------------------------------------------------


def _elementwise(node: fx.Node, dtype) -> bool:
    """An elementwise aten op computing `dtype` from tensors of `dtype` (and numbers),
    deterministic, not in place: what one generated C loop can compute."""
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
        if not isinstance(v, torch.Tensor) or v.dtype != dtype:
            return False
    return all(not isinstance(a, (list, tuple)) for a in (*node.args, *node.kwargs.values()))


class PointwiseKernel(nn.Module):
    """A graph's chain of elementwise ops as one call: one generated kernel where the
    tensors allow (compile/pointwise.run), else the chain's own ops."""

    def __init__(self, chain: pw.PointwiseChain):
        super().__init__()
        self.chain = chain

    def forward(self, *xs: torch.Tensor) -> torch.Tensor:
        return pw.run(self.chain, *xs)

    def extra_repr(self) -> str:
        return self.chain.label


def _chains(graph: fx.Graph) -> list[list[fx.Node]]:
    """Maximal groups of elementwise nodes of one dtype, each with one result: every
    member but the last is used only inside the group. In graph order."""
    order = {n: i for i, n in enumerate(graph.nodes)}
    taken: set = set()
    found = []
    for root in reversed(list(graph.nodes)):
        val = root.meta.get("val")
        if root in taken or not isinstance(val, torch.Tensor) or not val.is_floating_point() or \
                not _elementwise(root, val.dtype):
            continue
        group, frontier = {root}, [root]
        while frontier:
            for a in frontier.pop().all_input_nodes:
                if a not in taken and a not in group and _elementwise(a, val.dtype) and \
                        all(u in group for u in a.users):
                    group.add(a)
                    frontier.append(a)
        if len(group) >= 2:
            taken |= group
            found.append(sorted(group, key=order.__getitem__))
    return found[::-1]


def _short(node: fx.Node) -> str:
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
    return all(u.op == "call_function" and isinstance(u.target, torch._ops.OpOverload)
               and not u.target._schema.is_mutable for u in node.users)


def _drop_copies(ctx) -> None:
    graph = ctx.gm.graph
    out = next(n for n in graph.nodes if n.op == "output")
    outputs = set(out.all_input_nodes)
    for n in list(graph.nodes):
        if _identity_copy(n, outputs):
            ctx.record("identity copy", [n], "removed (eager runs no kernel for it)")
            n.replace_all_uses_with(n.args[0])
            graph.erase_node(n)


def pointwise(ctx) -> None:
    """Chains of elementwise aten ops (bias + GELU, GELU's backward formula, add + ReLU,
    scale + mask, ...) as one JIT-compiled kernel each, where the backend compiles C
    (capability table: jit). Without a JIT the ops stay, recorded with the reason.
    First, copies eager does not make go: clones that keep the layout (what a
    zero-probability dropout becomes when traced). Batch norm's write-backs are
    undone before any pass, whatever is switched on (inplace.py)."""
    _drop_copies(ctx)
    chains = _chains(ctx.gm.graph)
    if not chains:
        return
    if not REGISTRY.get(ctx.backend).capabilities.jit:
        for group in chains:
            ctx.record("elementwise chain", group, "kept", applied=False,
                       note=f"'{ctx.backend}' cannot compile kernels (no jit_compile or device JIT): one kernel per op")
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
        chain = pw.PointwiseChain(fx.GraphModule(nn.Module(), sub), len(inputs), label)
        target = f"fl_pointwise_{sum(1 for _ in ctx.gm.named_children())}"
        ctx.gm.add_submodule(target, PointwiseKernel(chain))
        last = group[-1]
        with graph.inserting_before(last):
            new = graph.call_module(target, tuple(inputs))
        new.meta.update(last.meta)
        last.replace_all_uses_with(new)
        for n in reversed(group):
            graph.erase_node(n)
        ctx.record("elementwise chain", group, f"one JIT kernel ({label})")


CAPTURED: dict[str, Callable] = {"qkv": qkv_captured}
ATEN: dict[str, Callable] = {"qkv": qkv, "pointwise": pointwise, "layout": layout.layout}
