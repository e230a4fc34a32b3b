"""`torch.compile(model, backend="fl")`: the fusion passes on PyTorch's own graph capture.

Dynamo captures the model's Python (keyword arguments, graph breaks and
recompilations handled by PyTorch, not by torch_fl); AOTAutograd turns each
captured graph into aten graphs: a forward and a backward graph when a gradient
is needed, one inference graph otherwise. This backend rewrites those aten
graphs with the kernels the active fl backend's capability table declares,
then runs them on fl: every op of the rewritten graph goes through the usual
dispatch (native kernel, decomposition, JIT kernel, CPU fallback), so a graph
that no pass touched runs exactly the kernels eager PyTorch would.

Why aten graphs: the backward graph exists only there, so a pass can put the
backend's fused backward kernel where eager autograd would run a chain of ops;
and aten ops are what a plugin implements, so a match names the kernels it
replaces. Some passes rewrite Dynamo's graph instead, before AOTAutograd: their
replacement is an fl:: op with an autograd formula, so AOTAutograd's own trace
puts the fused forward kernel in the forward graph and its one-kernel backward
in the backward graph (matching the backward's mm/sum chains in the aten graph
is left out that way); the aten-graph side then records the kernels it finds.

Passes (same names as `fl.compile`; switch one off with
`torch.compile(m, backend="fl", options={"passes": {"attention": False}})`,
`backend(passes=...)` or FL_FUSION_DISABLE=attention,conv_bn):
  attention   aten graphs: the fused SDPA pair, forward and backward (switched
              off: the math composition); Dynamo's graph: nn.MultiheadAttention's
              self-attention as one QKV GEMM viewed as q, k, v + the fused pair,
              explicit matmul -> softmax -> matmul attention as SDPA
  conv_bn     aten inference graphs: conv -> bn -> relu as fl::conv_bn_relu,
              else the batch norm folded into the convolution (cached)
  linear_act  Dynamo's graph: linear -> ReLU/GELU as fl::linear_act; with a
              training dropout after it, fl::linear_act_dropout (the kernel's
              dropout epilogue, a fresh seed per call; aten_passes.py)
  add_norm    Dynamo's graph: (linear ->) (dropout ->) residual add -> LayerNorm
              as fl::linear_add_layer_norm / fl::add_layer_norm; a training
              dropout as their dropout epilogue with a fresh seed per call
              (fl::linear_add_layer_norm_dropout, fl::add_layer_norm_dropout: seeded.py)
  qkv         Dynamo's graph: linear projections of one input as one GEMM on
              the concatenated weights, split; inference graphs cache the
              concatenation (aten_passes.py)
  pointwise   aten graphs: chains of elementwise ops as one JIT kernel, where
              the backend can compile; first, copies eager does not make (the
              clone of a p=0 dropout, batch norm's statistics write-backs) go
              (aten_passes.py)
  layout      aten inference graphs: NHWC activations and cached channels-last
              weights for 2-D convolutions where the device prefers channels-last
              and its kernels write it; the traced layout comes back wherever an op
              could tell (layout.py)

`options={"replay": True}` records each aten graph whose ops are all plugin
kernel calls once as a kernel list and replays it without per-op Python
(compile/replay.py); the report's `replay:` line says whether, or why not.

`fusion_report(compiled)` returns what happened to a model compiled with
backend="fl": per Dynamo graph, its aten graphs (forward/backward/inference)
with the patterns fused (where, what, by what), graph breaks with Dynamo's
reasons, recompilations.

The backend reads the public API (`torch_fl.get_current_backend_name`,
`torch_fl.capabilities`), the `fl::` ops torch_fl registers with PyTorch, and
the dispatcher's exported SDPA compositions (the math route with `attention` off)."""

from __future__ import annotations

import operator
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx

from ..dispatch import sdpa_backward, sdpa_forward
from ..runtime import REGISTRY, Sources
from . import aten_passes, layout, seeded  # noqa: F401 - seeded defines the fl:: ops the passes call
from .fxnodes import activation, arg, is_call, only_user, op_name, where
from .inplace import restore_inplace_updates
from .replay import ReplayStatus, replayable
from .report import GRAPHS, AtenGraph, DynamoGraph, FusionReport, Pattern, forget, frame_modules

aten = torch.ops.aten

PASS_NAMES = ("conv_bn", "attention", "qkv", "add_norm", "linear_act", "pointwise", "layout")
SDPA_FWD = aten._scaled_dot_product_fused_attention_overrideable.default
SDPA_BWD = aten._scaled_dot_product_fused_attention_overrideable_backward.default
SDPA_KERNELS = ("aten::_scaled_dot_product_fused_attention_overrideable",
                "aten::_scaled_dot_product_fused_attention_overrideable_backward")
CONV_BN_RELU_KERNEL = "fl::conv_bn_relu"


# -- pass plumbing ---------------------------------------------------------------------


@dataclass
class _Ctx:
    gm: fx.GraphModule
    kind: str
    backend: str
    kernels: set
    patterns: list[Pattern]

    def has(self, *names: str) -> bool:
        return all(n in self.kernels for n in names)

    def record(self, pattern: str, nodes: list[fx.Node], replacement: str, applied: bool = True,
               note: str = "") -> None:
        self.patterns.append(Pattern(pattern, self.kind, where(nodes[0]), [op_name(n) for n in nodes],
                                     replacement, applied, note))








def enabled_passes(passes: Mapping[str, bool] | Iterable[str] | None) -> list[str]:
    """The passes to run: all by default; a {name: bool} dict or a list of names
    chooses; FL_FUSION_DISABLE=name,name switches passes off on top."""
    if passes is None:
        chosen = dict.fromkeys(PASS_NAMES, True)
    elif isinstance(passes, Mapping):
        chosen = {n: bool(passes.get(n, True)) for n in PASS_NAMES}
        wanted = list(passes)
    elif isinstance(passes, str):
        raise TypeError(f"passes={passes!r}: give a list of pass names or a dict {{name: bool}}")
    else:
        wanted = list(passes)
        chosen = {n: n in wanted for n in PASS_NAMES}
    if passes is not None:
        unknown = [p for p in wanted if p not in PASS_NAMES]
        if unknown:
            raise ValueError(f"unknown fusion pass(es) {unknown}; the passes are {list(PASS_NAMES)}")
    for name in filter(None, (s.strip() for s in os.environ.get("FL_FUSION_DISABLE", "").split(","))):
        if name not in PASS_NAMES:
            raise ValueError(f"FL_FUSION_DISABLE names an unknown pass {name!r}; the passes are {list(PASS_NAMES)}")
        chosen[name] = False
    return [n for n in PASS_NAMES if chosen[n]]


# -- attention -------------------------------------------------------------------------
#
# F.scaled_dot_product_attention on fl is routed by torch_fl's kernel for it
# (AutogradPrivateUse1): to the plugin's fused forward/backward pair when the
# backend declares both, else to PyTorch's math composition. AOTAutograd traces
# through that kernel, so on such a backend the forward graph holds the fused
# forward and the backward graph the fused backward. The pass checks the pair
# against the table and records it in both graphs; switched off, it rewrites
# both into the math composition (matmul, softmax, matmul and their backward
# formulas), so no fused attention kernel runs.


def math_sdpa_forward(query, key, value, attn_bias=None, dropout_p=0.0, is_causal=False, return_debug_mask=False,
                      *, scale=None, out_order=None):
    """The fused forward's results (same tuple) from matmul/softmax ops: what the graph runs with `attention` off
    (the dispatcher's own composition, its output laid out as the traced kernel's was)."""
    res = sdpa_forward(query, key, value, attn_bias, dropout_p, is_causal, return_debug_mask, scale=scale)
    return (_laid_out(res[0], out_order), *res[1:])


def math_sdpa_backward(grad_out, query, key, value, attn_bias, grad_input_mask, out, logsumexp, cum_seq_q, cum_seq_k,
                       max_q, max_k, dropout_p, is_causal, philox_seed, philox_offset, *, scale=None,
                       grad_orders=None):
    """The fused backward's gradients from matmul ops (the graph's route with `attention` off)."""
    *grads, grad_bias = sdpa_backward(grad_out, query, key, value, attn_bias, grad_input_mask, out, logsumexp,
                                      cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal, philox_seed,
                                      philox_offset, scale=scale)
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


def _softmaxes(ctx: _Ctx) -> list[fx.Node]:
    return [n for n in ctx.gm.graph.nodes if n.op == "call_function" and n.target in (
        aten._softmax.default, aten.softmax.int, aten._safe_softmax.default)]


def attention(ctx: _Ctx) -> None:
    """The fused attention pair, forward and backward, where the table declares it."""
    has = ctx.has(*SDPA_KERNELS)
    for n in ctx.gm.graph.nodes:
        if n.op == "call_function" and n.target in (SDPA_FWD, SDPA_BWD):
            name = SDPA_KERNELS[0 if n.target is SDPA_FWD else 1]
            ctx.record("scaled_dot_product_attention" + (" backward" if n.target is SDPA_BWD else ""), [n],
                       f"{name} (fused kernel of '{ctx.backend}')", applied=has,
                       note="" if has else f"'{ctx.backend}' does not declare {name}")
    if not has:
        for sm in _softmaxes(ctx):
            ctx.record("attention (math path)", [sm], "kept", applied=False,
                       note=f"'{ctx.backend}' has no fused attention kernel ({SDPA_KERNELS[0]} and its backward)")


def _attention_off(ctx: _Ctx) -> None:
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


# -- conv + batch norm (+ ReLU) --------------------------------------------------------


class FoldedConv(torch.nn.Module):
    """convolution -> inference batch norm as one convolution whose weights have the
    batch norm folded in. The fold is computed on the device once and cached; it is
    recomputed when any of the six tensors is another tensor or was written since,
    through any alias (runtime.Sources: an optimizer step, load_state_dict,
    p.data.mul_(), an EMA update, inference tensors too), so a model that keeps
    training between inference calls stays correct. The check is host-side: no kernel."""

    def __init__(self, eps: float, stride, padding, dilation, groups: int):
        super().__init__()
        self.eps, self.stride, self.padding, self.dilation, self.groups = eps, stride, padding, dilation, groups
        self.channels_last = False  # set by the layout pass: a channels-last weight and output
        self._sources = Sources()
        self._key: tuple | None = None
        self._folded: tuple | None = None

    def forward(self, x, weight, bias, bn_weight, bn_bias, mean, var):
        key = self._sources.key((weight, bias, bn_weight, bn_bias, mean, var))
        if key != self._key:
            scale = torch.rsqrt(var + self.eps)
            if bn_weight is not None:
                scale = scale * bn_weight
            shift = -mean * scale if bias is None else (bias - mean) * scale
            if bn_bias is not None:
                shift = shift + bn_bias
            w = weight * scale.reshape((-1,) + (1,) * (weight.dim() - 1))
            if self.channels_last:
                w = w.contiguous(memory_format=torch.channels_last)
            self._key, self._folded = key, (w, shift)
        w, b = self._folded
        args = (x, w, b, self.stride, self.padding, self.dilation, False, [0] * len(self.stride), self.groups)
        if self.channels_last:
            return layout.ChannelsLastConv.run(aten.convolution.out, args, 3)
        return aten.convolution.default(*args)


def conv_bn(ctx: _Ctx) -> None:
    """convolution -> inference batch norm (-> ReLU): the backend's fl::conv_bn_relu
    kernel when the table declares it and a ReLU follows, else the batch norm
    folded into the convolution's weights (FoldedConv). Only in inference graphs:
    the fused kernel has no backward and the fold is cached outside autograd, so a
    forward graph whose backward needs the gradients keeps the ops. Batch norm
    computing batch statistics (training) is a different aten op and never matches."""
    has = ctx.has(CONV_BN_RELU_KERNEL)
    graph = ctx.gm.graph
    for bn in list(graph.nodes):
        if bn.op != "call_function" or bn.target is not aten._native_batch_norm_legit_no_training.default:
            continue
        conv = bn.args[0]
        if not (isinstance(conv, fx.Node) and conv.target is aten.convolution.default):
            continue
        x, w, b, stride, padding, dilation, transposed, _, groups = conv.args
        _, bn_w, bn_b, mean, var, _, eps = bn.args
        out = next((u for u in bn.users if u.target is operator.getitem and u.args[1] == 0), None)
        relu = only_user(out) if out is not None else None
        relu = relu if relu is not None and relu.target in (aten.relu.default, aten.relu_.default) else None
        nodes = [conv, bn] + ([relu] if relu is not None else [])
        name = "conv+bn" + ("+relu" if relu is not None else "")
        if ctx.kind != "inference":
            ctx.record(name, nodes, "kept", applied=False, note=f"a gradient is needed ({ctx.kind} graph): "
                       f"{CONV_BN_RELU_KERNEL} has no backward and the fold is not differentiated")
            continue
        if out is None or len(conv.users) != 1 or len(bn.users) != 1:
            ctx.record(name, nodes, "kept", applied=False, note="an intermediate result is used elsewhere")
            continue
        val = x.meta.get("val")
        if transposed or val is None or val.dim() not in (3, 4):
            ctx.record(name, nodes, "kept", applied=False, note="transposed or not a 1-D/2-D convolution")
            continue
        if relu is not None and has:
            with graph.inserting_before(relu):
                new = graph.call_function(torch.ops.fl.conv_bn_relu.default,
                                          (x, w, b, bn_w, bn_b, mean, var, float(eps), list(stride), list(padding),
                                           list(dilation), groups))
            new.meta["val"] = relu.meta.get("val")  # the module path is the convolution's: what the kernel is
            new.meta.update({k: v for k, v in conv.meta.items() if k in ("nn_module_stack", "stack_trace")})
            relu.replace_all_uses_with(new)
            for n in (relu, out, bn, conv):
                graph.erase_node(n)
            ctx.record(name, nodes, f"{CONV_BN_RELU_KERNEL} (fused kernel of '{ctx.backend}')")
            continue
        target = f"fl_folded_conv_{sum(1 for _ in ctx.gm.named_children())}"
        ctx.gm.add_submodule(target, FoldedConv(float(eps), list(stride), list(padding), list(dilation), groups))
        with graph.inserting_before(out):
            new = graph.call_module(target, (x, w, b, bn_w, bn_b, mean, var))
        new.meta.update({k: v for k, v in out.meta.items() if k in ("val", "nn_module_stack", "stack_trace")})
        out.replace_all_uses_with(new)
        for n in (out, bn, conv):
            graph.erase_node(n)
        why = "" if relu is None else f"; '{ctx.backend}' has no {CONV_BN_RELU_KERNEL} kernel"
        ctx.record("conv+bn", nodes[:2], "convolution with the batch norm folded into its weights (cached)" + why)


# -- GEMM epilogues: linear + activation, (linear +) residual add + LayerNorm ---------
#
# These rewrite the captured (Dynamo) graph before AOTAutograd traces it: the
# replacement is an fl:: op with an autograd formula (torch_fl/fused.py), so
# AOTAutograd's trace puts the fused forward kernel in the forward graph and its
# one-kernel backward in the backward graph, where a rewrite of the aten graphs
# alone would have to match the backward's mm/sum/threshold_backward chains too.
# Dropout is matched only where it is an identity (p = 0, or not training): the
# kernels draw their mask from a seed, and a seed fixed in a graph would repeat
# the same mask every step.

LINEAR_ACT_KERNELS = ("fl::linear_act", "fl::linear_act_backward")
ADD_NORM_KERNELS = ("fl::add_layer_norm", "fl::add_layer_norm_backward")
LINEAR_ADD_NORM_KERNELS = ("fl::linear_add_layer_norm", "fl::linear_add_layer_norm_backward")
_F = torch.nn.functional






def _identity_dropout(node) -> bool:
    """F.dropout that changes nothing: p == 0 or training=False."""
    return is_call(node, _F.dropout) and (arg(node, 1, "p", 0.5) == 0.0 or arg(node, 2, "training", True) is False)




def _linear(node) -> bool:
    return is_call(node, _F.linear, torch._C._nn.linear) and len(node.args) in (2, 3) and not node.kwargs


def _replace_with(graph: fx.Graph, last: fx.Node, op, args: tuple, dead: list[fx.Node],
                  meta_from: fx.Node | None = None) -> None:
    with graph.inserting_before(last):
        call = graph.call_function(op, args)
        first = graph.call_function(operator.getitem, (call, 0))
    first.meta.update(last.meta)
    call.meta.update({k: v for k, v in (meta_from or last).meta.items() if k in ("nn_module_stack", "stack_trace")})
    last.replace_all_uses_with(first)
    for n in dead:
        if not n.users:
            graph.erase_node(n)


def linear_act_captured(gm: fx.GraphModule, kernels: set, patterns: list[Pattern], passes: list[str]) -> None:
    """F.linear -> ReLU / exact GELU (-> identity dropout) as fl::linear_act."""
    has = all(k in kernels for k in LINEAR_ACT_KERNELS)
    graph = gm.graph
    for lin in list(graph.nodes):
        if not _linear(lin) or len(lin.users) != 1:
            continue
        act_node = next(iter(lin.users))
        act = activation(act_node)
        if act is None:
            continue
        nodes, last = [lin, act_node], act_node
        if len(act_node.users) == 1 and _identity_dropout(next(iter(act_node.users))):
            last = next(iter(act_node.users))
            nodes.append(last)
        name = "linear+" + ("relu" if act == 1 else "gelu")
        if not has:
            patterns.append(Pattern(name, "captured", where(lin), [op_name(n) for n in nodes], "kept", False,
                                    f"no {LINEAR_ACT_KERNELS[0]} kernel"))
            continue
        x, w = lin.args[0], lin.args[1]
        b = lin.args[2] if len(lin.args) > 2 else None
        _replace_with(graph, last, torch.ops.fl.linear_act.default, (x, w, b, act, 0.0, 0, act == 2),
                      list(reversed(nodes)), meta_from=lin)
        patterns.append(Pattern(name, "captured", where(lin), [op_name(n) for n in nodes],
                                f"{LINEAR_ACT_KERNELS[0]} (bias + activation as the GEMM's epilogue; backward: "
                                f"{LINEAR_ACT_KERNELS[1]})"))


def _training_dropout(node) -> float | None:
    """p of an F.dropout the fused kernels' dropout epilogue can take: training, p a constant in (0, 1),
    not in place; else None."""
    if not is_call(node, _F.dropout) or arg(node, 3, "inplace", False):
        return None
    p, training = arg(node, 1, "p", 0.5), arg(node, 2, "training", True)
    return float(p) if training is True and isinstance(p, float) and 0.0 < p < 1.0 else None


def add_norm_captured(gm: fx.GraphModule, kernels: set, patterns: list[Pattern], passes: list[str]) -> None:
    """layer_norm(residual + dropout(linear(x))) as fl::linear_add_layer_norm,
    layer_norm(residual + dropout(x)) as fl::add_layer_norm. An identity dropout goes; a
    training dropout becomes the kernel's dropout epilogue with a fresh seed per call
    (fl::linear_add_layer_norm_dropout / fl::add_layer_norm_dropout, compile/seeded.py)."""
    has_linear = all(k in kernels for k in LINEAR_ADD_NORM_KERNELS)
    has_add = all(k in kernels for k in ADD_NORM_KERNELS)
    graph = gm.graph
    for norm in list(graph.nodes):
        if not is_call(norm, _F.layer_norm) or norm.kwargs or len(norm.args) != 5:
            continue
        add, shape, ln_w, ln_b, eps = norm.args
        if not (is_call(add, operator.add, torch.add) and len(add.args) == 2 and not add.kwargs
                and len(add.users) == 1 and len(shape) == 1 and all(isinstance(a, fx.Node) for a in add.args)):
            continue
        # the branch: the operand with a linear producer (through a dropout), else a dropout
        chosen = None
        for i in (1, 0):
            br, res = add.args[i], add.args[1 - i]
            p = _training_dropout(br) if len(br.users) == 1 else None
            drop = br if len(br.users) == 1 and (_identity_dropout(br) or p is not None) else None
            value = drop.args[0] if drop is not None else br
            lin = value if _linear(value) and len(value.users) == 1 and (drop is not None or value is br) else None
            if lin is not None or (chosen is None and drop is not None):
                chosen = (drop, value, lin, res, p or 0.0)
                if lin is not None:
                    break
        if chosen is None:
            chosen = (None, add.args[1], None, add.args[0], 0.0)
        drop, value, lin, res, p = chosen
        dropped = [drop] if drop is not None else []
        epilogue = " with its dropout epilogue, a fresh seed per call" if p else ""
        if lin is not None and has_linear:
            b = lin.args[2] if len(lin.args) > 2 else None
            nodes = [lin] + dropped + [add, norm]
            if p:
                op, args = torch.ops.fl.linear_add_layer_norm_dropout.default, (lin.args[0], lin.args[1], b, res, ln_w,
                                                                                 ln_b, float(eps), p)
            else:
                op, args = torch.ops.fl.linear_add_layer_norm.default, (lin.args[0], lin.args[1], b, res, ln_w, ln_b,
                                                                         float(eps), 0.0, 0, True)
            _replace_with(graph, norm, op, args, [norm, add] + dropped + [lin])
            patterns.append(Pattern("linear+" + ("dropout+" if p else "") + "add+layer_norm", "captured", where(norm),
                                    [op_name(n) for n in nodes],
                                    f"{LINEAR_ADD_NORM_KERNELS[0]}{epilogue} (GEMM; bias, residual add and LayerNorm "
                                    f"as its epilogue; backward: {LINEAR_ADD_NORM_KERNELS[1]})"))
        elif has_add:
            nodes = dropped + [add, norm]
            if p:
                op, args = torch.ops.fl.add_layer_norm_dropout.default, (value, res, ln_w, ln_b, float(eps), p)
            else:
                op, args = torch.ops.fl.add_layer_norm.default, (value, res, ln_w, ln_b, float(eps), 0.0, 0, True)
            _replace_with(graph, norm, op, args, [norm, add] + dropped)
            patterns.append(Pattern(("dropout+" if p else "") + "add+layer_norm", "captured", where(norm),
                                    [op_name(n) for n in nodes],
                                    f"{ADD_NORM_KERNELS[0]}{epilogue} (residual add and LayerNorm in one kernel; "
                                    f"backward: {ADD_NORM_KERNELS[1]})"))
        else:
            patterns.append(Pattern("add+layer_norm", "captured", where(norm), ["add", "layer_norm"], "kept", False,
                                    f"no {ADD_NORM_KERNELS[0]} kernel"))


def packed_self_attention(query: torch.Tensor, num_heads: int, in_proj_weight: torch.Tensor,
                          in_proj_bias: torch.Tensor | None, out_proj_weight: torch.Tensor,
                          out_proj_bias: torch.Tensor | None, gemm_epilogue: bool = False) -> tuple[torch.Tensor, None]:
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
        proj = _F.linear(x, in_proj_weight, in_proj_bias)
    q, k, v = proj.view(batch, length, 3, num_heads, head).permute(2, 0, 3, 1, 4).unbind(0)
    out = _F.scaled_dot_product_attention(q, k, v)  # (B, H, L, E) laid out (B, L, H, E) by the fused kernel
    out = out.transpose(1, 2).reshape(batch, length, embed)
    return _F.linear(out, out_proj_weight, out_proj_bias).transpose(0, 1), None


_MHA_ARGS = ("query", "key", "value", "embed_dim_to_check", "num_heads", "in_proj_weight", "in_proj_bias", "bias_k",
             "bias_v", "add_zero_attn", "dropout_p", "out_proj_weight", "out_proj_bias", "training",
             "key_padding_mask", "need_weights", "attn_mask", "use_separate_proj_weight", "q_proj_weight",
             "k_proj_weight", "v_proj_weight", "static_k", "static_v", "average_attn_weights", "is_causal")
_MHA_DEFAULTS = {"training": True, "key_padding_mask": None, "need_weights": True, "attn_mask": None,
                 "use_separate_proj_weight": False, "q_proj_weight": None, "k_proj_weight": None,
                 "v_proj_weight": None, "static_k": None, "static_v": None, "average_attn_weights": True,
                 "is_causal": False}


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
    mha_fn = _F.multi_head_attention_forward
    for node in list(gm.graph.nodes):
        if not is_call(node, mha_fn):
            continue
        call = {**_MHA_DEFAULTS, **dict(zip(_MHA_ARGS, node.args, strict=False)), **node.kwargs}
        why = None
        if not (call["query"] is call["key"] is call["value"]):
            why = "not self-attention"
        elif call["need_weights"] or any(u.target is not operator.getitem or u.args[1] != 0 for u in node.users):
            why = "its attention weights are used"
        elif any(call[k] is not None for k in ("bias_k", "bias_v", "key_padding_mask", "attn_mask")) or \
                call["add_zero_attn"] or call["use_separate_proj_weight"] or call["is_causal"]:
            why = "a mask, bias_k/bias_v, add_zero_attn or separate projections"
        elif call["dropout_p"] and call["training"]:
            why = "attention dropout in training"
        if why:
            patterns.append(Pattern("multi-head attention", "captured", where(node), ["multi_head_attention_forward"],
                                    "kept", False, why))
            continue
        with gm.graph.inserting_before(node):
            new = gm.graph.call_function(packed_self_attention, (
                call["query"], call["num_heads"], call["in_proj_weight"], call["in_proj_bias"],
                call["out_proj_weight"], call["out_proj_bias"],
                "linear_act" in passes and all(k in kernels for k in LINEAR_ACT_KERNELS)))
        new.meta.update(node.meta)
        node.replace_all_uses_with(new)
        gm.graph.erase_node(node)
        gemm = "fl::linear_act (GEMM + bias)" if new.args[-1] else "one QKV GEMM"
        patterns.append(Pattern("multi-head attention", "captured", where(new), ["multi_head_attention_forward"],
                                f"{gemm} viewed as q, k, v + the fused attention pair on the views"))


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
        if not (is_call(sm, _F.softmax, torch.softmax) or _is_method(sm, "softmax")) or not _single(sm):
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
        if _identity_dropout(user) and _single(user):
            probs, user = user, next(iter(user.users))
        if not (is_call(user, torch.matmul) and user.args[0] is probs):
            continue
        shapes = [n.meta.get("example_value") for n in (q, kt.args[0], user.args[1])]
        if any(v is None or v.dim() != 4 for v in shapes) or (mask is not None and not isinstance(mask, fx.Node)):
            continue
        with graph.inserting_before(user):
            new = graph.call_function(_F.scaled_dot_product_attention, (q, kt.args[0], user.args[1]),
                                      {"attn_mask": mask, "scale": scale})
        keep = ("example_value", "nn_module_stack", "stack_trace")
        new.meta.update({k: v for k, v in user.meta.items() if k in keep})
        user.replace_all_uses_with(new)
        nodes = [kt, qk] + chain[::-1] + ([probs] if probs is not sm else []) + [user]
        for n in reversed(nodes):
            graph.erase_node(n)
        patterns.append(Pattern("matmul-softmax-matmul attention", "captured", where(new),
                                [op_name(n) for n in nodes], "F.scaled_dot_product_attention (the fused pair)"))


def _expand_encoder_layer(graph: fx.Graph, node: fx.Node, embed: int) -> fx.Node:
    """The nodes of nn.TransformerEncoderLayer's formula (inference, no mask) for one
    aten::_transformer_encoder_layer_fwd call; returns the output node."""
    (src, _, heads, in_w, in_b, out_w, out_b, use_gelu, norm_first, eps, n1_w, n1_b, n2_w, n2_b, w1, b1, w2,
     b2) = node.args[:18]

    def call(fn, *args):
        n = graph.call_function(fn, args)
        n.meta.update({k: v for k, v in node.meta.items() if k in ("nn_module_stack", "stack_trace")})
        return n

    def attention(x):
        out = call(packed_self_attention, call(torch.transpose, x, 0, 1), heads, in_w, in_b, out_w, out_b)
        return call(torch.transpose, call(operator.getitem, out, 0), 0, 1)

    def feed_forward(x):
        return call(_F.linear, call(_F.gelu if use_gelu else _F.relu, call(_F.linear, x, w1, b1)), w2, b2)

    def norm(x, w, b):
        return call(_F.layer_norm, x, (embed,), w, b, eps)

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
            patterns.append(Pattern("encoder-layer fast path", "captured", where(node),
                                    ["_transformer_encoder_layer_fwd"], "kept", False,
                                    "a mask or an unknown shape: the fast path stays"))
            continue
        out = _expand_encoder_layer(gm.graph, node, int(val.shape[-1]))
        node.replace_all_uses_with(out)
        gm.graph.erase_node(node)
        patterns.append(Pattern("encoder-layer fast path", "captured", where(out), ["_transformer_encoder_layer_fwd"],
                                "the layer's formula on the device (was one CPU-fallback op)"))


_CAPTURED: dict[str, Callable[[fx.GraphModule, set, list[Pattern], list[str]], None]] = {
    "attention": attention_captured, "add_norm": add_norm_captured, **aten_passes.CAPTURED,
    "linear_act": lambda *a: (aten_passes.linear_act_dropout_captured(*a), linear_act_captured(*a))}
_FL_OPS = {"linear_act": "linear+act", "linear_act_backward": "linear+act backward",
           "linear_act_dropout": "linear+act+dropout", "linear_act_dropout_backward": "linear+act+dropout backward",
           "add_layer_norm": "add+layer_norm", "add_layer_norm_backward": "add+layer_norm backward",
           "linear_add_layer_norm": "linear+add+layer_norm",
           "linear_add_layer_norm_backward": "linear+add+layer_norm backward",
           "add_layer_norm_dropout": "dropout+add+layer_norm",
           "add_layer_norm_dropout_backward": "dropout+add+layer_norm backward",
           "linear_add_layer_norm_dropout": "linear+dropout+add+layer_norm",
           "linear_add_layer_norm_dropout_backward": "linear+dropout+add+layer_norm backward"}


def fused_ops(ctx: _Ctx) -> None:
    """Records the fl:: kernels the captured-graph rewrites put in this aten graph."""
    for n in ctx.gm.graph.nodes:
        if n.op == "call_function" and getattr(n.target, "namespace", None) == "fl":
            op = n.target.__name__.split(".")[0]
            if op in _FL_OPS:
                ctx.record(_FL_OPS[op], [n], f"fl::{op} (fused kernel of '{ctx.backend}')")


_PASSES: dict[str, Callable[[_Ctx], None]] = {"attention": attention, "conv_bn": conv_bn, **aten_passes.ATEN}
_OFF: dict[str, Callable[[_Ctx], None]] = {"attention": _attention_off}
NOT_IMPLEMENTED = tuple(n for n in PASS_NAMES if n not in _PASSES and n not in _CAPTURED)


# -- the backend -----------------------------------------------------------------------


def _count_ops(gm: fx.GraphModule) -> int:
    return sum(n.op in ("call_function", "call_module") for n in gm.graph.nodes)


def _buffer_updates(ctx: _Ctx) -> None:
    """Not a pass that can be switched off: it undoes what functionalization added (inplace.py)."""
    if ctx.kind == "backward":
        return
    counters, norms, kept = restore_inplace_updates(ctx.gm, ctx.kind)
    if norms:
        ctx.patterns.append(Pattern("batch norm running stats in place", ctx.kind, f"{norms} batch norm(s)",
                                    ["_native_batch_norm_legit_functional", "copy_", "copy_"],
                                    "aten::_native_batch_norm_legit (updates the buffers itself)"))
    if counters:
        ctx.patterns.append(Pattern("buffer counter in place", ctx.kind, f"{counters} buffer(s)", ["add", "copy_"],
                                    "aten::add_"))
    for name in kept:
        ctx.patterns.append(Pattern("batch norm running stats in place", ctx.kind, name,
                                    ["_native_batch_norm_legit_functional"], "kept", False,
                                    "the updated statistics are an output of an inference graph"))


def _aten_compiler(kind: str, record: DynamoGraph, kernels: set, passes: list[str], replay: bool = False) -> Callable:
    def compile_aten(gm: fx.GraphModule, example_inputs: list) -> Callable:
        from functorch.compile import make_boxed_func

        before = _count_ops(gm)
        ctx = _Ctx(gm, kind, record.backend, kernels, [])
        _buffer_updates(ctx)
        for name in PASS_NAMES:
            if name in passes and name in _PASSES:
                _PASSES[name](ctx)
            elif name not in passes and name in _OFF:
                _OFF[name](ctx)
        fused_ops(ctx)
        gm.graph.lint()
        gm.recompile()
        record.aten_graphs.append(AtenGraph(kind, before, _count_ops(gm), ctx.patterns))
        if replay:
            return replayable(make_boxed_func(gm.forward), record.replay, kind)
        return make_boxed_func(gm.forward)

    return compile_aten


def _symbolic(v) -> bool:
    return isinstance(v, torch.SymInt) or (isinstance(v, torch.Tensor) and any(
        isinstance(d, torch.SymInt) for d in v.shape))


def reset() -> None:
    """Forget the recorded graphs and measurements, and Dynamo's compiled code (torch._dynamo.reset())."""
    forget()
    torch._dynamo.reset()


def fusion_report(compiled: Any) -> FusionReport:
    """The report for a model compiled with backend="fl" (see FusionReport.of)."""
    return FusionReport.of(compiled)


def compile_graph(gm: fx.GraphModule, example_inputs: list, passes: list[str], replay: bool = False) -> Callable:
    """One Dynamo graph through AOTAutograd, its aten graphs through the passes (replay: each aten graph
    recorded and replayed as a kernel list where it can be, compile.replay)."""
    from functorch.compile import min_cut_rematerialization_partition
    from torch._dynamo.backends.common import aot_autograd

    backend = REGISTRY.ensure().name
    kernels = set(REGISTRY.get(backend).capabilities.kernels)
    reason = getattr(gm, "compile_subgraph_reason", None)
    frame = reason.user_stack[-1] if reason is not None and reason.user_stack else None
    record = DynamoGraph(str(gm.meta.get("dynamo_compile_id", "?")), frame.name if frame else "?",
                         frame.filename if frame else "", backend, list(passes),
                         reason.reason if reason is not None and reason.graph_break else None,
                         dynamic=any(_symbolic(n.meta.get("example_value")) for n in gm.graph.nodes
                                             if n.op == "placeholder"), modules=frame_modules(),
                         replay=ReplayStatus() if replay else None)
    wrapper = record.filename.replace(os.sep, "/").endswith("_dynamo/external_utils.py")
    if (wrapper or record.frame in ("forward", "_call_impl")) and record.modules:
        module = record.modules[0]()  # torch.compile(module)'s wrapper frame or a bare forward: name the model
        record.frame = f"{type(module).__name__}.forward" if module is not None else record.frame
    GRAPHS.append(record)
    captured: list[Pattern] = []
    before = _count_ops(gm)
    encoder_fast_path(gm, captured)
    for name in PASS_NAMES:
        if name in passes and name in _CAPTURED:
            _CAPTURED[name](gm, kernels, captured, passes)
    if captured:
        gm.graph.lint()
        gm.recompile()
        record.aten_graphs.append(AtenGraph("captured", before, _count_ops(gm), captured))
    return aot_autograd(
        fw_compiler=_aten_compiler("forward", record, kernels, passes, replay),
        bw_compiler=_aten_compiler("backward", record, kernels, passes, replay),
        inference_compiler=_aten_compiler("inference", record, kernels, passes, replay),
        partition_fn=min_cut_rematerialization_partition,
        keep_inference_input_mutations=True,
    )(gm, example_inputs)


def fl_backend(gm: fx.GraphModule, example_inputs: list, **kwargs: Any) -> Callable:
    """The Dynamo backend named "fl" (entry point group `torch_dynamo_backends`):
    `torch.compile(model, backend="fl", options={"passes": {...}, "replay": True})`."""
    options = dict(kwargs.pop("options", None) or {})
    passes = enabled_passes(options.pop("passes", None))
    replay = bool(options.pop("replay", False))
    if options or kwargs:
        raise TypeError(f"backend='fl' takes options={{'passes': ..., 'replay': ...}} only, not "
                        f"{sorted({**options, **kwargs})}")
    return compile_graph(gm, example_inputs, passes, replay)


def backend(passes: Mapping[str, bool] | Iterable[str] | None = None, replay: bool = False) -> Callable:
    """A backend callable with a fixed pass selection: torch.compile(m, backend=backend({"conv_bn": False}));
    replay=True records and replays the aten graphs where it can (compile.replay)."""
    chosen = enabled_passes(passes)

    def fl_with_passes(gm: fx.GraphModule, example_inputs: list, **kwargs: Any) -> Callable:
        return compile_graph(gm, example_inputs, chosen, replay)

    return fl_with_passes
