"""What the passes ask of an fx node: which call it is, its arguments, where in
the model it came from; and the one rewrite the GEMM-epilogue passes share. One
copy for the passes on Dynamo's graph and on the aten graphs (this package)."""

from __future__ import annotations

import operator
import re
from typing import Any

import torch
import torch.fx as fx

F = torch.nn.functional
KEEP_META = ("nn_module_stack", "stack_trace", "source_fn_stack")  # what a replacement node takes over


def is_call(node: Any, *targets: Any) -> bool:
    return isinstance(node, fx.Node) and node.op == "call_function" and node.target in targets


def arg(node: fx.Node, i: int, name: str, default: Any = None) -> Any:
    """Argument i, given positionally or by name."""
    return node.args[i] if len(node.args) > i else node.kwargs.get(name, default)


def outputs(graph: fx.Graph) -> list:
    """The graph's returned values, by position (an aten graph returns a tuple; a lone value is a list of one)."""
    returned = graph.output_node().args[0]
    return list(returned) if isinstance(returned, (tuple, list)) else [returned]


def fake_result(node: fx.Node) -> Any:
    """What node's op gives, run by its fake implementation on its arguments' traced values (None where
    they have none): the `val` a node a pass inserts needs, for the passes after it."""
    args = [a.meta.get("val") if isinstance(a, fx.Node) else a for a in node.args]
    if any(isinstance(a, fx.Node) and a.meta.get("val") is None for a in node.args):
        return None
    mode = torch._guards.detect_fake_mode([a for a in args if isinstance(a, torch.Tensor)])
    if mode is None:
        return None
    assert callable(node.target), "a call_function node's target is its op"
    with mode:
        return node.target(*args)


def only_user(node: fx.Node) -> fx.Node | None:
    return next(iter(node.users)) if len(node.users) == 1 else None


def where(node: fx.Node) -> str:
    """The module path the node came from (its nn_module_stack), else its name: what a report shows."""
    stack = node.meta.get("nn_module_stack") or node.meta.get("fwd_nn_module_stack")
    if stack:
        path = list(stack.values())[-1][0]
        return re.sub(r"^L\['[^']*'\]\.?", "", str(path)) or node.name
    return node.name


def op_name(node: fx.Node) -> str:
    t = node.target
    name = getattr(t, "name", None)
    return name() if callable(name) else getattr(t, "__name__", str(t))


def activation(node: Any) -> int | None:
    """fl::linear_act's `act` code for a ReLU (1) or exact GELU (2) node, else None."""
    if is_call(node, F.relu, torch.relu) and len(node.args) == 1 and not node.kwargs.get("inplace"):
        return 1
    if (
        is_call(node, F.gelu, torch._C._nn.gelu)
        and len(node.args) == 1
        and node.kwargs.get("approximate", "none") == "none"
    ):
        return 2
    return None


def is_linear(node: Any) -> bool:
    """A plain F.linear(x, w[, b]) call, every argument positional."""
    return is_call(node, F.linear, torch._C._nn.linear) and len(node.args) in (2, 3) and not node.kwargs


def identity_dropout(node: Any) -> bool:
    """F.dropout that changes nothing: p == 0 or training=False."""
    return is_call(node, F.dropout) and (arg(node, 1, "p", 0.5) == 0.0 or arg(node, 2, "training", True) is False)


def replace_with(
    graph: fx.Graph, last: fx.Node, op: Any, args: tuple, dead: list[fx.Node], meta_from: fx.Node | None = None
) -> None:
    """`last`'s uses read result 0 of op(*args) instead; the nodes of `dead` left without users go."""
    with graph.inserting_before(last):
        call = graph.call_function(op, args)
        first = graph.call_function(operator.getitem, (call, 0))
    first.meta.update(last.meta)
    call.meta.update({k: v for k, v in (meta_from or last).meta.items() if k in ("nn_module_stack", "stack_trace")})
    last.replace_all_uses_with(first)
    for n in dead:
        if not n.users:
            graph.erase_node(n)
