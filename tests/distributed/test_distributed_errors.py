"""The fl process group in this process: registration, the path each call
takes, the profiler's record, and every error path (bad arguments, ranks that
never arrive or run another backend, failed and late works). A one-rank group
on a HashStore is a real ProcessGroupFl (plugin communicator, gloo) without
touching torch.distributed's global state; the 2-process behaviour is in
test_distributed.py."""

from __future__ import annotations

import datetime
import json
import threading

import pytest
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import AllgatherOptions

import torch_fl as fl
from torch_fl.distributed import (
    BackendMismatchError,
    CollectiveError,
    CollectiveTimeoutError,
    FlWork,
    ProcessGroupFl,
)
from torch_fl.distributed.work import Worker, wrap_error

TIMEOUT = datetime.timedelta(seconds=10)


def group(backend: str, world: int = 1, store=None, timeout: datetime.timedelta = TIMEOUT) -> ProcessGroupFl:
    fl.initialize(backend)
    return ProcessGroupFl(store if store is not None else dist.HashStore(), 0, world, timeout)


def ar_opts(op=dist.ReduceOp.SUM) -> dist.AllreduceOptions:
    o = dist.AllreduceOptions()
    o.reduceOp = op
    return o


def test_registered_for_the_fl_and_cpu_devices():
    assert "fl" in dist.Backend.backend_list
    assert dist.Backend.backend_capability["fl"] == ["fl", "cpu"]
    assert dist.get_default_backend_for_device("fl") == "fl"  # init_process_group() with no backend picks it
    assert dist.get_default_backend_for_device("cpu") == "gloo"  # left as it was


@pytest.mark.parametrize(
    "backend,path,op_path",
    [("rocm", "plugin", "comm-plugin"), ("ascend", "cpu-relay", "comm-relay"), ("cpu", "cpu-relay", "comm-relay")],
)
def test_one_rank_group_paths_and_profile(backend, path, op_path):
    pg = group(backend)
    try:
        assert pg.path == path and pg.name() == "fl" and pg.size() == 1
        x = torch.tensor([1.5, -2.0, 4.0])
        t = x.to("fl")
        with fl.profile() as prof:
            pg.allreduce([t], ar_opts(dist.ReduceOp.AVG)).wait()
            out = torch.zeros(3).to("fl")
            pg.all_gather_single(out, t, AllgatherOptions()).wait()
            c = x.clone()
            pg.allreduce([c], ar_opts()).wait()
        assert torch.equal(t.cpu(), x) and torch.equal(out.cpu(), x) and torch.equal(c, x)
        rows = {(s.op, s.path): s for s in prof.collectives()}
        assert set(rows) == {
            ("c10d::all_reduce", op_path),
            ("c10d::all_gather_into_tensor", op_path),
            ("c10d::all_reduce", "comm-gloo"),
        }
        assert rows[("c10d::all_reduce", op_path)].comm_bytes == 12 and prof.comm_bytes == 12 + 12 + 12
        staged = 0 if backend != "ascend" else 2 * 12  # to the host and back; cpu memory is host memory
        assert rows[("c10d::all_reduce", op_path)].bytes_copied == staged
        assert "c10d::all_reduce" in prof.collectives_table() and "collectives: c10d::" in prof.render()
    finally:
        pg.shutdown()


def test_relay_can_be_forced(monkeypatch):
    monkeypatch.setenv("FL_DIST_RELAY", "1")
    pg = group("rocm")
    try:
        assert pg.path == "cpu-relay"
        t = torch.tensor([3.0, 5.0]).to("fl")
        with fl.profile() as prof:
            pg.broadcast([t], dist.BroadcastOptions()).wait()
        (row,) = prof.collectives()
        assert row.path == "comm-relay" and row.bytes_copied == 8  # the root's tensor only goes out
        assert t.cpu().tolist() == [3.0, 5.0]
    finally:
        pg.shutdown()


@pytest.fixture(scope="module")
def rocm_group():
    pg = group("rocm")
    yield pg
    pg.shutdown()


def test_bad_arguments_name_the_fix(rocm_group):
    pg = rocm_group
    fl.initialize("rocm")
    dev = fl.device("rocm")
    square = torch.ones(4, 4).to(dev)
    with pytest.raises(ValueError, match=r"contiguous tensors .*pass tensor.contiguous\(\)"):
        pg.allreduce([square.t()], ar_opts())
    with pytest.raises(ValueError, match=r"all be on one device; got \['cpu', 'fl:"):
        pg.allgather([[torch.zeros(4).to(dev)]], [torch.zeros(4)], AllgatherOptions())
    with pytest.raises(ValueError, match=r"fl and CPU tensors, not meta"):
        pg.allreduce([torch.zeros(2, device="meta")], ar_opts())
    with pytest.raises(ValueError, match=r"ReduceOp.AVG needs floating-point tensors, got torch.int64"):
        pg.allreduce([torch.ones(3, dtype=torch.int64).to(dev)], ar_opts(dist.ReduceOp.AVG))
    with pytest.raises(ValueError, match=r"ReduceOp.PREMUL_SUM is not supported .*use SUM, AVG"):
        pg.allreduce([torch.ones(3).to(dev)], ar_opts(dist._make_nccl_premul_sum(2.0)))
    with pytest.raises(ValueError, match=r"output must hold world \(1\) x 3 elements"):
        pg.all_gather_single(torch.zeros(4).to(dev), torch.zeros(3).to(dev), AllgatherOptions())
    with pytest.raises(ValueError, match=r"input must hold world \(1\) x 2 elements"):
        pg.reduce_scatter_single(torch.zeros(2).to(dev), torch.zeros(3).to(dev), dist.ReduceScatterOptions())
    with pytest.raises(ValueError, match=r"output list holds 2 tensors; it needs one per rank \(1\)"):
        pg.allgather([[torch.zeros(2).to(dev)] * 2], [torch.zeros(2).to(dev)], AllgatherOptions())
    with pytest.raises(ValueError, match=r"peer rank 0 is not another rank of this group of 1"):
        pg.send([torch.zeros(2).to(dev)], 0, 0)
    with pytest.raises(ValueError, match=r"needs the source rank .*pass src="):
        pg.recv_anysource([torch.zeros(2).to(dev)], 0)
    # the group still works after refusing them
    t = torch.tensor([7.0]).to(dev)
    assert pg.allreduce([t], ar_opts()).wait() and t.cpu().tolist() == [7.0]


def test_bitwise_ops_take_the_relay(rocm_group):
    """The plugin ABI has no bitwise reductions; gloo does."""
    fl.initialize("rocm")
    t = torch.tensor([6, 3], dtype=torch.int64).to("fl")
    with fl.profile() as prof:
        rocm_group.allreduce([t], ar_opts(dist.ReduceOp.BAND)).wait()
    assert t.cpu().tolist() == [6, 3] and prof.collectives()[0].path == "comm-relay"


def test_group_refuses_calls_after_shutdown():
    pg = group("ascend")
    pg.shutdown()
    with pytest.raises(CollectiveError, match="after the group was destroyed"):
        pg.allreduce([torch.ones(2).to("fl")], ar_opts())


def test_rank_that_never_arrives():
    with pytest.raises(CollectiveError, match=r"rank\(s\) \[1\] did not join within 1 s.*another backend"):
        group("ascend", world=2, timeout=datetime.timedelta(seconds=1))


def test_mismatched_backend_in_the_store():
    store = dist.HashStore()
    store.set("torch_fl/rank/1", json.dumps({"rank": 1, "backend": "minimal", "host": "h", "relay_forced": False}))
    store.set("torch_fl/read/1", "1")  # rank 1 read the others' entries too (else rank 0 waits its timeout for it)
    with pytest.raises(BackendMismatchError, match=r"rank 0: ascend, rank 1: minimal.*FL_BACKEND=ascend"):
        group("ascend", world=2, store=store)


def test_failed_work_reaches_wait_and_the_future():
    worker = Worker("test-worker")
    try:

        def boom():
            raise RuntimeError("rocm: all_reduce timed out after 50 ms waiting for rank 1")

        work = worker.submit(FlWork("fl process group: all_reduce on rank 0 (comm-plugin)", boom, [], 5.0))
        with pytest.raises(CollectiveTimeoutError, match=r"all_reduce on rank 0 .*timed out.*raise the process group"):
            work.wait()
        assert work.is_completed() and not work.is_success()
        assert isinstance(work.exception(), CollectiveTimeoutError)
        # C++ readers (DDP's reducer) see a failed future, not a value
        with pytest.raises(RuntimeError, match="waiting for rank 1"):
            work.get_future().wait()
    finally:
        worker.stop()


def test_work_wait_gives_up_on_a_blocked_queue():
    worker, release = Worker("test-worker"), threading.Event()
    try:
        blocked = worker.submit(FlWork("fl process group: barrier", lambda: release.wait(30), [], 5.0))
        later = worker.submit(FlWork("fl process group: all_reduce", lambda: None, ["x"], 5.0))
        with pytest.raises(CollectiveTimeoutError, match=r"all_reduce did not complete within 0.2 s"):
            later.wait(datetime.timedelta(seconds=0.2))
        assert not later.is_completed()
        release.set()
        assert blocked.wait() and later.wait() and later.result() == ["x"]
        assert later.get_future().wait() == ["x"]
    finally:
        worker.stop()


@pytest.mark.parametrize(
    "message,kind,needle",
    [
        ("[gloo/pair.cc:553] Connection closed by peer [127.0.0.1]:39564", CollectiveError, "probably died"),
        ("Timed out waiting 3000ms for recv operation to complete", CollectiveTimeoutError, "raise the process group"),
        ("rocm: all_reduce: ranks disagree: float32[10] vs float32[12]", CollectiveError, "float32[10]"),
    ],
)
def test_errors_are_classified(message, kind, needle):
    err = wrap_error(RuntimeError(message), "fl process group: all_reduce on rank 0")
    assert type(err) is kind and needle in str(err) and isinstance(err, dist.DistBackendError)


def test_capability_tables_say_which_path():
    rocm, ascend = fl.capabilities("rocm").render(), fl.capabilities("ascend").render()
    assert "collectives: plugin (the plugin's own all_reduce" in rocm and "other hosts go through the CPU relay" in rocm
    assert "collectives: cpu-relay (CPU relay: every collective copies to the host, runs gloo" in ascend
    assert "not built yet" not in rocm + ascend
