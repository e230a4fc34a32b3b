"""The `layout` pass of backend="fl": channels-last convolutions in inference
graphs, where the capability table says the device prefers them
(FL_FEATURE_CHANNELS_LAST) and its convolution kernels write a channels-last
output (FL_KERNEL_ANY_OUT_LAYOUT).

Why not let PyTorch pick the layout: the graph is traced with fake tensors, and
PyTorch's convolution rule for a PrivateUse1 tensor picks contiguous_format
whatever the input's layout (torch._C._select_conv_backend gives
_ConvBackend.Overrideable). So the pass asks for the layout itself: each 2-D
convolution (aten.convolution, fl::conv_bn_relu, a convolution with the batch
norm folded in) writes a channels-last output (fl::conv2d_nhwc, or
fl::conv_bn_relu's out= overload), and its weight is kept as a cached
channels-last copy. The ops between
convolutions (ReLU, add, pooling, batch norm, JIT pointwise kernels) keep the
layout they are given, so the activations stay NHWC from the first
convolution to the last; the first reads the graph's NCHW input and the kernel
transposes it once.

The convolutions become `fl::conv2d_nhwc` (torch_fl/fused/conv_nhwc.py), an op
whose fake implementation gives the channels-last output it writes, so the
rewritten graph's metadata is what runs (the value each replaced node was
traced with stays under meta[TRACED], which is what traced_layout restores);
fl::conv_bn_relu and the folded convolutions keep their ops, writing into a
channels-last buffer.

What the graph was traced with stays true where it matters: before an op whose
meaning depends on strides (view, as_strided...), before anything the pass does
not know, and at the graph's outputs (AOTAutograd regenerates aliased outputs
with as_strided on the traced strides), a tensor gets its traced layout back
(`traced_layout`): nothing when only size-1 dimensions differ, else one copy.

Training graphs too, where the convolution_backward kernel also writes any
layout (FL_KERNEL_ANY_OUT_LAYOUT): the forward's convolutions write NHWC as
above (the weight converted in the graph each call: the optimizer changes it
every step), and the tensors it saves for the backward stay NHWC (only the
outputs the caller sees get their traced layout back). The backward graph
(compiled after the forward, from the same Dynamo graph: PassContext.shared
names the saved tensors left NHWC, which the backward's placeholders are
named after) reads them as they are, and each convolution_backward that
computes an input gradient becomes fl::conv2d_nhwc_backward, which writes it
NHWC, so the
gradients flow NHWC from the last convolution to the first; the same
traced_layout guard stands before stride-dependent ops and at the outputs
(the parameters' gradients get their traced layout)."""

from __future__ import annotations

import operator
from collections.abc import Callable

import torch
import torch.fx as fx
from torch import nn

from ...runtime import REGISTRY, Sources, cached_value
from .base import Pass, PassContext
from .fxnodes import fake_result, is_call, outputs

aten = torch.ops.aten
CL = torch.channels_last
# ops whose result depends on the strides of their input, not only its values
STRIDED = {
    aten.view.default,
    aten._unsafe_view.default,
    aten.as_strided.default,
    aten._reshape_alias.default,
    aten.view.dtype,
    aten.view_as_real.default,
    aten.view_as_complex.default,
    aten.as_strided_scatter.default,
}


def _out_shape(x: torch.Tensor, w: torch.Tensor, stride, padding, dilation) -> tuple[int, ...]:
    ext = [
        (x.shape[2 + i] + 2 * padding[i] - dilation[i] * (w.shape[2 + i] - 1) - 1) // stride[i] + 1 for i in range(2)
    ]
    return (x.shape[0], w.shape[0], max(ext[0], 0), max(ext[1], 0))


class WeightCache:
    """A channels-last copy of a weight, made on the device once and remade when the
    weight changes (another storage, or written since through any alias:
    runtime.Sources): a model that keeps training between inference calls stays
    correct. A 1x1 weight is already channels-last and is used as it is."""

    def __init__(self) -> None:
        self._sources = Sources()
        self._key: tuple | None = None
        self._value: torch.Tensor | None = None

    def get(self, w: torch.Tensor, make: Callable[[], torch.Tensor] | None = None) -> torch.Tensor:
        key = self._sources.key((w,))
        value = self._value
        if key != self._key or value is None:
            v = make() if make is not None else w
            value = cached_value(v.contiguous(memory_format=CL))
            self._key, self._value = key, value
        return value


class ChannelsLastWeight(nn.Module):
    """An inference graph's convolution weight as a cached channels-last copy (WeightCache)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = WeightCache()

    def forward(self, w: torch.Tensor) -> torch.Tensor:
        return self.weight.get(w)


class ChannelsLastConvBnRelu(nn.Module):
    """fl::conv_bn_relu writing a channels-last output through its out= overload, with a
    cached channels-last weight (an inference op: the weight changes only between calls)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = WeightCache()

    def forward(self, x: torch.Tensor, w: torch.Tensor, *rest):
        args = (x, self.weight.get(w), *rest)
        stride, padding, dilation = rest[6:9]
        out = torch.empty(_out_shape(x, w, stride, padding, dilation), dtype=x.dtype, device=x.device, memory_format=CL)
        return torch.ops.fl.conv_bn_relu.out(*args, out=out)


def traced_layout(t, size, stride):
    """t with the strides the graph was traced with: t itself when they differ only on
    size-1 dimensions (the same memory order), a restrided view of it when only those
    strides' values differ, else a copy."""
    if not isinstance(t, torch.Tensor) or t.stride() == stride:
        return t
    if all(a == b for a, b, s in zip(t.stride(), stride, size, strict=True) if s != 1):
        return t.as_strided(size, stride, t.storage_offset())
    out = torch.empty_strided(size, stride, dtype=t.dtype, device=t.device)
    return out.copy_(t)


def _is_conv2d(node: fx.Node) -> bool:
    if is_call(node, aten.convolution.default):
        w = node.args[1].meta.get("val") if isinstance(node.args[1], fx.Node) else None
        return not node.args[6] and isinstance(w, torch.Tensor) and w.dim() == 4
    if is_call(node, torch.ops.fl.conv_bn_relu.default):
        x = node.args[0].meta.get("val") if isinstance(node.args[0], fx.Node) else None
        return isinstance(x, torch.Tensor) and x.dim() == 4
    return False


def _is_folded(gm: fx.GraphModule, node: fx.Node) -> bool:
    if node.op != "call_module":
        return False
    mod = _submodule(gm, node)
    # conv_bn's FoldedConv (which imports this module, so it is recognised by its attributes)
    return hasattr(mod, "channels_last") and isinstance(mod.stride, list) and len(mod.stride) == 2


def _submodule(gm: fx.GraphModule, node: fx.Node) -> nn.Module:
    assert isinstance(node.target, str), "a call_module node's target is the submodule's name"
    return gm.get_submodule(node.target)


def _static(val) -> bool:
    vals = val if isinstance(val, tuple | list) else (val,)
    return all(
        not isinstance(v, torch.Tensor) or not any(isinstance(d, torch.SymInt) for d in (*v.shape, *v.stride()))
        for v in vals
    )


def _keeps_values(gm: fx.GraphModule, node: fx.Node) -> bool:
    """A node that computes the same values whatever the layout of its tensor inputs."""
    if node.op == "call_function":
        return (
            isinstance(node.target, torch._ops.OpOverload)
            and node.target not in STRIDED
            or node.target is operator.getitem
        )
    if node.op == "call_module":  # torch_fl's own: folded convolutions, JIT pointwise chains, layout modules
        return type(_submodule(gm, node)).__module__.startswith("torch_fl.")
    return False


def _is_conv2d_backward(node: fx.Node) -> bool:
    """A 2-D convolution's backward that computes an input gradient (the first convolution's does not)."""
    if not is_call(node, aten.convolution_backward.default):
        return False
    x = node.args[1].meta.get("val") if isinstance(node.args[1], fx.Node) else None
    mask = node.args[10]
    return (
        isinstance(x, torch.Tensor)
        and x.dim() == 4
        and not node.args[7]
        and isinstance(mask, (list, tuple))
        and bool(mask[0])
    )


def _visible_outputs(n_outputs: int) -> int:
    """How many of a forward graph's outputs the caller sees (effect tokens, mutated inputs, the model's
    outputs, their intermediate bases, an rng offset: AOTAutograd's metadata); the rest are saved for the
    backward. All of them where the metadata does not say."""
    meta = getattr(torch._guards.TracingContext.try_get(), "fw_metadata", None)
    forward = getattr(meta, "num_forward", None)
    if not isinstance(forward, int):
        return n_outputs
    return min(n_outputs, forward + len(getattr(meta, "tokens", None) or ()))


SAVED_NHWC = "layout: saved tensors left channels-last"  # PassContext.shared key: their names


def layout(ctx: PassContext) -> None:
    gm, graph = ctx.gm, ctx.gm.graph
    convs = [
        n for n in graph.nodes if _is_conv2d(n) or _is_folded(gm, n) or is_call(n, aten.convolution_backward.default)
    ]
    if not convs:
        return
    caps = REGISTRY.get(ctx.backend).capabilities
    if not any(d.channels_last for d in caps.devices):
        return  # the device has no layout preference: NCHW is what it wants, nothing to record
    why = None
    if "aten::convolution" not in caps.any_layout_kernels:
        why = (
            f"'{ctx.backend}' prefers channels-last, but its convolution kernel does not write a channels-last "
            f"output (no FL_KERNEL_ANY_OUT_LAYOUT): converting would add copies and keep no activation NHWC"
        )
    elif ctx.kind != "inference" and "aten::convolution_backward" not in caps.any_layout_kernels:
        why = (
            f"a {ctx.kind} graph: its backward would need a convolution_backward kernel that writes a "
            f"channels-last gradient (FL_KERNEL_ANY_OUT_LAYOUT), which '{ctx.backend}' does not declare"
        )
    elif not all(_static(n.meta.get("val")) for n in graph.nodes if n.op != "output"):
        why = "dynamic shapes: the traced layouts are symbolic"
    if why is not None:
        ctx.record("channels-last convolutions", convs, "kept", applied=False, note=why)
        return
    if ctx.kind == "backward":
        _backward(ctx, convs)
        return
    # a forward's saved tensors, by position, with the names the backward's placeholders have (AOTAutograd's,
    # from before any pass renamed a node)
    saved = {}
    if ctx.kind == "forward":
        names = ctx.output_names
        saved = {k: name for k, name in enumerate(names) if name is not None and k >= _visible_outputs(len(names))}
    fused_out = "fl::conv_bn_relu" in caps.any_layout_kernels
    convs = [n for n in convs if not is_call(n, aten.convolution_backward.default)]  # (a backward's only)
    rewritten, kept, replaced = [], [], []
    for i, node in enumerate(convs):
        if _is_folded(gm, node):
            vars(_submodule(gm, node))["channels_last"] = True  # FoldedConv's plain attribute, not a tensor
            rewritten.append(node)
            continue
        if node.target is torch.ops.fl.conv_bn_relu.default and not fused_out:
            kept.append(node)
            continue
        if node.target is aten.convolution.default:
            new = _conv2d_nhwc(gm, node, i, cached=ctx.kind == "inference")
        else:
            target = f"fl_channels_last_conv_bn_relu_{i}"
            gm.add_submodule(target, ChannelsLastConvBnRelu())
            with graph.inserting_before(node):
                new = graph.call_module(target, tuple(node.args))
            _take_meta(new, node, None)
        node.replace_all_uses_with(new)
        replaced.append((node, new))
    if kept:
        ctx.record(
            "channels-last convolutions",
            kept,
            "kept",
            applied=False,
            note=f"'{ctx.backend}''s fl::conv_bn_relu kernel writes NCHW only",
        )
    if not rewritten and not replaced:
        return
    boundaries, left = _restore_traced_layouts(gm, rewritten + [new for _, new in replaced], set(saved))
    if ctx.kind == "forward":  # every saved tensor a convolution's layout may reach: the backward guards them
        ctx.shared[SAVED_NHWC] = {saved[k] for k in left}
    note = f"{len(convs) - len(kept)} convolution(s); traced layout restored at {boundaries} place(s)"
    returned = outputs(graph)
    left_4d = [k for k in left if _dims(returned[k]) == 4]  # (batch norm's saved statistics are 1-D)
    if left_4d:
        note += f"; {len(left_4d)} saved tensor(s) left NHWC for the backward"
    ctx.record(
        "channels-last convolutions",
        [n for n in convs if n not in kept],
        "NHWC activations, cached channels-last weights" if ctx.kind == "inference" else "NHWC activations",
        note=note,
    )
    for node, _ in replaced:  # erased after the record, which names them
        graph.erase_node(node)


TRACED = "fl_traced_val"  # node.meta key: the value a node replaced by the pass was traced with


def _take_meta(new: fx.Node, old: fx.Node, val) -> None:
    """new's metadata: old's, with the value the new op really gives (its fake implementation's) where known;
    the traced value stays under TRACED, which traced_layout restores."""
    new.meta.update(old.meta)
    if val is not None:
        new.meta[TRACED] = old.meta.get("val")
        new.meta["val"] = val


def _traced(node: fx.Node):
    return node.meta.get(TRACED, node.meta.get("val"))


def _conv2d_nhwc(gm: fx.GraphModule, node: fx.Node, i: int, cached: bool) -> fx.Node:
    """aten.convolution (2-D, not transposed) as fl::conv2d_nhwc, whose fake implementation gives the
    channels-last output it writes. In an inference graph the weight comes through a cached channels-last
    copy (ChannelsLastWeight); in a training step's forward the op converts it each call (the optimizer
    changes it every step, and a replay must repeat the conversion, which a cache hit would leave out)."""
    graph = gm.graph
    x, w, bias, stride, padding, dilation, _, _, groups = node.args
    with graph.inserting_before(node):
        if cached:
            target = f"fl_channels_last_weight_{i}"
            gm.add_submodule(target, ChannelsLastWeight())
            w_cl = graph.call_module(target, (w,))
            assert isinstance(w, fx.Node), "a convolution's weight is a tensor"
            w_val = w.meta.get("val")
            if isinstance(w_val, torch.Tensor):
                w_cl.meta["val"] = _fake_channels_last(w_val)
            w = w_cl
        new = graph.call_function(torch.ops.fl.conv2d_nhwc.default, (x, w, bias, stride, padding, dilation, groups))
    _take_meta(new, node, fake_result(new))
    return new


def _fake_channels_last(val: torch.Tensor) -> torch.Tensor:
    mode = torch._guards.detect_fake_mode([val])
    if mode is None:
        return val
    with mode:
        return val.contiguous(memory_format=CL)


def _dims(node) -> int:
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    return val.dim() if isinstance(val, torch.Tensor) else -1


def _backward(ctx: PassContext, convs: list[fx.Node]) -> None:
    """A training step's backward: the saved tensors its forward left NHWC arrive NHWC, and each
    convolution_backward that computes an input gradient writes it NHWC."""
    gm, graph = ctx.gm, ctx.gm.graph
    names = ctx.shared.get(SAVED_NHWC, set())
    producers = [n for n in graph.nodes if n.op == "placeholder" and n.name in names]
    replaced = []
    for node in convs:
        if not _is_conv2d_backward(node):
            continue
        go, x, w, bias_sizes, stride, padding, dilation, _, _, groups, mask = node.args
        with graph.inserting_before(node):
            new = graph.call_function(
                torch.ops.fl.conv2d_nhwc_backward.default,
                (go, x, w, bias_sizes, stride, padding, dilation, groups, mask),
            )
        val = fake_result(new)
        _take_meta(new, node, val)
        for user in node.users:  # the gradients picked from the tuple: what they really are
            if user.target is operator.getitem and val is not None:
                user.meta[TRACED], user.meta["val"] = user.meta.get("val"), val[user.args[1]]
        node.replace_all_uses_with(new)
        replaced.append((node, new))
    if not producers and not replaced:
        return
    boundaries, _ = _restore_traced_layouts(gm, producers + [new for _, new in replaced], set())
    ctx.record(
        "channels-last convolutions",
        [node for node, _ in replaced] or convs,
        "NHWC input gradients",
        note=(
            f"{sum(_dims(n) == 4 for n in producers)} saved tensor(s) read NHWC, {len(replaced)} input gradient(s) "
            f"written NHWC; "
            f"traced layout restored at {boundaries} place(s)"
        ),
    )
    for node, _ in replaced:
        graph.erase_node(node)


def _restore_traced_layouts(gm: fx.GraphModule, producers: list[fx.Node], keep: set[int]) -> tuple[int, list[int]]:
    """Puts traced_layout before every use of a possibly channels-last tensor by a node that
    could tell the difference, and before the graph's outputs but those at the positions in
    `keep` (a forward's saved tensors, which its backward reads as they are). Returns how many
    were put, and the kept output positions whose tensor may be channels-last."""
    graph = gm.graph
    maybe = set(producers)
    for node in graph.nodes:  # topological: a node downstream of a producer may carry the layout on
        if node not in maybe and any(a in maybe for a in node.all_input_nodes) and _keeps_values(gm, node):
            maybe.add(node)
    first = next(n for n in graph.nodes if n.op != "placeholder")
    count = 0
    cache: dict[fx.Node, fx.Node] = {}

    def fixed(src: fx.Node) -> fx.Node | None:
        nonlocal count
        val = _traced(src)
        if not isinstance(val, torch.Tensor):
            return None
        node = cache.get(src)
        if node is None:
            # after its producer; a placeholder's after the last placeholder (placeholders come first)
            with graph.inserting_after(src) if src.op != "placeholder" else graph.inserting_before(first):
                node = graph.call_function(traced_layout, (src, tuple(val.shape), tuple(val.stride())))
            node.meta.update(src.meta)
            node.meta.pop(TRACED, None)
            node.meta["val"] = val
            cache[src] = node
            count += 1
        return node

    left: list[int] = []
    for node in list(graph.nodes):
        if node.op == "output":
            outs = node.args[0] if isinstance(node.args[0], (tuple, list)) else None
            if outs is not None:
                new = list(outs)
                for k, a in enumerate(outs):
                    if isinstance(a, fx.Node) and a in maybe:
                        if k in keep:
                            left.append(k)
                        else:
                            new[k] = fixed(a) or a
                node.args = (type(outs)(new),)
                continue
        elif node in maybe and _keeps_values(gm, node):
            continue
        for src in [a for a in node.all_input_nodes if a in maybe]:
            f = fixed(src)
            if f is not None:
                node.replace_input_with(src, f)
    return count, left


PASS = Pass("layout", aten=layout)
