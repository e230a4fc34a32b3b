"""Host-plugin FFT kernels (k_fft.c) and complex pointwise/copy kernels (k_complex.c,
reached through k_binary.c and k_unary.c; copy_ in k_elementwise.c) called directly,
against torch CPU: every length class (1, powers of two, primes and composites through
Bluestein), multi-dim transforms, strided inputs and outputs, the three normalizations,
both precisions, and the errors the kernels raise."""

from __future__ import annotations

import warnings

import harness
import pytest
import torch

aten = torch.ops.aten
LENGTHS = [1, 2, 7, 8, 12, 17]
REAL = [torch.float32, torch.float64]
CPLX = {torch.float32: torch.complex64, torch.float64: torch.complex128}


def rnd(shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype.is_complex:
        return torch.randn(shape, generator=g, dtype=dtype)
    return torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)


def close(got, expected):
    tol = 2e-5 if expected.dtype in (torch.float32, torch.complex64) else 1e-12
    scale = max(expected.abs().max().item(), 1.0) if expected.numel() else 1.0
    torch.testing.assert_close(got, expected, rtol=0, atol=tol * scale)


def run(op, x, args, out):
    """Calls the kernel with x as input 0 and `out` (any layout) as output 0."""
    st = harness.call(op, [x], [out], [("tensor", 0), *args])
    assert st == 0, f"{op} declined"
    return out


def out_like(expected, layout="contig"):
    if layout == "transposed" and expected.dim() >= 2:
        return torch.empty_like(expected.transpose(0, -1).contiguous()).transpose(0, -1).fill_(7)
    if layout == "sliced":
        return torch.zeros(expected.shape[:-1] + (2 * expected.shape[-1],), dtype=expected.dtype)[..., ::2]
    return torch.full_like(expected, 7)


def test_kernels_declared():
    k = harness.kernels()
    for op in ("aten::_fft_r2c", "aten::_fft_c2c", "aten::_fft_c2r"):
        assert op in k


@pytest.mark.parametrize("dtype", REAL)
@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("onesided", [True, False])
def test_r2c_1d(dtype, n, onesided):
    x = rnd((3, n), dtype)
    for norm in (0, 1, 2):
        e = aten._fft_r2c(x, [1], norm, onesided)
        close(run("aten::_fft_r2c", x, [("ints", [1]), ("int", norm), ("bool", onesided)], out_like(e)), e)


@pytest.mark.parametrize("dtype", list(CPLX.values()))
@pytest.mark.parametrize("n", LENGTHS)
def test_c2c_1d(dtype, n):
    x = rnd((n, 2), dtype)
    for norm in (0, 1, 2):
        for forward in (True, False):
            e = aten._fft_c2c(x, [0], norm, forward)
            close(run("aten::_fft_c2c", x, [("ints", [0]), ("int", norm), ("bool", forward)], out_like(e)), e)


@pytest.mark.parametrize("dtype", list(CPLX.values()))
@pytest.mark.parametrize("n", LENGTHS)
def test_c2r_1d(dtype, n):
    # PyTorch's contract is n//2 + 1 entries; with more (its CPU kernel then reads garbage or asserts)
    # the kernel reads the first n//2 + 1
    for extra in (0, n // 2 + 1):
        x = rnd((2, n // 2 + 1 + extra), dtype, seed=extra)
        for norm in (0, 1, 2):
            e = aten._fft_c2r(x[:, : n // 2 + 1].contiguous(), [1], norm, n)
            close(run("aten::_fft_c2r", x, [("ints", [1]), ("int", norm), ("int", n)], out_like(e)), e)


@pytest.mark.parametrize("n", [97, 250, 1024])  # a prime, a composite, a power of two: float64 accuracy holds
def test_long_lengths_accurate(n):
    x = rnd((n,), torch.complex128)
    e = aten._fft_c2c(x, [0], 0, True)
    close(run("aten::_fft_c2c", x, [("ints", [0]), ("int", 0), ("bool", True)], out_like(e)), e)


@pytest.mark.parametrize("layout", ["contig", "transposed", "sliced"])
def test_multidim_strided(layout):
    base = rnd((5, 4, 6), torch.float64)
    xs = {
        "contig": base,
        "transposed": base.transpose(0, 2).contiguous().transpose(0, 2),
        "sliced": rnd((5, 4, 13), torch.float64)[..., 1::2],
    }
    x = xs[layout]
    for dims in ([0, 2], [2, 0, 1], [1]):
        e = aten._fft_r2c(x, dims, 1, True)
        close(run("aten::_fft_r2c", x, [("ints", dims), ("int", 1), ("bool", True)], out_like(e, layout)), e)
        c = e if layout == "contig" else e.transpose(0, 1).contiguous().transpose(0, 1)
        ec = aten._fft_c2c(c, dims, 2, False)
        close(run("aten::_fft_c2c", c, [("ints", dims), ("int", 2), ("bool", False)], out_like(ec, layout)), ec)
        last = x.shape[dims[-1]]
        er = aten._fft_c2r(c, dims, 2, last)
        close(run("aten::_fft_c2r", c, [("ints", dims), ("int", 2), ("int", last)], out_like(er, layout)), er)


def test_negative_dims_and_empty_dim_list():
    x = rnd((3, 4), torch.complex64)
    e = aten._fft_c2c(x, [1], 0, True)  # PyTorch's callers wrap dims first; its CPU kernel asserts on [-1]
    close(run("aten::_fft_c2c", x, [("ints", [-1]), ("int", 0), ("bool", True)], out_like(e)), e)
    close(run("aten::_fft_c2c", x, [("ints", []), ("int", 0), ("bool", True)], out_like(x)), x)


def test_errors_and_declines():
    x = rnd((3, 4), torch.complex64)
    with pytest.raises(RuntimeError, match="dim 5 out of range"):
        harness.call(
            "aten::_fft_c2c", [x], [torch.empty_like(x)], [("tensor", 0), ("ints", [5]), ("int", 0), ("bool", True)]
        )
    with pytest.raises(RuntimeError, match="unsupported normalization 3"):
        harness.call(
            "aten::_fft_c2c", [x], [torch.empty_like(x)], [("tensor", 0), ("ints", [0]), ("int", 3), ("bool", True)]
        )
    with pytest.raises(RuntimeError, match="last_dim_size 10 needs 6"):
        harness.call(
            "aten::_fft_c2r", [x], [torch.empty(3, 10)], [("tensor", 0), ("ints", [1]), ("int", 0), ("int", 10)]
        )
    # precision mix (complex64 in, float64 out) and a real input to c2c are declined, not guessed
    assert (
        harness.call(
            "aten::_fft_c2r",
            [x],
            [torch.empty(3, 6, dtype=torch.float64)],
            [("tensor", 0), ("ints", [1]), ("int", 0), ("int", 6)],
        )
        == 3
    )
    r = torch.randn(3, 4)
    assert (
        harness.call(
            "aten::_fft_c2c",
            [r],
            [torch.empty(3, 4, dtype=torch.complex64)],
            [("tensor", 0), ("ints", [1]), ("int", 0), ("bool", True)],
        )
        == 3
    )


# ---- copies and pointwise arithmetic on complex tensors ----


@pytest.mark.parametrize(
    "src_dtype,dst_dtype",
    [
        (torch.float32, torch.complex64),
        (torch.int64, torch.complex128),
        (torch.complex64, torch.complex128),
        (torch.complex128, torch.complex64),
        (torch.complex64, torch.float32),
        (torch.complex128, torch.float16),
        (torch.complex128, torch.complex128),
    ],
)
def test_copy_(src_dtype, dst_dtype):
    src = rnd((4, 6), src_dtype) if src_dtype != torch.int64 else torch.arange(24).view(4, 6)
    for dst in (torch.zeros(4, 6, dtype=dst_dtype), torch.zeros(6, 9, dtype=dst_dtype).t()[1:5]):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # complex -> real: PyTorch warns, keeps the real part
            expected = dst.clone().copy_(src.t().t())
        harness.call("aten::copy_", [dst, src.t().t()], [dst], [("tensor", 0), ("tensor", 1), ("bool", False)])
        torch.testing.assert_close(dst, expected, rtol=0, atol=0)


def test_fill_and_zero_complex128():
    t = torch.full((3, 5), 2 + 1j, dtype=torch.complex128)[:, ::2]
    harness.call("aten::fill_.Scalar", [t], [t], [("tensor", 0), ("float", 1.5)])
    assert torch.equal(t, torch.full((3, 3), 1.5 + 0j, dtype=torch.complex128))
    harness.call("aten::zero_", [t], [t], [("tensor", 0)])
    assert torch.equal(t, torch.zeros(3, 3, dtype=torch.complex128))


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_pointwise(dtype):
    a, b = rnd((4, 5), dtype, 1), rnd((4, 5), dtype, 2)
    r = torch.randn(4, 5, dtype=torch.float64)
    cases = [
        ("aten::add.Tensor", [a, b], [("tensor", 0), ("tensor", 1), ("float", 0.5)], a + 0.5 * b),
        ("aten::sub.Tensor", [a, b], [("tensor", 0), ("tensor", 1), ("int", 2)], a - 2 * b),
        ("aten::mul.Tensor", [a, b], [("tensor", 0), ("tensor", 1)], a * b),
        ("aten::mul.Tensor", [a, r], [("tensor", 0), ("tensor", 1)], a * r),
        ("aten::mul.Tensor", [a], [("tensor", 0), ("int", 2)], a * 2),
        ("aten::div.Tensor", [a, b], [("tensor", 0), ("tensor", 1), ("none",)], a / b),
        ("aten::neg", [a], [("tensor", 0)], -a),
        ("aten::_conj_physical", [a], [("tensor", 0)], a.conj_physical()),
    ]
    for op, ins, args, expected in cases:
        out = torch.full_like(expected, 7)
        assert harness.call(op, ins, [out], args) == 0, op
        close(out, expected.to(out.dtype))
    # in place, on a strided view
    base = a.clone()
    v = base[:, ::2]
    exp = v.clone().mul_(v)
    harness.call("aten::mul_.Tensor", [v, v], [v], [("tensor", 0), ("tensor", 1)])
    close(v, exp)


def test_complex_scalar_declined():
    a = rnd((3,), torch.complex64)
    out = torch.empty_like(a)
    # a complex Python scalar reaches a kernel as FL_ARG_OTHER: declined, the runtime takes another tier
    assert harness.call("aten::mul.Tensor", [a], [out], [("tensor", 0), ("other",)]) == 3
