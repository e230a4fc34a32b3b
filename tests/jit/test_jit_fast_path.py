"""JIT kernels on the C++ core's fast path (dispatch.jit_replay): a call the JIT tier served with one generated
kernel on the op's own arguments is committed like a native call, and later calls of its signature replay the
kernel without entering Python. On `minimal` (float32 and bfloat16 only, 33 kernels) float32 sin, atan2 and
floor are decompositions that reduce to the op's own JIT kernel; with decompositions switched off the JIT is
the first path. The replay must give the Python path's bits (fast path off), read floats per call, keep the
counts under "jit", be forgotten when the JIT is switched off, and step aside for the profiler."""

import pytest
import torch

import torch_fl as fl
from torch_fl.dispatch import decomp_replay
from torch_fl.jit.pointwise_kernels import PointwiseKernel
from torch_fl.runtime import REGISTRY, core, disabled_paths, native


@pytest.fixture
def minimal():
    fl.set_backend("minimal")
    yield REGISTRY.get("minimal")
    fl.set_backend("cpu")


@pytest.fixture
def jit_calls(monkeypatch):
    """How many times Python's JIT tier ran a pointwise kernel."""
    seen = [0]
    run = PointwiseKernel.__call__

    def counted(self, *args, **kwargs):
        seen[0] += 1
        return run(self, *args, **kwargs)

    monkeypatch.setattr(PointwiseKernel, "__call__", counted)
    return seen


def hits() -> int:
    return core.lib().fl_core_fast_hits()


def python_path(fn):
    """fn() with the C++ fast path off (FL_FAST_PATH=0's switch): what the Python dispatcher computes."""
    native.FAST.enabled = False
    native.sync_fast_path()
    before = hits()
    try:
        out = fn()
    finally:
        native.FAST.enabled = True
        native.sync_fast_path()
    assert hits() == before
    return out


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    a, b = a.cpu(), b.cpu()
    return (
        a.dtype == b.dtype
        and a.shape == b.shape
        and a.stride() == b.stride()
        and torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))
    )


CALLS = {  # served by the JIT through the op's decomposition on minimal float32
    "sin": lambda a, b: torch.sin(a),
    "atan2": lambda a, b: torch.atan2(a, b),
    "floor": lambda a, b: torch.floor(a * 10),
    "non-contiguous": lambda a, b: torch.sin(a.t()),
    "out=": lambda a, b: torch.sin(a, out=torch.empty_like(a)),
    "in place": lambda a, b: a.clone().sin_(),
    "in place, non-contiguous": lambda a, b: a.t().clone().t().atan2_(b),
}


@pytest.mark.parametrize("name", list(CALLS))
def test_a_repeated_signature_replays_the_jit_kernel_in_cpp_with_pythons_bits(minimal, jit_calls, name):
    fn = CALLS[name]
    for k in range(3):
        a, b = torch.randn(4, 5, device="fl"), torch.randn(4, 5, device="fl")
        before, ran = hits(), jit_calls[0]
        got = fn(a, b)
        if k:  # the first call taught the core the signature
            assert hits() > before and jit_calls[0] == ran, name
        assert same_bits(got, python_path(lambda a=a, b=b: fn(a, b))), name


def test_floats_read_per_call_are_patched_and_baked_ones_are_not_committed(minimal, jit_calls):
    x = torch.randn(4, 5, device="fl") * 10
    with disabled_paths("decomposition"):  # the JIT is the first path
        assert fl.explain("atan2", torch.float32).path == "jit"
        for k, s in enumerate((2.5, -1.25, 3.75, 0.5)):
            before, ran = hits(), jit_calls[0]
            got = torch.atan2(x, torch.tensor(s))  # a 0-dim CPU tensor: the kernel reads it per call
            if k:
                assert hits() == before + 1 and jit_calls[0] == ran
            assert same_bits(got, python_path(lambda s=s: torch.atan2(x, torch.tensor(s))))
            torch.testing.assert_close(got.cpu(), torch.atan2(x.cpu(), torch.tensor(s)))  # this call's float
        y = x.clone()
        for k, s in enumerate((2.5, 1.25)):
            before = hits()
            y.atan2_(torch.tensor(s))
            assert hits() == before + k
        torch.testing.assert_close(y.cpu(), torch.atan2(torch.atan2(x.cpu(), torch.tensor(2.5)), torch.tensor(1.25)))
        before = hits()
        for s in (2.5, 1.25, 3.75):  # remainder.Scalar: the float is baked into the generated source
            torch.testing.assert_close((x % s).cpu(), x.cpu() % s)
        assert hits() == before


def test_replayed_calls_count_under_the_jit(minimal):
    a = torch.randn(3, 3, device="fl")
    torch.sin(a)
    core.drain_counts()
    before = dict(minimal.counts)
    h = hits()
    for _ in range(5):
        torch.sin(a)
    assert hits() - h == 5
    core.drain_counts()
    assert minimal.counts[("aten::sin", "jit")] - before[("aten::sin", "jit")] == 5
    assert fl.explain("sin", torch.float32).path == "decomposition"  # the plan is unchanged


def test_switching_the_jit_off_forgets_committed_calls(minimal, jit_calls):
    a = torch.randn(6, device="fl")
    torch.sin(a), torch.sin(a)
    assert core.lib().fl_core_fast_size() > 0
    with disabled_paths("jit"):
        assert core.lib().fl_core_fast_size() == 0
        core.drain_counts()
        before = dict(minimal.counts)
        h = hits()
        for _ in range(2):
            torch.testing.assert_close(torch.sin(a).cpu(), torch.sin(a.cpu()))  # the CPU fallback now
        core.drain_counts()
        assert minimal.counts.get(("aten::sin", "jit"), 0) == before.get(("aten::sin", "jit"), 0)
        assert hits() == h
    ran = jit_calls[0]
    torch.sin(a)
    assert jit_calls[0] == ran + 1  # planned again, through Python


def test_the_profiler_sees_every_call(minimal):
    a = torch.randn(5, device="fl")
    torch.atan2(a, a), torch.atan2(a, a)
    h = hits()
    with fl.profile() as prof:
        for _ in range(3):
            torch.atan2(a, a)
    assert hits() == h
    assert ("aten::atan2", 3, "decomposition/jit") in [(o.op, o.calls, o.path) for o in prof.ops()]
    torch.atan2(a, a)
    assert hits() == h + 1


def test_a_decomposition_that_does_more_than_the_jit_kernel_is_not_committed(minimal, jit_calls, monkeypatch):
    monkeypatch.setattr(decomp_replay, "MAX_BYTES", -1)  # no decomposition plan either (they would replay it)
    a, b = torch.randn(4, 4, device="fl"), torch.randn(4, 4, device="fl")
    ran = []
    for _ in range(3):  # where, abs, neg and signbit: not one kernel of copysign itself
        before = jit_calls[0]
        assert torch.equal(torch.copysign(a, b).cpu(), torch.copysign(a.cpu(), b.cpu()))
        ran.append(jit_calls[0] - before)
    assert ran[0] == ran[1] == ran[2] > 0  # signbit's JIT kernel through Python on every call


def test_gather_is_replayed_and_a_bad_index_still_raises(minimal):
    """gather's JIT kernel (jit/index.py) writes only its output, so its calls are replayed in C++: right values,
    into an out= tensor too. A replayed call that meets an index out of range goes back to Python, which raises
    PyTorch's error; the process stays usable. scatter_add_ (a fold into self) is never replayed."""
    x = torch.randn(4, 10)
    fx = x.to("fl")
    out = torch.empty(4, 3, device="fl")
    served = 0
    for _ in range(4):
        i = torch.randint(0, 10, (4, 3))
        before = hits()
        got = torch.gather(fx, 1, i.to("fl"))
        into = torch.gather(fx, 1, i.to("fl"), out=out)
        served += hits() - before
        want = torch.gather(x, 1, i)
        assert torch.equal(got.cpu(), want) and into is out and torch.equal(out.cpu(), want)
    assert served >= 5  # the second call of each signature on
    bad = torch.tensor([[1, 2, 10]] * 4)
    with pytest.raises(RuntimeError, match="out of bounds for dimension 1 with size 10"):
        torch.gather(fx, 1, bad.to("fl"))
    i = torch.randint(0, 10, (4, 3))
    assert torch.equal(torch.gather(fx, 1, i.to("fl")).cpu(), torch.gather(x, 1, i))
    acc, src = torch.zeros(4, 10), torch.randn(4, 3)
    facc = acc.to("fl")
    before = hits()
    for _ in range(3):
        facc.scatter_add_(1, i.to("fl"), src.to("fl"))
        acc.scatter_add_(1, i, src)
    assert hits() == before
    assert torch.allclose(facc.cpu(), acc, atol=1e-6)
