"""The four-tier dispatcher: paths, caching, explanations, and gradients on every path."""

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_close

import torch_fl as fl
from torch_fl.runtime import REGISTRY, disabled_paths


def _counts(op: str) -> dict:
    return {p: n for (name, p), n in REGISTRY.get("cpu").counts.items() if name == op}


def test_explain_reports_each_tier():
    cpu = fl.capabilities("cpu")
    # a native kernel where the plugin has one
    native = next(op for op in ("aten::mm", "aten::add.Tensor") if cpu.supports(op))
    assert fl.explain(native).path == "native"
    # trace: no host kernel, PyTorch has a decomposition
    e = fl.explain("trace")
    assert e.path in ("decomposition", "fallback") and any("decomposition" in r for r in e.reasons)
    assert fl.explain("view").path == "view"
    with disabled_paths("native", "decomposition"):
        assert fl.explain(native).path == "fallback"
    text = str(fl.explain(native))
    assert native in text and "backend 'cpu'" in text


def test_plan_is_cached_per_signature():
    b = REGISTRY.get("cpu")
    x = torch.randn(4, device="fl")
    y = x.exp()
    key = (torch.ops.aten.exp.default, (torch.float32,))
    assert key in b.plans
    plan = b.plans[key]
    x.exp()
    assert b.plans[key] is plan
    assert_close(y, x.cpu().exp())


def test_every_call_is_counted():
    x = torch.randn(8, 8, device="fl")
    before = dict(_counts("aten::exp"))
    x.exp()
    x.exp()
    after = _counts("aten::exp")
    assert sum(after.values()) - sum(before.values()) == 2


OPS = [
    ("matmul", lambda a, b: a @ b, [(5, 7), (7, 3)]),
    ("linear", lambda a, w, b: F.linear(a, w, b), [(4, 6), (5, 6), (5,)]),
    ("softmax", lambda a: F.softmax(a, -1), [(3, 9)]),
    ("log_softmax_nll", lambda a: F.cross_entropy(a, torch.tensor([1, 0, 3]).to(a.device)), [(3, 5)]),
    ("layer_norm", lambda a, w, b: F.layer_norm(a, (6,), w, b), [(4, 6), (6,), (6,)]),
    ("gelu_tanh", lambda a: F.gelu(a) * torch.tanh(a), [(4, 6)]),
    (
        "conv_bn_relu",
        lambda x, w, g, b: F.relu(F.batch_norm(F.conv2d(x, w, padding=1), None, None, g, b, training=True)),
        [(2, 3, 6, 6), (4, 3, 3, 3), (4,), (4,)],
    ),
    ("maxpool_avgpool", lambda x: F.avg_pool2d(F.max_pool2d(x, 3, 2, 1), 2), [(2, 3, 8, 8)]),
    ("reductions", lambda a: a.sum(0).mean() + a.amax(1).sum() + a.var(1).sum(), [(5, 6)]),
    ("pointwise_broadcast", lambda a, b: (a * b - a / (b.abs() + 1)).sigmoid().sqrt(), [(4, 1, 3), (2, 3)]),
    ("embedding", lambda w: F.embedding(torch.tensor([[0, 2], [3, 3]]).to(w.device), w).sum(-1), [(5, 4)]),
    ("cumprod_cummax", lambda a: torch.cumprod(a, 1) + torch.cummax(a, 1).values, [(3, 4)]),
]


@pytest.mark.parametrize(
    "disabled", [(), ("native",), ("native", "decomposition")], ids=["all-paths", "no-native", "fallback-only"]
)
@pytest.mark.parametrize("name,fn,shapes", OPS, ids=[o[0] for o in OPS])
def test_values_and_gradients_match_cpu_on_every_path(name, fn, shapes, disabled):
    torch.manual_seed(0)
    cpu_inputs = [torch.randn(*s, dtype=torch.float64, requires_grad=True) for s in shapes]
    fl_inputs = [t.detach().to("fl").requires_grad_() for t in cpu_inputs]
    expected = fn(*cpu_inputs)
    expected.sum().backward()
    with disabled_paths(*disabled):
        out = fn(*fl_inputs)
        out.sum().backward()
    assert out.device.type == "fl"
    assert_close(out, expected, 1e-9, what=f"{name} output")
    for i, (c, f) in enumerate(zip(cpu_inputs, fl_inputs, strict=True)):
        assert f.grad is not None, f"{name}: gradient of input {i} is None"
        assert f.grad.device.type == "fl"
        assert_close(f.grad, c.grad, 1e-9, what=f"{name} grad {i}")


def test_disabled_paths_validation():
    with pytest.raises(ValueError, match="can only disable"):
        with disabled_paths("fallback"):
            pass


def test_foreach_ops_for_optimizers():
    ts = [torch.randn(3, device="fl") for _ in range(3)]
    cpu = [t.cpu() for t in ts]
    torch._foreach_mul_(ts, 2.0)
    torch._foreach_add_(ts, [torch.ones(3, device="fl")] * 3, alpha=0.5)
    for t, c in zip(ts, cpu, strict=True):
        assert_close(t, c * 2 + 0.5)
    norms = torch._foreach_norm(ts)
    assert_close(torch.stack([n.cpu() for n in norms]), torch.stack([(c * 2 + 0.5).norm() for c in cpu]))


def test_non_contiguous_and_zero_size():
    a = torch.randn(6, 8)
    f = a.to("fl")
    assert_close(f.t() @ f, a.t() @ a)
    assert_close(f[:, ::2].exp(), a[:, ::2].exp())
    z = torch.empty(0, 5, device="fl")
    assert (z + 1).shape == (0, 5)
    assert z.sum().item() == 0.0


def test_type_promotion_and_scalars():
    i = torch.arange(6, device="fl")
    r = i * 1.5
    assert r.dtype == torch.float32
    assert_close(r, torch.arange(6) * 1.5)
    assert (i + 2).dtype == torch.int64 and (i + 2).cpu().tolist() == [2, 3, 4, 5, 6, 7]
    assert (i > 2).dtype == torch.bool and (i > 2).cpu().tolist() == [False] * 3 + [True] * 3


def test_call_site_fast_path_keeps_values_scalars_and_metadata_right():
    # the second call of a signature reuses the marshalling of the first: new data, new float scalars
    a, b = torch.randn(6), torch.randn(6)
    for alpha in (0.5, 2.0, -3.25):
        fa, fb = a.to("fl"), b.to("fl")
        assert_close(torch.add(fa, fb, alpha=alpha), torch.add(a, b, alpha=alpha))
        a, b = b, a * 3
    # in-place ops write the tensor they were given
    x = torch.zeros(4, device="fl")
    for k in range(3):
        x.add_(torch.ones(4, device="fl"))
        assert x.cpu().tolist() == [k + 1.0] * 4
    # a tensor whose metadata changed in place is not matched with its old signature
    y = torch.ones(4, device="fl")
    (y * 2).cpu()
    y.resize_(2, 3).fill_(1)
    assert (y * 2).cpu().tolist() == [[2.0] * 3] * 2
    # broadcasting and views take their own signatures
    m = torch.randn(3, 4)
    fm = m.to("fl")
    assert_close(fm.t() * fm[0:1].t(), m.t() * m[0:1].t())
    assert_close(fm * fm[0], m * m[0])
    before = sum(_counts("aten::mul.Tensor").values())
    fm * fm[0]
    assert sum(_counts("aten::mul.Tensor").values()) == before + 1


def test_ops_taken_at_the_fl_key_get_the_fast_path_too():
    """convolution is CompositeExplicitAutograd: torch_fl takes it at the fl key, where the C++ core's fallback
    is its kernel, so a repeated signature skips the Python dispatcher (new data each call, right values),
    an out= call into a channels-last buffer too; the profiler still sees every call."""
    from torch_fl.runtime import core

    hits = core.lib().fl_core_fast_hits
    w, b = torch.randn(4, 3, 3, 3), torch.randn(4)
    fw, fb = w.to("fl"), b.to("fl")
    out = torch.empty(2, 4, 6, 6, device="fl", memory_format=torch.channels_last)
    served = 0
    for _ in range(3):
        x = torch.randn(2, 3, 8, 8)
        fx = x.to("fl")
        before = hits()
        y = torch.ops.aten.convolution(fx, fw, fb, [1, 1], [0, 0], [1, 1], False, [0, 0], 1)
        r = torch.ops.aten.convolution.out(fx, fw, fb, [1, 1], [0, 0], [1, 1], False, [0, 0], 1, out=out)
        served += hits() - before
        assert r.is_contiguous(memory_format=torch.channels_last)
        assert_close(y, torch.nn.functional.conv2d(x, w, b), 1e-5)
        assert_close(r, torch.nn.functional.conv2d(x, w, b), 1e-5)
    assert served == 4  # the second and third calls of each
    with fl.profile() as prof:
        torch.nn.functional.conv2d(x.to("fl"), fw, fb)
    assert [o.calls for o in prof.ops() if o.op == "aten::convolution"] == [1]


@pytest.mark.parametrize("backend", ["cpu", "rocm", "minimal"])
def test_casts_on_the_device_skip_python_from_the_third_call(backend, monkeypatch):
    """A cast (.to(dtype), .half(), autocast's) reaches the device as _copy_from(src, dst) and is served as
    copy_: the C++ core learns it under _copy_from's key, so a repeated cast never enters Python, with the
    values PyTorch gives. A complex-to-real cast is never learnt: PyTorch warns on each such call."""
    import importlib

    entry = importlib.import_module("torch_fl.dispatch.entry")
    calls: list = []
    real = entry.ENTRY.dispatch
    monkeypatch.setattr(entry.ENTRY, "dispatch", lambda func, a, k: calls.append(str(func)) or real(func, a, k))
    fl.set_backend(backend)
    for dtype in (torch.float16, torch.float64, torch.int32, torch.bfloat16):
        for k in range(4):
            x = torch.randn(3, 5) * 50
            fx = x.to("fl")
            calls.clear()
            got = fx.to(dtype)
            if k >= 2:
                assert calls == [], (dtype, calls)
            assert got.dtype == dtype and torch.equal(got.cpu(), x.to(dtype)), dtype
    z = torch.randn(4, dtype=torch.complex64).to("fl")
    out = torch.empty(4, device="fl")
    for _ in range(3):
        with pytest.warns(UserWarning, match="discards the imaginary part"):
            out.copy_(z)
        assert torch.equal(out.cpu(), z.cpu().real)


@pytest.mark.parametrize("backend", ["cpu", "ascend"])  # host-accessible memory, and device memory kept apart
def test_partial_overlap_is_refused_and_aliasing_survives_the_fallback(backend):
    fl.set_backend(backend)
    x = torch.arange(6.0).to("fl")
    with pytest.raises(RuntimeError, match="refer to a single memory location"):
        x[1:].add_(x[:-1])  # CPU PyTorch refuses this too
    assert x.cpu().tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    with disabled_paths("native", "decomposition"):  # the CPU fallback sees one host copy of the buffer
        y = torch.arange(6.0).to("fl")
        y[::2].mul_(y[1::2])
        assert y.cpu().tolist() == [0.0, 1.0, 6.0, 3.0, 20.0, 5.0]
        z = torch.arange(4.0).to("fl")
        z.add_(z)  # full overlap is fine
        assert z.cpu().tolist() == [0.0, 2.0, 4.0, 6.0]


@pytest.mark.parametrize("backend", ["cpu", "rocm", "minimal"])
def test_arange_runs_on_the_device_without_fallback(backend):
    fl.set_backend(backend)
    fl.set_cpu_fallback(False)  # a factory the plugin has a kernel for needs no host round trip
    try:
        for args, kw in [
            ((5,), {}),
            ((2, 9), {}),
            ((1.0, 2.0, 0.25), {}),
            ((0, 10, 3), {"dtype": torch.float32}),
            ((0,), {}),
        ]:
            got, want = torch.arange(*args, device="fl", **kw), torch.arange(*args, **kw)
            assert got.device == fl.current_device() and got.dtype == want.dtype
            assert torch.equal(got.cpu(), want)
    finally:
        fl.set_cpu_fallback(True)
        fl.set_backend("cpu")


def test_layout_cache_keys_floats_by_value():
    """arange's bounds are floats that shape its result: a cached layout must not be reused
    across different bounds (mvlgamma's backward calls arange like this)."""
    a = torch.arange(0.0, 0.5, 0.5, device="fl")
    b = torch.arange(-0.5, 0.5, 0.5, device="fl")
    c = torch.arange(4.0, device="fl")
    d = torch.arange(3.0, device="fl")
    assert a.cpu().tolist() == [0.0] and b.cpu().tolist() == [-0.5, 0.0]
    assert c.shape == (4,) and d.shape == (3,)


def test_dtype_the_device_lacks_takes_the_cpu_kernel_whole():
    """minimal computes in no float64: an op with a CPU kernel and only PyTorch's decomposition goes to the CPU
    fallback whole (one round trip, PyTorch's CPU kernel: the baseline's bits), not through torch._refs' sub-ops,
    each a fallback of its own (sigmoid was neg, exp, add, div: 4 round trips plus the refs' Python); an in-place
    op writes self's host copy back once, with no copy_ fallback after it; the fused LSTM cell, which the CPU
    has no kernel for, runs whole on torch_fl's host kernel. What needs the device (its RNG) or is torch_fl's
    own decomposition (zero_ as a memory fill) keeps it."""
    fl.set_backend("minimal")
    try:
        m = REGISTRY.get("minimal")
        counts = lambda op: dict((p, n) for (name, p), n in m.counts.items() if name == op)  # noqa: E731
        x = torch.randn(6, 5, dtype=torch.float64)
        d = x.to("fl")
        assert fl.explain("sigmoid", torch.float64).path == "fallback"
        assert fl.explain("sigmoid", torch.float32).path == "native"
        assert fl.explain("zero_", torch.float64).path == "decomposition"
        assert fl.explain("_thnn_fused_lstm_cell", torch.float64).path == "fallback"
        assert fl.explain("_thnn_fused_lstm_cell", torch.float32).path == "decomposition"
        assert fl.explain("exponential_", torch.float64).path == "decomposition"
        before = {op: counts(op) for op in ("aten::neg", "aten::exp", "aten::copy_")}
        for fn in (
            torch.sigmoid,
            torch.tanh,
            torch.special.expit,
            lambda t: torch.softmax(t, 1),
            lambda t: torch.nn.functional.gelu(t),
            lambda t: t.sinc(),
        ):
            assert torch.equal(fn(d).cpu(), fn(x))
        for fn in (lambda t: t.add_(1.5), lambda t: t.mul_(t), lambda t: t.sigmoid_()):
            a, b = x.clone(), d.clone()
            fn(a), fn(b)
            assert torch.equal(b.cpu(), a)
        # none of them went through a sub-op in float64 (the clones' copy_ are the only copies)
        assert counts("aten::neg") == before["aten::neg"] and counts("aten::exp") == before["aten::exp"]
        assert counts("aten::copy_").get("fallback", 0) - before["aten::copy_"].get("fallback", 0) <= 3
        # the fused cell's host kernel serves LSTM, forward and backward
        lstm = torch.nn.LSTM(3, 4).double()
        inp = torch.randn(2, 1, 3, dtype=torch.float64, requires_grad=True)
        ref = lstm(inp)[0]
        ref.sum().backward()
        dlstm, dinp = lstm.to("fl"), inp.detach().to("fl").requires_grad_()
        got = dlstm(dinp)[0]
        got.sum().backward()
        assert_close(got.cpu(), ref.detach(), rel=1e-12)
        assert_close(dinp.grad.cpu(), inp.grad, rel=1e-12)
    finally:
        fl.set_backend("cpu")


@pytest.mark.parametrize("backend", ["ascend", "minimal"])
def test_addmm_with_default_scales_decomposes_to_mm_and_add(backend):
    """A chip without addmm runs nn.Linear as two kernels, mm and add, with the bits of torch's decomposition
    (which multiplies both terms by their scale of 1 first: four kernels); other scales take torch's."""
    fl.set_backend(backend)
    torch.manual_seed(0)
    x, w, b = torch.randn(4, 64, device="fl"), torch.randn(32, 64, device="fl"), torch.randn(32, device="fl")
    torch_decomposition = torch._decomp.decomposition_table[torch.ops.aten.addmm.default]
    with fl.profile() as prof:
        y = F.linear(x, w, b)
    assert prof.kernels == 2, str(prof)
    expected = torch_decomposition(b, x, w.t())  # its sub-ops dispatched on the same backend
    assert torch.equal(y.cpu(), expected.cpu())
    for beta, alpha in ((0.5, 2.0), (0, 1), (1, 3)):
        got = torch.addmm(b, x, w.t(), beta=beta, alpha=alpha)
        assert torch.equal(got.cpu(), torch_decomposition(b, x, w.t(), beta=beta, alpha=alpha).cpu()), (beta, alpha)
    assert_close(y, F.linear(x.cpu(), w.cpu(), b.cpu()))
