"""The `qkv` pass: projections of one input as one GEMM.

Dynamo's graph: F.linear calls reading one input (q, k, v of a Hugging Face /
GPT-style attention, or any such group) become one GEMM on the concatenated
weights, split into the parts. AOTAutograd then sees the cat and its backward (a
split: views), so a training step runs one GEMM per direction where it ran three,
and the three input gradients come out of one GEMM instead of three GEMMs and two
adds. The cat costs a kernel per weight group and call; in aten inference graphs
(no gradient) it is cached, keyed on the weights' identity, storage and version
(`CachedCat`)."""

from __future__ import annotations

import operator
import weakref

import torch
import torch.fx as fx
from torch import nn

from ...runtime import Sources, cached_value
from ..graph_report import Pattern
from .base import Pass, PassContext
from .fxnodes import KEEP_META, is_call, is_linear, where

aten = torch.ops.aten
F = torch.nn.functional


def _val(node):
    return node.meta.get("example_value", node.meta.get("val")) if isinstance(node, fx.Node) else None


def qkv_captured(gm: fx.GraphModule, kernels: set, patterns: list[Pattern], passes: list[str]) -> None:
    """F.linear calls on the same input with weights of one in_features, dtype and
    bias-ness (q, k, v projections) as one GEMM on torch.cat of their weights (and
    biases), split into the parts. Every backend has a GEMM, so this is not a table
    choice: what it saves is kernels, not a missing kernel."""
    graph = gm.graph
    groups: dict[fx.Node, list[fx.Node]] = {}
    for n in graph.nodes:
        if is_linear(n) and isinstance(n.args[0], fx.Node) and all(isinstance(a, fx.Node) for a in n.args[1:]):
            groups.setdefault(n.args[0], []).append(n)
    for x, lins in groups.items():
        ws = [_val(n.args[1]) for n in lins]
        if len(lins) < 2 or any(w is None or w.dim() != 2 for w in ws):
            continue
        first = lins[0]
        same = [
            n
            for n, w in zip(lins, ws, strict=True)
            if w.shape[1] == ws[0].shape[1]
            and w.dtype == ws[0].dtype
            and w.device == ws[0].device
            and (len(n.args) == 3) == (len(first.args) == 3)
        ]
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
                node.meta.update({k: v for k, v in same[0].meta.items() if k in KEEP_META})
        for i, n in enumerate(same):
            with graph.inserting_after(parts):
                part = graph.call_function(operator.getitem, (parts, i))
            part.meta.update(n.meta)
            n.replace_all_uses_with(part)
            graph.erase_node(n)
        pattern = "QKV projections" if len(same) == 3 else f"{len(same)} projections of one input"
        patterns.append(
            Pattern(
                pattern,
                "captured",
                ", ".join(where(n) for n in same),
                ["linear"] * len(same),
                "one GEMM on the concatenated weights, split into the parts",
            )
        )


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
        value = self._value
        if not alive or key != self._key or value is None:
            value = self._value = cached_value(torch.cat(tensors, self.dim))
            self._refs, self._key = [weakref.ref(t) for t in tensors], key
        return value


def qkv(ctx: PassContext) -> None:
    """The aten side of `qkv`: in an inference graph, the concatenation of weights that
    are graph inputs is cached (CachedCat); in forward/backward graphs it stays a
    kernel per call (its gradient is needed), recorded as such."""
    graph = ctx.gm.graph
    returned = set(next(n for n in graph.nodes if n.op == "output").all_input_nodes)
    for n in list(graph.nodes):
        # a concatenation the graph returns is not cached: the caller could write into the cached tensor
        if (
            not is_call(n, aten.cat.default)
            or not all(a.op == "placeholder" for a in n.args[0])
            or len(n.args[0]) < 2
            or (ctx.kind == "inference" and n in returned)
        ):
            continue
        if ctx.kind != "inference":
            ctx.record(
                "QKV weight concatenation",
                [n],
                "kept",
                applied=False,
                note=f"a gradient is needed ({ctx.kind} graph): the weights are concatenated each call "
                f"(one kernel; its backward is a split, no kernel)",
            )
            continue
        target = f"fl_cached_cat_{sum(1 for _ in ctx.gm.named_children())}"
        ctx.gm.add_submodule(target, CachedCat(int(n.args[1]) if len(n.args) > 1 else 0))
        with graph.inserting_before(n):
            new = graph.call_module(target, tuple(n.args[0]))
        new.meta.update(n.meta)
        n.replace_all_uses_with(new)
        graph.erase_node(n)
        ctx.record("QKV weight concatenation", [n], "cached across calls while the weights are unchanged")


PASS = Pass("qkv", captured=qkv_captured, aten=qkv)
