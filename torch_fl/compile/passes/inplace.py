"""Buffer updates back in place: what AOTAutograd's functionalization costs a training step.

AOTAutograd traces a model into functional aten graphs: an op that mutates a
module buffer becomes an out-of-place op plus a `copy_` of its result into the
buffer at the end of the graph. For batch norm in training that is, per layer:
`num_batches_tracked + 1` and a copy back, and `_native_batch_norm_legit_functional`,
which on a device without that op runs as two clones of the running statistics,
the in-place batch norm on the clones, and two copies back. Eager PyTorch runs
one in-place add and one batch norm kernel that updates the statistics itself.
On a ResNet-50 that is 53 batch norms x 5 copies per training step.

The rewrite puts the in-place ops back where the mutated value is a graph input
(a module buffer) read by nothing else in the graph:

  add = add(b, 1) ... copy_(b, add)                  ->  add_(b, 1)      at the copy
  f = _native_batch_norm_legit_functional(x, w, bias, rm, rv, True, momentum, eps)
  copy_(rm, f[3]); copy_(rv, f[4])                   ->  _native_batch_norm_legit(x, w, bias, rm, rv, True, ...)

The updated statistics f[3], f[4] may also be graph outputs: in a forward graph
those are tensors saved for the backward, whose batch norm backward in training
mode reads the batch statistics (f[1], f[2]) and never the running ones. They
become f[1], f[2] there (same shape and dtype) rather than the buffers
themselves, so that a second forward updating the buffers before the first
backward runs cannot invalidate a saved tensor. Only in forward graphs, where
the outputs after the user's are saved tensors: an inference graph returns
only what the user asked for, so there the pattern is kept unless f[3], f[4] are
used by the copies alone."""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

from ..graph_report import Pattern
from .base import PassContext

aten = torch.ops.aten
BN_FUNCTIONAL = aten._native_batch_norm_legit_functional.default
BN_INPLACE = aten._native_batch_norm_legit.default


def _copies_into(graph: fx.Graph) -> dict[fx.Node, list[fx.Node]]:
    """Graph input -> the copy_ nodes that write into it."""
    out: dict[fx.Node, list[fx.Node]] = {}
    for n in graph.nodes:
        if n.op != "call_function" or n.target is not aten.copy_.default:
            continue
        dst = n.args[0]
        assert isinstance(dst, fx.Node), "aten.copy_'s self is a tensor: a node of the graph"
        if dst.op == "placeholder":
            out.setdefault(dst, []).append(n)
    return out


def _counter_updates(graph: fx.Graph, copies: dict[fx.Node, list[fx.Node]]) -> int:
    done = 0
    for buf, writes in copies.items():
        if len(writes) != 1:
            continue
        copy = writes[0]
        src = copy.args[1]
        buf_users = set(buf.users)  # read before `is buf` below, which narrows buf to an fx argument's type
        if not (
            isinstance(src, fx.Node)
            and src.target is aten.add.Tensor
            and src.args[0] is buf
            and isinstance(src.args[1], (int, float))
            and len(src.users) == 1
            and not src.kwargs
        ):
            continue
        if buf_users != {src, copy} or copy.users:
            continue
        with graph.inserting_before(copy):
            new = graph.call_function(aten.add_.Tensor, (buf, src.args[1]))
        new.meta.update(copy.meta)
        copy.replace_all_uses_with(new)
        graph.erase_node(copy)
        graph.erase_node(src)
        done += 1
    return done


def _batch_norms(graph: fx.Graph, copies: dict[fx.Node, list[fx.Node]], kind: str) -> tuple[int, list[str]]:
    done, kept = 0, []
    output = next(n for n in reversed(graph.nodes) if n.op == "output")
    for f in list(graph.nodes):
        if f.op != "call_function" or f.target is not BN_FUNCTIONAL or f.kwargs:
            continue
        x, w, b, rm, rv, training, momentum, eps = f.args
        if training is not True or not all(isinstance(t, fx.Node) and t.op == "placeholder" for t in (rm, rv)):
            continue
        items = {u.args[1]: u for u in f.users if u.target is operator.getitem}
        stat_mean, stat_var = items.get(3), items.get(4)
        if stat_mean is None or stat_var is None:
            continue
        stats = [stat_mean, stat_var]
        writes = [copies.get(rm, []), copies.get(rv, [])]
        if any(len(c) != 1 or c[0].args[1] is not s or c[0].users for c, s in zip(writes, stats, strict=True)):
            continue
        if set(rm.users) != {f, writes[0][0]} or set(rv.users) != {f, writes[1][0]}:
            continue
        other = [u for s in stats for u in s.users if u not in (writes[0][0], writes[1][0])]
        if any(u is not output for u in other) or (other and kind != "forward"):
            kept.append(f.name)
            continue
        with graph.inserting_before(f):
            new = graph.call_function(BN_INPLACE, (x, w, b, rm, rv, True, momentum, eps))
        new.meta.update({k: v for k, v in f.meta.items() if k != "val"})
        for i in (0, 1, 2):
            if i in items:
                items[i].args = (new, i)
        for s, batch in zip(stats, (1, 2), strict=True):  # saved for the backward: never read in training mode
            if s.users and batch not in items:
                with graph.inserting_after(new):
                    items[batch] = graph.call_function(operator.getitem, (new, batch))
            for c in writes:
                if c[0].args[1] is s:
                    graph.erase_node(c[0])
            s.replace_all_uses_with(items[batch])
            graph.erase_node(s)
        graph.erase_node(f)
        done += 1
    return done, kept


def restore_inplace_updates(gm: fx.GraphModule, kind: str) -> tuple[int, int, list[str]]:
    """Counter updates and batch norms put back in place: (counters, batch norms, kept batch-norm nodes)."""
    copies = _copies_into(gm.graph)
    if not copies:
        return 0, 0, []
    norms, kept = _batch_norms(gm.graph, copies, kind)
    counters = _counter_updates(gm.graph, _copies_into(gm.graph))
    return counters, norms, kept


def buffer_updates(ctx: PassContext) -> None:
    """The rewrite on one aten graph, recorded. Not a pass that can be switched off: it undoes what
    functionalization added; the registry runs it before the aten passes (passes/__init__.py)."""
    if ctx.kind == "backward":
        return
    counters, norms, kept = restore_inplace_updates(ctx.gm, ctx.kind)
    if norms:
        ctx.patterns.append(
            Pattern(
                "batch norm running stats in place",
                ctx.kind,
                f"{norms} batch norm(s)",
                ["_native_batch_norm_legit_functional", "copy_", "copy_"],
                "aten::_native_batch_norm_legit (updates the buffers itself)",
            )
        )
    if counters:
        ctx.patterns.append(
            Pattern("buffer counter in place", ctx.kind, f"{counters} buffer(s)", ["add", "copy_"], "aten::add_")
        )
    for name in kept:
        ctx.patterns.append(
            Pattern(
                "batch norm running stats in place",
                ctx.kind,
                name,
                ["_native_batch_norm_legit_functional"],
                "kept",
                False,
                "the updated statistics are an output of an inference graph",
            )
        )
