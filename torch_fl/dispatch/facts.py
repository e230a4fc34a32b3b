"""What an op's schema says, computed once per OpOverload: argument names,
defaults and kinds, which arguments it writes, which argument each return
aliases, whether it is a view, pointwise, an out= overload (and its functional
twin), and PyTorch's checks that run before any tier (memory overlap, argument
prechecks). Every tier reads these facts instead of parsing the schema again."""

from __future__ import annotations

import torch

from . import argcheck, layouts, overlap

aten = torch.ops.aten


class OpFacts:
    """What the schema says about an op, computed once per OpOverload."""

    __slots__ = (
        "func",
        "name",
        "arg_names",
        "kwarg_only",
        "defaults",
        "has_default",
        "mutable",
        "is_out",
        "is_view",
        "pointwise",
        "ret_alias",
        "n_returns",
        "handler",
        "_functional",
        "tensor_arg",
        "overlap",
        "precheck",
        "_inplace_overlap",
        "generator_at",
        "host_args",
        "layout_rule",
    )

    def __init__(self, func):
        schema = func._schema
        self.func = func
        self.name = schema.name + ("" if func._overloadname == "default" else "." + func._overloadname)
        args = schema.arguments
        self.arg_names = [a.name for a in args]
        self.tensor_arg = [isinstance(a.type, torch.TensorType) for a in args]
        # the position of a `Generator? generator` argument (random ops), swapped into the plugin (dispatch.rng)
        accepted = HOST_ARGS.get(schema.name)
        self.host_args = (
            tuple((i, bound) for i, a in enumerate(args) for name, bound in (accepted or ()) if a.name == name) or None
        )
        self.generator_at = next((i for i, a in enumerate(args) if "Generator" in str(a.type)), None)
        self.kwarg_only = [a.kwarg_only for a in args]
        self.has_default = [a.has_default_value() for a in args]
        self.defaults = [a.default_value if a.has_default_value() else None for a in args]
        self.mutable = [i for i, a in enumerate(args) if a.alias_info is not None and a.alias_info.is_write]
        self.is_out = any(args[i].kwarg_only for i in self.mutable)
        # which argument (if any) each return aliases
        sets = {}
        for i, a in enumerate(args):
            if a.alias_info is not None:
                for s in a.alias_info.before_set:
                    sets[s] = i
        self.ret_alias = []
        view = False
        for r in schema.returns:
            idx = None
            if r.alias_info is not None:
                for s in r.alias_info.before_set:
                    idx = sets.get(s, idx)
                if not r.alias_info.is_write:
                    view = True
            self.ret_alias.append(idx)
        self.n_returns = len(schema.returns)
        self.is_view = view and not self.mutable
        self.pointwise = torch.Tag.pointwise in func.tags
        self.handler = None  # the dispatcher's function for the op (set by dispatch.entry at its first call)
        self._functional: tuple | None = None
        self.overlap = overlap.rule_for(func, self.mutable)  # what CPU refuses when outputs alias inputs
        self.precheck = argcheck.precheck_for(func)  # PyTorch's argument checks its meta function skips
        self.layout_rule = layouts.rule_for(func)  # where CPU lays results out channels-last and meta does not
        self._inplace_overlap: tuple | None = None

    def overlap_rule(self, vals):
        """The overlap rule for this call: PyTorch hands an in-place op (a.addmm_(b, c)) to a backend as
        its out= overload writing into self, and CPU judges it by the in-place op's rule."""
        if not self.is_out or vals[0] is not vals[self.mutable[0]]:
            return self.overlap
        if self._inplace_overlap is None:
            sibling = inplace_sibling(self)
            if sibling is None:  # no in-place form (gather): CPU judges the out= call as it is
                rule = self.overlap
            else:  # self is the written tensor itself here: it may overlap it fully
                rule = sibling.overlap
                if rule is not None:
                    rule = overlap.Rule(rule.internal, rule.partial, rule.full, 0)
            self._inplace_overlap = (rule,)
        return self._inplace_overlap[0]

    @property
    def functional(self) -> tuple | None:
        """For an out= overload: (the functional overload's facts, the positions of its arguments among
        this op's, the positions of the outputs), e.g. add.out -> add.Tensor. None for other ops, and
        for out= overloads without a functional twin of the same arguments (factories)."""
        if self._functional is None:
            self._functional = (functional_twin(self),)
        return self._functional[0]

    def normalize(self, args, kwargs) -> list:
        n = len(args)
        total = len(self.arg_names)
        if n == total and not kwargs:
            return list(args)
        vals = list(args) + [None] * (total - n)
        for i in range(n, total):
            name = self.arg_names[i]
            if name in kwargs:
                vals[i] = kwargs[name]
            elif self.has_default[i]:
                vals[i] = self.defaults[i]
        return vals

    def split(self, vals) -> tuple[list, dict]:
        """Normalized values back into (args, kwargs) as a caller passes them: keyword-only ones by name."""
        args = [v for i, v in enumerate(vals) if not self.kwarg_only[i]]
        kwargs = {self.arg_names[i]: v for i, v in enumerate(vals) if self.kwarg_only[i]}
        return args, kwargs

    def call(self, vals):
        """Call the op with normalized values (keyword-only ones by name)."""
        return self.call_decomposition(self.func, vals)

    def call_decomposition(self, fn, vals):
        """Call fn (the op, or a function with its schema) with normalized values, leaving out the
        arguments that only repeat their schema default, as a caller would (a decomposition may treat
        "not given" differently from the default's value: torch._refs' add multiplies by an explicit
        alpha=1)."""
        pos, kw = [], {}
        for i, v in enumerate(vals):
            if self.kwarg_only[i]:
                if not self._is_default(i, v):
                    kw[self.arg_names[i]] = v
            else:
                pos.append(v)
        n = len(pos)
        while n and not self.kwarg_only[n - 1] and self._is_default(n - 1, pos[n - 1]):
            n -= 1
        return fn(*pos[:n], **kw)

    def _is_default(self, i: int, v) -> bool:
        if not self.has_default[i] or isinstance(v, torch.Tensor):
            return False
        d = self.defaults[i]
        if isinstance(v, (list, tuple)):  # [] is not a None default: all(x, dim=[]) reduces nothing, dim=None all
            return isinstance(d, (list, tuple)) and list(v) == list(d)
        return type(v) is type(d) and v == d


# Arguments PyTorch's CUDA kernels take from the host and move to the device themselves: index tensors of
# advanced indexing (x[cpu_idx], x[cpu_mask] = v), index_fill's index, and a 0-dim value ("0-dim": only then).
# The dispatcher moves them the same way before any tier (dispatch.plan.compute).
_INDEXING = (("indices", None), ("values", "0-dim"))
HOST_ARGS = {
    "aten::index": (("indices", None),),
    "aten::_unsafe_index": (("indices", None),),
    "aten::index_put": _INDEXING,
    "aten::index_put_": _INDEXING,
    "aten::_index_put_impl_": _INDEXING,
    "aten::_unsafe_index_put": _INDEXING,
    "aten::index_fill": (("index", None), ("value", "0-dim")),
    "aten::index_fill_": (("index", None), ("value", "0-dim")),
    # a 0-dim CPU operand of a binary op, which CUDA's TensorIterator reads as a scalar; torch._refs' copysign
    # (the decomposition where a plugin has no kernel) refuses two devices, the others take it as they are
    "aten::copysign": (("self", "0-dim"), ("other", "0-dim")),
    "aten::copysign_": (("other", "0-dim"),),
}

FACTS: dict = {}  # OpOverload -> OpFacts


def facts(func) -> OpFacts:
    f = FACTS.get(func)
    if f is None:
        f = FACTS[func] = OpFacts(func)
        if f.precheck is None and f.is_out:
            # an out= overload is checked as its functional twin (nll_loss_forward.output, the structured op's
            # only overload a backend sees); the twin's arguments lead the out= overload's, in order
            twin = f.functional
            if twin is not None and list(twin[1]) == list(range(len(twin[1]))):
                f.precheck = twin[0].precheck
    return f


def functional_twin(f: OpFacts) -> tuple | None:
    if not f.is_out:
        return None
    schema = f.func._schema
    outs = [i for i in f.mutable if f.kwarg_only[i]]
    inputs = [i for i in range(len(f.arg_names)) if i not in outs]
    want = [(schema.arguments[i].name, str(schema.arguments[i].type)) for i in inputs]
    ns, base = schema.name.split("::")
    packet = getattr(getattr(torch.ops, ns), base)  # aten's, or a library's own (fl::conv_bn_relu.out)
    for name in packet.overloads():
        op = getattr(packet, name)
        s = op._schema
        if s.is_mutable or len(s.returns) != len(outs):
            continue
        if [(a.name, str(a.type)) for a in s.arguments] == want:
            return facts(op), tuple(inputs), tuple(outs)
    return None


def inplace_sibling(f: OpFacts) -> OpFacts | None:
    """The in-place overload (addmm_) with the arguments of an out= overload's functional twin."""
    twin = f.functional
    if twin is None:
        return None
    want = [(a.name, str(a.type)) for a in twin[0].func._schema.arguments]
    ns, base = twin[0].func._schema.name.split("::")
    packet = getattr(getattr(torch.ops, ns), base + "_", None)
    if packet is None:
        return None
    for name in packet.overloads():
        op = getattr(packet, name)
        if [(a.name, str(a.type)) for a in op._schema.arguments] == want:
            return facts(op)
    return None


def op_name(func) -> str:
    """The name reports use: an out= overload is named after its functional twin (PyTorch hands
    structured ops such as add or mm to a backend as add.out, mm.out)."""
    f = facts(func)
    twin = f.functional
    return twin[0].name if twin is not None else f.name


def resolve_op(op):
    """The OpOverload an op, its packet or its name ("aten::add.Tensor", "add.Tensor", "mm") means. The fl::
    ops exist once torch_fl is imported (its fused-ops package and the compiler define them)."""
    if isinstance(op, torch._ops.OpOverload):
        return op
    if isinstance(op, torch._ops.OpOverloadPacket):
        return op.default
    if isinstance(op, str):
        ns, name = op.split("::", 1) if "::" in op else ("aten", op)
        base, _, overload = name.partition(".")
        packet = getattr(getattr(torch.ops, ns, None), base, None)
        if packet is None:
            raise ValueError(f"unknown operator {op!r}")
        overloads = [o for o in packet.overloads() if _in_dispatcher(packet, o)]
        if not overload and "default" not in overloads:  # aten::add's "default" is TorchScript's scalar add
            raise ValueError(
                f"{ns}::{base} needs an overload name: " + ", ".join(f"{ns}::{base}.{o}" for o in overloads)
            )
        overload = overload or "default"
        if overload not in overloads:
            raise ValueError(f"{ns}::{base} has no overload {overload!r}; overloads: {', '.join(overloads)}")
        return getattr(packet, overload)
    raise TypeError(f"explain() takes an aten op or its name, not {type(op).__name__}")


def _in_dispatcher(packet, overload: str) -> bool:
    """Whether an overload is a dispatcher operator: torch.ops also lists
    TorchScript-only ones (aten::add's scalar "default") that have no kernels."""
    try:
        torch._C._dispatch_find_schema_or_throw(packet._qualified_op_name, "" if overload == "default" else overload)
    except RuntimeError:
        return False
    return True
