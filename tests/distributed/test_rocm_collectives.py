"""The rocm emulator's collectives (plugins_cffi/emulated/comm_shm.c): real
data movement between spawned processes through POSIX shared memory, called
through the plugin's comm_* entry points. Children send their results back
through a queue; the parent checks them against torch on the CPU.

Three process groups run once per module (fixtures): two ranks (every op,
dtype and reduce op, a message larger than the shared chunk, mismatched calls,
point-to-point, barrier, zero-size tensors, then a peer that exits before a
collective), and three ranks with a tiny shared chunk (FL_ROCM_COMM_CHUNK_BYTES)
so every op runs through many uneven steps, then a rank that exits while the
other two wait. Argument errors and comm_init timeouts run in this process."""

import multiprocessing as mp
import os
import time
import traceback
import uuid

import pytest
import torch

from torch_fl.runtime import desc, ffi
from torch_fl.runtime.abi import FL_ERR_INTERNAL, FL_ERR_INVALID, FL_OK

pytestmark = pytest.mark.slow  # spawned processes

SUM, PROD, MIN, MAX, AVG = range(5)
OPS = {"sum": SUM, "prod": PROD, "min": MIN, "max": MAX, "avg": AVG}
FLOATS = ("float32", "float64", "float16", "bfloat16")
INTS = ("int64", "int32")
BIG = 3_000_000  # 12 MB of float32: many steps through the 512 KiB shared buffer sets
TIMEOUT_MS = 2000


# ---------------------------------------------------------------- shared by parent and children


def _make(dtype: str, n: int, rank: int, salt: int) -> torch.Tensor:
    """Deterministic per-rank input: floats in [0.5, 2.5) (products stay tame), ints in [-50, 50)."""
    g = torch.Generator().manual_seed(7919 * rank + salt)
    dt = getattr(torch, dtype)
    if dt.is_floating_point:
        return (torch.rand(n, generator=g, dtype=torch.float64) * 2 + 0.5).to(dt)
    return torch.randint(-50, 50, (n,), generator=g, dtype=torch.int64).to(dt)


def _salt(*key) -> int:
    return sum((i + 1) * ord(ch) for i, ch in enumerate("/".join(map(str, key)))) % 100_003


def _wire(t: torch.Tensor):
    t = t.detach().cpu().contiguous()
    raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
    return ("tensor", str(t.dtype).split(".")[1], tuple(t.shape), raw)


def _unwire(w) -> torch.Tensor:
    _, dtype, shape, raw = w
    dt = getattr(torch, dtype)
    if not raw:
        return torch.empty(shape, dtype=dt)
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dt).reshape(shape)


def _reduce(xs: list, op: str, dtype: str) -> torch.Tensor:
    """Reference: reduce the ranks' inputs in float64 / int64, round once to dtype."""
    dt = getattr(torch, dtype)
    wide = torch.float64 if dt.is_floating_point else torch.int64
    s = torch.stack([x.to(wide) for x in xs])
    r = {
        "sum": lambda: s.sum(0),
        "prod": lambda: s.prod(0),
        "min": lambda: s.amin(0),
        "max": lambda: s.amax(0),
        "avg": lambda: s.mean(0),
    }[op]()
    return r.to(dt)


# ---------------------------------------------------------------- the child side


class _Rank:
    """One process's view: the rocm plugin table and device tensors."""

    def __init__(self, rank: int, world: int):
        import torch_fl as fl
        from torch_fl.runtime import REGISTRY

        fl.initialize("rocm")
        self.fl, self.rank, self.world = fl, rank, world
        self.plugin = REGISTRY.get("rocm").plugin
        self.T = self.plugin.table
        self.dev = fl.device("rocm")

    def put(self, cpu: torch.Tensor) -> torch.Tensor:
        return cpu.to(self.dev)

    def empty(self, n: int, dtype) -> torch.Tensor:
        return torch.empty(n, dtype=dtype, device=self.dev)

    @staticmethod
    def d(t: torch.Tensor):
        return ffi.new("fl_tensor_t*", desc(t))

    def status(self, st: int):
        return (st, self.plugin.last_error() if st else "")

    def init(self, uid: str, timeout_ms: int = TIMEOUT_MS):
        cp = ffi.new("void**")
        st = self.T.comm_init(0, uid.encode(), self.rank, self.world, timeout_ms, cp)
        assert st == FL_OK, f"rank {self.rank}: comm_init: {self.plugin.last_error()}"
        return cp[0]


def _scenario_two(r: _Rank, uid: str) -> dict:
    res = {}
    comm = r.init(uid)
    T, d = r.T, r.d
    # all_reduce: every op x dtype (1001 elements: the per-rank reduce parts are uneven)
    for dtype in FLOATS + INTS:
        for op in OPS:
            t = r.put(_make(dtype, 1001, r.rank, _salt("ar", dtype, op)))
            st = T.comm_all_reduce(0, d(t), OPS[op], comm)
            res[("ar", dtype, op)] = r.status(st) + (_wire(t),)
    # larger than the shared chunk
    t = r.put(_make("float32", BIG, r.rank, _salt("big")))
    res["big"] = r.status(T.comm_all_reduce(0, d(t), SUM, comm)) + (_wire(t),)
    # broadcast from rank 1, all_gather, reduce_scatter
    t = r.put(_make("float64", 5000, r.rank, _salt("bc")))
    res["bc"] = r.status(T.comm_broadcast(0, d(t), 1, comm)) + (_wire(t),)
    x = r.put(_make("int32", 777, r.rank, _salt("ag")))
    out = r.empty(2 * 777, torch.int32)
    res["ag"] = r.status(T.comm_all_gather(0, d(x), d(out), comm)) + (_wire(out),)
    for dtype, op in (("float32", "sum"), ("int64", "max"), ("bfloat16", "avg")):
        x = r.put(_make(dtype, 2 * 513, r.rank, _salt("rs", dtype, op)))
        out = r.empty(513, getattr(torch, dtype))
        res[("rs", dtype, op)] = r.status(T.comm_reduce_scatter(0, d(x), d(out), OPS[op], comm)) + (_wire(out),)
    # point to point, both directions; 300k floats = 1.2 MB, several chunks of the pair's ring
    a1, a2, b = (_make("float32", 300_000, 0, 1), _make("int64", 33, 0, 2), _make("float16", 4097, 1, 3))
    if r.rank == 0:
        res["send"] = [r.status(T.comm_send(0, d(r.put(a1)), 1, comm)), r.status(T.comm_send(0, d(r.put(a2)), 1, comm))]
        got = r.empty(4097, torch.float16)
        res["recv"] = [r.status(T.comm_recv(0, d(got), 1, comm)) + (_wire(got),)]
    else:
        g1, g2 = r.empty(300_000, torch.float32), r.empty(33, torch.int64)
        res["recv"] = [
            r.status(T.comm_recv(0, d(g1), 0, comm)) + (_wire(g1),),
            r.status(T.comm_recv(0, d(g2), 0, comm)) + (_wire(g2),),
        ]
        res["send"] = [r.status(T.comm_send(0, d(r.put(b)), 0, comm))]
    # a receive of the wrong size fails, and the pair stays in step
    if r.rank == 0:
        T.comm_send(0, d(r.put(torch.arange(10.0))), 1, comm)
        T.comm_send(0, d(r.put(torch.arange(5.0) + 100)), 1, comm)
    else:
        short, nxt = r.empty(8, torch.float32), r.empty(5, torch.float32)
        res["recv_short"] = r.status(T.comm_recv(0, d(short), 0, comm))
        res["recv_next"] = r.status(T.comm_recv(0, d(nxt), 0, comm)) + (_wire(nxt),)
    # barrier: rank 0 waits for the late rank 1
    if r.rank == 1:
        time.sleep(0.5)
    t0 = time.perf_counter()
    res["barrier"] = r.status(T.comm_barrier(comm)) + (time.perf_counter() - t0,)
    # zero-size tensors
    z, z2 = r.empty(0, torch.float32), r.empty(0, torch.float32)
    res["zero"] = [
        r.status(T.comm_all_reduce(0, d(z), SUM, comm)),
        r.status(T.comm_broadcast(0, d(z), 0, comm)),
        r.status(T.comm_all_gather(0, d(z), d(z2), comm)),
        r.status(T.comm_reduce_scatter(0, d(z), d(z2), SUM, comm)),
        r.status(T.comm_send(0, d(z), 1 - r.rank, comm)),
        r.status(T.comm_recv(0, d(z), 1 - r.rank, comm)),
    ]
    # argument errors (local: no communication, the communicator stays usable)
    t = r.put(torch.ones(4))
    res["bad_args"] = [
        r.status(T.comm_broadcast(0, d(t), 2, comm)),
        r.status(T.comm_send(0, d(t), r.rank, comm)),
        r.status(T.comm_recv(0, d(t), 5, comm)),
        r.status(T.comm_all_gather(0, d(t), d(r.empty(7, torch.float32)), comm)),
        r.status(T.comm_all_reduce(0, d(t), 9, comm)),
        r.status(T.comm_all_reduce(7, d(t), SUM, comm)),
    ]
    # the ranks disagree on the call: every rank fails, and stays in step
    t = r.put(torch.ones(10 + 2 * r.rank))
    res["mismatch"] = r.status(T.comm_all_reduce(0, d(t), SUM, comm))
    t = r.put(torch.full((3,), float(r.rank + 1)))
    res["after_mismatch"] = r.status(T.comm_all_reduce(0, d(t), SUM, comm)) + (_wire(t),)
    res["destroy"] = T.comm_destroy(comm)

    # a peer that leaves: rank 1 joins a new communicator, then exits
    comm = r.init(uid + "-t")
    if r.rank == 1:
        return res
    t = r.put(torch.ones(16))
    t0 = time.perf_counter()
    st = T.comm_all_reduce(0, d(t), SUM, comm)
    res["timeout"] = r.status(st) + (time.perf_counter() - t0,)
    res["after_timeout"] = r.status(T.comm_barrier(comm))
    res["timeout_destroy"] = T.comm_destroy(comm)
    return res


def _scenario_three(r: _Rank, uid: str) -> dict:
    os.environ["FL_ROCM_COMM_CHUNK_BYTES"] = "4096"  # read by rank 0 when it creates the segment
    res = {}
    comm = r.init(uid)
    T, d = r.T, r.d
    for dtype, op in (("float32", "sum"), ("float16", "sum"), ("int64", "max"), ("float64", "avg"), ("int32", "prod")):
        t = r.put(_make(dtype, 10007, r.rank, _salt("ar3", dtype, op)))
        res[("ar", dtype, op)] = r.status(T.comm_all_reduce(0, d(t), OPS[op], comm)) + (_wire(t),)
    t = r.put(_make("float64", 5000, r.rank, _salt("bc3")))
    res["bc"] = r.status(T.comm_broadcast(0, d(t), 2, comm)) + (_wire(t),)
    x = r.put(_make("int32", 3001, r.rank, _salt("ag3")))
    out = r.empty(3 * 3001, torch.int32)
    res["ag"] = r.status(T.comm_all_gather(0, d(x), d(out), comm)) + (_wire(out),)
    x = r.put(_make("float32", 3 * 2001, r.rank, _salt("rs3")))
    out = r.empty(2001, torch.float32)
    res["rs"] = r.status(T.comm_reduce_scatter(0, d(x), d(out), SUM, comm)) + (_wire(out),)
    # a ring of sends (each message spans many 4 KiB slots)
    nxt, prv = (r.rank + 1) % 3, (r.rank - 1) % 3
    msg, got = r.put(_make("float32", 9999, r.rank, _salt("ring"))), r.empty(9999, torch.float32)
    if r.rank % 2 == 0:
        s = T.comm_send(0, d(msg), nxt, comm)
        v = T.comm_recv(0, d(got), prv, comm)
    else:
        v = T.comm_recv(0, d(got), prv, comm)
        s = T.comm_send(0, d(msg), nxt, comm)
    res["ring"] = (s, v, r.plugin.last_error() if s or v else "", _wire(got))
    res["barrier"] = r.status(T.comm_barrier(comm))
    res["destroy"] = T.comm_destroy(comm)

    # rank 2 leaves: ranks 0 and 1 both fail within about the timeout
    comm = r.init(uid + "-t")
    if r.rank == 2:
        return res
    t = r.put(torch.ones(16))
    t0 = time.perf_counter()
    st = T.comm_all_reduce(0, d(t), SUM, comm)
    res["timeout"] = r.status(st) + (time.perf_counter() - t0,)
    T.comm_destroy(comm)
    return res


def _child(scenario: str, rank: int, world: int, uid: str, q) -> None:
    try:
        r = _Rank(rank, world)
        q.put((rank, "ok", {"two": _scenario_two, "three": _scenario_three}[scenario](r, uid)))
    except BaseException:
        q.put((rank, "error", traceback.format_exc()))


def _run_group(scenario: str, world: int, budget_s: float = 120) -> tuple[str, list]:
    uid = uuid.uuid4().hex
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_child, args=(scenario, rank, world, uid, q), daemon=True) for rank in range(world)]
    for p in procs:
        p.start()
    results = [None] * world
    try:
        for _ in range(world):
            rank, kind, payload = q.get(timeout=budget_s)
            assert kind == "ok", f"rank {rank} failed:\n{payload}"
            results[rank] = payload
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    return uid, results


def _leftovers(uid: str) -> list:
    return [f for f in os.listdir("/dev/shm") if uid in f]


@pytest.fixture(scope="module")
def two():
    return _run_group("two", 2)


@pytest.fixture(scope="module")
def three():
    return _run_group("three", 3)


def _ok(entry, what):
    assert entry[0] == FL_OK, f"{what}: status {entry[0]}: {entry[1]}"
    return _unwire(entry[2]) if len(entry) > 2 else None


def _same_on_every_rank(results, key):
    raw = [res[key][2][3] for res in results]
    assert all(x == raw[0] for x in raw), f"{key}: ranks got different bytes"


# ---------------------------------------------------------------- two ranks


@pytest.mark.parametrize("dtype", FLOATS + INTS)
def test_all_reduce_every_op(two, dtype):
    _, results = two
    for op in OPS:
        key = ("ar", dtype, op)
        if op == "avg" and dtype in INTS:
            for res in results:  # like gloo: no average of integers
                st, msg = res[key][:2]
                assert st == FL_ERR_INVALID and "avg" in msg and dtype in msg, (st, msg)
            continue
        xs = [_make(dtype, 1001, rank, _salt("ar", dtype, op)) for rank in range(2)]
        expected = _reduce(xs, op, dtype)  # two ranks: one rounding, so exact
        for rank, res in enumerate(results):
            got = _ok(res[key], f"{key} rank {rank}")
            assert got.dtype == expected.dtype and torch.equal(got, expected), f"{key} rank {rank}"
        _same_on_every_rank(results, key)


def test_all_reduce_larger_than_the_shared_chunk(two):
    _, results = two
    expected = _make("float32", BIG, 0, _salt("big")) + _make("float32", BIG, 1, _salt("big"))
    for rank, res in enumerate(results):
        assert torch.equal(_ok(res["big"], f"big rank {rank}"), expected)


def test_broadcast_all_gather_reduce_scatter(two):
    _, results = two
    root = _make("float64", 5000, 1, _salt("bc"))
    gathered = torch.cat([_make("int32", 777, rank, _salt("ag")) for rank in range(2)])
    for rank, res in enumerate(results):
        assert torch.equal(_ok(res["bc"], "broadcast"), root)
        assert torch.equal(_ok(res["ag"], "all_gather"), gathered)
        for dtype, op in (("float32", "sum"), ("int64", "max"), ("bfloat16", "avg")):
            full = _reduce([_make(dtype, 2 * 513, k, _salt("rs", dtype, op)) for k in range(2)], op, dtype)
            got = _ok(res[("rs", dtype, op)], f"reduce_scatter {dtype} {op}")
            assert torch.equal(got, full[rank * 513 : (rank + 1) * 513]), (dtype, op, rank)


def test_send_recv_both_directions_in_order(two):
    _, (r0, r1) = two
    assert [s for s, _ in r0["send"]] == [FL_OK, FL_OK] and r1["send"][0][0] == FL_OK
    assert torch.equal(_ok(r1["recv"][0], "recv 1"), _make("float32", 300_000, 0, 1))
    assert torch.equal(_ok(r1["recv"][1], "recv 2"), _make("int64", 33, 0, 2))
    assert torch.equal(_ok(r0["recv"][0], "recv back"), _make("float16", 4097, 1, 3))
    st, msg = r1["recv_short"]
    assert st == FL_ERR_INVALID and "expected 32 bytes" in msg and "40" in msg, (st, msg)
    assert torch.equal(_ok(r1["recv_next"], "recv after a short one"), torch.arange(5.0) + 100)


def test_barrier_waits_for_the_late_rank(two):
    _, (r0, r1) = two
    assert r0["barrier"][0] == FL_OK and r1["barrier"][0] == FL_OK
    assert r0["barrier"][2] > 0.3, r0["barrier"]


def test_zero_size_tensors(two):
    _, results = two
    for res in results:
        assert [s for s, _ in res["zero"]] == [FL_OK] * 6, res["zero"]


def test_argument_errors_and_mismatched_calls(two):
    _, results = two
    for res in results:
        sts = [s for s, _ in res["bad_args"]]
        msgs = [m for _, m in res["bad_args"]]
        assert sts == [FL_ERR_INVALID] * 6, res["bad_args"]
        assert "root 2 out of range" in msgs[0] and "itself" in msgs[1] and "peer 5" in msgs[2]
        assert "expected world (2) x 4" in msgs[3] and "reduce op 9" in msgs[4] and "no device 7" in msgs[5]
        st, msg = res["mismatch"]
        assert st == FL_ERR_INVALID and "float32[10]" in msg and "float32[12]" in msg, (st, msg)
        assert torch.equal(_ok(res["after_mismatch"], "all_reduce after a mismatch"), torch.full((3,), 3.0))
        assert res["destroy"] == FL_OK


def test_peer_that_exits_times_out(two):
    _, (r0, _) = two
    st, msg, elapsed = r0["timeout"]
    assert st == FL_ERR_INTERNAL, (st, msg)
    assert "all_reduce timed out after 2000 ms waiting for rank 1" in msg, msg
    assert elapsed >= 1.9, elapsed  # it waited out the configured timeout (load can only make it longer)
    st, msg = r0["after_timeout"]
    assert st == FL_ERR_INTERNAL and "failed earlier" in msg, (st, msg)
    assert r0["timeout_destroy"] == FL_OK


def test_no_shared_memory_left_behind(two, three):
    for uid, _ in (two, three):
        assert _leftovers(uid) == []


# ---------------------------------------------------------------- three ranks, 4 KiB chunks


def test_three_ranks_small_chunks(three):
    _, results = three
    for dtype, op in (("float32", "sum"), ("float16", "sum"), ("int64", "max"), ("float64", "avg"), ("int32", "prod")):
        key = ("ar", dtype, op)
        expected = _reduce([_make(dtype, 10007, k, _salt("ar3", dtype, op)) for k in range(3)], op, dtype)
        for res in results:
            got = _ok(res[key], str(key))
            if dtype in INTS:
                assert torch.equal(got, expected), key
            else:
                torch.testing.assert_close(got, expected, rtol=1e-2 if dtype == "float16" else 1e-6, atol=0)
        _same_on_every_rank(results, key)  # one rank reduces each element, in rank order
    root = _make("float64", 5000, 2, _salt("bc3"))
    gathered = torch.cat([_make("int32", 3001, k, _salt("ag3")) for k in range(3)])
    full = _reduce([_make("float32", 3 * 2001, k, _salt("rs3")) for k in range(3)], "sum", "float32")
    for rank, res in enumerate(results):
        assert torch.equal(_ok(res["bc"], "broadcast"), root)
        assert torch.equal(_ok(res["ag"], "all_gather"), gathered)
        torch.testing.assert_close(_ok(res["rs"], "reduce_scatter"), full[rank * 2001 : (rank + 1) * 2001])
        s, v, msg, got = res["ring"]
        assert (s, v) == (FL_OK, FL_OK), msg
        assert torch.equal(_unwire(got), _make("float32", 9999, (rank - 1) % 3, _salt("ring")))
        assert res["barrier"][0] == FL_OK and res["destroy"] == FL_OK


def test_three_ranks_one_leaves(three):
    _, results = three
    for rank in (0, 1):
        st, msg, _ = results[rank]["timeout"]  # it returned: a hang would hit the fixture's join timeout
        assert st == FL_ERR_INTERNAL, (st, msg)
        # whichever rank gives up first aborts the communicator for the other
        assert "timed out after 2000 ms waiting for rank 2" in msg or "aborted" in msg, msg
    assert any("timed out" in results[k]["timeout"][1] for k in (0, 1))


# ---------------------------------------------------------------- in this process


@pytest.fixture(scope="module")
def rocm():
    from torch_fl.runtime import REGISTRY

    return REGISTRY.get("rocm").plugin


def _init(plugin, uid, rank, world, timeout_ms=TIMEOUT_MS, device=0):
    cp = ffi.new("void**")
    st = plugin.table.comm_init(device, uid.encode() if isinstance(uid, str) else uid, rank, world, timeout_ms, cp)
    return st, plugin.last_error() if st else "", cp[0]


def test_entry_points_present_only_on_rocm():
    from torch_fl.runtime import REGISTRY

    assert REGISTRY.get("rocm").plugin.optional["comm_all_reduce"]
    for name in ("ascend", "minimal"):
        assert not REGISTRY.get(name).plugin.optional["comm_all_reduce"]


@pytest.mark.parametrize(
    "args,needle",
    [
        ((2, 2), "rank 2 out of range for world=2"),
        ((-1, 2), "rank -1 out of range"),
        ((0, 0), "world=0"),
        ((0, 1, 0), "timeout_ms=0"),
        ((0, 1, TIMEOUT_MS, 9), "no device 9"),
    ],
)
def test_comm_init_rejects_bad_arguments(rocm, args, needle):
    st, msg, comm = _init(rocm, uuid.uuid4().hex, *args)
    assert st == FL_ERR_INVALID and needle in msg, (st, msg)
    assert comm == ffi.NULL


@pytest.mark.parametrize("uid", ["", "a/b", "x" * 129, "id with space"])
def test_comm_init_rejects_bad_unique_ids(rocm, uid):
    st, msg, _ = _init(rocm, uid, 0, 1)
    assert st == FL_ERR_INVALID and "unique_id" in msg, (st, msg)


def test_comm_init_times_out_without_peers(rocm):
    uid = uuid.uuid4().hex
    t0 = time.perf_counter()
    st, msg, comm = _init(rocm, uid, 0, 2, timeout_ms=300)  # rank 1 never comes
    assert st == FL_ERR_INTERNAL and "comm_init timed out after 300 ms waiting for rank 1" in msg, (st, msg)
    st, msg, comm = _init(rocm, uuid.uuid4().hex, 1, 2, timeout_ms=300)  # rank 0 never creates it
    assert st == FL_ERR_INTERNAL and "waiting for rank 0" in msg, (st, msg)
    assert time.perf_counter() - t0 < 3
    assert _leftovers(uid) == []


def test_single_rank_communicator(rocm):
    import torch_fl as fl

    dev = fl.device("rocm")
    uid = uuid.uuid4().hex
    st, msg, comm = _init(rocm, uid, 0, 1)
    assert st == FL_OK, msg
    assert _leftovers(uid) == []  # unlinked as soon as every rank (here: one) joined
    T = rocm.table
    x = torch.tensor([1.5, -2.0, 3.0]).to(dev)
    assert T.comm_all_reduce(0, ffi.new("fl_tensor_t*", desc(x)), AVG, comm) == FL_OK
    assert x.cpu().tolist() == [1.5, -2.0, 3.0]
    out = torch.empty(3, device=dev)
    assert T.comm_all_gather(0, ffi.new("fl_tensor_t*", desc(x)), ffi.new("fl_tensor_t*", desc(out)), comm) == 0
    assert out.cpu().tolist() == [1.5, -2.0, 3.0]
    assert T.comm_barrier(comm) == FL_OK
    assert T.comm_send(0, ffi.new("fl_tensor_t*", desc(x)), 0, comm) == FL_ERR_INVALID
    b = torch.ones(3, dtype=torch.bool).to(dev)
    assert T.comm_all_reduce(0, ffi.new("fl_tensor_t*", desc(b)), SUM, comm) != FL_OK
    assert T.comm_destroy(comm) == FL_OK
    assert T.comm_barrier(ffi.NULL) == FL_ERR_INVALID and "NULL communicator" in rocm.last_error()
