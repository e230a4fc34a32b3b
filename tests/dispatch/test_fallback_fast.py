"""The CPU fallback's C++ fast path (csrc/fl_cpu_fallback.cpp) and same-device copies as device memory copies.

A call the CPU fallback served in Python is committed to the C++ core; later calls with the same signature are
served there: host copies through the plugin, PyTorch's CPU kernel, the copies back. The results must be the
CPU's bits, the path must really be taken (its counter), and every rule that makes Python decide again must
hold: a new signature, the CPU-fallback switch, paths switched off, another backend's device, a listener, a
dispatch mode, a device-only decomposition, and calls whose tensors share memory."""

import copy

import pytest
import torch
from conftest import run_py
from torch.utils._python_dispatch import TorchDispatchMode

import torch_fl as fl
from torch_fl.runtime import REGISTRY, clear_plans, core, disabled_paths, events


@pytest.fixture
def minimal():
    fl.set_backend("minimal")  # float32/bfloat16 only: float64 is the CPU fallback's
    yield REGISTRY.get("minimal")
    fl.set_cpu_fallback(True)
    fl.set_backend("cpu")


def hits() -> int:
    return core.lib().fl_fallback_hits()


def copies() -> int:
    return core.lib().fl_fallback_copies()


def counts(backend, op: str) -> dict:
    return {p: n for (name, p), n in backend.counts.items() if name == op}


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.dtype == b.dtype
        and a.shape == b.shape
        and a.stride() == b.stride()
        and torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))
    )


CALLS = {  # name -> (fn, number of fl-level calls the fast path serves per run once committed)
    "mul": (lambda a, b: a * b, 1),
    "add_ in place": (lambda a, b: a.clone().add_(b, alpha=0.5), 1),
    "sigmoid": (lambda a, b: torch.sigmoid(a), 1),
    "mm": (lambda a, b: a @ b.t(), 1),
    "cat": (lambda a, b: torch.cat([a, b, a], 1), 1),
    "rsub (generic kernel)": (lambda a, b: 1 - a, 1),
    "max (two results)": (lambda a, b: torch.max(a, 1)[0] + torch.max(a, 1)[1], 2),
    "transpose copy": (lambda a, b: a.t().contiguous(), 1),
    "out= of the user": (lambda a, b: torch.mul(a, b, out=torch.empty_like(a)), 1),
}


@pytest.mark.parametrize("name", list(CALLS))
def test_repeated_float64_calls_are_served_in_cpp_with_the_cpus_bits(minimal, name):
    fn, served = CALLS[name]
    for k in range(3):
        x, y = torch.randn(4, 5, dtype=torch.float64), torch.randn(4, 5, dtype=torch.float64)
        fx, fy = x.to("fl"), y.to("fl")
        before = hits()
        got = fn(fx, fy)
        if k:  # the first call taught the core the signature
            assert hits() - before >= served, name
        assert same_bits(got.cpu(), fn(x, y)), name


def test_committed_calls_are_counted_under_the_fallback(minimal):
    a = torch.randn(3, 3, dtype=torch.float64, device="fl")
    core.drain_counts()
    before = counts(minimal, "aten::sigmoid").get("fallback", 0)
    h = hits()
    for _ in range(5):
        torch.sigmoid(a)
    assert hits() - h >= 4
    assert counts(minimal, "aten::sigmoid").get("fallback", 0) - before == 5
    assert fl.explain("sigmoid", torch.float64).path == "fallback"
    assert fl.explain("rsub.Scalar", torch.float64).path == "fallback"  # a generic kernel the CPU serves whole


def test_a_new_signature_goes_through_python_once(minimal):
    a = torch.randn(2, 3, dtype=torch.float64, device="fl")
    b = torch.randn(3, 2, dtype=torch.float64, device="fl")
    torch.tanh(a)
    size = core.lib().fl_fallback_size()
    h = hits()
    torch.tanh(b)  # another shape: another key
    assert hits() == h and core.lib().fl_fallback_size() == size + 1
    torch.tanh(b)
    assert hits() == h + 1


def test_the_fallback_switch_and_disabled_paths_forget_committed_calls(minimal):
    a = torch.randn(4, dtype=torch.float64, device="fl")
    torch.exp(a), torch.exp(a)
    assert core.lib().fl_fallback_size() > 0
    fl.set_cpu_fallback(False)
    assert core.lib().fl_fallback_size() == 0
    h = hits()
    with pytest.raises(NotImplementedError, match="CPU fallback"):
        torch.exp(a)  # minimal has no float64 path of its own: the switch holds on a repeated signature too
    assert hits() == h
    fl.set_cpu_fallback(True)
    torch.exp(a), torch.exp(a)
    assert core.lib().fl_fallback_size() > 0 and hits() == h + 1
    with disabled_paths("jit"):
        assert core.lib().fl_fallback_size() == 0


def test_another_backends_device_never_meets_minimals_plans(minimal):
    x = torch.randn(3, 4, dtype=torch.float64)
    m = x.to("fl")
    m * m, m * m  # committed for minimal's device
    fl.set_backend("rocm")  # computes float64 itself
    rocm = REGISTRY.get("rocm")
    r = x.to("fl")
    assert r.device != m.device
    core.drain_counts()
    before = counts(rocm, "aten::mul.Tensor")
    h = hits()
    for _ in range(3):
        assert same_bits((r * r).cpu(), x * x)
    assert hits() == h
    after = counts(rocm, "aten::mul.Tensor")
    assert after.get("native", 0) - before.get("native", 0) == 3
    assert after.get("fallback", 0) == before.get("fallback", 0)


def test_listeners_modes_and_device_only_decompositions_take_the_python_path(minimal):
    a = torch.randn(5, dtype=torch.float64, device="fl")
    torch.sin(a), torch.sin(a)
    h = hits()
    with fl.profile() as prof:  # the profiler sees every call, so the fast path steps aside
        for _ in range(3):
            torch.sin(a)
    assert hits() == h
    assert [(o.calls, o.path) for o in prof.ops() if o.op == "aten::sin"] == [(3, "fallback")]

    class Seen(TorchDispatchMode):
        ops: list = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(func)
            return func(*args, **(kwargs or {}))

    with Seen():
        torch.sin(a)  # the mode sees the op, then calls it with itself set aside: the backend may serve it
        assert torch.ops.aten.sin.default in Seen.ops and hits() == h + 1
        with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(torch._C.DispatchKey.Python)):
            torch.sin(a)  # a mode still set at the backend: Python's path, which sets it aside
        assert hits() == h + 1
    h = hits()
    core.lib().fl_fallback_device_only(1)  # what dispatch.plan says inside a decomposition that must stay
    try:
        torch.sin(a)
    finally:
        core.lib().fl_fallback_device_only(0)
    assert hits() == h
    torch.sin(a)
    assert hits() == h + 1


def test_calls_whose_tensors_share_memory(minimal):
    x = torch.arange(6.0, dtype=torch.float64)
    for _ in range(3):  # the same tensor twice: one host copy, as on the CPU
        fx = x.to("fl")
        fx.add_(fx)
        assert fx.cpu().tolist() == (x + x).tolist()
    for _ in range(2):  # partly overlapping: refused as the CPU refuses it, every time
        fx = x.to("fl")
        with pytest.raises(RuntimeError, match="refer to a single memory location"):
            fx[1:].add_(fx[:-1])
        assert fx.cpu().tolist() == x.tolist()
    for _ in range(3):  # strided views of one buffer: the fallback sees them alias
        y = torch.arange(6.0, dtype=torch.float64)
        fy = y.to("fl")
        fy[::2].mul_(fy[1::2])
        y[::2].mul_(y[1::2])
        assert fy.cpu().tolist() == y.tolist()


def test_results_of_any_size_and_outputs_the_kernel_resizes(minimal):
    for values in ([0.0, 1.0, 2.0, 0.0], [1.0, 1.0, 0.0, 3.0], [0.0, 0.0, 0.0, 0.0]):
        x = torch.tensor(values, dtype=torch.float64)
        assert torch.equal(torch.nonzero(x.to("fl")).cpu(), torch.nonzero(x))
    x = torch.randn(3, 4, dtype=torch.float64)
    fx = x.to("fl")
    for _ in range(3):
        out = torch.empty(0, dtype=torch.float64, device="fl")
        torch.exp(fx, out=out)  # out= resized by the call: Python gives it its storage
        assert same_bits(out.cpu(), torch.exp(x))
    out = torch.empty(3, 4, dtype=torch.float64, device="fl")
    ptr = out.data_ptr()
    for _ in range(3):
        torch.exp(fx, out=out)  # a user's out= keeps its memory
    assert out.data_ptr() == ptr and same_bits(out.cpu(), torch.exp(x))


def test_writes_reach_the_write_watch(minimal):
    w = torch.randn(4, dtype=torch.float64, device="fl")
    lib = core.lib()
    base = core.ffi.cast("void *", w.untyped_storage().data_ptr())
    lib.fl_core_watch(base, 1)
    try:
        gens = []
        for _ in range(3):
            w.mul_(2.0)
            gens.append(lib.fl_core_write_generation(base))
        assert gens[0] < gens[1] < gens[2]
    finally:
        lib.fl_core_watch(base, 0)


def test_bytes_moved_include_the_fast_path(minimal):
    a = torch.randn(16, dtype=torch.float64, device="fl")
    torch.cos(a)
    b0, h = events.bytes_moved(), hits()
    torch.cos(a)
    assert hits() == h + 1 and events.bytes_moved() - b0 == 2 * 16 * 8  # the input there, the result back


@pytest.mark.parametrize("backend", ["cpu", "minimal"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64])
def test_same_device_copies_are_device_copies(backend, dtype):
    fl.set_backend(backend)
    try:
        b = REGISTRY.get(backend)
        x = (torch.randn(5, 7) * 100).to(dtype)
        fx = x.to("fl")
        core.drain_counts()
        before = counts(b, "aten::copy_")
        c0 = copies()
        clones = [fx.clone() for _ in range(3)]
        assert copies() - c0 >= 2  # the first taught the core; the next are device copies in C++
        after = counts(b, "aten::copy_")
        assert after.get("copy", 0) - before.get("copy", 0) == 3
        assert all(after.get(p, 0) == before.get(p, 0) for p in ("native", "fallback"))
        for c in clones:
            assert c.data_ptr() != fx.data_ptr() and same_bits(c.cpu(), x)
        dst = torch.zeros(5, 7, dtype=dtype, device="fl")
        dst.copy_(fx)
        assert same_bits(dst.cpu(), x)
        # not one memory copy: a transpose, a broadcast, a cast, strided memory, an overlap
        assert same_bits(fx.t().contiguous().cpu(), x.t().contiguous())
        row = torch.zeros(5, 7, dtype=dtype, device="fl")
        row.copy_(fx[0])
        assert same_bits(row.cpu(), x[0].expand(5, 7).contiguous())
        assert torch.equal(fx.to(torch.float16).cpu(), x.to(torch.float16))
        s = torch.zeros(5, 14, dtype=dtype, device="fl")
        s[:, ::2].copy_(fx)
        ref = torch.zeros(5, 14, dtype=dtype)
        ref[:, ::2].copy_(x)
        assert same_bits(s.cpu(), ref)
        y = torch.arange(8).to(dtype).to("fl")
        with pytest.raises(RuntimeError, match="refer to a single memory location"):
            y[1:].copy_(y[:-1])
    finally:
        fl.set_backend("cpu")


def test_gradcheck_of_a_float64_lstm_is_exact_and_served_in_cpp(minimal):
    """The workload the fast path exists for: PyTorch's gradcheck of a float64 LSTM on a chip without
    float64 (its perturbations are same-device copies; every op a CPU-fallback call)."""
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(3, 2).double()
    x = torch.randn(2, 1, 3, dtype=torch.float64, requires_grad=True)
    flstm, fx = copy.deepcopy(lstm).to("fl"), x.detach().to("fl").requires_grad_()
    h, c = hits(), copies()
    assert torch.autograd.gradcheck(lambda t: flstm(t)[0], (fx,))
    assert hits() - h > 100 and copies() - c > 10
    ref = torch.autograd.grad(lstm(x)[0].sum(), x)[0]
    got = torch.autograd.grad(flstm(fx)[0].sum(), fx)[0]
    assert torch.allclose(got.cpu(), ref, rtol=1e-12, atol=0)


ASYNC_CHECK = """
import torch, torch_fl as fl
from torch_fl.runtime import core
fl.initialize("minimal")
lib = core.lib()
x, y = torch.randn(6, 5, dtype=torch.float64), torch.randn(6, 5, dtype=torch.float64)
fx, fy = x.to("fl"), y.to("fl")
for _ in range(3):
    assert torch.equal((fx * fy + 1).cpu(), x * y + 1)
    assert torch.equal(fx.t().contiguous().cpu(), x.t().contiguous())
    assert torch.equal(fx.clone().cpu(), x)
    z = fx.clone()
    z.mul_(fy)
    assert torch.equal(z.cpu(), x * y)
assert lib.fl_fallback_hits() >= 6 and lib.fl_fallback_copies() >= 4, (lib.fl_fallback_hits(), lib.fl_fallback_copies())
print("ok")
"""


def test_the_fast_path_on_an_asynchronous_device_it_cannot_read():
    """FL_EMU_ASYNC=1: kernels finish after their call returns and device memory is PROT_NONE to the host, so
    a direct host read would crash and a missing wait would give wrong values."""
    r = run_py(ASYNC_CHECK, env={"FL_EMU_ASYNC": "1"})
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-3000:]


def test_an_exact_op_whose_decomposition_reached_no_native_kernel_takes_its_jit_kernel_first(minimal):
    """bitwise_not and logical_not on bool: minimal has no kernel for them, and their torch._refs decompositions
    end in the JIT kernel of bitwise_not after three Python dispatches. After the first call the op's own JIT
    kernel comes first; all() (a reduction without a JIT kernel) keeps its decomposition, which reaches a
    native kernel (sum)."""
    x = torch.tensor([[0.0, 1.0, 2.0], [0.0, -1.0, 0.0]], dtype=torch.float64)
    b, fb = x == 0, (x == 0).to("fl")
    clear_plans()
    assert fl.explain("logical_not", torch.bool).path == "decomposition"
    for _ in range(3):
        assert torch.equal(torch.logical_not(fb).cpu(), torch.logical_not(b))
        assert torch.equal(torch.bitwise_not(fb).cpu(), torch.bitwise_not(b))
        assert torch.equal(fb.all(1).cpu(), b.all(1)) and fb.all().item() == b.all().item()
    for op in ("logical_not", "bitwise_not"):
        e = fl.explain(op, torch.bool)
        assert e.path == "jit" and any("reached no native kernel" in r for r in e.reasons), str(e)
    assert fl.explain("all", torch.bool).path == "decomposition"
    f32 = torch.tensor([0.0, 1.5], device="fl")
    for _ in range(2):  # floats keep the tiers' order: only exact dtypes are learned
        torch.logical_not(f32)
    assert not any("reached no native kernel" in r for r in fl.explain("logical_not", torch.float32).reasons)


def _lstm_cell_reference(ig, hg, cx, ib, hb):  # the cell as torch_fl's Python decomposition computed it
    i, f, g, o = (ig + hg + ib + hb).chunk(4, 1)
    i, f, g, o = torch.sigmoid(i), torch.sigmoid(f), torch.tanh(g), torch.sigmoid(o)
    cy = f * cx + i * g
    return o * torch.tanh(cy), cy, torch.cat([i, f, g, o], 1)


def _lstm_cell_backward_reference(grad_hy, grad_cy, cx, cy, workspace):
    i, f, g, o = workspace.chunk(4, 1)
    tanh_cy = torch.tanh(cy)
    grad_c = grad_hy * o * (1 - tanh_cy * tanh_cy) + grad_cy
    gates = torch.cat(
        [
            grad_c * g * i * (1 - i),
            grad_c * cx * f * (1 - f),
            grad_c * i * (1 - g * g),
            grad_hy * tanh_cy * o * (1 - o),
        ],
        1,
    )
    return gates, grad_c * f, gates.sum(0)


def _gru_cell_reference(ig, hg, hx, ib, hb):
    ir, ii, in_ = (ig + ib).chunk(3, 1)
    hr, hi, hn = (hg + hb).chunk(3, 1)
    r, z = torch.sigmoid(ir + hr), torch.sigmoid(ii + hi)
    n = torch.tanh(in_ + r * hn)
    return n + z * (hx - n), torch.cat([r, z, n, hx, hn], 1)


def _gru_cell_backward_reference(grad_hy, workspace):
    r, z, n, hx, hn = workspace.chunk(5, 1)
    grad_z = grad_hy * (hx - n) * z * (1 - z)
    grad_n = grad_hy * (1 - z) * (1 - n * n)
    grad_r = grad_n * hn * r * (1 - r)
    gi, gh = torch.cat([grad_r, grad_z, grad_n], 1), torch.cat([grad_r, grad_z, grad_n * r], 1)
    return gi, gh, grad_hy * z, gi.sum(0), gh.sum(0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_rnn_cells_compute_op_for_op_what_the_python_decomposition_did(dtype):
    """runtime/csrc/fl_rnn.cpp holds the fused cells' arithmetic: the same ops in the same order as the Python
    decomposition it replaced, so the same bits, on host tensors (the CPU fallback's host kernel) and fl ones."""
    torch.manual_seed(0)
    b, h = 3, 4
    lstm = [
        torch.randn(b, 4 * h, dtype=dtype),
        torch.randn(b, 4 * h, dtype=dtype),
        torch.randn(b, h, dtype=dtype),
        torch.randn(4 * h, dtype=dtype),
        torch.randn(4 * h, dtype=dtype),
    ]
    gru = [
        torch.randn(b, 3 * h, dtype=dtype),
        torch.randn(b, 3 * h, dtype=dtype),
        torch.randn(b, h, dtype=dtype),
        torch.randn(3 * h, dtype=dtype),
        torch.randn(3 * h, dtype=dtype),
    ]
    ops = torch.ops.fl_rnn
    grads = [torch.randn(b, h, dtype=dtype), torch.randn(b, h, dtype=dtype)]
    for on_fl in (False, True):  # the Python composition on the same device is the reference
        move = (lambda t: t.to("fl")) if on_fl else (lambda t: t)
        lstm_, gru_, grads_ = list(map(move, lstm)), list(map(move, gru)), list(map(move, grads))
        want = _lstm_cell_reference(*lstm_)
        assert all(same_bits(g.cpu(), w.cpu()) for g, w in zip(ops.lstm_cell(*lstm_), want, strict=True))
        got = ops.lstm_cell_backward(*grads_, lstm_[2], want[1], want[2], True)
        ref = _lstm_cell_backward_reference(*grads_, lstm_[2], want[1], want[2])
        assert all(same_bits(g.cpu(), w.cpu()) for g, w in zip(got, ref, strict=True))
        want = _gru_cell_reference(*gru_)
        assert all(same_bits(g.cpu(), w.cpu()) for g, w in zip(ops.gru_cell(*gru_), want, strict=True))
        got, ref = ops.gru_cell_backward(grads_[0], want[1], True), _gru_cell_backward_reference(grads_[0], want[1])
        assert all(same_bits(g.cpu(), w.cpu()) for g, w in zip(got, ref, strict=True))


def test_a_float64_lstm_on_minimal_runs_each_cell_whole_on_the_host(minimal):
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(3, 4, 2).double()
    x = torch.randn(5, 2, 3, dtype=torch.float64, requires_grad=True)
    flstm, fx = copy.deepcopy(lstm).to("fl"), x.detach().to("fl").requires_grad_()
    flstm(fx)[0].sum().backward()  # teaches the core each cell's signature
    core.drain_counts()
    cells = counts(minimal, "aten::_thnn_fused_lstm_cell").get("fallback", 0)
    h = hits()
    out = flstm(fx)[0]
    assert counts(minimal, "aten::_thnn_fused_lstm_cell").get("fallback", 0) - cells == 5 * 2  # steps x layers
    assert hits() - h >= 5 * 2  # each cell one call of the C++ fast path (the GEMMs around them too)
    assert fl.explain("_thnn_fused_lstm_cell", torch.float64).path == "fallback"
    ref = lstm(x)[0]
    assert torch.allclose(out.cpu(), ref, rtol=1e-12, atol=1e-14)
