"""Capturing a model as a torch.fx graph of module calls.

Why torch.fx symbolic tracing: it runs the model's Python with proxies, not
tensors, so it works whatever the tensor type (fl tensors are a wrapper
subclass that dynamo cannot trace into), keeps nn modules as graph nodes
(so every pattern has a module path), and the passes can rewrite calls of
modules into calls of fused replacements that hold the same parameters.

Two things stop plain symbolic tracing on common models, and both are
handled here: forward arguments that are None or flags (traced as concrete
values, one graph per such call signature) and PyTorch's own Transformer
containers, whose forward checks tensor properties for its fast path; they
are traced through the equivalent plain formula (`_SUBSTITUTES`)."""

from __future__ import annotations

import inspect

import torch
import torch.fx as fx
from torch import nn


def _encoder(m: nn.TransformerEncoder, src, mask=None, src_key_padding_mask=None, is_causal=None):
    out = src
    for layer in m.layers:
        out = layer(out, src_mask=mask, src_key_padding_mask=src_key_padding_mask, is_causal=bool(is_causal))
    return m.norm(out) if m.norm is not None else out


def _encoder_layer(m: nn.TransformerEncoderLayer, src, src_mask=None, src_key_padding_mask=None, is_causal=False):
    def sa(x):
        out = m.self_attn(x, x, x, attn_mask=src_mask, key_padding_mask=src_key_padding_mask, need_weights=False,
                          is_causal=is_causal)[0]
        return m.dropout1(out)

    def ff(x):
        return m.dropout2(m.linear2(m.dropout(m.activation(m.linear1(x)))))

    x = src
    if m.norm_first:
        x = x + sa(m.norm1(x))
        return x + ff(m.norm2(x))
    x = m.norm1(x + sa(x))
    return m.norm2(x + ff(x))


# PyTorch modules whose forward cannot be traced symbolically, and the same
# computation written so it can (the slow path of their own forward).
_SUBSTITUTES = {nn.TransformerEncoder: _encoder, nn.TransformerEncoderLayer: _encoder_layer}


class Tracer(fx.Tracer):
    """Keeps torch.nn layers (and nn.MultiheadAttention) as leaves; traces
    through user modules, containers and the substituted Transformer modules."""

    def __init__(self, leaf_modules: tuple = ()):
        super().__init__()
        self.leaf_modules = leaf_modules

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        if type(m) in _SUBSTITUTES:
            return False
        if self.leaf_modules and isinstance(m, self.leaf_modules):
            return True
        return super().is_leaf_module(m, qualname)

    def call_module(self, m, forward, args, kwargs):
        sub = _SUBSTITUTES.get(type(m))
        if sub is not None:
            return super().call_module(m, lambda *a, **k: sub(m, *a, **k), args, kwargs)
        return super().call_module(m, forward, args, kwargs)


class Root(nn.Module):
    """Holds the user's model as `model`, so the model itself is traced as
    a module call (and can be substituted); its forward is generated with the
    call's positional arity, since fx cannot trace *args."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model


def bind(model: nn.Module, args: tuple, kwargs: dict) -> tuple[list[str], list]:
    """The call's arguments in the order of model.forward's signature, defaults filled in."""
    sig = inspect.signature(model.forward)
    params = list(sig.parameters.values())
    if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params):
        if kwargs:
            raise TypeError("keyword arguments to a forward(*args, **kwargs) cannot be captured")
        return [f"arg{i}" for i in range(len(args))], list(args)
    bound = sig.bind(*args, **kwargs)
    bound.apply_defaults()
    return list(bound.arguments), list(bound.arguments.values())


def capture(model: nn.Module, names: list[str], values: list, leaf_modules: tuple = ()) -> fx.GraphModule:
    """The model's graph for a call whose non-tensor arguments are `values`'
    non-tensor entries (they are fixed in the graph: None masks, flags)."""
    tensor_names = [n for n, v in zip(names, values, strict=True) if isinstance(v, torch.Tensor)]
    concrete = {n: v for n, v in zip(names, values, strict=True) if not isinstance(v, torch.Tensor)}
    args = ", ".join(tensor_names)
    call = ", ".join(f"{n}={n}" if n in tensor_names else f"{n}=_concrete[{n!r}]" for n in names)
    if names and names[0].startswith("arg") and all(n.startswith("arg") for n in names):
        call = ", ".join(n if n in tensor_names else f"_concrete[{n!r}]" for n in names)
    namespace: dict = {"_concrete": concrete}
    exec(f"def forward(self, {args}):\n    return self.model({call})\n", namespace)  # noqa: S102
    cls = type("Captured" + type(model).__name__, (Root,), {"forward": namespace["forward"]})
    root = cls(model)
    graph = Tracer(leaf_modules).trace(root)
    gm = fx.GraphModule(root, graph, class_name=cls.__name__)
    gm.model = model  # every target resolves through the live model (buffers replaced by .to() included)
    return gm


def module_path(node: fx.Node) -> str:
    """The dotted path of the user's module a node belongs to ("" for the model itself)."""
    if node.op == "call_module":
        path = str(node.target)
    else:
        stack = node.meta.get("nn_module_stack") or {}
        path = next(reversed(stack.values()))[0] if stack else "model"
    path = path[len("model"):] if path.startswith("model") else path
    return path.lstrip(".") or "(model)"
