"""The fusion passes: each finds one family of patterns in a captured graph
and rewrites it, as the active backend's capability table allows.

A pass reads the graph (module calls, function calls, method calls), checks
that a match is safe to rewrite (intermediate results used nowhere else,
batch norm in inference mode, ...), and replaces the matched nodes with one
call of a replacement from `modules`. Every match, rewritten or not, is
recorded with its module path, so the report can show where fusion happened
and where a backend's missing kernel kept the unfused path."""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn

from .. import fused as _fused
from . import modules
from .capture import module_path
from .pointwise import PointwiseChain

# plugins_cffi/include/fl_plugin.h: FL_FEATURE_CHANNELS_LAST
FEATURE_CHANNELS_LAST = 16
SDPA_KERNELS = ("aten::_scaled_dot_product_fused_attention_overrideable",
                "aten::_scaled_dot_product_fused_attention_overrideable_backward")
CONV_BN_RELU_KERNEL = "fl::conv_bn_relu"
LINEAR_ACT_KERNELS = _fused.LINEAR_ACT_KERNELS
ADD_NORM_KERNELS = _fused.ADD_NORM_KERNELS
LINEAR_ADD_NORM_KERNELS = _fused.LINEAR_ADD_NORM_KERNELS
ATTENTION_DROPOUT_KERNELS = _fused.ATTENTION_DROPOUT_KERNELS


@dataclass
class Record:
    """One pattern found in the graph: what, where, what it became."""

    pattern: str
    path: str
    replaced: list[str]
    replacement: str
    applied: bool = True
    note: str = ""
    nodes: set = field(default_factory=set)  # names of the unfused graph's nodes it covers


@dataclass
class Context:
    """What a pass may read (the backend's capabilities) and write (records, hints)."""

    gm: fx.GraphModule
    backend: str
    kernels: dict
    features: int
    records: list[Record] = field(default_factory=list)
    hints: list[str] = field(default_factory=list)
    origin: dict = field(default_factory=dict)  # node name -> names of unfused nodes it stands for
    counter: int = 0

    def has_kernels(self, *names: str) -> bool:
        return all(n in self.kernels for n in names)

    def module(self, node: fx.Node) -> nn.Module | None:
        return self.gm.get_submodule(str(node.target)) if node.op == "call_module" else None

    def add_module(self, prefix: str, module: nn.Module) -> str:
        name = f"fused_{prefix}_{self.counter}"
        self.counter += 1
        self.gm.add_submodule(name, module)
        return name

    def record(self, pattern: str, nodes: list[fx.Node], replacement: str, new: fx.Node | None = None,
               applied: bool = True, note: str = "") -> Record:
        covered: set = set()
        for n in nodes:
            covered |= self.origin.get(n.name, {n.name})
        rec = Record(pattern, module_path(nodes[0]), [_describe(n, self) for n in nodes], replacement, applied,
                     note, covered)
        self.records.append(rec)
        if new is not None:
            self.origin[new.name] = covered
            new.meta["fusion_record"] = len(self.records) - 1
        return rec

    def hint(self, text: str) -> None:
        if text not in self.hints:
            self.hints.append(text)


def _describe(node: fx.Node, ctx: Context) -> str:
    if node.op == "call_module":
        return type(ctx.module(node)).__name__
    if node.op == "call_method":
        return f".{node.target}()"
    return getattr(node.target, "__name__", str(node.target))


def _replace(ctx: Context, nodes: list[fx.Node], output: fx.Node, target: str, args: tuple,
             kwargs: dict | None = None, at: fx.Node | None = None) -> fx.Node:
    """Puts a call of module `target` before `at` (default: the first of `nodes`), in place of `output`,
    then drops `nodes`."""
    graph = ctx.gm.graph
    with graph.inserting_before(at if at is not None else nodes[0]):
        new = graph.call_module(target, args, kwargs or {})
    new.meta.update({k: v for k, v in output.meta.items() if k == "nn_module_stack"})
    output.replace_all_uses_with(new)
    for n in reversed(nodes):
        if not n.users:
            graph.erase_node(n)
    return new


def _only_user(node: fx.Node) -> fx.Node | None:
    return next(iter(node.users)) if len(node.users) == 1 else None


def _is_relu(node: fx.Node, ctx: Context) -> bool:
    if node.op == "call_module":
        return isinstance(ctx.module(node), nn.ReLU)
    if node.op == "call_function":
        return node.target in (F.relu, torch.relu)
    return node.op == "call_method" and node.target == "relu"


# -- Conv + BN (+ ReLU) --------------------------------------------------------------


def conv_bn(ctx: Context) -> None:
    """conv -> inference batch norm (-> ReLU): the backend's fused kernel when it
    declares one, else the batch norm folded into the convolution's weights.
    Batch norm that computes batch statistics (training) is not touched."""
    fused = ctx.has_kernels(CONV_BN_RELU_KERNEL)
    for node in list(ctx.gm.graph.nodes):
        conv = ctx.module(node)
        if not isinstance(conv, (nn.Conv1d, nn.Conv2d)) or node.kwargs:
            continue
        bn_node = _only_user(node)
        bn = ctx.module(bn_node) if bn_node is not None else None
        if not isinstance(bn, (nn.BatchNorm1d, nn.BatchNorm2d)) or bn_node.args != (node,):
            continue
        if bn.training or bn.running_mean is None:
            ctx.record("conv+bn", [node, bn_node], "kept", applied=False,
                       note="batch norm computes batch statistics (training mode): nothing to fold")
            continue
        relu_node = _only_user(bn_node)
        relu = relu_node if relu_node is not None and _is_relu(relu_node, ctx) else None
        numeric = not isinstance(conv.padding, str) and conv.padding_mode == "zeros"
        if relu is not None and fused and numeric:
            name = ctx.add_module("conv_bn_relu", modules.ConvBnRelu(conv, bn))
            nodes = [node, bn_node, relu]
            new = _replace(ctx, nodes, relu, name, (node.args[0],))
            ctx.record("conv+bn+relu", nodes, f"{CONV_BN_RELU_KERNEL} (fused kernel of '{ctx.backend}')", new)
            continue
        name = ctx.add_module("conv_bn", modules.FoldedConvBN(conv, bn))
        nodes = [node, bn_node]
        new = _replace(ctx, nodes, bn_node, name, (node.args[0],))
        why = "" if fused or relu is None else f"; '{ctx.backend}' has no {CONV_BN_RELU_KERNEL} kernel"
        ctx.record("conv+bn", nodes, "convolution with the batch norm folded into its weights" + why, new)


# -- attention -------------------------------------------------------------------------


def _missing_attention_hint(ctx: Context, where: str) -> str:
    return (f"performance hint: backend '{ctx.backend}' has no fused attention kernel ({SDPA_KERNELS[0]} and "
            f"{SDPA_KERNELS[1].split('::')[1]}); attention at {where} runs the math path (matmul, softmax, "
            f"matmul: one kernel each, the score matrix written to memory). A plugin that registers these two "
            f"kernels gets them used with no model change.")


def attention(ctx: Context) -> None:
    """nn.MultiheadAttention used as self-attention, F.scaled_dot_product_attention
    and the explicit matmul -> (scale) -> (mask) -> softmax -> (dropout) ->
    matmul pattern, onto the backend's fused attention kernel."""
    has = ctx.has_kernels(*SDPA_KERNELS)
    for node in list(ctx.gm.graph.nodes):
        mha = ctx.module(node)
        if isinstance(mha, nn.MultiheadAttention):
            _mha(ctx, node, mha, has)
        elif node.op == "call_function" and node.target is F.scaled_dot_product_attention:
            if has:
                ctx.record("scaled_dot_product_attention", [node], f"{SDPA_KERNELS[0]} (already routed at run time)")
            else:
                ctx.record("scaled_dot_product_attention", [node], "math path", applied=False)
                ctx.hint(_missing_attention_hint(ctx, module_path(node)))
        elif _is_softmax(node):
            _explicit(ctx, node, has)


def _mha(ctx: Context, node: fx.Node, mha: nn.MultiheadAttention, has: bool) -> None:
    names = ["query", "key", "value", "key_padding_mask", "need_weights", "attn_mask", "average_attn_weights",
             "is_causal"]
    call = dict(zip(names, node.args, strict=False))
    call.update(node.kwargs)
    q = call.get("query")
    weights_used = any(not (u.op == "call_function" and u.target is operator.getitem and u.args[1] == 0)
                       for u in node.users)
    why = None
    if not (q is call.get("key") is call.get("value")):
        why = "not self-attention (query, key and value differ)"
    elif call.get("need_weights", True) and weights_used:
        why = "its attention weights are used (need_weights)"
    elif not mha._qkv_same_embed_dim or mha.bias_k is not None or mha.add_zero_attn:
        why = "separate q/k/v projections, bias_k/bias_v or add_zero_attn"
    if why:
        ctx.record("multi-head attention", [node], "kept", applied=False, note=why)
        return
    if not has and not mha.training:  # inference without the kernel: the rewrite would only move copies around
        ctx.record("multi-head attention", [node], "math path", applied=False, note="no fused attention kernel")
        ctx.hint(_missing_attention_hint(ctx, module_path(node)))
        return
    dropout = mha.training and mha.dropout > 0
    dropout_kernel = dropout and ctx.has_kernels(*ATTENTION_DROPOUT_KERNELS)
    if dropout and not dropout_kernel:
        ctx.hint(_missing_kernel_hint(ctx, ATTENTION_DROPOUT_KERNELS, module_path(node),
                                      "attention with dropout runs the math path (matmul, softmax, dropout, matmul "
                                      "and their backward)"))
    module = modules.FusedSelfAttention(mha, linear_kernel=ctx.has_kernels(*LINEAR_ACT_KERNELS),
                                         dropout_kernel=dropout_kernel)
    name = ctx.add_module("attention", module)
    args = (q, call.get("attn_mask"), call.get("key_padding_mask"), call.get("is_causal", False))
    new = _replace(ctx, [node], node, name, args)
    if dropout_kernel:
        ctx.record("multi-head attention", [node], f"one QKV GEMM + {ATTENTION_DROPOUT_KERNELS[0]} on strided views",
                   new)
    elif has:
        ctx.record("multi-head attention", [node], f"one QKV GEMM + {SDPA_KERNELS[0]} on strided views", new)
    else:
        ctx.record("multi-head attention", [node], "one QKV GEMM + math attention on strided views", new,
                   note="no fused attention kernel")
        ctx.hint(_missing_attention_hint(ctx, module_path(new)))


def _is_softmax(node: fx.Node) -> bool:
    return ((node.op == "call_function" and node.target in (F.softmax, torch.softmax))
            or (node.op == "call_method" and node.target == "softmax"))


def _is_matmul(node) -> bool:
    return isinstance(node, fx.Node) and (
        (node.op == "call_function" and node.target in (torch.matmul, operator.matmul, torch.bmm))
        or (node.op == "call_method" and node.target in ("matmul", "bmm")))


def _arg(node: fx.Node, i: int, name: str, default=None):
    return node.args[i] if len(node.args) > i else node.kwargs.get(name, default)


def _explicit(ctx: Context, sm: fx.Node, has: bool) -> None:
    dim = _arg(sm, 1, "dim")
    if not isinstance(dim, int) or _arg(sm, 2, "dtype") is not None or _arg(sm, 2, "_stacklevel") not in (None, 3):
        return
    chain = [sm]
    x = sm.args[0]
    mask = mask_kind = None
    if isinstance(x, fx.Node) and len(x.users) == 1 and x.op in ("call_function", "call_method"):
        if x.target in (operator.add, torch.add, "add") and len(x.args) == 2 and not x.kwargs:
            chain.append(x)
            x, mask, mask_kind = x.args[0], x.args[1], "add"
        elif x.target in ("masked_fill", torch.masked_fill) and len(x.args) == 3 and x.args[2] in (
                float("-inf"), -1e9, -1e4, torch.finfo(torch.float32).min):
            chain.append(x)
            x, mask, mask_kind = x.args[0], x.args[1], "fill"
    scale, scale_op = None, "mul"
    if isinstance(x, fx.Node) and len(x.users) == 1 and x.op in ("call_function", "call_method") and \
            x.target in (operator.truediv, operator.mul, torch.div, torch.mul, "div", "mul") and len(x.args) == 2:
        chain.append(x)
        scale_op = "mul" if x.target in (operator.mul, torch.mul, "mul") else "div"
        x, scale = x.args[0], x.args[1]
    if not _is_matmul(x) or len(x.users) != 1:
        return
    qk = x
    chain.append(qk)
    q, kt = qk.args[0], qk.args[1]
    if not (isinstance(kt, fx.Node) and kt.target in ("transpose", torch.transpose) and len(kt.users) == 1):
        return
    k, k_dims = kt.args[0], tuple(kt.args[1:3])
    chain.append(kt)
    probs = sm
    dropout_p = 0.0
    user = _only_user(sm)
    if user is not None:
        mod = ctx.module(user)
        if isinstance(mod, nn.Dropout):
            dropout_p = mod.p if mod.training else 0.0
            probs, user = user, _only_user(user)
            chain.insert(0, probs)
    if user is None or not _is_matmul(user) or user.args[0] is not probs:
        return
    out, v = user, user.args[1]
    nodes = [kt, qk] + [n for n in reversed(chain) if n not in (kt, qk)] + [out]
    if not has:
        ctx.record("matmul-softmax-matmul attention", nodes, "math path", applied=False)
        ctx.hint(_missing_attention_hint(ctx, module_path(sm)))
        return
    graph = ctx.gm.graph
    with graph.inserting_before(out):
        new = graph.call_function(modules.explicit_attention,
                                  (q, k, v, k_dims, scale, scale_op, mask, mask_kind or "", dropout_p, dim))
    new.meta.update({k_: v_ for k_, v_ in sm.meta.items() if k_ == "nn_module_stack"})
    out.replace_all_uses_with(new)
    order = {n: i for i, n in enumerate(graph.nodes)}
    for n in sorted(nodes, key=lambda n: -order[n]):
        if not n.users:
            graph.erase_node(n)
    ctx.record("matmul-softmax-matmul attention", nodes, f"{SDPA_KERNELS[0]}", new)


def _missing_kernel_hint(ctx: Context, kernels: tuple, where: str, what: str) -> str:
    return (f"performance hint: backend '{ctx.backend}' has no {kernels[0]} kernel (and {kernels[1]}); at {where} "
            f"{what}. A plugin that registers these two kernels gets them used with no model change.")


# -- residual add + LayerNorm (after a GEMM) ------------------------------------------


def _is_add(node) -> bool:
    return (isinstance(node, fx.Node) and node.op in ("call_function", "call_method") and not node.kwargs
            and node.target in (operator.add, torch.add, "add") and len(node.args) == 2
            and all(isinstance(a, fx.Node) for a in node.args))


@dataclass
class _Branch:
    """One operand of a residual add: [Dropout](producer) where each result is used only there."""

    dropout_node: fx.Node | None
    dropout: nn.Module | None
    value: fx.Node  # the dropout's input (the operand itself without a dropout)
    linear: nn.Linear | None = None  # the GEMM producing `value`, when there is one
    linear_node: fx.Node | None = None  # its call (removed when fused); None for attention's projection
    linear_input: fx.Node | None = None
    attention: modules.FusedSelfAttention | None = None  # `value` is its projected output


def _branch(ctx: Context, node: fx.Node) -> _Branch:
    br = _Branch(None, None, node)
    mod = ctx.module(node)
    if isinstance(mod, nn.Dropout) and len(node.users) == 1 and isinstance(node.args[0], fx.Node):
        br = _Branch(node, mod, node.args[0])
    v = br.value
    if len(v.users) != 1:
        return br
    lin = ctx.module(v)
    if type(lin) is nn.Linear and len(v.args) == 1 and not v.kwargs:
        br.linear, br.linear_node, br.linear_input = lin, v, v.args[0]
    elif v.op == "call_function" and v.target is operator.getitem and v.args[1] == 0 and \
            isinstance(v.args[0], fx.Node) and len(v.args[0].users) == 1:
        attn = ctx.module(v.args[0])
        if isinstance(attn, modules.FusedSelfAttention) and attn.project:
            br.linear, br.linear_input, br.attention = attn.mha.out_proj, v, attn
    return br


def add_norm(ctx: Context) -> None:
    """residual + [Dropout](Linear(x)) -> LayerNorm (a post-norm Transformer
    block's two residual joins) as `fl::linear_add_layer_norm`: the GEMM's
    epilogue adds the bias, applies dropout, adds the residual and normalises;
    without a linear producer (or its kernel), residual + [Dropout](x) ->
    LayerNorm as `fl::add_layer_norm`. nn.MultiheadAttention's output
    projection (once the attention pass has rewritten the module) counts as
    the linear layer."""
    fused_linear = ctx.has_kernels(*LINEAR_ADD_NORM_KERNELS)
    fused_add = ctx.has_kernels(*ADD_NORM_KERNELS)
    graph = ctx.gm.graph
    for node in list(graph.nodes):
        norm = ctx.module(node)
        if not isinstance(norm, nn.LayerNorm) or len(norm.normalized_shape) != 1 or len(node.args) != 1 or node.kwargs:
            continue
        add = node.args[0]
        if not _is_add(add) or len(add.users) != 1 or add.args[0] is add.args[1]:
            continue
        # x + f(x): the branch is the operand with a linear producer, else the one with a dropout, else the second
        branches = [(_branch(ctx, add.args[i]), add.args[1 - i]) for i in (1, 0)]
        br, residual = next((b for b in branches if b[0].linear is not None),
                            next((b for b in branches if b[0].dropout is not None), branches[0]))
        drop = [br.dropout_node] if br.dropout_node is not None else []
        where = module_path(node)
        if br.linear is not None and fused_linear:
            if br.attention is not None:
                br.attention.project = False  # the projection becomes this kernel's GEMM
            removed = drop + ([br.linear_node] if br.linear_node is not None else [])
            inputs, module = (br.linear_input, residual), modules.LinearAddNorm(br.linear, norm, br.dropout)
            what = "MultiheadAttention.out_proj" if br.attention is not None else "Linear"
            pattern, by = "linear+add+layer_norm", (f"{LINEAR_ADD_NORM_KERNELS[0]} ({what} GEMM; bias"
                                                    f"{', dropout' if drop else ''}, residual add and LayerNorm as "
                                                    f"its epilogue)")
        elif fused_add:
            if br.linear is not None:
                ctx.hint(_missing_kernel_hint(ctx, LINEAR_ADD_NORM_KERNELS, where,
                                              "the linear layer is one more kernel before the add + LayerNorm"))
            removed, inputs = drop, (br.value, residual)
            module = modules.LinearAddNorm(None, norm, br.dropout)
            pattern, by = "add+layer_norm", (f"{ADD_NORM_KERNELS[0]} (residual add"
                                             f"{', dropout' if drop else ''} and LayerNorm in one kernel)")
        else:
            kernels = LINEAR_ADD_NORM_KERNELS if br.linear is not None else ADD_NORM_KERNELS
            nodes = drop + [add, node]
            ctx.record("add+layer_norm", nodes, "kept", applied=False, note=f"no {kernels[0]} kernel")
            ctx.hint(_missing_kernel_hint(ctx, kernels, where, "the residual add and LayerNorm (and the GEMM "
                                          "before them) run as separate kernels"))
            continue
        name = ctx.add_module("add_norm", module)
        with graph.inserting_before(add):  # every input is defined before the add
            new = graph.call_module(name, inputs)
        new.meta.update({k: v for k, v in node.meta.items() if k == "nn_module_stack"})
        node.replace_all_uses_with(new)
        nodes = removed[::-1] + [add, node]
        ctx.record(pattern, nodes, by, new)
        for n in [node, add] + removed:
            graph.erase_node(n)


# -- GEMM + bias + activation ------------------------------------------------------------

_ACTIVATIONS = {nn.ReLU: "relu", F.relu: "relu", torch.relu: "relu", "relu": "relu"}


def _activation(ctx: Context, node: fx.Node) -> str | None:
    m = ctx.module(node)
    if m is not None:
        if isinstance(m, nn.ReLU):
            return "relu"
        if isinstance(m, nn.GELU) and m.approximate == "none":
            return "gelu"
        return None
    if node.op == "call_function" and node.target in (F.relu, torch.relu) and len(node.args) == 1:
        return "relu"
    if node.op == "call_function" and node.target is F.gelu and len(node.args) == 1 and \
            node.kwargs.get("approximate", "none") == "none":
        return "gelu"
    if node.op == "call_method" and node.target == "relu" and len(node.args) == 1:
        return "relu"
    return None


def linear_act(ctx: Context) -> None:
    """nn.Linear -> ReLU/GELU (-> Dropout) as `fl::linear_act` (bias,
    activation and dropout as the GEMM's epilogue, one backward kernel for all
    three gradients)."""
    has = ctx.has_kernels(*LINEAR_ACT_KERNELS)
    for node in list(ctx.gm.graph.nodes):
        lin = ctx.module(node)
        if type(lin) is not nn.Linear or len(node.args) != 1 or node.kwargs:
            continue
        user = _only_user(node)
        act = _activation(ctx, user) if user is not None else None
        if act is None:
            continue
        nodes = [node, user]
        dropout = None
        nxt = _only_user(user)
        if nxt is not None and isinstance(ctx.module(nxt), nn.Dropout) and nxt.args[0] is user:
            dropout = ctx.module(nxt)
            nodes.append(nxt)
        if not has:
            ctx.record(f"linear+{act}", nodes, "kept", applied=False, note=f"no {LINEAR_ACT_KERNELS[0]} kernel")
            ctx.hint(_missing_kernel_hint(ctx, LINEAR_ACT_KERNELS, module_path(node),
                                          f"the GEMM, bias and {act} run as separate kernels"))
            continue
        name = ctx.add_module("linear_act", modules.LinearAct(lin, act, dropout))
        new = _replace(ctx, nodes, nodes[-1], name, (node.args[0],))
        ctx.record(f"linear+{act}", nodes, f"{LINEAR_ACT_KERNELS[0]} (bias + {act}"
                   f"{' + dropout' if dropout is not None else ''} as the GEMM's epilogue)", new)


# -- QKV -----------------------------------------------------------------------------


def qkv(ctx: Context) -> None:
    """Several nn.Linear reading the same input (q, k and v projections) as one GEMM."""
    groups: dict = {}
    for node in ctx.gm.graph.nodes:
        lin = ctx.module(node)
        if type(lin) is nn.Linear and len(node.args) == 1 and not node.kwargs:
            groups.setdefault(node.args[0], []).append((node, lin))
    for group in groups.values():
        if len(group) < 2:
            continue
        first = group[0][1]
        group = [(n, m) for n, m in group if m.in_features == first.in_features
                 and (m.bias is None) == (first.bias is None)]
        if len(group) < 2:
            continue
        nodes = [n for n, _ in group]
        name = ctx.add_module("qkv", modules.PackedLinear([m for _, m in group]))
        graph = ctx.gm.graph
        with graph.inserting_before(nodes[0]):
            packed = graph.call_module(name, (nodes[0].args[0],))
        packed.meta["nn_module_stack"] = nodes[0].meta.get("nn_module_stack", {})
        for i, n in enumerate(nodes):
            with graph.inserting_after(packed):
                part = graph.call_function(operator.getitem, (packed, i))
            n.replace_all_uses_with(part)
        pattern = "QKV projections" if len(nodes) == 3 else f"{len(nodes)} projections of one input"
        rec = ctx.record(pattern, nodes, "one GEMM over the stacked weights", packed)
        rec.path = ", ".join(module_path(n) for n in nodes)
        for n in nodes:
            graph.erase_node(n)


# -- elementwise chains ----------------------------------------------------------------

_PW_FUNCTIONS = {operator.add: "add", operator.sub: "sub", operator.mul: "mul", operator.truediv: "div",
                 operator.neg: "neg", torch.add: "add", torch.sub: "sub", torch.mul: "mul", torch.div: "div",
                 torch.relu: "relu", F.relu: "relu", F.gelu: "gelu", F.silu: "silu", torch.sigmoid: "sigmoid",
                 torch.tanh: "tanh", torch.exp: "exp", F.leaky_relu: "leaky_relu", torch.neg: "neg"}
_PW_METHODS = {"add", "sub", "mul", "div", "relu", "sigmoid", "tanh", "exp", "neg"}
_PW_MODULES: dict[type, Callable] = {
    nn.ReLU: lambda m: (F.relu, {}), nn.GELU: lambda m: (F.gelu, {"approximate": m.approximate}),
    nn.SiLU: lambda m: (F.silu, {}), nn.Sigmoid: lambda m: (torch.sigmoid, {}), nn.Tanh: lambda m: (torch.tanh, {}),
    nn.LeakyReLU: lambda m: (F.leaky_relu, {"negative_slope": m.negative_slope}),
}


def _pointwise_kind(node: fx.Node, ctx: Context) -> str | None:
    """The op's short name when the node is elementwise ("id" for an identity), else None."""
    if node.op == "call_function" and node.target in _PW_FUNCTIONS:
        return _PW_FUNCTIONS[node.target]
    if node.op == "call_method" and node.target in _PW_METHODS:
        return str(node.target)
    if node.op == "call_module":
        m = ctx.module(node)
        if type(m) in _PW_MODULES:
            return type(m).__name__.lower()
        if isinstance(m, nn.Identity) or (isinstance(m, nn.Dropout) and not m.training):
            return "id"
    return None


def pointwise(ctx: Context) -> None:
    """Maximal chains of elementwise ops whose intermediate results are used
    nowhere else become one JIT-compiled kernel (bias + GELU, add + ReLU,
    scale + mask, ...)."""
    graph = ctx.gm.graph
    taken: set = set()
    for node in reversed(list(graph.nodes)):
        if node in taken or _pointwise_kind(node, ctx) is None:
            continue
        group, frontier = [node], [node]
        while frontier:
            n = frontier.pop()
            for a in n.all_input_nodes:
                if a not in taken and a not in group and len(a.users) == 1 and _pointwise_kind(a, ctx):
                    group.append(a)
                    frontier.append(a)
        kinds = [_pointwise_kind(n, ctx) for n in group]
        if sum(k != "id" for k in kinds) < 2:
            continue
        taken.update(group)
        order = {n: i for i, n in enumerate(graph.nodes)}
        group.sort(key=order.__getitem__)
        _fuse_chain(ctx, group)


def _fuse_chain(ctx: Context, group: list[fx.Node]) -> None:
    inside = set(group)
    inputs: list[fx.Node] = []
    for n in group:
        for a in n.all_input_nodes:
            if a not in inside and a not in inputs:
                inputs.append(a)
    sub = fx.Graph()
    env = {a: sub.placeholder(f"x{i}") for i, a in enumerate(inputs)}
    for n in group:
        m = ctx.module(n)
        if n.op == "call_module" and _pointwise_kind(n, ctx) == "id":
            env[n] = env[n.args[0]]
        elif n.op == "call_module":
            fn, kw = _PW_MODULES[type(m)](m)
            env[n] = sub.call_function(fn, (env[n.args[0]],), kw)
        else:
            env[n] = sub.node_copy(n, lambda a: env[a])
            if "inplace" in env[n].kwargs:
                env[n].kwargs = {k: v for k, v in env[n].kwargs.items() if k != "inplace"}
    sub.output(env[group[-1]])
    fn = fx.GraphModule(nn.Module(), sub)
    label = ",".join(k for k in (_pointwise_kind(n, ctx) for n in group) if k != "id")
    chain = PointwiseChain(fn, len(inputs), label)
    name = ctx.add_module("pointwise", modules.FusedPointwise(chain))
    new = _replace(ctx, group, group[-1], name, tuple(inputs), at=group[-1])  # an input may come after group[0]
    ctx.record("elementwise chain", group, f"one JIT kernel ({label})", new)


# -- layout --------------------------------------------------------------------------


def layout(ctx: Context) -> None:
    """Channels-last convolutions on backends that declare the preference:
    inputs that reach a 2-D convolution are converted once where they enter
    the graph, and 4-D outputs are converted back where they leave it."""
    if not ctx.features & FEATURE_CHANNELS_LAST:
        return
    graph = ctx.gm.graph
    convs = [n for n in graph.nodes if isinstance(ctx.module(n), nn.Conv2d)
             or isinstance(getattr(ctx.module(n), "conv", None), nn.Conv2d)]
    if not convs:
        return
    reaching: set = set()
    for n in reversed(list(graph.nodes)):
        if n in convs or any(u in reaching for u in n.users):
            reaching.add(n)
    converted = []
    for p in [n for n in graph.nodes if n.op == "placeholder" and n in reaching]:
        with graph.inserting_after(p):
            new = graph.call_function(modules.to_channels_last, (p,))
        p.replace_all_uses_with(new, delete_user_cb=lambda u, new=new: u is not new)
        converted.append(p)
    out = next(n for n in graph.nodes if n.op == "output")
    with graph.inserting_before(out):
        back = graph.call_function(modules.to_contiguous_tree, (out.args[0],))
    out.args = (back,)
    ctx.record("layout", converted or convs[:1],
               f"channels-last for {len(convs)} convolutions ('{ctx.backend}' prefers NHWC); "
               f"converted at the graph's {len(converted)} input(s) and output(s)", back)


PASSES: dict[str, Callable[[Context], None]] = {
    "conv_bn": conv_bn, "attention": attention, "qkv": qkv, "add_norm": add_norm, "linear_act": linear_act,
    "pointwise": pointwise, "layout": layout,
}
