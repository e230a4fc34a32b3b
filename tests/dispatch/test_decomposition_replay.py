"""Decomposition plans (dispatch/decomp_replay.py, csrc/fl_decomp_plans.cpp): a call served by a decomposition
is recorded at the second call of its signature as a kernel graph, and later calls of that signature are
replayed by the C++ core without Python. The replays must give the bits the Python path gives, count what it
counts, and never serve a call whose signature does not fix the work (a layout the plan cannot copy, a buffer
over the bound; each value of a float gets its own plan); switching paths or the fallback forgets the plans and
frees their memory."""

import importlib

import pytest
import torch

import torch_fl as fl
from torch_fl.dispatch import decomp_replay
from torch_fl.dispatch.facts import OpFacts
from torch_fl.runtime import REGISTRY, clear_plans, core, disabled_paths, native

aten = torch.ops.aten


@pytest.fixture
def minimal():
    fl.set_backend("minimal")  # float32 addmm, gelu, log_softmax, nll_loss are decompositions there
    clear_plans()
    yield REGISTRY.get("minimal")
    clear_plans()
    fl.set_backend("cpu")


@pytest.fixture
def python_decompositions(monkeypatch):
    """How many decompositions Python ran (every op, nested ones too)."""
    calls = []
    real = OpFacts.call_decomposition

    def counting(self, fn, vals):
        calls.append(self.name)
        return real(self, fn, vals)

    monkeypatch.setattr(OpFacts, "call_decomposition", counting)
    return calls


def hits() -> int:
    return core.lib().fl_core_decomp_hits()


def plans() -> int:
    return core.lib().fl_core_decomp_size()


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.dtype == b.dtype
        and a.shape == b.shape
        and torch.equal(
            a.detach().cpu().contiguous().view(torch.uint8), b.detach().cpu().contiguous().view(torch.uint8)
        )
    )


def without_fast_path(fn, *args):
    """fn on the Python path only (FL_FAST_PATH=0): what a replay must reproduce bit for bit."""
    native.FAST.enabled = False
    native.sync_fast_path()
    try:
        return fn(*args)
    finally:
        native.FAST.enabled = True
        native.sync_fast_path()


CALLS = {  # name -> (fn, inputs as (shape, dtype) and the op counted under "decomposition")
    "addmm": (lambda b, x, w: torch.addmm(b, x, w.t()), [(16,), (4, 8), (16, 8)], "aten::addmm"),
    "gelu": (lambda x: torch.nn.functional.gelu(x), [(4, 32)], "aten::gelu"),
    "gelu tanh": (lambda x: torch.nn.functional.gelu(x, approximate="tanh"), [(3, 5)], "aten::gelu"),
    "gelu_backward": (lambda g, x: aten.gelu_backward(g, x), [(4, 32), (4, 32)], "aten::gelu_backward"),
    "_log_softmax": (lambda x: torch.log_softmax(x, 1), [(4, 10)], "aten::_log_softmax"),
}


def inputs(shapes, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g).to("fl") for s in shapes]


@pytest.mark.parametrize("name", list(CALLS))
def test_the_third_call_of_a_signature_is_served_in_cpp(minimal, python_decompositions, name):
    fn, shapes, op = CALLS[name]
    args = inputs(shapes)
    h, ran = hits(), len(python_decompositions)
    fn(*args)  # the first call serves (a JIT kernel's watch may take it: dispatch.jit_replay) ...
    assert hits() == h and len(python_decompositions) > ran, name
    for k in range(2):  # ... a later one records
        fn(*inputs(shapes, seed=k))
    assert plans() == 1, name
    for k in range(3):
        args = inputs(shapes, seed=10 + k)
        h, ran = hits(), len(python_decompositions)
        got = fn(*args)
        assert hits() == h + 1 and len(python_decompositions) == ran, name
        assert same_bits(got, without_fast_path(fn, *args)), name


@pytest.mark.parametrize("shapes", [[(7,), (3, 5), (7, 5)], [(1,), (1, 1), (1, 1)], [(33,), (9, 17), (33, 17)]])
def test_replays_are_bit_identical_for_several_shapes(minimal, shapes):
    def fn(b, x, w):
        return torch.nn.functional.gelu(torch.addmm(b, x, w.t()))

    for k in range(5):
        args = inputs(shapes, seed=k)
        assert same_bits(fn(*args), without_fast_path(fn, *args))
    h = hits()
    args = inputs(shapes, seed=9)
    assert same_bits(fn(*args), without_fast_path(fn, *args))
    assert hits() == h + 2  # addmm and gelu


def test_non_dense_inputs_are_never_replayed_but_right(minimal):
    x = torch.randn(4, 64)
    fx = x.to("fl")
    h = hits()
    for _ in range(4):
        got = torch.nn.functional.gelu(fx[:, ::2])  # every other column: not dense
        assert same_bits(got, without_fast_path(torch.nn.functional.gelu, fx[:, ::2]))
    assert hits() == h
    for _ in range(4):  # a transposed tensor is dense: its strides are in the key
        got = torch.log_softmax(fx.t(), 1)
        assert same_bits(got, without_fast_path(torch.log_softmax, fx.t(), 1))
    assert hits() >= h + 1


def test_out_and_in_place_calls_write_the_given_tensors(minimal):
    b, x, w = inputs([(6,), (3, 4), (6, 4)])
    out = torch.empty(3, 6, device="fl")
    ptr = out.data_ptr()
    for _ in range(3):
        torch.addmm(b, x, w.t(), out=out)
    h = hits()
    b2, x2, w2 = inputs([(6,), (3, 4), (6, 4)], seed=5)
    got = torch.addmm(b2, x2, w2.t(), out=out)
    assert hits() == h + 1 and got is out and out.data_ptr() == ptr
    assert same_bits(out, without_fast_path(torch.addmm, b2, x2, w2.t()))
    acc = torch.zeros(3, 6, device="fl")
    ref = torch.zeros(3, 6, device="fl")
    for k in range(4):
        xk, wk = inputs([(3, 4), (6, 4)], seed=k)
        acc.addmm_(xk, wk.t())  # addmm.out into self: the replay reads self before it writes it
        without_fast_path(ref.addmm_, xk, wk.t())
        assert same_bits(acc, ref)
    assert hits() >= h + 2


def test_counts_are_what_the_python_path_counts(minimal):
    def fn(b, x, w):
        return torch.nn.functional.gelu(torch.addmm(b, x, w.t()))

    def delta(run, args):
        core.drain_counts()
        before = dict(minimal.counts)
        run(*args)
        core.drain_counts()
        return {k: v - before.get(k, 0) for k, v in minimal.counts.items() if v != before.get(k, 0)}

    shapes = [(16,), (4, 8), (16, 8)]
    for k in range(3):
        fn(*inputs(shapes, seed=k))
    h = hits()
    replayed = delta(fn, inputs(shapes, seed=3))
    assert hits() == h + 2
    python = delta(lambda *a: without_fast_path(fn, *a), inputs(shapes, seed=4))
    assert replayed[("aten::addmm", "decomposition")] == 1
    assert replayed[("aten::gelu", "decomposition")] == 1
    assert replayed == python


def test_switching_paths_or_the_fallback_forgets_the_plans_and_frees_them(minimal):
    x = torch.randn(64, 64).to("fl")
    torch.fl.synchronize()
    allocated = torch.fl.memory_allocated()
    for _ in range(4):
        torch.nn.functional.gelu(x)
    assert plans() == 1 and core.lib().fl_core_decomp_bytes() > 0
    assert torch.fl.memory_allocated() > allocated  # the plan's buffers: the input copy, the result, intermediates
    clear_plans()
    assert plans() == 0 and core.lib().fl_core_decomp_bytes() == 0
    assert torch.fl.memory_allocated() == allocated  # the memory went back
    for _ in range(4):  # the dispatcher's plans were forgotten too: the signature is learnt again
        torch.nn.functional.gelu(x)
    assert plans() == 1
    with disabled_paths("native"):
        assert plans() == 0
        for _ in range(3):  # gelu's sub-ops are JIT kernels now: what a plan of this block records
            got = torch.nn.functional.gelu(x)
        assert same_bits(got, without_fast_path(torch.nn.functional.gelu, x))
    assert plans() == 0
    for _ in range(4):
        torch.nn.functional.gelu(x)
    assert plans() == 1
    fl.set_cpu_fallback(False)
    try:
        assert plans() == 0
    finally:
        fl.set_cpu_fallback(True)


def test_the_profiler_sees_every_call(minimal):
    x = torch.randn(4, 10).to("fl")
    for _ in range(3):
        torch.log_softmax(x, 1)
    h = hits()
    with fl.profile() as prof:
        for _ in range(4):
            torch.log_softmax(x, 1)
    assert hits() == h
    assert [(o.calls, o.path) for o in prof.ops() if o.op == "aten::_log_softmax"] == [(4, "decomposition")]
    torch.log_softmax(x, 1)
    assert hits() == h + 1


@pytest.mark.parametrize(
    "name,first,second",
    [
        (
            "leaky_relu",
            lambda x: torch.nn.functional.leaky_relu(x, 0.3),
            lambda x: torch.nn.functional.leaky_relu(x, 0.7),
        ),
        ("addmm beta", lambda x: torch.addmm(x, x, x, beta=0.5), lambda x: torch.addmm(x, x, x, beta=0.25)),
        ("addmm int beta", lambda x: torch.addmm(x, x, x, beta=2), lambda x: torch.addmm(x, x, x, beta=3)),
        ("softplus", lambda x: torch.nn.functional.softplus(x, 2.0), lambda x: torch.nn.functional.softplus(x, 3.0)),
    ],
)
def test_a_number_in_the_call_is_never_served_stale(minimal, name, first, second):
    x = torch.randn(5, 5)
    fx = x.to("fl")
    for _ in range(3):
        assert same_bits(first(fx), without_fast_path(first, fx)), name
    for _ in range(3):
        assert same_bits(second(fx), without_fast_path(second, fx)), name
    assert torch.allclose(second(fx).cpu(), second(x), atol=1e-5), name


def test_big_calls_are_not_committed(minimal, python_decompositions):
    x = torch.randn(512, 1024).to("fl")  # 2 MiB: over the bound on one plan's buffers
    assert x.numel() * 4 > decomp_replay.MAX_BYTES
    for _ in range(4):
        got = torch.nn.functional.gelu(x)
    assert plans() == 0
    assert same_bits(got, without_fast_path(torch.nn.functional.gelu, x))
    mid = torch.randn(128, 512).to("fl")  # 256 KiB in, but the recording's buffers (the input's copy, the
    for _ in range(3):  # result, erf's and the products' intermediates) pass the bound: not committed either
        torch.nn.functional.gelu(mid)
    assert plans() == 0
    for _ in range(2):  # and not recorded again: each call runs its decomposition once
        ran = python_decompositions.count("aten::gelu")
        torch.nn.functional.gelu(mid)
        assert python_decompositions.count("aten::gelu") == ran + 1


def test_a_plan_serves_only_the_stream_it_was_recorded_on(minimal):
    x = torch.randn(4, 10).to("fl")
    for _ in range(3):
        torch.log_softmax(x, 1)
    h = hits()
    side = torch.Stream("fl")
    with side:  # the plan's static buffers are used in the recording stream's order
        got = torch.log_softmax(x, 1)
    side.synchronize()
    assert hits() == h
    assert same_bits(got, without_fast_path(torch.log_softmax, x, 1))
    for _ in range(2):  # the side stream's call recorded the signature again: back on the default stream, the
        got = torch.log_softmax(x, 1)  # next call records once more, and the one after is served
    assert hits() == h + 1
    assert same_bits(got, without_fast_path(torch.log_softmax, x, 1))


def test_calls_from_two_threads_are_right(minimal):
    import threading

    x = torch.randn(8, 32).to("fl")
    want = without_fast_path(torch.nn.functional.gelu, x).cpu()
    for _ in range(4):
        torch.nn.functional.gelu(x)
    assert plans() == 1
    h = hits()
    bad = []

    def work():
        for _ in range(50):
            if not torch.equal(torch.nn.functional.gelu(x).cpu(), want):
                bad.append(1)

    threads = [threading.Thread(target=work) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not bad and hits() > h  # a call that finds the plan busy in the other thread goes to Python


def test_a_plan_steps_aside_under_another_default_dtype_or_determinism(minimal):
    """The default dtype and torch.use_deterministic_algorithms are process settings a decomposition may read
    and the key does not hold: a plan recorded under one never serves under another."""
    fn, shapes, _ = CALLS["gelu"]
    for k in range(4):
        fn(*inputs(shapes, seed=k))
    assert plans() == 1
    args = inputs(shapes, seed=20)
    h = hits()
    fn(*args)
    assert hits() == h + 1  # served by the plan
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        h = hits()
        got = fn(*args)
        assert hits() == h and same_bits(got, without_fast_path(fn, *args))
    finally:
        torch.set_default_dtype(old)
    torch.use_deterministic_algorithms(True)
    try:
        h = hits()
        fn(*args)
        assert hits() == h
    finally:
        torch.use_deterministic_algorithms(False)
    h = hits()
    for _ in range(3):  # the same settings again: served by a plan again (a call may record it anew first)
        fn(*args)
    assert hits() > h


def _python_calls(monkeypatch) -> list:
    """The ops that reach the Python dispatcher (the C++ fast paths serve the rest)."""
    entry = importlib.import_module("torch_fl.dispatch.entry")
    seen: list = []
    real = entry.ENTRY.dispatch

    def counting(func, args, kwargs):
        seen.append(str(func))
        return real(func, args, kwargs)

    monkeypatch.setattr(entry.ENTRY, "dispatch", counting)
    return seen


@pytest.mark.parametrize(
    "name,fn",
    [
        ("leaky_relu", lambda x, a: torch.nn.functional.leaky_relu(x, a)),
        ("mul.Scalar", lambda x, a: aten.mul.Scalar(x, a)),
        ("layer_norm eps", lambda x, a: torch.nn.functional.layer_norm(x, (6,), eps=a)),
        ("lerp weight as a CPU tensor", lambda x, a: torch.lerp(x, x.flip(0), torch.tensor(a))),
    ],
)
def test_each_value_of_a_number_gets_its_own_plan(minimal, monkeypatch, name, fn):
    """A float (or a number given as a 0-dim CPU tensor) is part of a plan's key: calls alternating two values
    are each served in C++ from their own plan, with the Python path's bits."""
    calls = _python_calls(monkeypatch)
    x = torch.randn(4, 6)
    fx = x.to("fl")
    for _ in range(3):
        fn(fx, 0.25)
    first = plans()
    for _ in range(3):
        fn(fx, 0.5)
    assert plans() == first + 1, name  # the same signature with another value: a plan of its own
    for _ in range(2):
        for a in (0.5, 0.25):
            h = hits()
            calls.clear()
            got = fn(fx, a)
            assert hits() > h and calls == [], (name, calls)
            assert same_bits(got, without_fast_path(fn, fx, a)), name
            assert torch.allclose(got.cpu(), fn(x, a), atol=1e-6), name


def test_layer_norm_backward_with_its_output_mask_is_served_in_cpp(minimal, monkeypatch):
    """native_layer_norm_backward's output_mask is a list of bools, which the key holds."""
    calls = _python_calls(monkeypatch)
    g = torch.Generator().manual_seed(0)
    x, w, b, gout = (torch.randn(s, generator=g) for s in ((4, 6), (6,), (6,), (4, 6)))
    fx, fw, fb = (t.to("fl").requires_grad_() for t in (x, w, b))
    fgout = gout.to("fl")  # dense (a sum's gradient would be an expanded scalar, which no plan copies)
    for _ in range(3):
        torch.nn.functional.layer_norm(fx, (6,), fw, fb).backward(fgout)
    calls.clear()
    fx.grad = fw.grad = fb.grad = None
    torch.nn.functional.layer_norm(fx, (6,), fw, fb).backward(fgout)
    assert not [c for c in calls if "layer_norm" in c], calls
    rx, rw, rb = (t.clone().requires_grad_() for t in (x, w, b))
    torch.nn.functional.layer_norm(rx, (6,), rw, rb).backward(gout)
    for got, want in ((fx.grad, rx.grad), (fw.grad, rw.grad), (fb.grad, rb.grad)):
        assert torch.allclose(got.cpu(), want, atol=1e-5)


def test_expanded_inputs_are_replayed_from_their_span(minimal):
    """An expanded input (a stride-0 dim: BERT's token-type ids) is copied as the span of its elements: a plan
    serves it, with the Python path's bits."""
    base = torch.randn(1, 32)
    fx = base.to("fl")
    for _ in range(3):
        torch.nn.functional.gelu(fx.expand(4, 32))
    h = hits()
    for k in range(3):
        x = torch.randn(1, 32, generator=torch.Generator().manual_seed(k)).to("fl").expand(4, 32)
        got = torch.nn.functional.gelu(x)
        assert same_bits(got, without_fast_path(torch.nn.functional.gelu, x))
        assert torch.allclose(got.cpu(), torch.nn.functional.gelu(x.cpu()), atol=1e-6)
    assert hits() == h + 3


def test_replays_read_inputs_in_place_at_any_storage_offset(minimal):
    """A plan's kernels read the call's tensors where they are (no copy into the static inputs): dense slices at
    other storage offsets give the Python path's bits, and the tensors read are left as they were."""

    def fn(b, x, w):
        return torch.addmm(b, x, w.t())

    bb, bx, bw = (torch.randn(n).to("fl") for n in (40, 64, 160))  # three storages: no aliasing in the key
    for k in range(6):
        b, x, w = bb[k : k + 16], bx[k : k + 32].view(4, 8), bw[3 * k : 3 * k + 128].view(16, 8)
        before = [t.cpu() for t in (bb, bx, bw)]
        h = hits()
        got = fn(b, x, w)
        if k >= 2:
            assert hits() == h + 1, k  # served by the plan, whatever the offsets
        assert same_bits(got, without_fast_path(fn, b, x, w)), k
        assert all(torch.equal(t.cpu(), c) for t, c in zip((bb, bx, bw), before, strict=True)), k
