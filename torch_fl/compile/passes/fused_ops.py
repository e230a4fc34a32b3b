"""The fl:: kernels in an aten graph, recorded: what the captured-graph rewrites
(linear_act, add_norm) put there reaches the aten graphs only through
AOTAutograd's trace, forward kernels in the forward graph and their backward ops
in the backward graph; this step names them in the report of each aten graph.
Not switchable: it rewrites nothing; the registry runs it after the aten passes."""

from __future__ import annotations

from .base import PassContext

FL_OPS = {
    "linear_act": "linear+act",
    "linear_act_backward": "linear+act backward",
    "linear_act_dropout": "linear+act+dropout",
    "linear_act_dropout_backward": "linear+act+dropout backward",
    "add_layer_norm": "add+layer_norm",
    "add_layer_norm_backward": "add+layer_norm backward",
    "linear_add_layer_norm": "linear+add+layer_norm",
    "linear_add_layer_norm_backward": "linear+add+layer_norm backward",
    "add_layer_norm_dropout": "dropout+add+layer_norm",
    "add_layer_norm_dropout_backward": "dropout+add+layer_norm backward",
    "linear_add_layer_norm_dropout": "linear+dropout+add+layer_norm",
    "linear_add_layer_norm_dropout_backward": "linear+dropout+add+layer_norm backward",
}


def fused_ops(ctx: PassContext) -> None:
    """Records the fl:: kernels the captured-graph rewrites put in this aten graph."""
    for n in ctx.gm.graph.nodes:
        if n.op == "call_function" and getattr(n.target, "namespace", None) == "fl":
            op = n.target.__name__.split(".")[0]
            if op in FL_OPS:
                ctx.record(FL_OPS[op], [n], f"fl::{op} (fused kernel of '{ctx.backend}')")
