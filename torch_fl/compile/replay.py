"""Graph replay for `torch.compile(model, backend="fl", options={"replay": True})`.

An aten graph (inference, or a training step's forward and backward) whose
every op ends in a plugin kernel call (native or fused
kernels, JIT kernels run the same way, decompositions into those) is recorded
once as a kernel list (torch_fl.runtime.recording / KernelGraph) and then
replayed by one C function: no dispatcher, no per-op Python. Why: for small
models the host time per op, not the kernels, is the step time.

The lifecycle, per input signature (shapes, strides, dtypes, devices, the
parameters' storages, non-tensor values):
  1st call   runs the graph normally (a warm-up: plans, JIT kernels, the
             conv+bn fold cache are made outside the recording);
  2nd call   runs it under the recorder, on private static copies of the
             caller's inputs; if something in it cannot be replayed (a CPU
             fallback, a host copy, .item(), a random op, ...) the graph is
             reported not replayable with the op named, and this signature
             keeps running normally, with the same results;
  later      replay: the kernels run on the caller's inputs where they are
             (an input some kernel writes into is copied into its static
             buffer first), the outputs are written by the kernels into fresh
             tensors (or copied out of their static buffers, runtime.graph's
             bind_outputs says which).
Parameters and buffers (AOTAutograd's static inputs) are used in place: their
storage is part of the recording, so an in-place update (an optimizer step,
load_state_dict) is seen by the next replay; a parameter with a new storage, or,
in an inference graph, one written since the recording, through any alias
(runtime.WriteGuard: the conv+bn fold caches on it; training graphs have no such
cache, and the optimizer writes every parameter each step), makes the next call
a warm-up and the one after a new recording. A
backward graph's inputs (saved tensors, gradients) are not static: read in place
as above, never written. A changed shape, dtype or
stride is another signature (recorded anew, up to MAX_SIGNATURES, then run
normally): never a replay of the wrong shapes.

Outputs: fresh tensors on every call (the kernels write into them, or a copy out of the static outputs), so a
result stays valid after the next call, unlike torch.cuda.graphs' static
outputs; outputs that share memory (y and y.view(-1)) are views of one fresh
copy, as in eager; an output that is a view of an input is the same view of the
caller's tensor. The graph steps aside (runs normally) while a profiler listens, since
it reports every op, and inside another recording. A Dynamo graph's status
(fusion_report's `replay:` line) covers its aten graphs: a training step is
replayed when both its forward and its backward are (dropout with p > 0 keeps
them from it: a replay would repeat the mask)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ..runtime import KernelGraph, WriteGuard, async_copy, cached_storages, events, recording

MAX_SIGNATURES = 8  # recordings kept per graph (each holds its buffers)
# By default (options replay=None) a graph is not recorded when its buffers would exceed this: a recording
# pins every storage its kernels touch (the static inputs copied, the intermediates, the outputs) for the
# life of the graph, and at that size the kernels, not the host's per-op time that replay saves, set the
# step time (64 MiB at host memory bandwidth is milliseconds; replay saves ~5-20 us per kernel).
AUTO_MAX_BYTES = 64 << 20
_RECORDING_LOCK = threading.Lock()


@dataclass
class ReplayStatus:
    """Whether a graph is replayed, and why not: the per-graph line of fusion_report."""

    replayed: bool = False
    reason: str | None = "not run yet (the first call is a warm-up, the second records)"
    kernels: int = 0
    replays: int = 0
    recordings: int = 0
    replay_ns: int = 0  # time spent in the replay calls, guards to outputs (kernels included): the wrapper's cost
    last_replay_ns: int = 0  # the latest replay call's
    # per aten graph of this Dynamo graph ("inference", or "forward" and "backward"): [replayed, reason, kernels]
    parts: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        # the latest recording's KernelGraph (its kernel names, kernel_count; bench_fusion times it): a plain
        # attribute, not a field, so that the report stays plain data (asdict)
        self.graph: KernelGraph | None = None

    def update(self, kind: str, replayed: bool, reason: str | None, kernels: int = 0) -> None:
        """One aten graph's state; the status is replayed when all of them are (a training step is
        replayed when both its forward and its backward are), and names the first reason otherwise."""
        self.parts[kind] = [replayed, reason, kernels]
        self.replayed = all(p[0] for p in self.parts.values())
        many = len(self.parts) > 1
        self.reason = next(((f"{k}: {p[1]}" if many else p[1]) for k, p in self.parts.items() if not p[0]), None)
        self.kernels = sum(p[2] for p in self.parts.values() if p[0])

    def __str__(self) -> str:
        if self.replayed:
            kinds = f" ({' + '.join(f'{k} {p[2]}' for k, p in self.parts.items())})" if len(self.parts) > 1 else ""
            return f"replayed: {self.kernels} kernels{kinds}, {self.replays} replay(s), {self.recordings} recording(s)"
        return f"not replayed: {self.reason}"


class _Entry:
    """One signature's recording: the kernel graph, its static buffers, how to make the outputs."""

    __slots__ = (
        "graph",
        "objs",
        "guard",
        "copied",
        "values",
        "out_specs",
        "owned",
        "tensor_idx",
        "all_tensors",
        "simple",
    )

    def __init__(
        self,
        graph: KernelGraph | None,
        static: list,
        copied: list,
        values: list,
        out_specs: tuple,
        check_writes: bool = True,
    ):
        self.graph = graph
        # the static inputs (parameters, buffers), used in place: the C++ guards check their addresses
        self.objs = tuple(a for _, a in static)
        # an inference graph's host-side caches (the conv+bn fold) derive from them: a write through any alias
        # (an optimizer step, p.data.mul_(), inference tensors too) makes the next call a warm-up
        self.guard = WriteGuard(self.objs) if check_writes and graph is not None else None
        self.copied = copied  # (index, static buffer)
        self.values = values  # (index, value) of the non-tensor arguments the recording saw
        self.out_specs = out_specs
        # per output region: whether its one output is allocated as itself (no shared region)
        owned = [False] * len(out_specs[1])
        for spec in out_specs[0]:
            if spec[0] == "own":
                owned[spec[1]] = True
        self.owned = owned
        # fl_graph::replay takes the tensor arguments alone; its results are all of the outputs where simple
        # (below), else the fresh ones alone
        self.tensor_idx = sorted([i for i, _ in static] + [i for i, _ in copied])
        self.all_tensors = not values
        # the C++ op makes every result (fresh tensors, views of inputs, Nones) unless another value is among them
        self.simple = _all_made_in_cpp(out_specs[0])


def _all_made_in_cpp(specs: list) -> bool:
    """Whether the replay op makes every result of a recording: all but plain values other than None (a
    number among a graph's outputs: Python puts it into the list)."""
    return all(spec[0] != "value" or spec[1] is None for spec in specs)


def _span(t: torch.Tensor) -> int:
    """Elements from t's first to its last (what torch.empty_strided allocates for t's layout): the bytes a
    replay copies for an input or an output, dense or not."""
    if t.numel() == 0:
        return 0
    return 1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride(), strict=True))


class ReplayedGraph:
    """A boxed compiled aten graph (make_boxed_func) that replays its recording where it can."""

    _boxed_call = True

    def __init__(
        self,
        fn: Callable,
        static_inputs: set[int],
        mutated: set[int],
        status: ReplayStatus,
        kind: str = "inference",
        max_bytes: int | None = None,
    ):
        self.fn = fn
        self.max_bytes = max_bytes  # None: any size
        self.kind = kind
        self._boxed_call = True  # on the instance too: wrappers that copy __dict__ (functools.wraps) keep it
        self.static_inputs = static_inputs
        self.mutated = mutated
        self.status = status
        self.entries: dict = {}  # signature -> _Entry (graph None: not replayable)
        self.warm: set = set()  # signatures that ran their warm-up
        self.last: _Entry | None = None
        self.lock = threading.Lock()
        # an input the caller owns that the graph writes into: the write would land in a static copy
        self.writes_inputs = bool(mutated - static_inputs)
        if self.writes_inputs:
            status.update(kind, False, f"the graph writes into its input(s) {sorted(mutated - static_inputs)}")

    def __call__(self, args: list) -> Any:
        t0 = time.perf_counter_ns()
        if events.STATE.listeners or events.STATE.recording is not None or self.writes_inputs:
            return self.fn(args)
        entry = self.last
        if entry is not None and entry.graph is not None and self._precheck(entry, args):
            out = self._replay(entry, args, t0)
            if out is not None:
                return out
        key = self._signature(args)
        if key is None:
            return self.fn(args)
        entry = self.entries.get(key)
        if entry is not None:
            if entry.graph is None:
                return self.fn(args)
            if self._precheck(entry, args):
                out = self._replay(entry, args, t0)
                if out is not None:
                    self.last = entry
                    return out
            # same shapes, but a parameter has another address or was written: warm up, then record anew
            del self.entries[key]
            self.warm.discard(key)
            self.last = None
        if key not in self.warm:
            self.warm.add(key)
            if self.kind not in self.status.parts:  # what the report says until the next call records
                self.status.update(self.kind, False, "warmed up once (the next call records, later calls replay)")
            return self.fn(args)
        if len(self.entries) >= MAX_SIGNATURES:
            return self.fn(args)
        return self._record(key, args)

    # -- signatures and guards --------------------------------------------------------

    def _signature(self, args: list) -> tuple | None:
        """What a recording depends on; None where a value cannot be a part of one (a CPU tensor)."""
        key: list[tuple[Any, ...]] = []
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor):
                if a.device.type != "fl":
                    if not any(e.graph is not None for e in self.entries.values()):
                        self.status.update(
                            self.kind,
                            False,
                            f"input {i} is a {a.device.type} tensor (its values would be baked into the kernels)",
                        )
                    return None
                ptr = a.untyped_storage().data_ptr() if i in self.static_inputs else None
                key.append((ptr, a.dtype, a.device, tuple(a.shape), a.stride(), a.storage_offset() if ptr else 0))
            elif a is None or isinstance(a, (int, float, bool)):
                key.append(("value", type(a), a))
            else:
                return None
        return tuple(key)

    @staticmethod
    def _precheck(entry: _Entry, args: list) -> bool:
        """What the C++ guards (fl_graph::replay: every tensor's layout, the parameters' addresses) do not
        check: the non-tensor arguments, and an inference graph's parameters written since the recording."""
        if entry.guard is not None and entry.guard.written():
            return False
        for i, value in entry.values:
            if args[i] != value or type(args[i]) is not type(value):
                return False
        return True

    # -- record ------------------------------------------------------------------------

    def _record(self, key: tuple, args: list) -> Any:
        if not _RECORDING_LOCK.acquire(blocking=False):  # another thread records (one recorder per process)
            self.warm.discard(key)  # this signature warms up and records again later
            return self.fn(args)
        try:
            return self._record_locked(key, args)
        finally:
            _RECORDING_LOCK.release()

    def _too_big(self, nbytes: int) -> str | None:
        if self.max_bytes is None or nbytes <= self.max_bytes:
            return None
        return (
            f"its buffers would hold {nbytes / (1 << 20):.1f} MiB of device memory (by default graphs up to "
            f"{self.max_bytes / (1 << 20):.0f} MiB are replayed; options={{'replay': True}} replays any size)"
        )

    def _record_locked(self, key: tuple, args: list) -> Any:
        copied, static, values = [], [], []
        call = list(args)
        big = self._too_big(
            sum(
                _span(a) * a.element_size()
                for i, a in enumerate(args)
                if isinstance(a, torch.Tensor) and i not in self.static_inputs
            )
        )
        if big is not None:  # its copied inputs alone: refused before a recording doubles them
            return self._refuse(key, args, big)
        for i, a in enumerate(args):
            if not isinstance(a, torch.Tensor):
                values.append((i, a))
            elif i in self.static_inputs:
                static.append((i, a))
            else:
                # the static buffer has the input's strides (an expanded gradient keeps its stride 0), so the
                # replay copies the bytes of the input's span, whatever its layout
                buf = torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device=a.device)
                n = _span(a)
                if n:
                    buf.as_strided((n,), (1,), buf.storage_offset()).copy_(a.as_strided((n,), (1,), a.storage_offset()))
                copied.append((i, buf))
                call[i] = buf
        with recording() as rec:
            outs = self.fn(call)
        self.status.recordings += 1
        if rec.reason is not None:
            return self._refuse(key, args, rec.reason, outs)
        # alive with the model anyway: its parameters, and what the compiled graph's caches derived from them
        # (folded, channels-last and concatenated weights: runtime.cached_value)
        params = {a.untyped_storage().data_ptr() for _, a in static} | cached_storages()
        big = self._too_big(
            sum(s.nbytes() for s in rec.keep if isinstance(s, torch.UntypedStorage) and s.data_ptr() not in params)
        )
        if big is not None:
            return self._refuse(key, args, big, outs)
        by_storage = {a.untyped_storage().data_ptr(): ("static", i, a) for i, a in static}
        by_storage.update({b.untyped_storage().data_ptr(): ("input", i, b) for i, b in copied})
        specs: list[tuple[Any, ...]] = []
        regions: dict[int, list[int]] = {}  # regions: storage -> [first byte, end byte] of the fresh outputs in it
        for k, o in enumerate(outs):
            if not isinstance(o, torch.Tensor):
                specs.append(("value", o))
                continue
            if o.device.type != "fl":
                return self._refuse(key, args, f"output {k} is a {o.device.type} tensor", outs)
            base = by_storage.get(o.untyped_storage().data_ptr())
            if base is not None:  # a view of an input: the same view of the caller's tensor
                kind, i, t = base
                specs.append((kind, i, tuple(o.shape), o.stride(), o.storage_offset() - t.storage_offset()))
                continue
            # a fresh output: outputs sharing a storage (y and y.view(-1)) come back as views of one fresh
            # copy of the bytes they span, so an in-place edit of one shows in the other, as in eager
            first = int(o.storage_offset()) * o.element_size()  # a real output's offset: an int
            span = regions.setdefault(o.untyped_storage().data_ptr(), [first, first])
            span[0], span[1] = min(span[0], first), max(span[1], first + _span(o) * o.element_size())
            specs.append(("fresh", o.untyped_storage().data_ptr(), tuple(o.shape), o.stride(), o.dtype, first))
        order = list(regions)
        users = {ptr: sum(1 for sp in specs if sp[0] == "fresh" and sp[1] == ptr) for ptr in regions}
        for n, spec in enumerate(specs):
            if spec[0] == "fresh":
                lo = regions[spec[1]][0]
                if (spec[5] - lo) % spec[4].itemsize:
                    return self._refuse(
                        key, args, "outputs view one storage at offsets their dtypes cannot express", outs
                    )
                offset = (spec[5] - lo) // spec[4].itemsize
                # the only output in its storage: one empty_strided is its region (a replay's outputs are
                # made per call, and three calls per output cost more than a small graph's kernels)
                own = users[spec[1]] == 1
                specs[n] = ("own" if own else "fresh", order.index(spec[1]), spec[2], spec[3], spec[4], offset)
        out_copies = [(ptr + lo, hi - lo) for ptr, (lo, hi) in regions.items()]
        region_sizes = [hi - lo for lo, hi in regions.values()]
        if rec.device is None:
            return self._refuse(key, args, "the graph launches no kernel", outs)
        graph = KernelGraph(rec, [(b.data_ptr(), _span(b) * b.element_size()) for _, b in copied], out_copies)
        # a copied input no kernel writes into is read in place by later replays (no copy); the recording's
        # static copy stays for the inputs that are written, and for a caller's tensor at an offset its readers'
        # dtypes cannot express
        graph.bind_inputs()
        # and a fresh output the kernels write all of is written straight into the call's result (no copy out)
        graph.bind_outputs()
        # the guards and results of the whole call in C++ (KernelGraph.call): every tensor argument in order
        bufs = dict(copied)
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor):
                graph.guard_tensor(bufs[i] if i in bufs else a, copied=i in bufs)
        # views of the caller's tensors and Nones too, unless another value sits among the results (then Python
        # assembles the list around the fresh tensors: _Entry.simple)
        views = _all_made_in_cpp(specs)
        position = {i: n for n, i in enumerate(i for i, a in enumerate(args) if isinstance(a, torch.Tensor))}
        for spec in specs:
            if spec[0] in ("own", "fresh"):
                graph.out_tensor(spec[1], spec[0] == "own", spec[2], spec[3], spec[4], spec[5])
            elif not views:
                continue
            elif spec[0] == "value":
                graph.out_none()
            else:
                graph.out_view(position[spec[1]], spec[2], spec[3], args[spec[1]].dtype, spec[4])
        # the write guard is for host-side caches derived from parameters (the conv+bn fold), which only
        # inference graphs have; in training the optimizer writes every parameter each step
        entry = _Entry(
            graph,
            static,
            copied,
            values,
            (specs, region_sizes, rec.device.torch_device),
            check_writes=self.kind == "inference",
        )
        self.entries[key] = entry
        self.last = entry
        self.status.update(self.kind, True, None, graph.kernel_count)
        self.status.graph = graph
        # this call's results: copies of the static outputs, as every replay returns them
        return self._outputs(entry, args, lambda dsts: graph.replay(None, dsts, run_kernels=False))

    def _refuse(self, key: tuple, args: list, reason: str, outs: Any = None) -> Any:
        self.entries[key] = _Entry(None, [], [], [], ([], [], None))
        self.status.update(
            self.kind,
            any(e.graph is not None for e in self.entries.values()),
            reason,
            self.status.parts.get(self.kind, [0, 0, 0])[2],
        )
        return outs if outs is not None else self.fn(args)

    # -- replay ------------------------------------------------------------------------

    def _replay(self, entry: _Entry, args: list, t0: int) -> list | None:
        """The replay, or None where the C++ guards missed (nothing ran)."""
        if async_copy.PENDING:
            async_copy.order_for_kernels([args[i] for i, _ in entry.copied])
        graph = entry.graph
        assert graph is not None, "only an entry with a recorded graph is replayed"
        tensors = args if entry.all_tensors else [args[i] for i in entry.tensor_idx]
        with self.lock:
            fresh = graph.call(tensors)
        if fresh is None:
            return None
        if entry.simple:
            out = fresh
        else:  # views of the caller's inputs and plain values among the results
            made = iter(fresh)
            out = []
            for spec in entry.out_specs[0]:
                kind = spec[0]
                if kind in ("own", "fresh"):
                    out.append(next(made))
                elif kind == "value":
                    out.append(spec[1])
                else:
                    a = args[spec[1]]
                    out.append(a.as_strided(spec[2], spec[3], a.storage_offset() + spec[4]))
        args.clear()  # the boxed convention: the callee drops its inputs
        self.status.replays += 1
        took = time.perf_counter_ns() - t0
        self.status.replay_ns += took
        self.status.last_replay_ns = took
        return out

    @staticmethod
    def _outputs(entry: _Entry, args: list, run: Callable) -> list:
        specs, sizes, device = entry.out_specs
        owned = entry.owned
        regions: list = [None] * len(sizes)
        dsts = [0] * len(sizes)
        for n, size in enumerate(sizes):
            if not owned[n]:
                regions[n] = r = torch.empty(size, dtype=torch.uint8, device=device)
                dsts[n] = r.data_ptr()
        outs = []
        for spec in specs:
            kind = spec[0]
            if kind == "own":
                t = torch.empty_strided(spec[2], spec[3], dtype=spec[4], device=device)
                dsts[spec[1]] = t.data_ptr()
                outs.append(t)
            elif kind == "fresh":
                storage = regions[spec[1]].untyped_storage()
                outs.append(torch.empty(0, dtype=spec[4], device=device).set_(storage, spec[5], spec[2], spec[3]))
            elif kind == "value":
                outs.append(spec[1])
            else:
                a = args[spec[1]]
                outs.append(a.as_strided(spec[2], spec[3], a.storage_offset() + spec[4]))
        run(dsts)
        args.clear()  # the boxed convention: the callee drops its inputs
        return outs


def replayable(fn: Callable, status: ReplayStatus, kind: str = "inference", bounded: bool = False) -> ReplayedGraph:
    """Wrap a boxed aten graph (make_boxed_func) of `kind` ("inference", "forward", "backward") for replay
    (bounded: not recorded where its buffers would exceed AUTO_MAX_BYTES).
    Called inside AOTAutograd's compiler, where its metadata says which inputs of an inference or forward
    graph are parameters/buffers (used in place, not copied) and which inputs the graph mutates; a backward
    graph's inputs (saved tensors, gradients) are all copied."""
    static: set[int] = set()
    mutated: set[int] = set()
    ctx = torch._guards.TracingContext.try_get()
    meta = getattr(ctx, "fw_metadata", None)
    if meta is not None and kind != "backward":
        static = set(getattr(meta, "static_input_indices", ()) or ())
        mutated = {
            i for i, info in enumerate(getattr(meta, "input_info", ())) if info.mutates_data or info.mutates_metadata
        }
    return ReplayedGraph(fn, static, mutated, status, kind, AUTO_MAX_BYTES if bounded else None)
