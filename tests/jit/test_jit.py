"""The JIT tier: C code generated from PyTorch's core-aten decomposition of a
pointwise op, compiled by the plugin (cached on disk by source hash), run on
the device; a compile failure warns and falls through to the CPU fallback."""

import os

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_close, run_py

import torch_fl as fl
from torch_fl import jit
from torch_fl.dispatch import facts


@pytest.fixture
def minimal_strict():
    fl.set_backend("minimal")  # 33 primitive kernels
    fl.set_cpu_fallback(False)  # anything not native, decomposed or JIT-compiled must fail
    yield
    fl.set_cpu_fallback(True)


def test_codegen_turns_the_traced_graph_into_c():
    x = torch.ones(3).to(fl.device("minimal"))
    src, symbol = jit.generate(facts(torch.ops.aten.elu.default), [x, 1.5, 1.0, 1.0], torch.float32)
    assert symbol.startswith("fl_jit_") and f"int {symbol}(" in src
    assert "expm1(" in src and "(0x1.8000000000000p+0)" in src  # alpha = 1.5, exact in hex
    assert "typedef struct" in src and "fl_tensor_t" in src  # the ABI header itself is included
    with pytest.raises(jit.Unsupported):
        jit.generate(facts(torch.ops.aten.add.Tensor), [x, x.to(torch.bfloat16)], torch.float32)


@pytest.mark.parametrize(
    "fn,dtype",
    [
        (lambda x: F.elu(x, 0.7), torch.float32),
        (lambda x: F.softplus(x, beta=2.0), torch.float32),
        (lambda x: torch.atan2(x, x * 0.5 + 0.5), torch.float32),
        (lambda x: torch.remainder(x, 0.7), torch.float32),
        (lambda x: F.mish(x), torch.bfloat16),
        (lambda x: torch.where(x > 0, x.sin(), x.cos()), torch.float32),
    ],
)
def test_jit_kernels_match_cpu_without_any_fallback(minimal_strict, fn, dtype):
    x = torch.randn(4, 5, dtype=dtype)
    before = jit.STATS["compiled"] + jit.STATS["memory_hits"]
    got = fn(x.to("fl"))
    assert_close(got, fn(x), 2e-2 if dtype == torch.bfloat16 else 1e-5)
    assert jit.STATS["compiled"] + jit.STATS["memory_hits"] > before


def test_jit_on_strided_and_in_place(minimal_strict):
    x = torch.randn(6, 4)
    d = x.to("fl").t()  # non-contiguous
    assert_close(F.elu(d, 0.3), F.elu(x.t(), 0.3))
    y = x.to("fl")
    y.sub_(torch.ones(4, device="fl"), alpha=0.5)  # in-place with broadcasting
    assert_close(y, x - 0.5)


def test_jit_shared_layout_runs_in_memory_order_in_parallel(minimal_strict):
    """Tensors of one dense layout (channels-last here, and long enough to be split over the
    threads) run fl_walk_flat's plain loop; a broadcast operand takes the coordinate walk.
    Both give CPU's values, and the result keeps the input's layout as on the CPU."""
    x = torch.randn(4, 16, 40, 40).contiguous(memory_format=torch.channels_last)  # 102400 elements
    d = x.to("fl")
    got = F.elu(d, 0.3)
    assert got.is_contiguous(memory_format=torch.channels_last)
    assert_close(got, F.elu(x, 0.3))
    b = torch.randn(16, 1, 1)
    assert_close(torch.remainder(d, b.to("fl") + 2.0), torch.remainder(x, b + 2.0))


def test_jit_integer_division_by_zero_in_a_long_parallel_loop_raises(minimal_strict):
    a = torch.arange(1, 200001, dtype=torch.int64)
    b = torch.full_like(a, 3)
    b[123457] = 0
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        torch.remainder(a.to("fl"), b.to("fl"))
    b[123457] = 5
    assert_close(torch.remainder(a.to("fl"), b.to("fl")), torch.remainder(a, b))


def test_profiler_shows_compile_then_cached_kernels(minimal_strict, tmp_path):
    from torch_fl.runtime import clear_plans

    clear_plans()  # fresh plans: the JIT kernels' in-memory caches start empty
    x = torch.randn(8).to("fl")
    with fl.profile() as first:
        torch.hypot(x, x * 0.377)  # a fresh signature: compiled here
    with fl.profile() as second:
        torch.hypot(x, x * 0.377)  # the same signature: the kernel compiled above
    compiles = [e for e in first.events if e.path == "jit-compile"]
    assert compiles and {e.op for e in compiles} <= {e.op for e in first.events if e.path == "jit"}
    assert not [e for e in second.events if e.path == "jit-compile"]
    jit_calls = [e for e in second.events if e.path == "jit"]
    assert jit_calls and all(e.kernels == 1 for e in jit_calls)


@pytest.mark.slow  # a subprocess
def test_disk_cache_is_hit_by_a_new_process(tmp_path):
    code = """
        import torch, torch.nn.functional as F, torch_fl as fl
        from torch_fl import jit
        fl.initialize("minimal"); fl.set_cpu_fallback(False)
        F.elu(torch.randn(4).to("fl"), 0.25)
        print("COMPILE_S", jit.STATS["compile_s"], jit.STATS["compiled"])
    """
    env = {"FL_JIT_CACHE": str(tmp_path)}
    first = run_py(code, env=env)
    assert "COMPILE_S" in first.stdout, first.stdout + first.stderr
    libs = [f for f in os.listdir(tmp_path) if f.endswith(".so")]
    assert len(libs) == 1
    stamp = os.path.getmtime(tmp_path / libs[0])
    second = run_py(code, env=env)
    assert "COMPILE_S" in second.stdout
    # loaded, not rebuilt; beside it, the digest it was checked against (docs/security.md)
    assert sorted(os.listdir(tmp_path)) == [libs[0], libs[0] + ".sha256"]
    assert os.path.getmtime(tmp_path / libs[0]) == stamp


@pytest.mark.slow  # a subprocess
def test_compile_failure_warns_and_falls_back(tmp_path):
    r = run_py(
        """
        import warnings, torch, torch.nn.functional as F, torch_fl as fl
        fl.initialize("minimal")
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            x = torch.randn(5)
            y = F.elu(x.to("fl"), 0.9)
        print("OK", torch.allclose(y.cpu(), F.elu(x, 0.9)))
        print("WARN", [str(m.message)[:160] for m in w if "JIT" in str(m.message)])
        print("PATHS", fl.explain("aten::elu").calls)
    """,
        env={"FL_JIT_CACHE": str(tmp_path), "CC": "/bin/false"},
    )
    assert "OK True" in r.stdout, r.stdout + r.stderr
    assert (
        "torch_fl JIT: no kernel for aten::elu on minimal: jit_compile: the C compiler '/bin/false' exited "
        "with status 1: (it printed nothing)" in r.stdout
    )
    assert "'fallback': 1" in r.stdout


_VECTOR_SCRIPT = """
import sys, torch, torch_fl as fl
fl.set_backend("cpu")
torch.manual_seed(0)
x = torch.randn(64, 96) * 4
x[0, :8] = torch.tensor([float("inf"), -float("inf"), float("nan"), -0.0, 1e-40, -1e-40, 88.0, -800.0])
y = torch.randn(64, 96) * 2
def chain(a, b):
    return (torch.sigmoid(a) * torch.tanh(b) + torch.erf(a * 0.5) - torch.expm1(b * 0.1)
            + torch.log1p(a.abs()) * torch.cos(b) + torch.exp(-a.abs()))
fc = torch.compile(chain, backend="fl")
xd, yd = x.to("fl"), y.to("fl")
outs = {
    "flat": fc(xd, yd),  # one dense layout: the loop over memory order
    "rows": fc(xd[:, 8:72], yd[:, 16:80]),  # contiguous rows, not dense: the loop along each row
    "walk": fc(xd.t(), yd.t().contiguous()),  # a transposed operand: the coordinate walk
}
report = str(fl.fusion_report(fc))
assert "-> one JIT kernel" in report, report
torch.save({k: v.cpu() for k, v in outs.items()}, sys.argv[1])
"""


def test_vectorized_host_kernels_give_the_scalar_kernels_bits(tmp_path):
    """A fused chain of exp/tanh/erf/expm1/log1p/cos, run as the JIT kernel GCC vectorizes with glibc's libmvec
    (render.vector_math, on this machine when it has AVX2) and as the scalar kernel (FL_JIT_VECTOR_MATH=0), over
    a dense operand, contiguous rows of a slice and a transposed operand, with inf, NaN, -0.0, subnormals and
    overflowing inputs: the same float32 bits, NaNs where the other has them, and no farther from the float64
    truth than native float32 is. Where this machine can vectorize, the vectorized kernel's library calls a
    4-wide libmvec variant and the scalar one none (so the comparison compares two different kernels)."""
    from torch_fl.jit import render

    results, libraries = {}, {}
    for vector in ("1", "0"):
        cache = tmp_path / f"jit{vector}"
        out = tmp_path / f"out{vector}.pt"
        proc = run_py(
            _VECTOR_SCRIPT.replace("sys.argv[1]", repr(str(out))),
            env={"FL_JIT_CACHE": str(cache), "FL_JIT_VECTOR_MATH": vector},
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        results[vector] = torch.load(out)
        libraries[vector] = b"".join(p.read_bytes() for p in cache.rglob("*.so"))
    assert libraries["1"] and libraries["0"]
    if render.vector_math():
        assert b"_ZGVdN4v_tanh" in libraries["1"] and b"_ZGVdN4v_exp" in libraries["1"]
    assert b"_ZGVdN4v_" not in libraries["0"]
    torch.manual_seed(0)
    x = torch.randn(64, 96) * 4
    x[0, :8] = torch.tensor([float("inf"), -float("inf"), float("nan"), -0.0, 1e-40, -1e-40, 88.0, -800.0])
    y = torch.randn(64, 96) * 2

    def chain(a, b):
        return (
            torch.sigmoid(a) * torch.tanh(b)
            + torch.erf(a * 0.5)
            - torch.expm1(b * 0.1)
            + torch.log1p(a.abs()) * torch.cos(b)
            + torch.exp(-a.abs())
        )

    operands = {"flat": (x, y), "rows": (x[:, 8:72], y[:, 16:80]), "walk": (x.t(), y.t().contiguous())}
    for name, (a, b) in operands.items():
        vec, sca = results["1"][name], results["0"][name]
        assert torch.equal(vec.isnan(), sca.isnan()), name
        assert torch.equal(vec.nan_to_num(0.0), sca.nan_to_num(0.0)), f"{name}: the vectorized kernel's bits differ"
        truth, native = chain(a.double(), b.double()), chain(a, b)
        assert torch.equal(vec.isnan(), truth.isnan()), name
        finite = truth.isfinite()
        assert torch.equal(vec[~finite].nan_to_num(0.0), truth[~finite].float().nan_to_num(0.0)), name
        err = (vec.double() - truth)[finite].abs().max()
        native_err = (native.double() - truth)[finite].abs().max()
        assert err <= 2 * native_err + 1e-6, f"{name}: {err} against float64, native float32 {native_err}"
