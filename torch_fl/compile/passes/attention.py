"""The `attention` pass: the backend's fused attention pair, forward and backward.

Aten graphs: F.scaled_dot_product_attention on fl is routed by torch_fl's kernel
for it (AutogradPrivateUse1): to the plugin's fused forward/backward pair when
the backend declares both, else to PyTorch's math composition. AOTAutograd
traces through that kernel, so on such a backend the forward graph holds the
fused forward and the backward graph the fused backward. The pass checks the
pair against the table and records it in both graphs; switched off, it rewrites
both into the math composition (matmul, softmax, matmul and their backward
formulas), so no fused attention kernel runs.

Dynamo's graph: nn.MultiheadAttention's self-attention as one QKV GEMM viewed as
q, k, v + the fused pair (`packed_self_attention`), and explicit matmul ->
softmax -> matmul attention as F.scaled_dot_product_attention, where the table
has the pair."""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

from ...dispatch import sdpa_backward, sdpa_forward
from ..graph_report import Pattern
from .base import Pass, PassContext
from .fxnodes import arg, identity_dropout, is_call, op_name, where
from .linear_act import LINEAR_ACT_KERNELS

aten = torch.ops.aten
F = torch.nn.functional
SDPA_FWD = aten._scaled_dot_product_fused_attention_overrideable.default
SDPA_BWD = aten._scaled_dot_product_fused_attention_overrideable_backward.default
SDPA_KERNELS = (
    "aten::_scaled_dot_product_fused_attention_overrideable",
    "aten::_scaled_dot_product_fused_attention_overrideable_backward",
)


# -- aten graphs: the fused pair, or the math composition when switched off -------------


def math_sdpa_forward(
    query,
    key,
    value,
    attn_bias=None,
    dropout_p=0.0,
    is_causal=False,
    return_debug_mask=False,
    *,
    scale=None,
    out_order=None,
):
    """The fused forward's results (same tuple) from matmul/softmax ops: what the graph runs with `attention` off
    (the dispatcher's own composition, its output laid out as the traced kernel's was)."""
    res = sdpa_forward(query, key, value, attn_bias, dropout_p, is_causal, return_debug_mask, scale=scale)
    return (_laid_out(res[0], out_order), *res[1:])


def math_sdpa_backward(
    grad_out,
    query,
    key,
    value,
    attn_bias,
    grad_input_mask,
    out,
    logsumexp,
    cum_seq_q,
    cum_seq_k,
    max_q,
    max_k,
    dropout_p,
    is_causal,
    philox_seed,
    philox_offset,
    *,
    scale=None,
    grad_orders=None,
):
    """The fused backward's gradients from matmul ops (the graph's route with `attention` off)."""
    *grads, grad_bias = sdpa_backward(
        grad_out,
        query,
        key,
        value,
        attn_bias,
        grad_input_mask,
        out,
        logsumexp,
        cum_seq_q,
        cum_seq_k,
        max_q,
        max_k,
        dropout_p,
        is_causal,
        philox_seed,
        philox_offset,
        scale=scale,
    )
    return (*(_laid_out(g, st) for g, st in zip(grads, grad_orders or (None,) * 3, strict=True)), grad_bias)


def _dim_order(strides) -> tuple[int, ...]:
    """Dimensions from outermost to innermost in memory (a stable sort of the strides)."""
    return tuple(sorted(range(len(strides)), key=lambda d: -strides[d]))


def _laid_out(t: torch.Tensor, order) -> torch.Tensor:
    """`t` laid out in the memory order the fused kernel's meta function gave at trace
    time (the graph's later views rely on it); a copy only where it differs. An order,
    not strides: with dynamic shapes the strides are symbols."""
    if order is None or _dim_order(t.stride()) == tuple(order):
        return t
    inverse = sorted(range(len(order)), key=lambda d: order[d])
    return t.permute(*order).contiguous().permute(*inverse)


def _trace_order(val) -> tuple[int, ...] | None:
    """The memory order of a traced (fake) tensor, read from its stride hints, so that
    reading it adds no guard (a guard on a symbolic stride would recompile per shape)."""
    if not isinstance(val, torch.Tensor):
        return None
    hints = [s.node.hint if isinstance(s, torch.SymInt) else int(s) for s in val.stride()]
    return None if any(h is None for h in hints) else _dim_order(hints)


def _softmaxes(ctx: PassContext) -> list[fx.Node]:
    return [
        n
        for n in ctx.gm.graph.nodes
        if n.op == "call_function" and n.target in (aten._softmax.default, aten.softmax.int, aten._safe_softmax.default)
    ]


def attention(ctx: PassContext) -> None:
    """The fused attention pair, forward and backward, where the table declares it."""
    has = ctx.has(*SDPA_KERNELS)
    for n in ctx.gm.graph.nodes:
        if n.op == "call_function" and n.target in (SDPA_FWD, SDPA_BWD):
            name = SDPA_KERNELS[0 if n.target is SDPA_FWD else 1]
            ctx.record(
                "scaled_dot_product_attention" + (" backward" if n.target is SDPA_BWD else ""),
                [n],
                f"{name} (fused kernel of '{ctx.backend}')",
                applied=has,
                note="" if has else f"'{ctx.backend}' does not declare {name}",
            )
    if not has:
        for sm in _softmaxes(ctx):
            ctx.record(
                "attention (math path)",
                [sm],
                "kept",
                applied=False,
                note=f"'{ctx.backend}' has no fused attention kernel ({SDPA_KERNELS[0]} and its backward)",
            )


def _attention_off(ctx: PassContext) -> None:
    """`attention` switched off: the fused pair becomes the math composition."""
    for n in ctx.gm.graph.nodes:
        if n.op != "call_function" or n.target not in (SDPA_FWD, SDPA_BWD):
            continue
        val = n.meta.get("val")
        orders = [_trace_order(v) for v in val] if val is not None else [None] * 4
        if n.target is SDPA_FWD:
            n.target, n.kwargs = math_sdpa_forward, {**n.kwargs, "out_order": orders[0]}
        else:
            n.target, n.kwargs = math_sdpa_backward, {**n.kwargs, "grad_orders": tuple(orders[:3])}


# -- Dynamo's graph: nn.MultiheadAttention, explicit attention ---------------------------


def packed_self_attention(
    query: torch.Tensor,
    num_heads: int,
    in_proj_weight: torch.Tensor,
    in_proj_bias: torch.Tensor | None,
    out_proj_weight: torch.Tensor,
    out_proj_bias: torch.Tensor | None,
    gemm_epilogue: bool = False,
) -> tuple[torch.Tensor, None]:
    """F.multi_head_attention_forward's self-attention without its copies: one QKV GEMM
    viewed as q, k, v (unbind: one stack in the backward, not three select_backward),
    the fused attention on those views, the output projection reading the result as a
    view where the kernel lays it out (B, L, H, E). query is (L, B, E), as there; the
    work is done batch-first, where a batch_first model's tensors are contiguous.
    gemm_epilogue: the QKV GEMM with its bias as fl::linear_act (one kernel each way)."""
    length, batch, embed = query.shape
    head = embed // num_heads
    x = query.transpose(0, 1)  # (B, L, E): nn.MultiheadAttention(batch_first=True) made query from it as a view
    if gemm_epilogue and x.is_contiguous():
        proj = torch.ops.fl.linear_act.default(x, in_proj_weight, in_proj_bias, 0, 0.0, 0, False)[0]
    else:
        proj = F.linear(x, in_proj_weight, in_proj_bias)
    q, k, v = proj.view(batch, length, 3, num_heads, head).permute(2, 0, 3, 1, 4).unbind(0)
    out = F.scaled_dot_product_attention(q, k, v)  # (B, H, L, E) laid out (B, L, H, E) by the fused kernel
    out = out.transpose(1, 2).reshape(batch, length, embed)
    return F.linear(out, out_proj_weight, out_proj_bias).transpose(0, 1), None


_MHA_ARGS = (
    "query",
    "key",
    "value",
    "embed_dim_to_check",
    "num_heads",
    "in_proj_weight",
    "in_proj_bias",
    "bias_k",
    "bias_v",
    "add_zero_attn",
    "dropout_p",
    "out_proj_weight",
    "out_proj_bias",
    "training",
    "key_padding_mask",
    "need_weights",
    "attn_mask",
    "use_separate_proj_weight",
    "q_proj_weight",
    "k_proj_weight",
    "v_proj_weight",
    "static_k",
    "static_v",
    "average_attn_weights",
    "is_causal",
)
_MHA_DEFAULTS = {
    "training": True,
    "key_padding_mask": None,
    "need_weights": True,
    "attn_mask": None,
    "use_separate_proj_weight": False,
    "q_proj_weight": None,
    "k_proj_weight": None,
    "v_proj_weight": None,
    "static_k": None,
    "static_v": None,
    "average_attn_weights": True,
    "is_causal": False,
}


def attention_captured(gm: fx.GraphModule, kernels: set, patterns: list[Pattern], passes: list[str]) -> None:
    """The attention pass's Dynamo-graph side: nn.MultiheadAttention, explicit attention."""
    mha_captured(gm, kernels, patterns, passes)
    explicit_attention_captured(gm, kernels, patterns, passes)


def mha_captured(gm: fx.GraphModule, kernels: set, patterns: list[Pattern], passes: list[str]) -> None:
    """nn.MultiheadAttention's self-attention (Dynamo keeps F.multi_head_attention_forward as
    one call) as packed_self_attention, where the table has the fused attention pair.
    Only the plain case: no masks, no bias_k/bias_v, no dropout, weights not returned."""
    if not all(k in kernels for k in SDPA_KERNELS):
        return
    mha_fn = F.multi_head_attention_forward
    for node in list(gm.graph.nodes):
        if not is_call(node, mha_fn):
            continue
        call = {**_MHA_DEFAULTS, **dict(zip(_MHA_ARGS, node.args, strict=False)), **node.kwargs}
        why = None
        if not (call["query"] is call["key"] is call["value"]):
            why = "not self-attention"
        elif call["need_weights"] or any(u.target is not operator.getitem or u.args[1] != 0 for u in node.users):
            why = "its attention weights are used"
        elif (
            any(call[k] is not None for k in ("bias_k", "bias_v", "key_padding_mask", "attn_mask"))
            or call["add_zero_attn"]
            or call["use_separate_proj_weight"]
            or call["is_causal"]
        ):
            why = "a mask, bias_k/bias_v, add_zero_attn or separate projections"
        elif call["dropout_p"] and call["training"]:
            why = "attention dropout in training"
        if why:
            patterns.append(
                Pattern(
                    "multi-head attention",
                    "captured",
                    where(node),
                    ["multi_head_attention_forward"],
                    "kept",
                    False,
                    why,
                )
            )
            continue
        with gm.graph.inserting_before(node):
            new = gm.graph.call_function(
                packed_self_attention,
                (
                    call["query"],
                    call["num_heads"],
                    call["in_proj_weight"],
                    call["in_proj_bias"],
                    call["out_proj_weight"],
                    call["out_proj_bias"],
                    "linear_act" in passes and all(k in kernels for k in LINEAR_ACT_KERNELS),
                ),
            )
        new.meta.update(node.meta)
        node.replace_all_uses_with(new)
        gm.graph.erase_node(node)
        gemm = "fl::linear_act (GEMM + bias)" if new.args[-1] else "one QKV GEMM"
        patterns.append(
            Pattern(
                "multi-head attention",
                "captured",
                where(new),
                ["multi_head_attention_forward"],
                f"{gemm} viewed as q, k, v + the fused attention pair on the views",
            )
        )


def _single(node) -> bool:
    return isinstance(node, fx.Node) and len(node.users) == 1


def _is_method(node, name: str) -> bool:
    return isinstance(node, fx.Node) and node.op == "call_method" and node.target == name


def explicit_attention_captured(gm: fx.GraphModule, kernels: set, patterns: list[Pattern], passes: list[str]) -> None:
    """matmul(q, k^T) -> (* or / a constant) -> (+ mask) -> softmax(-1) -> (identity dropout)
    -> matmul(., v) on 4-D tensors (an "eager" attention implementation, e.g. Hugging
    Face's) as F.scaled_dot_product_attention, which runs the fused pair, forward and
    backward, where the table has it. Elsewhere the pattern is left as written."""
    if not all(k in kernels for k in SDPA_KERNELS):
        return
    graph = gm.graph
    for sm in list(graph.nodes):
        if not (is_call(sm, F.softmax, torch.softmax) or _is_method(sm, "softmax")) or not _single(sm):
            continue
        if arg(sm, 1, "dim") not in (-1, 3) or arg(sm, 2, "dtype") is not None or len(sm.args) > 2:
            continue
        chain, x, mask, scale = [sm], sm.args[0], None, 1.0  # no scaling op: scale 1, not SDPA's default
        if is_call(x, operator.add) and _single(x) and len(x.args) == 2:
            chain.append(x)
            x, mask = x.args
        if is_call(x, operator.mul, operator.truediv) and _single(x) and isinstance(x.args[1], (int, float)):
            chain.append(x)
            scale = float(x.args[1]) if x.target is operator.mul else 1.0 / float(x.args[1])
            x = x.args[0]
        if not (is_call(x, torch.matmul) and _single(x)):
            continue
        qk = x
        q, kt = qk.args
        if not (_is_method(kt, "transpose") and _single(kt)) or sorted(d % 4 for d in kt.args[1:3]) != [2, 3]:
            continue
        probs, user = sm, next(iter(sm.users))
        if identity_dropout(user) and _single(user):
            probs, user = user, next(iter(user.users))
        if not (is_call(user, torch.matmul) and user.args[0] is probs):
            continue
        shapes = [n.meta.get("example_value") for n in (q, kt.args[0], user.args[1])]
        if any(v is None or v.dim() != 4 for v in shapes) or (mask is not None and not isinstance(mask, fx.Node)):
            continue
        with graph.inserting_before(user):
            new = graph.call_function(
                F.scaled_dot_product_attention, (q, kt.args[0], user.args[1]), {"attn_mask": mask, "scale": scale}
            )
        keep = ("example_value", "nn_module_stack", "stack_trace")
        new.meta.update({k: v for k, v in user.meta.items() if k in keep})
        user.replace_all_uses_with(new)
        nodes = [kt, qk] + chain[::-1] + ([probs] if probs is not sm else []) + [user]
        for n in reversed(nodes):
            graph.erase_node(n)
        patterns.append(
            Pattern(
                "matmul-softmax-matmul attention",
                "captured",
                where(new),
                [op_name(n) for n in nodes],
                "F.scaled_dot_product_attention (the fused pair)",
            )
        )


PASS = Pass("attention", captured=attention_captured, aten=attention, off=_attention_off)
