"""The host kernels' worker pool (plugins_cffi/host/pool.c): results of the kernels that split their
range over it (the elementwise engine, copies, fills) equal PyTorch's at sizes around the thresholds,
with one thread and with two, from several Python threads at once, and in a forked child."""

from __future__ import annotations

import math
import os
import signal
import threading
import time

import harness
import pytest
import torch

# below PAR_MIN (inline), at it, a few chunks, an odd size, more than 1 MiB (fill and memcpy blocks)
SIZES = [16, 32767, 32768, 32769, 100_003, (1 << 20) // 4 + 7, (1 << 20) + 5]


@pytest.fixture(params=[1, 2], ids=["1 thread", "2 threads"])
def threads(request):
    old = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(old)


def _binary(n: int) -> None:
    a, b = torch.randn(n), torch.randn(n)
    out = torch.full((n,), 7.0)
    harness.call("aten::add.Tensor", [a, b], [out], [("tensor", 0), ("tensor", 1), ("int", 1)])
    assert torch.equal(out, a + b)
    harness.call("aten::mul.Tensor", [a, b], [out], [("tensor", 0), ("tensor", 1)])
    assert torch.equal(out, a * b)


@pytest.mark.parametrize("n", SIZES)
def test_elementwise_copies_and_fills(n, threads):
    _binary(n)
    # a broadcast operand and a converting output (float64 computed, stored as float32)
    a, row = torch.randn(n), torch.randn(1)
    out = torch.empty(n)
    harness.call("aten::sub.Tensor", [a, row.expand(n)], [out], [("tensor", 0), ("tensor", 1), ("int", 1)])
    assert torch.equal(out, a - row)
    # fills: zero, a value, -0.0 (not all-zero bytes), int8, complex128
    for dt, v in (
        (torch.float32, 0.0),
        (torch.float32, 2.5),
        (torch.float32, -0.0),
        (torch.int8, -3),
        (torch.float64, 1e300),
        (torch.complex128, 0.0),
    ):
        t = torch.full((n,), 9, dtype=dt)
        harness.call(
            "aten::fill_.Scalar",
            [t],
            [t],
            [("tensor", 0), ("float" if dt.is_floating_point or dt.is_complex else "int", v)],
        )
        assert torch.equal(t, torch.full((n,), v, dtype=dt)), dt
        if dt.is_floating_point and math.copysign(1.0, v) < 0:
            assert torch.signbit(t).all()
    t = torch.randn(n)
    harness.call("aten::zero_", [t], [t], [("tensor", 0)])
    assert not t.any()
    # contiguous copy (memcpy blocks above 1 MiB), converting copy, transposing copy
    src, dst = torch.randn(n), torch.empty(n)
    harness.call("aten::copy_", [dst, src], [dst], [("tensor", 0), ("tensor", 1), ("bool", False)])
    assert torch.equal(dst, src)
    d64 = torch.empty(n, dtype=torch.float64)
    harness.call("aten::copy_", [d64, src], [d64], [("tensor", 0), ("tensor", 1), ("bool", False)])
    assert torch.equal(d64, src.double())
    rows = max(8, n // 256)
    m = torch.randn(256, rows)
    dt_ = torch.empty(rows, 256)
    harness.call("aten::copy_", [dt_, m.t()], [dt_], [("tensor", 0), ("tensor", 1), ("bool", False)])
    assert torch.equal(dt_, m.t())


def test_concurrent_callers():
    """Python threads calling kernels at once: one runs on the pool, the others inline; all exact."""
    torch.set_num_threads(2)
    errors = []

    def work(seed: int) -> None:
        try:
            g = torch.Generator().manual_seed(seed)
            for n in (40_000, 300_001, (1 << 20) + 5):
                a, b = torch.randn(n, generator=g), torch.randn(n, generator=g)
                out = torch.empty(n)
                for _ in range(5):
                    harness.call("aten::add.Tensor", [a, b], [out], [("tensor", 0), ("tensor", 1), ("int", 1)])
                    assert torch.equal(out, a + b)
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    ts = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_forked_child_starts_its_own_pool():
    """The child has no workers (fork copies one thread): its first parallel call starts them anew. The
    child calls nothing but the kernel and numpy: PyTorch's own parallel ops hang in a forked child of a
    process that used OpenMP (libgomp's pool is not there either)."""
    torch.set_num_threads(2)
    n = 300_001
    a, b = torch.randn(n), torch.randn(n)
    want = (a + b).numpy().copy()
    out = torch.empty(n)
    harness.call("aten::add.Tensor", [a, b], [out], [("tensor", 0), ("tensor", 1), ("int", 1)])  # pool running
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            out2 = torch.empty(n)
            harness.call("aten::add.Tensor", [a, b], [out2], [("tensor", 0), ("tensor", 1), ("int", 1)])
            code = 0 if (out2.numpy() == want).all() else 2
        finally:
            os._exit(code)
    for _ in range(1200):  # a hung child fails the test instead of hanging it
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.05)
    else:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail("the forked child hung")
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
