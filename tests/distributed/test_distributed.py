"""The `fl` process group (torch_fl/distributed): every collective and DDP with
2 real processes on loopback, on every backend, checked against PyTorch on
the CPU; then the failure cases (a rank that dies, a rank that hangs, ranks
on different backends).

One 2-process run per backend (module fixture) does everything, so the
process groups are few: the ranks compute, save their results with
torch.save, and the tests here compare them with references computed from
the same deterministic inputs. The four runs start the group four ways:
cpu through torchrun with `init_process_group()` and no backend (fl is the
default for the fl accelerator), rocm over tcp://, ascend over env:// with
"fl", minimal with "cpu:gloo,fl:fl". rocm takes the plugin path (shared
memory between the two processes); the others the CPU relay.

This file is also the ranks' program: `python test_distributed.py <scenario>
<backend> <out_dir>` with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set."""

from __future__ import annotations

import copy
import datetime
import os
import socket
import subprocess
import sys
import time
import traceback

import pytest
import torch

pytestmark = pytest.mark.slow  # 2-process runs per backend

BACKENDS = ("cpu", "rocm", "ascend", "minimal")
PATH = {"cpu": "cpu-relay", "rocm": "plugin", "ascend": "cpu-relay", "minimal": "cpu-relay"}
OPS = ("sum", "avg", "max", "min", "product")
BIG = 600_000  # 2.4 MB of float32: several steps through the rocm emulator's 512 KiB shared buffers
STEPS = 3
TIMEOUT_S = 20
FAIL_TIMEOUT_S = 3
HERE = os.path.dirname(os.path.abspath(__file__))


# ---------------------------------------------------------------- shared by the ranks and the tests


def make(dtype: torch.dtype, n: int, rank: int, salt: int) -> torch.Tensor:
    """Deterministic per-rank CPU input: floats in [0.5, 2.5) (products stay tame), ints in [-50, 50)."""
    g = torch.Generator().manual_seed(7919 * rank + salt)
    if dtype.is_floating_point:
        return (torch.rand(n, generator=g, dtype=torch.float64) * 2 + 0.5).to(dtype)
    return torch.randint(-50, 50, (n,), generator=g, dtype=torch.int64).to(dtype)


def salt_of(*key: str) -> int:
    """A seed from names that is the same in every process (str hashes are not)."""
    return sum((i + 1) * ord(ch) for i, ch in enumerate("/".join(key))) % 100_003


def summed(dtype: torch.dtype, n: int, salt: int) -> torch.Tensor:
    """What the two ranks' `make(dtype, n, rank, salt)` add up to."""
    return make(dtype, n, 0, salt) + make(dtype, n, 1, salt)


def reference_reduce(xs: list[torch.Tensor], op: str) -> torch.Tensor:
    s = torch.stack(xs)
    return {
        "sum": lambda: s.sum(0),
        "avg": lambda: s.mean(0),
        "max": lambda: s.amax(0),
        "min": lambda: s.amin(0),
        "product": lambda: s.prod(0),
    }[op]().to(xs[0].dtype)


def mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


def mlp_batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(6, 8, generator=g), torch.randn(6, 4, generator=g)


class SeqModel(torch.nn.Module):
    """Variable-length token sequences (the Torch-FL article's pitfall 3): the gradient
    shapes do not depend on the length, but `long_head` only runs for
    sequences longer than 6, so some steps leave it unused."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.emb = torch.nn.Embedding(20, 8)
        self.head = torch.nn.Linear(8, 3)
        self.long_head = torch.nn.Linear(8, 3)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.emb(tokens).mean(1)
        out = self.head(h)
        if tokens.shape[1] > 6:
            out = out + self.long_head(h)
        return out


def seq_batch(step: int, rank: int, lengths: tuple) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(500 * step + rank)
    length = lengths[step][rank]
    return torch.randint(0, 20, (4, length), generator=g), torch.randn(4, 3, generator=g)


SEQ_LENGTHS = ((3, 9), (8, 4), (5, 7))  # per step, per rank: both short and long, different per rank
SEQ_SHORT = ((3, 4), (5, 9))  # step 0 leaves long_head unused on both ranks


def train(model, batches, lr: float = 0.1):
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for x, y in batches:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return model


# ---------------------------------------------------------------- the ranks' program


def _cpu(t: torch.Tensor) -> torch.Tensor:
    return t.detach().cpu().clone()


def _error(e: BaseException) -> tuple[str, str, list]:
    return (type(e).__name__, str(e), [c.__name__ for c in type(e).__mro__])


def scenario_main(backend: str, rank: int, world: int, out_dir: str) -> dict:
    import torch.distributed as dist

    import torch_fl as fl
    from torch_fl.distributed import ProcessGroupFl, collectives_path

    fl.initialize(backend)
    timeout = datetime.timedelta(seconds=TIMEOUT_S)
    if backend == "cpu":  # under torchrun, no backend named
        dist.init_process_group(timeout=timeout)
    elif backend == "rocm":
        dist.init_process_group(
            "fl",
            init_method=f"tcp://127.0.0.1:{os.environ['MASTER_PORT']}",
            rank=rank,
            world_size=world,
            timeout=timeout,
        )
    elif backend == "ascend":
        dist.init_process_group("fl", init_method="env://", timeout=timeout)
    else:
        dist.init_process_group("cpu:gloo,fl:fl", timeout=timeout)
    res: dict = {
        "backend_name": dist.distributed_c10d._get_default_group().name(),
        "default_for_fl": dist.get_default_backend_for_device("fl"),
        "path": collectives_path(),
        "pg_type": type(dist.distributed_c10d._get_default_group()).__name__,
        "is_fl_pg": isinstance(dist.distributed_c10d._get_default_group(), ProcessGroupFl),
    }
    dev = fl.device()

    def put(t):
        return t.to(dev)

    for dtype in (torch.float32, torch.int64):
        for op in OPS:
            if op == "avg" and not dtype.is_floating_point:
                continue
            t = put(make(dtype, 1001, rank, salt_of(str(dtype), op)))
            dist.all_reduce(t, op=getattr(dist.ReduceOp, op.upper()))
            res[("all_reduce", str(dtype), op)] = _cpu(t)
    t = put(make(torch.bfloat16, 257, rank, 11))
    dist.all_reduce(t)
    res["all_reduce_bf16"] = _cpu(t)
    for op in ("max", "min"):  # a bool "stop" flag: the rocm plugin declines bool reductions, the relay serves it
        flag = put(torch.tensor([rank == 0, True, False]))
        dist.all_reduce(flag, op=getattr(dist.ReduceOp, op.upper()))
        res[("bool_flag", op)] = _cpu(flag)
    t = put(make(torch.float32, BIG, rank, 12))
    dist.all_reduce(t)
    res["all_reduce_big"] = _cpu(t)
    t = put(make(torch.float32, 513, rank, 13))
    dist.broadcast(t, src=1)
    res["broadcast"] = _cpu(t)
    outs = [put(torch.zeros(77, dtype=torch.int64)) for _ in range(world)]
    dist.all_gather(outs, put(make(torch.int64, 77, rank, 14)))
    res["all_gather"] = [_cpu(o) for o in outs]
    out = put(torch.zeros(world * 100))
    dist.all_gather_into_tensor(out, put(make(torch.float32, 100, rank, 15)))
    res["all_gather_into_tensor"] = _cpu(out)
    out = put(torch.zeros(50))
    dist.reduce_scatter(out, [put(make(torch.float32, 50, rank, 16 + k)) for k in range(world)])
    res["reduce_scatter"] = _cpu(out)
    out = put(torch.zeros(64))
    dist.reduce_scatter_tensor(out, put(make(torch.float32, world * 64, rank, 20)), op=dist.ReduceOp.MAX)
    res["reduce_scatter_tensor"] = _cpu(out)
    # through the relay on every backend (no plugin entry point for them)
    t = put(make(torch.float32, 31, rank, 21))
    dist.reduce(t, dst=0)
    if rank == 0:
        res["reduce"] = _cpu(t)
    out = put(torch.zeros(world * 10))
    dist.all_to_all_single(out, put(make(torch.float32, world * 10, rank, 22)))
    res["all_to_all_single"] = _cpu(out)
    # point to point, both directions
    if rank == 0:
        dist.send(put(make(torch.float32, 3000, 0, 23)), dst=1)
        got = put(torch.zeros(33, dtype=torch.int64))
        res["recv_src"] = dist.recv(got, src=1)
        res["recv"] = _cpu(got)
    else:
        got = put(torch.zeros(3000))
        res["recv_src"] = dist.recv(got, src=0)
        res["recv"] = _cpu(got)
        dist.send(put(make(torch.int64, 33, 1, 24)), dst=0)
    dist.barrier()
    # async handles: issued back to back, waited in reverse order
    ts = [put(make(torch.float32, 2000, rank, 30 + k)) for k in range(4)]
    works = [dist.all_reduce(t, async_op=True) for t in ts]
    res["async_types"] = sorted({type(w).__name__ for w in works})
    res["async_wait"] = [w.wait() for w in reversed(works)]
    res["async_completed"] = [w.is_completed() and w.is_success() for w in works]
    res["async"] = [_cpu(t) for t in ts]
    fut = dist.all_reduce(put(make(torch.float32, 10, rank, 35)), async_op=True).get_future()
    res["future"] = [_cpu(x) for x in fut.wait()]
    # CPU tensors and Python objects in the same group
    c = make(torch.float32, 16, rank, 36)
    dist.all_reduce(c)
    res["cpu_all_reduce"] = c
    objs: list = [None] * world
    dist.all_gather_object(objs, {"rank": rank, "backend": fl.get_current_backend_name()})
    res["objects"] = objs
    # a subgroup is a second fl process group (its own communicator and gloo) beside the world group
    sub = dist.new_group([0, 1])
    t = put(make(torch.float32, 64, rank, 37))
    dist.all_reduce(t, group=sub, op=dist.ReduceOp.MAX)
    res["subgroup"] = (type(sub).__name__, _cpu(t))
    # the profiler's per-collective record
    with fl.profile() as prof:
        dist.all_reduce(put(make(torch.float32, 1000, rank, 40)))
        dist.all_gather_into_tensor(put(torch.zeros(world * 256)), put(make(torch.float32, 256, rank, 41)))
        dist.all_reduce(make(torch.float32, 8, rank, 42))
    res["profile"] = [
        {
            "op": s.op,
            "path": s.path,
            "calls": s.calls,
            "comm_bytes": s.comm_bytes,
            "bytes_copied": s.bytes_copied,
            "backend": s.backend,
        }
        for s in prof.collectives()
    ]
    res["profile_render"] = prof.render()

    # DDP: several buckets (tiny bucket_cap_mb), so all-reduces overlap the backward
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = copy.deepcopy(mlp()).to(dev)
    ddp = DDP(model, bucket_cap_mb=0.0003)
    train(ddp, [(put(x), put(y)) for x, y in (mlp_batch(s, rank) for s in range(STEPS))])
    res["ddp"] = {k: _cpu(v) for k, v in model.state_dict().items()}

    # variable-length inputs, with and without find_unused_parameters
    model = SeqModel().to(dev)
    ddp = DDP(model, find_unused_parameters=True)
    train(ddp, [(put(x), put(y)) for x, y in (seq_batch(s, rank, SEQ_LENGTHS) for s in range(len(SEQ_LENGTHS)))])
    res["ddp_varlen"] = {k: _cpu(v) for k, v in model.state_dict().items()}
    ddp = DDP(SeqModel().to(dev))
    try:
        train(ddp, [(put(x), put(y)) for x, y in (seq_batch(s, rank, SEQ_SHORT) for s in range(len(SEQ_SHORT)))])
        res["ddp_unused_error"] = None
    except RuntimeError as e:
        res["ddp_unused_error"] = _error(e)
    dist.barrier()
    dist.destroy_process_group()
    return res


def scenario_dead(backend: str, rank: int, world: int, out_dir: str) -> dict:
    """Rank 1 dies after building DDP; rank 0's next training step must fail, not hang."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import torch_fl as fl

    fl.initialize(backend)
    dist.init_process_group("fl", timeout=datetime.timedelta(seconds=FAIL_TIMEOUT_S))
    dev = fl.device()
    ddp = DDP(mlp().to(dev))
    dist.barrier()
    if rank == 1:
        os._exit(0)
    res = {}
    x, y = mlp_batch(0, 0)
    try:
        torch.nn.functional.mse_loss(ddp(x.to(dev)), y.to(dev)).backward()
        res["error"] = None
    except RuntimeError as e:
        res["error"] = _error(e)
    return res


def scenario_hang(backend: str, rank: int, world: int, out_dir: str) -> dict:
    """Rank 1 stays alive but stops calling collectives; rank 0 times out."""
    import torch.distributed as dist

    import torch_fl as fl

    fl.initialize(backend)
    dist.init_process_group("fl", timeout=datetime.timedelta(seconds=FAIL_TIMEOUT_S))
    dev = fl.device()
    t = torch.ones(8).to(dev)
    dist.all_reduce(t)
    res = {"first": _cpu(t)}
    if rank == 1:  # alive and silent until rank 0 has given up and saved its result
        deadline = time.monotonic() + 60
        while not os.path.exists(os.path.join(out_dir, "rank0.pt")) and time.monotonic() < deadline:
            time.sleep(0.1)
        os._exit(0)
    try:
        dist.all_reduce(t)
        res["error"] = None
    except RuntimeError as e:
        res["error"] = _error(e)
    return res


def scenario_mismatch(backend: str, rank: int, world: int, out_dir: str) -> dict:
    """Rank 0 runs `backend`, rank 1 runs ascend: both fail at init_process_group."""
    import torch.distributed as dist

    import torch_fl as fl

    fl.initialize(backend if rank == 0 else "ascend")
    try:
        dist.init_process_group("fl", timeout=datetime.timedelta(seconds=TIMEOUT_S))
        return {"error": None}
    except Exception as e:  # noqa: BLE001 - the test checks the type
        return {"error": _error(e)}


SCENARIOS = {"main": scenario_main, "dead": scenario_dead, "hang": scenario_hang, "mismatch": scenario_mismatch}


def _rank_main(argv: list[str]) -> None:
    scenario, backend, out_dir = argv
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    try:
        res = SCENARIOS[scenario](backend, rank, world, out_dir)
    except BaseException:
        res = {"crash": traceback.format_exc()}
    torch.save(res, os.path.join(out_dir, f"rank{rank}.pt"))
    sys.stdout.flush()
    os._exit(0)  # a rank whose peer died must not wait for gloo's teardown


# ---------------------------------------------------------------- launching runs


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FL_") or k in ("FL_CACHE_DIR", "FL_JIT_CACHE")}
    env.update(MASTER_ADDR="127.0.0.1", WORLD_SIZE="2", PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    return env


def launch(
    scenario: str, backend: str, out_dir, torchrun: bool = False, budget_s: float = 240, reporting: tuple = (0, 1)
) -> list[dict | None]:
    """Runs the scenario's two ranks and returns their saved results (None
    for a rank that is not `reporting`: one that is made to die)."""
    port = _free_port()
    args = [scenario, backend, str(out_dir)]
    env = _env()
    logs = [open(os.path.join(out_dir, f"log{r}.txt"), "w") for r in range(2)]
    if torchrun:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", __file__, *args]
        procs = [subprocess.Popen(cmd, env=env, stdout=logs[0], stderr=subprocess.STDOUT, cwd=HERE)]
    else:
        procs = [
            subprocess.Popen(
                [sys.executable, __file__, *args],
                env=dict(env, RANK=str(r), MASTER_PORT=str(port)),
                stdout=logs[r],
                stderr=subprocess.STDOUT,
                cwd=HERE,
            )
            for r in range(2)
        ]
    deadline = time.monotonic() + budget_s
    try:
        for p in procs:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        pass
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for f in logs:
            f.close()
    results: list[dict | None] = [None, None]
    for r in reporting:
        path = os.path.join(out_dir, f"rank{r}.pt")
        if not os.path.exists(path):
            log = "\n".join(open(os.path.join(out_dir, f"log{k}.txt")).read()[-3000:] for k in range(len(logs)))
            raise AssertionError(f"{scenario}/{backend}: rank {r} saved no result; logs:\n{log}")
        res = torch.load(path, weights_only=False)
        assert "crash" not in res, f"{scenario}/{backend} rank {r} crashed:\n{res['crash']}"
        results[r] = res
    return results


@pytest.fixture(scope="module", params=BACKENDS)
def run(request, tmp_path_factory):
    backend = request.param
    return backend, launch("main", backend, tmp_path_factory.mktemp(f"dist_{backend}"), torchrun=backend == "cpu")


# ---------------------------------------------------------------- the collectives


def test_group_is_the_fl_backend_and_takes_the_declared_path(run):
    import torch_fl as fl

    backend, results = run
    for res in results:
        assert res["backend_name"] == "fl" and res["pg_type"] == "ProcessGroupFl" and res["is_fl_pg"]
        assert res["default_for_fl"] == "fl"
        assert res["path"] == PATH[backend] == fl.capabilities(backend).collectives_path


def test_all_reduce_every_op(run):
    _, results = run
    for dtype in (torch.float32, torch.int64):
        for op in OPS:
            if op == "avg" and not dtype.is_floating_point:
                continue
            salt = salt_of(str(dtype), op)
            expected = reference_reduce([make(dtype, 1001, r, salt) for r in range(2)], op)
            got = [res[("all_reduce", str(dtype), op)] for res in results]
            assert torch.equal(got[0], got[1]), f"{dtype} {op}: the ranks disagree"
            torch.testing.assert_close(got[0], expected, rtol=1e-6, atol=0, msg=f"{dtype} {op}")
    for res in results:
        assert res[("bool_flag", "max")].tolist() == [True, True, False]
        assert res[("bool_flag", "min")].tolist() == [False, True, False]
    expected = reference_reduce([make(torch.bfloat16, 257, r, 11).double() for r in range(2)], "sum")
    for res in results:
        torch.testing.assert_close(res["all_reduce_bf16"].double(), expected, rtol=1e-2, atol=0)
        torch.testing.assert_close(res["all_reduce_big"], summed(torch.float32, BIG, 12))


def test_broadcast_gather_scatter(run):
    _, results = run
    gathered = [make(torch.int64, 77, r, 14) for r in range(2)]
    full_rs = summed(torch.float32, 50, 16), summed(torch.float32, 50, 17)
    full_max = torch.maximum(make(torch.float32, 128, 0, 20), make(torch.float32, 128, 1, 20))
    a2a = [make(torch.float32, 20, r, 22) for r in range(2)]
    for rank, res in enumerate(results):
        assert torch.equal(res["broadcast"], make(torch.float32, 513, 1, 13))
        assert all(torch.equal(a, b) for a, b in zip(res["all_gather"], gathered, strict=True))
        assert torch.equal(
            res["all_gather_into_tensor"], torch.cat([make(torch.float32, 100, r, 15) for r in range(2)])
        )
        torch.testing.assert_close(res["reduce_scatter"], full_rs[rank])
        assert torch.equal(res["reduce_scatter_tensor"], full_max[rank * 64 : (rank + 1) * 64])
        assert torch.equal(res["all_to_all_single"], torch.cat([a2a[r][rank * 10 : (rank + 1) * 10] for r in range(2)]))
    torch.testing.assert_close(results[0]["reduce"], summed(torch.float32, 31, 21))


def test_send_recv_both_directions(run):
    _, (r0, r1) = run
    assert torch.equal(r1["recv"], make(torch.float32, 3000, 0, 23)) and r1["recv_src"] == 0
    assert torch.equal(r0["recv"], make(torch.int64, 33, 1, 24)) and r0["recv_src"] == 1


def test_async_handles_are_real_works(run):
    _, results = run
    for res in results:
        assert res["async_types"] == ["FlWork"]
        assert res["async_wait"] == [True] * 4 and res["async_completed"] == [True] * 4
        for k, got in enumerate(res["async"]):
            torch.testing.assert_close(got, summed(torch.float32, 2000, 30 + k))
        torch.testing.assert_close(res["future"][0], summed(torch.float32, 10, 35))


def test_cpu_tensors_and_objects_share_the_group(run):
    backend, results = run
    for res in results:
        torch.testing.assert_close(res["cpu_all_reduce"], summed(torch.float32, 16, 36))
        assert res["objects"] == [{"rank": 0, "backend": backend}, {"rank": 1, "backend": backend}]


def test_subgroup(run):
    _, results = run
    expected = torch.maximum(make(torch.float32, 64, 0, 37), make(torch.float32, 64, 1, 37))
    for res in results:
        kind, got = res["subgroup"]
        assert kind == "ProcessGroupFl" and torch.equal(got, expected)


def test_profile_counts_bytes_per_collective(run):
    backend, results = run
    path = "comm-plugin" if PATH[backend] == "plugin" else "comm-relay"
    # the plugin moves device memory itself, and the cpu plugin's memory is host memory that the
    # relay hands to gloo without a copy: only the emulators with memory kept apart stage bytes
    staged = 1 if backend in ("ascend", "minimal") else 0
    for res in results:
        rows = {(r["op"], r["backend"]): r for r in res["profile"]}
        assert set(rows) == {
            ("c10d::all_reduce", backend),
            ("c10d::all_gather_into_tensor", backend),
            ("c10d::all_reduce", "host"),
        }, rows
        ar, ag, host = (
            rows[("c10d::all_reduce", backend)],
            rows[("c10d::all_gather_into_tensor", backend)],
            rows[("c10d::all_reduce", "host")],
        )
        assert (ar["path"], ar["calls"], ar["comm_bytes"]) == (path, 1, 1000 * 4)
        assert (ag["path"], ag["calls"], ag["comm_bytes"]) == (path, 1, 2 * 256 * 4)  # the gathered output
        assert (host["path"], host["comm_bytes"], host["bytes_copied"]) == ("comm-gloo", 8 * 4, 0)
        assert ar["bytes_copied"] == staged * 2 * 1000 * 4  # copied to the host and back
        assert ag["bytes_copied"] == staged * (256 + 2 * 256) * 4  # the input out, the gathered output back
        assert "collectives: c10d::" in res["profile_render"]


# ---------------------------------------------------------------- DDP


def test_ddp_matches_single_process_training(run):
    backend, results = run
    reference = train(
        mlp(),
        [tuple(torch.cat(t) for t in zip(*(mlp_batch(s, r) for r in range(2)), strict=True)) for s in range(STEPS)],
    )
    for rank, res in enumerate(results):
        for name, value in reference.state_dict().items():
            torch.testing.assert_close(
                res["ddp"][name],
                value,
                rtol=1e-5,
                atol=1e-6,
                msg=lambda m, n=name, r=rank: f"{backend} rank {r} {n}: {m}",
            )
    for name in results[0]["ddp"]:
        assert torch.equal(results[0]["ddp"][name], results[1]["ddp"][name]), f"ranks diverged at {name}"


def test_ddp_variable_length_inputs(run):
    """Lengths differ per rank and per step, and long_head runs only on some:
    with find_unused_parameters=True the parameters match one process that
    averages both ranks' losses (the concatenated batch's mean, batches
    being equal in size)."""
    backend, results = run
    model = SeqModel()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(len(SEQ_LENGTHS)):
        opt.zero_grad()
        loss = (
            sum(
                torch.nn.functional.mse_loss(model(x), y)
                for x, y in (seq_batch(step, r, SEQ_LENGTHS) for r in range(2))
            )
            / 2
        )
        loss.backward()
        opt.step()
    for res in results:
        for name, value in model.state_dict().items():
            torch.testing.assert_close(res["ddp_varlen"][name], value, rtol=1e-5, atol=1e-6)


def test_ddp_unused_parameters_fail_with_the_fix_named(run):
    _, results = run
    for res in results:
        err = res["ddp_unused_error"]
        assert err is not None, "a parameter left unused without find_unused_parameters must fail"
        assert "find_unused_parameters=True" in err[1], err


# ---------------------------------------------------------------- failures


def test_dead_rank_fails_ddp_within_the_timeout(tmp_path):
    r0, _ = launch("dead", "rocm", tmp_path, reporting=(0,))
    assert r0["error"] is not None, "the backward of a step whose peer died must fail"
    name, msg, _ = r0["error"]
    # DDP's reducer re-raises the all-reduce's error from its future
    # the error names the configured timeout: the wait ended by it (a hang would instead run into the
    # launcher's budget and leave no error); no wall-clock bound here, these machines are noisy
    assert "all_reduce" in msg and "timed out after 3000 ms waiting for rank 1" in msg, (name, msg)


def test_hung_rank_times_out_on_the_relay(tmp_path):
    r0, _ = launch("hang", "ascend", tmp_path, reporting=(0,))
    assert torch.equal(r0["first"], torch.full((8,), 2.0))
    name, msg, mro = r0["error"]
    assert name == "CollectiveTimeoutError" and "DistBackendError" in mro, (name, msg)
    assert "all_reduce" in msg and "raise the process group's timeout=" in msg, msg


def test_backend_mismatch_is_reported_on_every_rank(tmp_path):
    results = launch("mismatch", "rocm", tmp_path)
    for res in results:
        name, msg, _ = res["error"]
        assert name == "BackendMismatchError", (name, msg)
        assert "rank 0: rocm, rank 1: ascend" in msg and "FL_BACKEND" in msg, msg


if __name__ == "__main__":
    _rank_main(sys.argv[1:])
