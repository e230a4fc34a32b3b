"""The `add_norm` pass: (linear ->) (dropout ->) residual add -> LayerNorm in Dynamo's
graph as the backend's fl::linear_add_layer_norm (GEMM; bias, residual add and
LayerNorm as its epilogue) or fl::add_layer_norm (add and LayerNorm in one kernel).
A dropout that is an identity (p = 0, or not training) goes; a training dropout
becomes the kernels' dropout epilogue with a fresh seed per call
(fl::linear_add_layer_norm_dropout, fl::add_layer_norm_dropout: passes/seeded.py).
A captured-graph rewrite for the reason linear_act is one (passes/linear_act.py):
the fl:: ops carry their one-kernel backward into AOTAutograd's backward graph."""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx as fx

from ..graph_report import Pattern
from . import seeded  # noqa: F401 - seeded defines the fl:: ops the rewrite calls
from .base import Pass
from .fxnodes import arg, identity_dropout, is_call, is_linear, op_name, replace_with, where

F = torch.nn.functional
ADD_NORM_KERNELS = ("fl::add_layer_norm", "fl::add_layer_norm_backward")
LINEAR_ADD_NORM_KERNELS = ("fl::linear_add_layer_norm", "fl::linear_add_layer_norm_backward")


def _training_dropout(node) -> float | None:
    """p of an F.dropout the fused kernels' dropout epilogue can take: training, p a constant in (0, 1),
    not in place; else None."""
    if not is_call(node, F.dropout) or arg(node, 3, "inplace", False):
        return None
    p, training = arg(node, 1, "p", 0.5), arg(node, 2, "training", True)
    return float(p) if training is True and isinstance(p, float) and 0.0 < p < 1.0 else None


def add_norm_captured(gm: fx.GraphModule, kernels: set, patterns: list[Pattern], passes: list[str]) -> None:
    """layer_norm(residual + dropout(linear(x))) as fl::linear_add_layer_norm,
    layer_norm(residual + dropout(x)) as fl::add_layer_norm. An identity dropout goes; a
    training dropout becomes the kernel's dropout epilogue with a fresh seed per call
    (fl::linear_add_layer_norm_dropout / fl::add_layer_norm_dropout, passes/seeded.py)."""
    has_linear = all(k in kernels for k in LINEAR_ADD_NORM_KERNELS)
    has_add = all(k in kernels for k in ADD_NORM_KERNELS)
    graph = gm.graph
    for norm in list(graph.nodes):
        if not is_call(norm, F.layer_norm) or norm.kwargs or len(norm.args) != 5:
            continue
        add, shape, ln_w, ln_b, eps = norm.args
        if not (
            is_call(add, operator.add, torch.add)
            and len(add.args) == 2
            and not add.kwargs
            and len(add.users) == 1
            and len(shape) == 1
            and all(isinstance(a, fx.Node) for a in add.args)
        ):
            continue
        # the branch: the operand with a linear producer (through a dropout), else a dropout
        chosen = None
        for i in (1, 0):
            br, res = add.args[i], add.args[1 - i]
            p = _training_dropout(br) if len(br.users) == 1 else None
            drop = br if len(br.users) == 1 and (identity_dropout(br) or p is not None) else None
            value = drop.args[0] if drop is not None else br
            lin = value if is_linear(value) and len(value.users) == 1 and (drop is not None or value is br) else None
            if lin is not None or (chosen is None and drop is not None):
                chosen = (drop, value, lin, res, p or 0.0)
                if lin is not None:
                    break
        if chosen is None:
            chosen = (None, add.args[1], None, add.args[0], 0.0)
        drop, value, lin, res, p = chosen
        args: tuple[Any, ...]
        dropped = [drop] if drop is not None else []
        epilogue = " with its dropout epilogue, a fresh seed per call" if p else ""
        if lin is not None and has_linear:
            b = lin.args[2] if len(lin.args) > 2 else None
            nodes = [lin] + dropped + [add, norm]
            if p:
                op, args = (
                    torch.ops.fl.linear_add_layer_norm_dropout.default,
                    (lin.args[0], lin.args[1], b, res, ln_w, ln_b, float(eps), p),
                )
            else:
                op, args = (
                    torch.ops.fl.linear_add_layer_norm.default,
                    (lin.args[0], lin.args[1], b, res, ln_w, ln_b, float(eps), 0.0, 0, True),
                )
            replace_with(graph, norm, op, args, [norm, add] + dropped + [lin])
            patterns.append(
                Pattern(
                    "linear+" + ("dropout+" if p else "") + "add+layer_norm",
                    "captured",
                    where(norm),
                    [op_name(n) for n in nodes],
                    f"{LINEAR_ADD_NORM_KERNELS[0]}{epilogue} (GEMM; bias, residual add and LayerNorm "
                    f"as its epilogue; backward: {LINEAR_ADD_NORM_KERNELS[1]})",
                )
            )
        elif has_add:
            nodes = dropped + [add, norm]
            if p:
                op, args = torch.ops.fl.add_layer_norm_dropout.default, (value, res, ln_w, ln_b, float(eps), p)
            else:
                op, args = torch.ops.fl.add_layer_norm.default, (value, res, ln_w, ln_b, float(eps), 0.0, 0, True)
            replace_with(graph, norm, op, args, [norm, add] + dropped)
            patterns.append(
                Pattern(
                    ("dropout+" if p else "") + "add+layer_norm",
                    "captured",
                    where(norm),
                    [op_name(n) for n in nodes],
                    f"{ADD_NORM_KERNELS[0]}{epilogue} (residual add and LayerNorm in one kernel; "
                    f"backward: {ADD_NORM_KERNELS[1]})",
                )
            )
        else:
            patterns.append(
                Pattern(
                    "add+layer_norm",
                    "captured",
                    where(norm),
                    ["add", "layer_norm"],
                    "kept",
                    False,
                    f"no {ADD_NORM_KERNELS[0]} kernel",
                )
            )


PASS = Pass("add_norm", captured=add_norm_captured)
