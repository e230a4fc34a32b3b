"""The `fl` process group: torch.distributed collectives on fl tensors.

Why a process group of our own: gloo rejects fl tensors (PrivateUse1), and
a plugin that ships collectives (a vendor's NCCL-like library) must run them
on device memory without a trip through the host. PyTorch lets a Python
class stand in for a whole ProcessGroup (its pybind trampoline forwards the
virtual collectives, which is what DDP's C++ reducer calls), so this is a
`torch.distributed.ProcessGroup` subclass registered as backend "fl" for the
devices "fl" and "cpu".

Each call takes one of three paths, decided per call from the tensors:
  comm-plugin  fl tensors on the group's backend, whose plugin declares the
               comm_* entry points: the plugin moves the data (in place, on
               the device);
  comm-relay   any other fl tensor: copy to the host, run gloo, copy back
               (zero-copy when the device memory is host accessible);
  comm-gloo    CPU tensors (object collectives, user CPU tensors): gloo.
All three share one ordered queue (see work.py), so mixing them cannot
reorder calls between ranks. The group's gloo runs on a PrefixStore of the
same c10d store, and the plugin's unique id is exchanged through that store
too: torch.distributed's rendezvous (env://, tcp://, torchrun) is the only
transport set-up there is."""

from __future__ import annotations

import datetime
import json
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import (
    AllgatherOptions,
    AllreduceCoalescedOptions,
    AllreduceOptions,
    AllToAllOptions,
    BarrierOptions,
    BroadcastOptions,
    GatherOptions,
    PrefixStore,
    ProcessGroupGloo,
    ReduceOp,
    ReduceOptions,
    ReduceScatterOptions,
    ScatterOptions,
)

from ..runtime import REGISTRY, abi, async_copy, config, desc, device_of, events, ffi, host_view, is_fl
from .work import BackendMismatchError, CollectiveError, FlWork, Worker

BACKEND_NAME = "fl"
RELAY_ENV = "FL_DIST_RELAY"
PLUGIN, RELAY, GLOO = "comm-plugin", "comm-relay", "comm-gloo"
PATHS = (PLUGIN, RELAY, GLOO)
_KEY = "torch_fl/"

_REDUCE_CODES = (("SUM", 0), ("PRODUCT", 1), ("MIN", 2), ("MAX", 3), ("AVG", 4))  # fl_reduce_op_t
_BITWISE = ("BAND", "BOR", "BXOR")

# process-group method -> (public torch.distributed name, gloo method, argument roles).
# A role says how a tensor argument travels through the relay: "in" (copied to the
# host), "out" (copied back), "inout" (both); None marks a non-tensor argument.
_OPS: dict[str, tuple[str, str, tuple]] = {
    "allreduce": ("all_reduce", "allreduce", ("inout", None)),
    "allreduce_coalesced": ("all_reduce_coalesced", "allreduce_coalesced", ("inout", None)),
    "broadcast": ("broadcast", "broadcast", ("inout", None)),
    "allgather": ("all_gather", "allgather", ("out", "in", None)),
    "allgather_coalesced": ("all_gather_coalesced", "allgather_coalesced", ("out", "in", None)),
    "all_gather_single": ("all_gather_into_tensor", "_allgather_base", ("out", "in", None)),
    "reduce_scatter": ("reduce_scatter", "reduce_scatter", ("out", "in", None)),
    "reduce_scatter_single": ("reduce_scatter_tensor", "_reduce_scatter_base", ("out", "in", None)),
    "reduce": ("reduce", "reduce", ("inout", None)),
    "gather": ("gather", "gather", ("out", "in", None)),
    "scatter": ("scatter", "scatter", ("out", "in", None)),
    "alltoall": ("all_to_all", "alltoall", ("out", "in", None)),
    "all_to_all_single": ("all_to_all_single", "alltoall_base", ("out", "in", None, None, None)),
    "send": ("send", "send", ("in", None, None)),
    "recv": ("recv", "recv", ("out", None, None)),
    "barrier": ("barrier", "barrier", (None,)),
}
# the calls a plugin's comm_* entry points serve; the rest always relay
_PLUGIN_OPS = {
    "allreduce",
    "allreduce_coalesced",
    "broadcast",
    "allgather",
    "all_gather_single",
    "reduce_scatter",
    "reduce_scatter_single",
    "send",
    "recv",
    "barrier",
}


# -- registration ------------------------------------------------------------------


def register() -> None:
    """Registers "fl" with torch.distributed, once per process.

    devices=["fl", "cpu"]: `init_process_group("fl")` then serves CPU tensors
    too (object collectives, barrier), and c10d's default backend for the
    `fl` accelerator becomes "fl", so `init_process_group()` with no backend
    picks it the way it picks NCCL for CUDA."""
    if not dist.is_available() or "FL" in dist.Backend._plugins:
        return
    dist.Backend.register_backend(BACKEND_NAME, _create, extended_api=False, devices=["fl", "cpu"])


def _create(store, rank: int, world: int, timeout: datetime.timedelta) -> ProcessGroupFl:
    return ProcessGroupFl(store, rank, world, timeout)


# -- helpers ----------------------------------------------------------------------


def _host_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"


def _walk(obj: Any) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            yield from _walk(x)


def _reduce_name(op) -> str:
    for name in [n for n, _ in _REDUCE_CODES] + list(_BITWISE) + ["PREMUL_SUM"]:
        if op == getattr(ReduceOp, name):
            return name
    return str(op)


def _ptr(t: torch.Tensor) -> int:
    return t.data_ptr()


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _align(n: int) -> int:
    return (n + 63) // 64 * 64


# -- the process group ----------------------------------------------------------------


class ProcessGroupFl(dist.ProcessGroup):
    """torch.distributed's process group for fl tensors (backend name "fl").

    Users never construct it: `dist.init_process_group("fl")` (or with no
    backend, in a process that imported torch_fl) does. All ranks must have
    selected the same fl backend; they meet in the constructor through the
    c10d store, which also carries the plugin's communicator id."""

    def __init__(self, store, rank: int, world: int, timeout: datetime.timedelta):
        # the stub lists only (store, rank, size); pybind also binds (rank, size), the Python subclass's constructor
        super().__init__(rank, world)  # type: ignore[call-arg]
        self._rank, self._world = rank, world
        self._timeout = timeout
        self._timeout_s = timeout.total_seconds()
        self.backend = REGISTRY.ensure()
        cur = REGISTRY.current_device
        self.device = cur if cur is not None and cur.backend is self.backend else self.backend.devices[0]
        self.ranks_info = self._meet(store)
        self.path = self._choose_path()
        self._gloo = ProcessGroupGloo(PrefixStore(_KEY + "gloo/", store), rank, world, timeout)
        self._comm = None
        if self.path == "plugin":
            self._comm = self._comm_init(store)
        self._worker = Worker(f"torch_fl-pg-rank{rank}")
        self._arena = torch.empty(0, dtype=torch.uint8)  # the relay's host staging memory (see _relay_call)
        self._closed = False

    # -- start-up -------------------------------------------------------------
    def _meet(self, store) -> list[dict]:
        """Every rank publishes what it runs; a rank on another backend (or one
        that never arrives) fails every rank now, not at the first collective."""
        caps = self.backend.capabilities
        mine = {
            "rank": self._rank,
            "backend": self.backend.name,
            "plugin": os.path.basename(caps.plugin_path),
            "emulated": caps.emulated,
            "collectives": caps.collectives_path,
            "host": _host_id(),
            "relay_forced": config.env_bool(RELAY_ENV, False),
            "pid": os.getpid(),
        }
        store.set(f"{_KEY}rank/{self._rank}", json.dumps(mine))
        keys = [f"{_KEY}rank/{r}" for r in range(self._world)]
        try:
            store.wait(keys, self._timeout)
        except Exception as e:  # noqa: BLE001 - the store's own timeout error, re-raised with the ranks missing
            missing = [r for r, k in enumerate(keys) if not store.check([k])]
            raise CollectiveError(
                f"fl process group: rank(s) {missing} did not join within {self._timeout_s:.0f} s. Every rank must "
                "call init_process_group with backend 'fl' (or none, after importing torch_fl); a rank that "
                f"chose another backend (gloo, nccl) or died never arrives ({e})"
            ) from e
        infos = [json.loads(store.get(k)) for k in keys]
        names = sorted({i["backend"] for i in infos})
        if len(names) > 1:
            # every rank reads the others' entries before any raises: rank 0 hosts the store,
            # and a rank 0 that exits at once would leave the others a store error instead
            store.set(f"{_KEY}read/{self._rank}", "1")
            try:
                store.wait([f"{_KEY}read/{r}" for r in range(self._world)], self._timeout)
            except Exception:  # noqa: BLE001 - the mismatch below is the error worth reporting
                pass
            per_rank = ", ".join(f"rank {i['rank']}: {i['backend']}" for i in infos)
            raise BackendMismatchError(
                f"fl process group: the ranks selected different fl backends ({per_rank}). Every rank must run the "
                f"same backend: set FL_BACKEND (e.g. FL_BACKEND={infos[0]['backend']}) for every rank, or call "
                "fl.initialize(<name>) with the same name before init_process_group"
            )
        return infos

    def _choose_path(self) -> str:
        caps = self.backend.capabilities
        if caps.collectives_path != "plugin" or any(i["relay_forced"] for i in self.ranks_info):
            return "cpu-relay"
        if caps.emulated and len({i["host"] for i in self.ranks_info}) > 1:
            return "cpu-relay"  # an emulator's collectives move data through one host's shared memory
        return "plugin"

    def _comm_init(self, store):
        key = f"{_KEY}uid"
        if self._rank == 0:
            store.set(key, uuid.uuid4().hex)
        store.wait([key], self._timeout)
        uid = store.get(key).decode()
        out = ffi.new("void**")
        p = self.backend.plugin
        timeout_ms = max(1, min(int(self._timeout_s * 1000), 2**31 - 1))
        st = p.table.comm_init(self.device.local, uid.encode(), self._rank, self._world, timeout_ms, out)
        if st:
            raise CollectiveError(
                f"fl process group: the '{self.backend.name}' plugin's comm_init failed on rank "
                f"{self._rank}: {p.last_error() or 'no message'}"
            )
        return out[0]

    # -- identity ---------------------------------------------------------------
    def getBackendName(self) -> str:  # noqa: N802 - the C++ virtual's name
        return BACKEND_NAME

    def _get_backend_name(self) -> str:
        return BACKEND_NAME

    def __repr__(self) -> str:
        return f"<ProcessGroupFl rank {self._rank}/{self._world} backend {self.backend.name} collectives {self.path}>"

    # -- the dispatch of one call --------------------------------------------------
    def _submit(
        self, method: str, args: tuple, *, reduce_op=None, root: int | None = None, peer: int | None = None
    ) -> FlWork:
        if self._closed:
            raise CollectiveError(f"fl process group: {_OPS[method][0]} called after the group was destroyed")
        public, gloo_method, roles = _OPS[method]
        what = f"fl process group: {public} on rank {self._rank}"
        tensors = list(_walk(args))
        fl = [t for t in tensors if is_fl(t)]
        others = [t for t in tensors if not is_fl(t)]
        if fl and others:
            devs = sorted({str(t.device) for t in tensors})
            raise ValueError(
                f"{public}: the tensors of one collective must all be on one device; got {devs}. "
                "Move them with .to(...) first"
            )
        for t in others:
            if t.device.type != "cpu":
                raise ValueError(
                    f"{public}: the fl process group takes fl and CPU tensors, not {t.device}; "
                    "use a process group of that device's backend"
                )
        devices = {device_of(t) for t in fl}
        if len(devices) > 1:
            raise ValueError(
                f"{public}: the tensors of one collective must all be on one fl device; got "
                f"{sorted(str(d.torch_device) for d in devices)}"
            )
        for t in fl:
            if not t.is_contiguous():
                raise ValueError(
                    f"{public}: collectives need contiguous tensors (got shape {tuple(t.shape)}, strides "
                    f"{t.stride()}); pass tensor.contiguous()"
                )
        op_name = code = None
        if reduce_op is not None:
            op_name = _reduce_name(reduce_op)
            code = dict(_REDUCE_CODES).get(op_name)
            if code is None and op_name not in _BITWISE:
                raise ValueError(
                    f"{public}: ReduceOp.{op_name} is not supported by the fl process group; use SUM, "
                    "AVG, PRODUCT, MIN, MAX (or BAND/BOR/BXOR on integer tensors)"
                )
            if op_name == "AVG":
                bad = [t.dtype for t in tensors if not (t.is_floating_point() or t.is_complex())]
                if bad:
                    raise ValueError(
                        f"{public}: ReduceOp.AVG needs floating-point tensors, got {bad[0]}; all_reduce "
                        "with SUM and divide by the world size"
                    )
        if fl:
            async_copy.wait_for(fl)  # copies into these buffers land before the collective reads them
        device = next(iter(devices)) if devices else None
        if device is None:
            path = GLOO
        elif (
            self._comm is not None
            and device.backend is self.backend
            and method in _PLUGIN_OPS
            and (reduce_op is None or code is not None)
        ):
            path = PLUGIN
        else:
            path = RELAY
        in_bytes = out_bytes = 0
        flat_roles = self._roles(method, roles, root)
        for arg, role in zip(args, flat_roles, strict=True):
            n = sum(_nbytes(t) for t in _walk(arg))
            in_bytes += n if role in ("in", "inout") else 0
            out_bytes += n if role in ("out", "inout") else 0
        comm_bytes = max(in_bytes, out_bytes)
        if path == PLUGIN:
            run, staged = self._plugin_call(method, args, code, root, peer, device, gloo_method, flat_roles), 0
        elif path == RELAY:
            run, staged = self._relay_call(gloo_method, args, flat_roles, device)
        else:
            run, staged = self._gloo_call(gloo_method, args), 0
        result = [t for t in _walk(args[0])] if roles[0] in ("out", "inout") else []
        backend_name = device.backend.name if device is not None else "host"
        label = f"c10d::{public}"

        def execute() -> None:
            t0 = time.perf_counter()
            run()
            if events.STATE.listeners:
                events.emit(
                    events.OpEvent(
                        label, backend_name, path, time.perf_counter() - t0, 0, staged, 0, t0, comm_bytes=comm_bytes
                    )
                )

        source = peer if method == "recv" and peer is not None else -1
        work = FlWork(f"{what} ({path})", execute, result, self._timeout_s, source_rank=source)
        opts = args[-1]
        return self._worker.submit(work, inline=getattr(opts, "asyncOp", True) is False)

    def _roles(self, method: str, roles: tuple, root: int | None) -> tuple:
        """Broadcast and reduce move data one way on most ranks: the root's
        tensor only goes out (broadcast) and the others' only come back."""
        if method == "broadcast":
            return ("in" if self._rank == root else "out", None)
        if method == "reduce":
            return ("inout" if self._rank == root else "in", None)
        return roles

    # -- the three paths -----------------------------------------------------------
    def _plugin_call(
        self,
        method: str,
        args: tuple,
        code: int | None,
        root: int | None,
        peer: int | None,
        device,
        gloo_method: str = "",
        roles: tuple = (),
    ) -> Callable[[], None]:
        p, T, comm = self.backend.plugin, self.backend.plugin.table, self._comm
        local = device.local
        what = f"the '{self.backend.name}' plugin's comm"

        def d(t: torch.Tensor):
            return ffi.new("fl_tensor_t*", desc(t))

        def check(st: int, name: str) -> None:
            if st:  # FlWork turns it into a CollectiveError (a CollectiveTimeoutError for timeouts)
                raise RuntimeError(f"{what}_{name} failed: {p.last_error() or 'no message'}")

        if method in ("allreduce", "allreduce_coalesced"):
            descs = [d(t) for t in args[0]]

            def run_all_reduce() -> None:
                for t, x in zip(args[0], descs, strict=True):
                    st = T.comm_all_reduce(local, x, code, comm)
                    if st == abi.FL_ERR_UNSUPPORTED:
                        # the plugin declines this dtype or op (a bool "stop" flag under MAX): the host relay
                        # serves it, on every rank alike, since every rank's plugin declines the same call
                        self._relay_call(gloo_method, ([t], *args[1:]), roles, device)[0]()
                        continue
                    check(st, "all_reduce")

            return run_all_reduce
        if method == "broadcast":
            descs = [d(t) for t in args[0]]

            def run_broadcast() -> None:
                for x in descs:
                    check(T.comm_broadcast(local, x, root, comm), "broadcast")

            return run_broadcast
        if method == "all_gather_single":
            o, i = d(args[0]), d(args[1])
            return lambda: check(T.comm_all_gather(local, i, o, comm), "all_gather")
        if method == "reduce_scatter_single":
            o, i = d(args[0]), d(args[1])
            return lambda: check(T.comm_reduce_scatter(local, i, o, code, comm), "reduce_scatter")
        if method == "allgather":
            outs, ins = args[0], args[1]
            jobs = []
            for k, inp in enumerate(ins):
                self._check_list(outs[k], inp, "all_gather", "output")
                tmp = torch.empty(self._world * inp.numel(), dtype=inp.dtype, device=inp.device)
                jobs.append((d(inp), tmp, d(tmp), outs[k]))

            def run_allgather() -> None:
                for di, tmp, dt, targets in jobs:
                    check(T.comm_all_gather(local, di, dt, comm), "all_gather")
                    for r, o in enumerate(targets):
                        n = _nbytes(o)
                        p.copy_d2d(local, _ptr(o), _ptr(tmp) + r * n, n)

            return run_allgather
        if method == "reduce_scatter":
            outs, ins = args[0], args[1]
            jobs = []
            for k, out in enumerate(outs):
                self._check_list(ins[k], out, "reduce_scatter", "input")
                tmp = torch.empty(self._world * out.numel(), dtype=out.dtype, device=out.device)
                jobs.append((ins[k], tmp, d(tmp), d(out)))

            def run_reduce_scatter() -> None:
                for sources, tmp, dt, do in jobs:
                    for r, s in enumerate(sources):
                        n = _nbytes(s)
                        p.copy_d2d(local, _ptr(tmp) + r * n, _ptr(s), n)
                    check(T.comm_reduce_scatter(local, dt, do, code, comm), "reduce_scatter")

            return run_reduce_scatter
        if method in ("send", "recv"):
            fn, name = (T.comm_send, "send") if method == "send" else (T.comm_recv, "recv")
            descs = [d(t) for t in args[0]]

            def run_send_recv() -> None:
                for x in descs:
                    check(fn(local, x, peer, comm), name)

            return run_send_recv
        if method == "barrier":
            return lambda: check(T.comm_barrier(comm), "barrier")
        raise AssertionError(method)

    def _check_list(self, tensors: list, single: torch.Tensor, public: str, what: str) -> None:
        if len(tensors) != self._world:
            raise ValueError(
                f"{public}: the {what} list holds {len(tensors)} tensors; it needs one per rank ({self._world})"
            )
        for t in tensors:
            if t.shape != single.shape or t.dtype != single.dtype:
                raise ValueError(
                    f"{public}: every {what} tensor must match the other argument "
                    f"({single.dtype} {tuple(single.shape)}); got {t.dtype} {tuple(t.shape)}"
                )

    def _relay_call(self, gloo_method: str, args: tuple, roles: tuple, device) -> tuple[Callable[[], None], int]:
        """Host counterparts of the fl tensors, then gloo. Device memory that is
        host memory (the cpu plugin) is handed to gloo as it is; otherwise the
        inputs are copied into a host staging arena that the group keeps and
        reuses (fresh buffers would page-fault on every call), and the outputs
        copied back."""
        p, local, gloo = device.plugin, device.local, self._gloo
        tensors = [(t, role) for arg, role in zip(args, roles, strict=True) if role for t in _walk(arg)]

        def build(obj, role, host_of):
            if isinstance(obj, torch.Tensor):
                return host_of(obj, role)
            if isinstance(obj, (list, tuple)):
                return [build(x, role, host_of) for x in obj]
            return obj

        if device.host_accessible:
            host_args = [build(a, r, lambda t, _: host_view(t)) if r else a for a, r in zip(args, roles, strict=True)]

            def run_zero_copy() -> None:
                p.synchronize(local)
                getattr(gloo, gloo_method)(*host_args).wait()

            return run_zero_copy, 0

        staged = sum(_nbytes(t) * ((r in ("in", "inout")) + (r in ("out", "inout"))) for t, r in tensors)
        arena_bytes = sum(_align(_nbytes(t)) for t, _ in tensors)

        def run() -> None:
            if self._arena.numel() < arena_bytes:
                self._arena = torch.empty(arena_bytes, dtype=torch.uint8)
            arena, offset, back = self._arena, [0], []

            def host_of(t: torch.Tensor, role: str) -> torch.Tensor:
                n, off = _nbytes(t), offset[0]
                offset[0] += _align(n)
                h = arena[off : off + n].view(t.dtype).view(t.shape)
                if role in ("in", "inout") and n:
                    p.copy_d2h(local, h.data_ptr(), _ptr(t), n)
                if role in ("out", "inout") and n:
                    back.append((t, h, n))
                return h

            p.synchronize(local)
            host_args = [build(a, r, host_of) if r else a for a, r in zip(args, roles, strict=True)]
            getattr(gloo, gloo_method)(*host_args).wait()
            for t, h, n in back:
                p.copy_h2d(local, _ptr(t), h.data_ptr(), n)
            events.STATE.bytes_copied += staged

        return run, staged

    def _gloo_call(self, gloo_method: str, args: tuple) -> Callable[[], None]:
        gloo = self._gloo
        return lambda: getattr(gloo, gloo_method)(*args).wait() and None

    # -- torch.distributed's entry points ------------------------------------------
    def allreduce(self, tensors, opts=None):
        return self._submit(
            "allreduce", (tensors, opts or AllreduceOptions()), reduce_op=(opts or AllreduceOptions()).reduceOp
        )

    def allreduce_coalesced(self, tensors, opts=None):
        opts = opts or AllreduceCoalescedOptions()
        return self._submit("allreduce_coalesced", (tensors, opts), reduce_op=opts.reduceOp)

    def broadcast(self, tensors, opts=None):
        opts = opts or BroadcastOptions()
        return self._submit("broadcast", (tensors, opts), root=opts.rootRank)

    def allgather(self, output_tensors, input_tensors, opts=None):
        return self._submit("allgather", (output_tensors, input_tensors, opts or AllgatherOptions()))

    def allgather_coalesced(self, output_lists, input_tensors, opts=None):
        return self._submit("allgather_coalesced", (output_lists, input_tensors, opts or AllgatherOptions()))

    def all_gather_single(self, output, input, opts=None):  # noqa: A002 - torch's own argument name
        opts = opts or AllgatherOptions()
        if output.numel() != input.numel() * self._world or output.dtype != input.dtype:
            raise ValueError(
                f"all_gather_into_tensor: the output must hold world ({self._world}) x "
                f"{input.numel()} elements of {input.dtype}; got {output.numel()} of {output.dtype}"
            )
        return self._submit("all_gather_single", (output, input, opts))

    _allgather_base = all_gather_single

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        works = [self.all_gather_single(o, i, opts) for o, i in zip(outputs, inputs, strict=True)]
        return works[-1] if works else self.barrier()

    def reduce_scatter(self, output_tensors, input_lists, opts=None):
        opts = opts or ReduceScatterOptions()
        return self._submit("reduce_scatter", (output_tensors, input_lists, opts), reduce_op=opts.reduceOp)

    def reduce_scatter_single(self, output, input, opts=None):  # noqa: A002
        opts = opts or ReduceScatterOptions()
        if input.numel() != output.numel() * self._world or output.dtype != input.dtype:
            raise ValueError(
                f"reduce_scatter_tensor: the input must hold world ({self._world}) x "
                f"{output.numel()} elements of {output.dtype}; got {input.numel()} of {input.dtype}"
            )
        return self._submit("reduce_scatter_single", (output, input, opts), reduce_op=opts.reduceOp)

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        works = [self.reduce_scatter_single(o, i, opts) for o, i in zip(outputs, inputs, strict=True)]
        return works[-1] if works else self.barrier()

    def reduce(self, tensors, opts=None):
        opts = opts or ReduceOptions()
        return self._submit("reduce", (tensors, opts), reduce_op=opts.reduceOp, root=opts.rootRank)

    def gather(self, output_lists, input_tensors, opts=None):
        return self._submit("gather", (output_lists, input_tensors, opts or GatherOptions()))

    def scatter(self, output_tensors, input_lists, opts=None):
        return self._submit("scatter", (output_tensors, input_lists, opts or ScatterOptions()))

    def alltoall(self, output_tensors, input_tensors, opts=None):
        return self._submit("alltoall", (output_tensors, input_tensors, opts or AllToAllOptions()))

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):  # noqa: A002
        return self._submit(
            "all_to_all_single",
            (output, input, list(output_split_sizes), list(input_split_sizes), opts or AllToAllOptions()),
        )

    alltoall_base = all_to_all_single

    def send(self, tensors, dst_rank: int, tag: int = 0):
        self._check_peer(dst_rank, "send")
        return self._submit("send", (tensors, dst_rank, tag), peer=dst_rank)

    def recv(self, tensors, src_rank: int, tag: int = 0):
        self._check_peer(src_rank, "recv")
        return self._submit("recv", (tensors, src_rank, tag), peer=src_rank)

    def recv_anysource(self, tensors, tag: int = 0):
        raise ValueError(
            "recv: the fl process group needs the source rank (a plugin matches messages per pair of "
            "ranks); pass src= to dist.recv / dist.irecv"
        )

    def _check_peer(self, peer: int, what: str) -> None:
        if not 0 <= peer < self._world or peer == self._rank:
            raise ValueError(
                f"{what}: peer rank {peer} is not another rank of this group of {self._world} "
                f"(this is rank {self._rank})"
            )

    def barrier(self, opts=None):
        return self._submit("barrier", (opts or BarrierOptions(),))

    # -- coalescing (batch_isend_irecv, _coalescing_manager) -----------------------
    def _start_coalescing(self, device=None) -> None:
        """Calls inside the block are queued as they come; nothing to open."""

    def _end_coalescing(self, device=None):
        return _LastOf(self)

    # -- teardown ---------------------------------------------------------------
    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._worker.stop(timeout_s=min(self._timeout_s, 10.0))
        if self._comm is not None:
            self.backend.plugin.table.comm_destroy(self._comm)
            self._comm = None
        try:
            self._gloo.shutdown()
        except Exception:  # noqa: BLE001 - gloo may already be torn down by a failed peer
            pass

    def abort(self) -> None:
        self.shutdown()


def _LastOf(pg: ProcessGroupFl) -> FlWork:  # noqa: N802 - reads as a type at the call site
    """The works of a coalesced block ran in order on the group's queue, so
    waiting for an empty marker queued after them waits for all of them."""
    work = FlWork("fl process group: end of a coalesced block", lambda: None, [], pg._timeout_s)
    return pg._worker.submit(work)


def collectives_path(group: dist.ProcessGroup | None = None) -> str:
    """'plugin' or 'cpu-relay': how fl tensors travel in this group (default: the world group)."""
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    if not isinstance(pg, ProcessGroupFl):
        raise ValueError(f"{pg!r} is not an fl process group; create one with dist.init_process_group('fl')")
    return pg.path
