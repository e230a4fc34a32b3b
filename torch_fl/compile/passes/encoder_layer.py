"""nn.TransformerEncoderLayer's inference fast path back as the layer's formula, on
Dynamo's graph before any pass. Not a pass that can be switched off: it changes
where the layer runs (the fast path is a CPU fallback on fl), not which kernels
fuse; the registry runs it first (passes/__init__.py)."""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

from ..graph_report import Pattern
from .attention import packed_self_attention
from .fxnodes import is_call, where

F = torch.nn.functional


def _expand_encoder_layer(graph: fx.Graph, node: fx.Node, embed: int) -> fx.Node:
    """The nodes of nn.TransformerEncoderLayer's formula (inference, no mask) for one
    aten::_transformer_encoder_layer_fwd call; returns the output node."""
    (src, _, heads, in_w, in_b, out_w, out_b, use_gelu, norm_first, eps, n1_w, n1_b, n2_w, n2_b, w1, b1, w2, b2) = (
        node.args[:18]
    )

    def call(fn, *args):
        n = graph.call_function(fn, args)
        n.meta.update({k: v for k, v in node.meta.items() if k in ("nn_module_stack", "stack_trace")})
        return n

    def attention(x):
        out = call(packed_self_attention, call(torch.transpose, x, 0, 1), heads, in_w, in_b, out_w, out_b)
        return call(torch.transpose, call(operator.getitem, out, 0), 0, 1)

    def feed_forward(x):
        return call(F.linear, call(F.gelu if use_gelu else F.relu, call(F.linear, x, w1, b1)), w2, b2)

    def norm(x, w, b):
        return call(F.layer_norm, x, (embed,), w, b, eps)

    with graph.inserting_before(node):
        if norm_first:
            x = call(operator.add, src, attention(norm(src, n1_w, n1_b)))
            return call(operator.add, x, feed_forward(norm(x, n2_w, n2_b)))
        x = norm(call(operator.add, src, attention(src)), n1_w, n1_b)
        return norm(call(operator.add, x, feed_forward(x)), n2_w, n2_b)


def encoder_fast_path(gm: fx.GraphModule, patterns: list[Pattern]) -> None:
    """nn.TransformerEncoderLayer in inference takes PyTorch's fast path, one
    aten::_transformer_encoder_layer_fwd, which no plugin implements: on fl it is a
    CPU fallback (every activation copied to the host and back). Dynamo keeps it as
    one call; it becomes the layer's own formula as graph nodes (self-attention as
    packed_self_attention, linear, activation, residual adds, LayerNorm), so it runs
    on the device and the passes after this one see its patterns. Not a pass that
    can be switched off: it changes where the layer runs, not which kernels fuse."""
    for node in list(gm.graph.nodes):
        if not is_call(node, torch._transformer_encoder_layer_fwd) or node.kwargs or len(node.args) < 18:
            continue
        val = node.meta.get("example_value")
        if any(a is not None for a in node.args[18:]) or not isinstance(node.args[2], int) or val is None:
            patterns.append(
                Pattern(
                    "encoder-layer fast path",
                    "captured",
                    where(node),
                    ["_transformer_encoder_layer_fwd"],
                    "kept",
                    False,
                    "a mask or an unknown shape: the fast path stays",
                )
            )
            continue
        out = _expand_encoder_layer(gm.graph, node, int(val.shape[-1]))
        node.replace_all_uses_with(out)
        gm.graph.erase_node(node)
        patterns.append(
            Pattern(
                "encoder-layer fast path",
                "captured",
                where(out),
                ["_transformer_encoder_layer_fwd"],
                "the layer's formula on the device (was one CPU-fallback op)",
            )
        )
