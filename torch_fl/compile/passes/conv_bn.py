"""The `conv_bn` pass: convolution -> inference batch norm (-> ReLU) in aten inference
graphs, as the backend's fl::conv_bn_relu kernel where the table declares it and a
ReLU follows, else as one convolution with the batch norm folded into its weights
(`FoldedConv`, cached on the device until a weight changes)."""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx as fx

from ...runtime import Sources, cached_value
from .base import Pass, PassContext
from .fxnodes import only_user

aten = torch.ops.aten
CONV_BN_RELU_KERNEL = "fl::conv_bn_relu"


class FoldedConv(torch.nn.Module):
    """convolution -> inference batch norm as one convolution whose weights have the
    batch norm folded in. The fold is computed on the device once and cached; it is
    recomputed when any of the six tensors is another tensor or was written since,
    through any alias (runtime.Sources: an optimizer step, load_state_dict,
    p.data.mul_(), an EMA update, inference tensors too), so a model that keeps
    training between inference calls stays correct. The check is host-side: no kernel."""

    def __init__(self, eps: float, stride: list, padding: list, dilation: list, groups: Any) -> None:
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
            self._key, self._folded = key, (cached_value(w), cached_value(shift))
        w, b = self._folded
        if self.channels_last:  # (2-D: the layout pass checks)
            return torch.ops.fl.conv2d_nhwc.default(x, w, b, self.stride, self.padding, self.dilation, self.groups)
        args = (x, w, b, self.stride, self.padding, self.dilation, False, [0] * len(self.stride), self.groups)
        return aten.convolution.default(*args)


def conv_bn(ctx: PassContext) -> None:
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
        assert (
            isinstance(x, fx.Node)
            and isinstance(stride, (list, tuple))
            and isinstance(padding, (list, tuple))
            and isinstance(dilation, (list, tuple))
        ), "aten.convolution's schema: int[] stride, padding, dilation"
        _, bn_w, bn_b, mean, var, _, eps = bn.args
        out = next((u for u in bn.users if u.target is operator.getitem and u.args[1] == 0), None)
        relu = only_user(out) if out is not None else None
        relu = relu if relu is not None and relu.target in (aten.relu.default, aten.relu_.default) else None
        nodes = [conv, bn] + ([relu] if relu is not None else [])
        name = "conv+bn" + ("+relu" if relu is not None else "")
        if ctx.kind != "inference":
            ctx.record(
                name,
                nodes,
                "kept",
                applied=False,
                note=f"a gradient is needed ({ctx.kind} graph): "
                f"{CONV_BN_RELU_KERNEL} has no backward and the fold is not differentiated",
            )
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
                new = graph.call_function(
                    torch.ops.fl.conv_bn_relu.default,
                    (x, w, b, bn_w, bn_b, mean, var, float(eps), list(stride), list(padding), list(dilation), groups),
                )
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


PASS = Pass("conv_bn", aten=conv_bn)
