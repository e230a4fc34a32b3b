"""The `linear_act` pass: F.linear -> ReLU / exact GELU in Dynamo's graph as the
backend's fl::linear_act (bias and activation as the GEMM's epilogue), and with a
training dropout after it as fl::linear_act_dropout (the kernel's dropout
epilogue, a fresh seed per call: passes/seeded.py).

Like add_norm, this rewrites the captured (Dynamo) graph before AOTAutograd
traces it: the replacement is an fl:: op with an autograd formula
(torch_fl/fused/epilogues.py), so AOTAutograd's trace puts the fused forward kernel in the
forward graph and its one-kernel backward in the backward graph, where a rewrite
of the aten graphs alone would have to match the backward's
mm/sum/threshold_backward chains too. A seed baked into a graph would drop the
same units every step; fl::linear_act_dropout's seed is a tensor the forward
graph returns and the backward graph reads."""

from __future__ import annotations

import operator
from collections.abc import Iterator

import torch
import torch.fx as fx

from ..graph_report import Pattern
from . import seeded  # noqa: F401 - seeded defines the fl:: ops the rewrite calls
from .base import Pass
from .fxnodes import KEEP_META, activation, arg, identity_dropout, is_call, is_linear, op_name, replace_with, where

F = torch.nn.functional
LINEAR_ACT_KERNELS = ("fl::linear_act", "fl::linear_act_backward")
_ACTS = {1: "relu", 2: "gelu"}


def _linear_acts(graph: fx.Graph) -> Iterator[tuple[fx.Node, fx.Node, int]]:
    """(linear, activation, fl::linear_act's act code) for each F.linear read only by a ReLU / exact GELU,
    checked as the iteration reaches it: the graph may change in between."""
    for lin in list(graph.nodes):
        if not is_linear(lin) or len(lin.users) != 1:
            continue
        act_node = next(iter(lin.users))
        act = activation(act_node)
        if act is not None:
            yield lin, act_node, act


def linear_act_captured(gm: fx.GraphModule, kernels: set, patterns: list[Pattern], passes: list[str]) -> None:
    """F.linear -> ReLU / exact GELU (-> identity dropout) as fl::linear_act."""
    has = all(k in kernels for k in LINEAR_ACT_KERNELS)
    graph = gm.graph
    for lin, act_node, act in _linear_acts(graph):
        nodes, last = [lin, act_node], act_node
        if len(act_node.users) == 1 and identity_dropout(next(iter(act_node.users))):
            last = next(iter(act_node.users))
            nodes.append(last)
        name = "linear+" + ("relu" if act == 1 else "gelu")
        if not has:
            patterns.append(
                Pattern(
                    name,
                    "captured",
                    where(lin),
                    [op_name(n) for n in nodes],
                    "kept",
                    False,
                    f"no {LINEAR_ACT_KERNELS[0]} kernel",
                )
            )
            continue
        x, w = lin.args[0], lin.args[1]
        b = lin.args[2] if len(lin.args) > 2 else None
        replace_with(
            graph,
            last,
            torch.ops.fl.linear_act.default,
            (x, w, b, act, 0.0, 0, act == 2),
            list(reversed(nodes)),
            meta_from=lin,
        )
        patterns.append(
            Pattern(
                name,
                "captured",
                where(lin),
                [op_name(n) for n in nodes],
                f"{LINEAR_ACT_KERNELS[0]} (bias + activation as the GEMM's epilogue; backward: "
                f"{LINEAR_ACT_KERNELS[1]})",
            )
        )


def linear_act_dropout_captured(gm: fx.GraphModule, kernels: set, patterns: list[Pattern], passes: list[str]) -> None:
    """F.linear -> ReLU / exact GELU -> F.dropout(p > 0, training=True) as
    fl::linear_act_dropout where the table has fl::linear_act and its backward (their
    dropout epilogue, a fresh seed per call). A dropout the kernel cannot take (in
    place, a p or training flag that is not a constant) is kept after a fused
    linear + activation, and the report says why. Runs before linear_act's own
    rewrite, which handles the pattern without a training dropout."""
    has = all(k in kernels for k in LINEAR_ACT_KERNELS)
    graph = gm.graph
    for lin, act_node, act in _linear_acts(graph):
        if len(act_node.users) != 1:
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
            patterns.append(
                Pattern(name, "captured", where(lin), replaced, "kept", False, f"no {LINEAR_ACT_KERNELS[0]} kernel")
            )
            continue
        if not isinstance(p, float) or not 0.0 < p < 1.0 or training is not True or inplace:
            patterns.append(
                Pattern(
                    name,
                    "captured",
                    where(lin),
                    replaced,
                    "linear+act fused, dropout kept",
                    False,
                    "the dropout is in place, p is 1 or p / training is not a constant: the "
                    "kernel's dropout epilogue scales by 1/(1-p) and needs both at compile time",
                )
            )
            continue  # linear_act's rewrite then fuses the linear + activation in front of it
        x, w = lin.args[0], lin.args[1]
        b = lin.args[2] if len(lin.args) > 2 else None
        with graph.inserting_before(drop):
            call = graph.call_function(torch.ops.fl.linear_act_dropout.default, (x, w, b, act, float(p), act == 2))
            first = graph.call_function(operator.getitem, (call, 0))
        first.meta.update(drop.meta)
        call.meta.update({k: v for k, v in lin.meta.items() if k in KEEP_META})
        drop.replace_all_uses_with(first)
        for n in (drop, act_node, lin):
            graph.erase_node(n)
        patterns.append(
            Pattern(
                name,
                "captured",
                where(lin),
                replaced,
                f"{LINEAR_ACT_KERNELS[0]} with its dropout epilogue, a fresh seed per call "
                f"(fl::linear_act_dropout; backward: {LINEAR_ACT_KERNELS[1]} regenerating the mask)",
            )
        )


def captured(gm: fx.GraphModule, kernels: set, patterns: list[Pattern], passes: list[str]) -> None:
    """Linear -> act -> training dropout first, then the pattern without one (or with an identity dropout)."""
    linear_act_dropout_captured(gm, kernels, patterns, passes)
    linear_act_captured(gm, kernels, patterns, passes)


PASS = Pass("linear_act", captured=captured)
