"""Kernel graphs: a piece of work recorded once as the list of plugin kernel
calls it made, then replayed by one C function with no per-op Python.

Why: a compiled graph of small ops spends most of its time in the dispatcher
(Python or the C++ fast path: keying the call, allocating outputs) rather than
in the kernels. When every op of the graph is a plugin kernel call, the calls
themselves are all that is left to do: the same kernels on the same buffers
with the same arguments, like a CUDA graph (torch.cuda.graphs) or
torch.accelerator.Graph.

While a `Recorder` is active (`recording()`), `run_native` hands it every
kernel call it makes (the kernel, the device, the descriptor and argument
arrays as built: the descriptors hold the buffers' addresses), and the C++
fast path steps aside so every call is seen. Whatever else touches device
memory makes the recording unusable, with a reason naming the op: a CPU
fallback, a copy between host and device, a host read of device memory
(`.item()`, a zero-copy host view), a kernel launched without run_native, an
op that draws random numbers (a replay would repeat them), work on another
thread or another device. The recorder keeps every storage it saw alive (the
static buffers, like a CUDA graph's memory pool): the recorded addresses stay
valid for the life of the graph.

`KernelGraph` hands the recorded list to the C++ core (csrc/fl_graph.cpp,
fl_core_graph_*): a replay copies the caller's inputs into the static input
buffers, calls every kernel in order, checks each status (a failure raises the
plugin's error naming the op and step) and copies the static outputs out.
What is an input or an output, and when a graph may be replayed at all, is
the caller's business (torch_fl.compile.replay for torch.compile graphs)."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch

from ..errors import FlError
from . import core, events
from .events import COPY, FALLBACK, JIT, NATIVE
from .native import kernel_call
from .tensor import is_fl, iter_tensors

if TYPE_CHECKING:
    from .registry import Device


class Recorder:
    """What a recording saw: the kernel calls in order, the storages they touched,
    and the first reason (if any) the work cannot be replayed."""

    def __init__(self) -> None:
        self.steps: list[list] = []  # [name, kernel, dev, inputs, out_descs, cargs, path]
        self.keep: list = []  # storages and kernel entries the recorded calls need alive
        self.reason: str | None = None
        self.counted: list[tuple[str, str]] = []  # (op, path) of each call the dispatcher counted, in order
        # a path that declines a call refuses the recording: what an unrecorded call would do may differ (a
        # recording takes no memory copy or fill, so a device-only decomposition can fail where it would not)
        self.strict = False
        self.device: Device | None = None
        self._host: str | None = None  # a host transfer not yet tied to an op
        self._thread = threading.get_ident()
        self._seen: set[int] = set()

    def declined(self, name: str) -> None:
        """A path of op `name` declined its call (the dispatcher tried the next one)."""
        if self.strict:
            self.refuse(f"a path of {name} declined its call during the recording")

    def refuse(self, reason: str) -> None:
        """The recorded work cannot be replayed; the first reason is the one reported."""
        if self.reason is None:
            self.reason = reason

    def kernel(self, f, kernel, dev, vals, outs, inputs: list, out_descs: list, cargs: list) -> None:
        """run_native made this call (it succeeded)."""
        if threading.get_ident() != self._thread:
            self.refuse(f"{f.name} ran on another thread during the recording")
            return
        if _draws_random(f, vals):
            self.refuse(f"{f.name} draws random numbers (a replay would repeat the same ones)")
        if self.device is None:
            self.device = dev
        elif dev is not self.device:
            self.refuse(f"{f.name} ran on {dev.torch_device}, the recording began on {self.device.torch_device}")
        for t in iter_tensors(list(vals) + list(outs)):
            if is_fl(t):
                s = t.untyped_storage()
                if s.data_ptr() not in self._seen:
                    self._seen.add(s.data_ptr())
                    self.keep.append(s)
        self.keep.append(kernel)
        self.steps.append([f.name, kernel, dev, list(inputs), list(out_descs), list(cargs), NATIVE])

    def op(self, name: str, path: str) -> None:
        """The dispatcher served op `name` by `path` (events.count)."""
        self.counted.append((name, path))
        if threading.get_ident() != self._thread:
            self.refuse(f"{name} ran on another thread during the recording")
        elif path == FALLBACK:
            self.refuse(f"{name} runs as a CPU fallback{self._where()}")
        elif path == COPY:
            self.refuse(f"{name} copies between the host and the device{self._where()}")
        elif self._host is not None:
            self.refuse(f"{name} {self._host}{self._where()}")
        elif path == JIT:  # the JIT kernel run_native just recorded is counted as a JIT call
            for step in reversed(self.steps):
                if step[0] != name or step[6] != NATIVE:
                    break
                step[6] = JIT
        self._host = None

    @staticmethod
    def _where() -> str:
        where = events.STATE.op_context()
        return f" (in {where})" if where else ""

    def transfer(self, what: str) -> None:
        """Device memory was read or written from the host (the op is named when it is counted)."""
        if threading.get_ident() != self._thread:
            self.refuse(f"another thread {what} during the recording")
        elif self._host is None:
            self._host = what


@contextmanager
def recording() -> Iterator[Recorder]:
    """Record the plugin kernel calls made inside the block (this thread; the C++ fast path off)."""
    if events.STATE.recording is not None:
        raise FlError("a kernel graph is already being recorded")
    from .native import sync_fast_path

    lib = core.lib()
    rec = Recorder()
    k0, f0, d0 = events.STATE.kernels, lib.fl_core_fast_hits(), lib.fl_core_decomp_hits()
    events.STATE.recording = rec
    sync_fast_path()
    try:
        yield rec
    finally:
        events.STATE.recording = None
        sync_fast_path()
        if rec._host is not None:
            rec.refuse(f"device memory was {rec._host.removeprefix('reads ').removeprefix('writes ')} outside any op")
        launched = events.STATE.kernels - k0
        if launched != len(rec.steps):
            rec.refuse(f"{launched - len(rec.steps)} kernel(s) were launched without run_native (not recordable)")
        if lib.fl_core_fast_hits() != f0 or lib.fl_core_decomp_hits() != d0:
            rec.refuse("the C++ fast path served calls during the recording")


def _draws_random(f, vals) -> bool:
    """An op PyTorch tags as seeded (dropout, fused attention, bernoulli, ...) unless this call's
    probability is 0 or it is not training: then it draws nothing."""
    func = getattr(f, "func", None)
    if func is None or torch.Tag.nondeterministic_seeded not in getattr(func, "tags", ()):
        return False
    for arg, v in zip(func._schema.arguments, vals, strict=False):
        if (arg.name in ("dropout_p", "p") and isinstance(v, (int, float)) and v == 0) or (
            arg.name == "train" and v is False
        ):
            return False
    return True


def _layout(shape, stride, dtype: torch.dtype) -> tuple:
    """An fl_core_layout_t for shape/stride/dtype, and the arrays it points at (keep them until the call)."""
    ffi = core.ffi
    sizes, strides = ffi.new("int64_t[]", list(shape)), ffi.new("int64_t[]", list(stride))
    layout = ffi.new("fl_core_layout_t *", {"ndim": len(shape), "sizes": sizes, "strides": strides})
    layout.dtype = core.scalar_type_code(dtype)
    return layout, (sizes, strides)


def _replay_op(graph: int, tensors: Sequence[torch.Tensor]) -> list:
    """fl_graph::replay, looked up once the core is loaded (its library registers the op)."""
    global _REPLAY_OP
    core.lib()
    # the overload's C++ callable itself: its Python __call__ adds ~0.3 us to every replay
    _REPLAY_OP = torch.ops.fl_graph.replay.default._op
    return _REPLAY_OP(graph, tensors)


_REPLAY_OP = _replay_op


def _addresses(addresses: Sequence[int]):
    """The caller's buffer addresses as fl_core_graph_replay takes them: a `uintptr_t[]` filled in one call
    (a `void *` cast per address cost ~1.5 us each, the largest part of a small graph's replay), passed as
    `void **` (the same width on every platform the core builds for). The array owns the memory: keep it
    referenced until the call returns."""
    if core.ffi.sizeof("uintptr_t") != core.ffi.sizeof("void *"):  # pragma: no cover - no such platform here
        raise FlError("uintptr_t and void * differ in width on this platform: graph replay cannot pass addresses")
    return core.ffi.new("uintptr_t[]", addresses)


class KernelGraph:
    """A recording as the C++ core's kernel list. inputs: (address, nbytes) of the
    static input buffers each replay copies the caller's inputs into; outputs:
    (address, nbytes) of the static outputs each replay copies out. The recorder's
    storages stay alive as long as this object. counted=False: a replay counts no
    call (its owner counts what the recording counted: dispatch.decomp_replay)."""

    def __init__(
        self,
        rec: Recorder,
        inputs: Sequence[tuple[int, int]] = (),
        outputs: Sequence[tuple[int, int]] = (),
        counted: bool = True,
    ) -> None:
        if rec.reason is not None:
            raise FlError(f"this recording cannot be replayed: {rec.reason}")
        if rec.device is None:
            raise FlError("this recording made no kernel call")
        self.device = rec.device
        self.names = [s[0] for s in rec.steps]
        self.keep = rec.keep
        self.n_inputs, self.n_outputs = len(inputs), len(outputs)
        lib = core.lib()
        self._lib = lib
        self._g = lib.fl_core_graph_new(self.device.index)
        if not self._g:
            raise FlError(f"the C++ core does not know {self.device.torch_device}")
        self._handle = int(core.ffi.cast("intptr_t", self._g))  # what fl_graph::replay takes
        for name, kernel, dev, ins, outs, cargs, path in rec.steps:
            slot = core.count_slot(dev.backend, name, path) if counted else -1
            call, arrays = kernel_call(kernel, dev.local, ins, outs, cargs, slot)
            lib.fl_core_graph_add_kernel(self._g, call)  # copies the call (arrays lives until then)
        for ptr, n in inputs:
            lib.fl_core_graph_add_input(self._g, core.pointer(ptr), n)
        for ptr, n in outputs:
            lib.fl_core_graph_add_output(self._g, core.pointer(ptr), n)
        self.bound = [False] * self.n_inputs  # bind_inputs(): the static inputs call() reads in place
        self.direct = [False] * self.n_outputs  # bind_outputs(): the static outputs call() writes in place
        self._failed = core.ffi.new("int64_t *")
        self._missed = core.ffi.new("int *")

    @property
    def kernel_count(self) -> int:
        return int(self._lib.fl_core_graph_size(self._g))

    def bind_inputs(self) -> list[bool]:
        """Let call() read each static input in place where no kernel writes into it: the kernels that read
        its buffer are pointed at the caller's tensor for the call, and its copy is skipped (replay() still
        copies). Why only unwritten ones: a kernel writing into a bound input would write the caller's tensor.
        Per input, whether it is bound."""
        self.bound = [self._lib.fl_core_graph_bind_input(self._g, k) == 1 for k in range(self.n_inputs)]
        return self.bound

    def bind_outputs(self, which: Sequence[int] | None = None) -> list[bool]:
        """Let call() (and the decomposition plans) have the kernels write each static output in `which` (None:
        all) straight into the call's fresh result, skipping its copy out (replay() still copies). Why only
        fresh results: a kernel writing into a caller's tensor while others read it would change what they
        read. The core refuses an output whose first kernel does not write all of it without reading it (then a
        result's prior bytes could matter), and one whose bytes another output shares. Per output, whether it
        is written directly."""
        ks = range(self.n_outputs) if which is None else which
        chosen = {k for k in ks if self._lib.fl_core_graph_bind_output(self._g, k) == 1}
        self.direct = [k in chosen for k in range(self.n_outputs)]
        return self.direct

    def replay(
        self, in_src: Sequence[int] | None, out_dst: Sequence[int] | None, run_kernels: bool = True, step_ns=None
    ) -> None:
        """One replay: in_src are the addresses of the caller's input bytes (one per static input; None: no
        input copies), out_dst where the static outputs go (None: no output copies). step_ns (an int64_t[]
        of kernel_count entries, core.ffi.new("int64_t[]", n)) receives each kernel's own time in ns."""
        ffi = core.ffi
        ins = _addresses(in_src) if in_src is not None else None  # owners, alive until the call returns
        outs = _addresses(out_dst) if out_dst is not None else None
        status = self._lib.fl_core_graph_replay(
            self._g,
            ffi.NULL if ins is None else ffi.cast("void **", ins),
            ffi.NULL if outs is None else ffi.cast("void **", outs),
            int(run_kernels),
            self._failed,
            ffi.NULL if step_ns is None else step_ns,
        )
        if status != 0:
            self._raise(status, self._failed[0])
        if run_kernels:
            events.STATE.kernels += len(self.names)

    # -- the whole call in C++ (fl_graph::replay) ----------------------------------------

    def guard_tensor(self, t: torch.Tensor, copied: bool) -> None:
        """The next tensor argument of call(): its layout must match t's; copied: its bytes go to the next
        static input (in the order they were added), else it is used in place and must be at t's address."""
        layout, keep = _layout(t.shape, t.stride(), t.dtype)
        if self._lib.fl_core_graph_guard_tensor(
            self._g, int(copied), core.ffi.NULL if copied else core.pointer(t.data_ptr()), layout
        ):
            raise FlError("fl_core_graph_guard_tensor refused an argument")
        del keep

    def out_tensor(self, region: int, own: bool, shape, stride, dtype: torch.dtype, offset: int) -> None:
        """The next result of call(): a tensor of its own whose bytes are static output `region` (own), or a
        view at `offset` elements into that region, which results share."""
        layout, keep = _layout(shape, stride, dtype)
        if self._lib.fl_core_graph_out_tensor(self._g, region, int(own), layout, offset):
            raise FlError(f"fl_core_graph_out_tensor refused result region {region}")
        del keep

    def out_view(self, arg: int, shape, stride, dtype: torch.dtype, offset: int) -> None:
        """The next result of call(): a view of its tensor argument `arg` with this layout, `offset` elements past
        that tensor's storage offset (made in C++, as the fresh results are: no Python per output)."""
        layout, keep = _layout(shape, stride, dtype)
        if self._lib.fl_core_graph_out_view(self._g, arg, layout, offset):
            raise FlError(f"fl_core_graph_out_view refused a view of argument {arg}")
        del keep

    def out_none(self) -> None:
        """The next result of call() is None (a backward graph's gradient that is not computed)."""
        if self._lib.fl_core_graph_out_none(self._g):
            raise FlError("fl_core_graph_out_none refused")

    def call(self, tensors: Sequence[torch.Tensor]) -> list | None:
        """The replay as one op (fl_graph::replay): the guards on `tensors` (as guard_tensor declared them),
        the fresh results (as out_tensor declared them), the kernels. None where a guard missed: nothing
        ran. A failing kernel raises as replay() does."""
        outs = _REPLAY_OP(self._handle, tensors)
        if not outs:
            status = self._lib.fl_core_graph_last_call(self._g, self._missed, self._failed)
            if self._missed[0]:
                return None
            if status != 0:
                self._raise(status, self._failed[0])
        events.STATE.kernels += len(self.names)
        return outs

    def release(self):
        """The core's graph handle, no longer this object's to free (fl_core_decomp_commit takes it over): the
        buffers its kernels use must then be kept alive by whoever owns it."""
        g, self._g, self._handle = self._g, None, 0
        return g

    def _raise(self, status: int, failed: int) -> None:
        if failed >= 0:
            what = f"kernel {self.names[failed]} (step {failed} of {len(self.names)} in a graph replay)"
        elif -failed - 1 < self.n_inputs:
            what = f"copy_d2d of input {-failed - 1} into a graph replay's static buffer"
        else:
            what = f"copy_d2d of output {-failed - 1 - self.n_inputs} out of a graph replay"
        self.device.plugin.check(status, what)
        raise FlError(f"{what} failed with status {status}")

    def __del__(self) -> None:
        g, self._g = getattr(self, "_g", None), None
        if g:
            self._lib.fl_core_graph_free(g)
