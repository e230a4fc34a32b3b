"""Host-plugin special-function kernels (k_special.c over fl_special_math.h)
against torch CPU: values in every declared dtype and memory layout, the
edge cases PyTorch defines (poles, NaN, infinities, degrees < 0), the
Tensor/Scalar overloads, and the errors the kernels raise."""

from __future__ import annotations

import os
import subprocess

import harness
import pytest
import torch
from test_elementwise_kernels import check, fl_call, make

aten = torch.ops.aten
S = torch.special
HALF = [torch.float16, torch.bfloat16]
LAYOUTS = ["contig", "transposed", "sliced", "bcast"]
NAN, INF = float("nan"), float("inf")

# (overload, input range, float16/bfloat16 supported by PyTorch, float32 tolerance scale)
UNARY = [
    (aten.digamma, (-4.5, 8.0), True, 4),
    (aten.lgamma, (-4.5, 8.0), True, 4),
    (aten.erfinv, (-0.98, 0.98), True, 8),
    (aten.i0, (-12.0, 12.0), True, 2),
    (aten.special_i0e, (-12.0, 12.0), True, 2),
    (aten.special_i1, (-12.0, 12.0), True, 2),
    (aten.special_i1e, (-12.0, 12.0), True, 2),
    (aten.angle, (-3.0, 3.0), True, 1),
    (aten.special_ndtri, (0.001, 0.999), False, 4),
    (aten.special_log_ndtr, (-30.0, 6.0), False, 2),
    (aten.special_erfcx, (-8.0, 60.0), False, 2),
    (aten.special_airy_ai, (-9.0, 9.0), False, 20),
    (aten.special_bessel_j0, (-20.0, 20.0), False, 8),
    (aten.special_bessel_j1, (-20.0, 20.0), False, 8),
    (aten.special_bessel_y0, (0.05, 20.0), False, 8),
    (aten.special_bessel_y1, (0.05, 20.0), False, 8),
    (aten.special_modified_bessel_i0, (-12.0, 12.0), False, 2),
    (aten.special_modified_bessel_i1, (-12.0, 12.0), False, 2),
    (aten.special_modified_bessel_k0, (0.05, 12.0), False, 2),
    (aten.special_modified_bessel_k1, (0.05, 12.0), False, 2),
    (aten.special_scaled_modified_bessel_k0, (0.05, 12.0), False, 2),
    (aten.special_scaled_modified_bessel_k1, (0.05, 12.0), False, 2),
    (aten.special_spherical_bessel_j0, (-15.0, 15.0), False, 2),
]
UNARY_IDS = [str(u[0]).split(".")[-1] for u in UNARY]


def _dtypes(half):
    return [torch.float32, torch.float64] + (HALF if half else [])


@pytest.mark.parametrize("op,rng,half,scale", UNARY, ids=UNARY_IDS)
def test_unary_values(op, rng, half, scale):
    for dt in _dtypes(half):
        for layout in LAYOUTS:
            check(op, make((9, 13), dt, layout, lo=rng[0], hi=rng[1]), tol_scale=scale)
        check(op, make((), dt, lo=rng[0], hi=rng[1]), tol_scale=scale)
        check(op, make((0, 3), dt), tol_scale=scale)
    # integers and bool promote to float32
    check(op, make((4, 5), torch.int64, lo=max(rng[0], -4), hi=min(rng[1], 6)), tol_scale=scale)
    check(op, torch.tensor([True, False]), tol_scale=scale)


@pytest.mark.parametrize("op,rng,half,scale", UNARY, ids=UNARY_IDS)
def test_unary_special_values(op, rng, half, scale):
    x = torch.tensor(
        [
            0.0,
            -0.0,
            1.0,
            -1.0,
            -2.0,
            -3.5,
            0.5,
            2.0,
            5.0,
            8.0,
            8.5,
            26.0,
            -26.8,
            50.0,
            51.0,
            104.0,
            1e-7,
            1e8,
            INF,
            -INF,
            NAN,
        ],
        dtype=torch.float64,
    )
    check(op, x)
    # float32 without 1e8: PyTorch's float kernels reduce cos(x - pi/4) & co in float there (no digits left)
    check(op, x[x != 1e8].float(), tol_scale=scale)


def test_inplace_variants():
    for op, lo, hi in [(aten.digamma_, 0.1, 5), (aten.lgamma_, -3.5, 5), (aten.erfinv_, -0.9, 0.9), (aten.i0_, -5, 5)]:
        for dt in [torch.float32, torch.float64, torch.bfloat16]:
            check(op, make((6, 7), dt, "transposed", lo=lo, hi=hi).clone(), tol_scale=4)


def test_large_parallel():
    x = make((300, 257), torch.float32, "sliced", lo=0.1, hi=20)
    check(aten.digamma, x, tol_scale=4)
    check(aten.special_bessel_j0, x, tol_scale=8)
    check(aten.igamma, x, x.t().contiguous().t() * 1.1, tol_scale=8)


# ---------------------------------------------------------------- int-argument ops
@pytest.mark.parametrize("n", [0, 1, 2, 3, 5])
def test_polygamma(n):
    for dt in [torch.float32, torch.float64, torch.bfloat16]:
        x = make((7, 6), dt, "transposed", lo=-3.7, hi=6)
        check(aten.polygamma, n, x, tol_scale=20)
        check(aten.polygamma_, x.clone(), n, tol_scale=20)
    poles = torch.tensor([0.0, -1.0, -2.0, -5.0, 1.0, 2.5, INF, -INF, NAN])
    check(aten.polygamma, n, poles.double())
    check(aten.polygamma, n, poles, tol_scale=20)
    # integer inputs: the poles in float32 are large finite numbers for n = 1, as in PyTorch
    check(aten.polygamma, n, torch.arange(-6, 7, dtype=torch.int16), tol_scale=20)


@pytest.mark.parametrize("p", [1, 2, 3, 5])
def test_mvlgamma(p):
    for dt in [torch.float32, torch.float64, torch.float16]:
        x = make((5, 6), dt, "sliced", lo=(p - 1) / 2 + 0.1, hi=9)
        check(aten.mvlgamma, x, p, tol_scale=8)
        check(aten.mvlgamma_, x.clone(), p, tol_scale=8)
    check(aten.mvlgamma, torch.arange(p, p + 6), p)


@pytest.mark.parametrize("decimals", [-2, -1, 0, 1, 3])
def test_round_decimals(decimals):
    for dt in [torch.float32, torch.float64, torch.float16, torch.bfloat16]:
        x = make((11, 9), dt, "transposed", lo=-500, hi=500)
        check(aten.round.decimals, x, decimals=decimals)
        check(aten.round_.decimals, x.clone(), decimals=decimals)
    halves = torch.tensor([0.125, 0.375, 2.5, -2.5, 1.005, NAN, INF, -0.0])
    check(aten.round.decimals, halves, decimals=decimals)
    check(aten.round.decimals, halves.double(), decimals=decimals)


def test_int_argument_errors():
    x = torch.rand(3) + 2
    with pytest.raises(RuntimeError, match="polygamma\\(n, x\\) does not support negative n"):
        fl_call(aten.polygamma, -1, x, out_like=torch.empty(3))
    with pytest.raises(RuntimeError, match="p has to be greater than or equal to 1"):
        fl_call(aten.mvlgamma, x, 0, out_like=torch.empty(3))
    with pytest.raises(RuntimeError, match="may not be a boolean tensor"):
        fl_call(aten.mvlgamma, torch.tensor([True, False]), 2, out_like=torch.empty(2))


# ---------------------------------------------------------------- incomplete gamma, zeta
def test_igamma_igammac():
    gen = torch.Generator().manual_seed(0)
    # a small and large, x on both sides of a and near it: every branch of SciPy's igam/igamc
    a = torch.cat(
        [
            torch.rand(200, generator=gen, dtype=torch.float64) * 5,
            torch.rand(200, generator=gen, dtype=torch.float64) * 400 + 20,
        ]
    )
    x = a * (torch.rand(400, generator=gen, dtype=torch.float64) * 1.6 + 0.2)
    edge_a = torch.tensor([0.0, 0.0, 1.0, 2.0, INF, INF, -1.0, 3.0, NAN], dtype=torch.float64)
    edge_x = torch.tensor([1.0, 0.0, 0.0, INF, 1.0, INF, 1.0, -1.0, 1.0], dtype=torch.float64)
    for op in (aten.igamma, aten.igammac):
        check(op, a, x)
        check(op, edge_a, edge_x)
        check(op, a.float(), x.float(), tol_scale=10)
        check(op, a[:5].bfloat16().reshape(5, 1), x[:7].bfloat16())  # broadcast
    check(aten.igamma_, a.clone(), x)
    check(aten.igammac_, a.float().clone(), x.float(), tol_scale=10)


def test_zeta_and_scalar_overloads():
    x = make((6, 5), torch.float64, "transposed", lo=0.5, hi=8)
    q = make((6, 5), torch.float64, "sliced", lo=-4, hi=6)
    check(aten.special_zeta, x, q)
    check(aten.special_zeta, torch.tensor([1.0, 0.5, 2.0, 3.0, 2.5]), torch.tensor([1.0, 1.0, -2.0, -1.5, 0.0]))
    check(aten.special_zeta.self_scalar, 2.0, q)
    check(aten.special_zeta.other_scalar, x.float(), 1.5, tol_scale=4)


# ---------------------------------------------------------------- orthogonal polynomials
POLYS = [
    "chebyshev_polynomial_t",
    "chebyshev_polynomial_u",
    "chebyshev_polynomial_v",
    "chebyshev_polynomial_w",
    "shifted_chebyshev_polynomial_t",
    "shifted_chebyshev_polynomial_u",
    "shifted_chebyshev_polynomial_v",
    "shifted_chebyshev_polynomial_w",
    "hermite_polynomial_h",
    "hermite_polynomial_he",
    "laguerre_polynomial_l",
    "legendre_polynomial_p",
]


@pytest.mark.parametrize("name", POLYS)
def test_polynomials(name):
    op = getattr(aten, "special_" + name)
    gen = torch.Generator().manual_seed(1)
    # |x| > 1 and the endpoints 0, +-1 too; degrees < 0, the closed-form range (n > 4..8) and NaN/inf degrees
    x = torch.cat(
        [
            torch.rand(120, generator=gen, dtype=torch.float64) * 2.4 - 1.2,
            torch.tensor([0.0, 1.0, -1.0, 0.5, 1.0, -1.0, INF, 0.3], dtype=torch.float64),
        ]
    )
    n = torch.cat(
        [
            torch.randint(-2, 14, (120,), generator=gen).double(),
            torch.tensor([3.0, 4.0, 5.0, 12.0, 11.0, NAN, 2.0, INF], dtype=torch.float64),
        ]
    )
    check(op.default, x, n)
    check(op.default, x.float(), n.float(), tol_scale=50)
    check(op.default, x.float().reshape(-1, 1)[:6], n[:9].long())  # int degrees, broadcast
    check(op.x_scalar, 0.3, n)
    check(op.x_scalar, 0.3, n[:20].long())
    check(op.n_scalar, x, 5)
    check(op.n_scalar, x.float(), 3.0, tol_scale=50)
    # float32 recurrences that overflow: PyTorch's infinities and NaNs (inf - inf), not double's finite values
    big_x = torch.tensor([3.0, -3.0, 7.5, -9.0, 40.0, 0.5])
    big_n = torch.tensor([[40.0], [60.0], [90.0], [127.0]])
    check(op.default, big_x, big_n, tol_scale=50)
    check(op.default, big_x.double(), big_n.double() * 4)


def test_hermite_degree_limit():
    # PyTorch gives NaN above degree 128 in float32 and 512 in float64
    x = torch.tensor([0.5, -0.25])
    for n in (128.0, 129.0, 200.0, 512.0, 513.0):
        check(aten.special_hermite_polynomial_h.n_scalar, x.double(), n)
        check(aten.special_hermite_polynomial_he.n_scalar, x.double(), n)
        check(aten.special_hermite_polynomial_h.n_scalar, x, n, tol_scale=1e3)
        check(aten.special_hermite_polynomial_he.n_scalar, x, n, tol_scale=1e3)


# ---------------------------------------------------------------- fmax/fmin, nextafter, frexp
def test_fmax_fmin():
    a = torch.tensor([1.0, NAN, NAN, -0.0, 3.0, -INF, 2.0])
    b = torch.tensor([NAN, 2.0, NAN, 0.0, -1.0, 5.0, INF])
    for dt in [torch.float32, torch.float64, torch.float16, torch.bfloat16]:
        check(aten.fmax, a.to(dt), b.to(dt))
        check(aten.fmin, a.to(dt), b.to(dt))
    big = torch.tensor([2**62 + 1, -(2**62) - 3, 5])
    for dt in [torch.int64, torch.int32, torch.uint8, torch.bool]:
        x, y = make((4, 6), dt, "transposed", lo=0, hi=9), make((6,), dt, lo=0, hi=9)
        check(aten.fmax, x, y)
        check(aten.fmin, x, y)
    check(aten.fmax, big, big.flip(0))  # exact beyond 2^53
    check(aten.fmin, make((3, 4), torch.int32, lo=-5, hi=5), make((3, 4), torch.float32))  # promotes to float


def test_nextafter():
    a = torch.tensor([0.0, -0.0, 1.0, 1.0, -1.0, 0.0, NAN, 2.0, 1e-40, 65504.0, INF, 3.0])
    b = torch.tensor([1.0, -1.0, 2.0, 0.0, -2.0, -0.0, 1.0, NAN, 0.0, INF, 0.0, 3.0])
    for dt in [torch.float32, torch.float64, torch.float16, torch.bfloat16]:
        check(aten.nextafter, a.to(dt), b.to(dt))
        check(aten.nextafter_, a.to(dt).clone(), b.to(dt))
        x = make((5, 8), dt, "transposed")
        check(aten.nextafter, x, make((8,), dt))


def test_frexp():
    x = torch.tensor([0.0, -0.0, 1.0, -3.5, 1e-40, 1e-310, 6e-8, 1e30, INF, -INF, NAN, 0.75])
    for dt in [torch.float32, torch.float64, torch.float16, torch.bfloat16]:
        check(aten.frexp.Tensor, x.to(dt))
        check(aten.frexp.Tensor, make((6, 7), dt, "sliced", lo=-1e4, hi=1e4))
    check(aten.frexp.Tensor, torch.empty(0, 4))
    st, _ = fl_call(aten.frexp.Tensor, torch.tensor([1.0]), out_like=(torch.empty(1), torch.empty(1)))
    assert st == 3  # an exponent output that is not int32 is declined
    with pytest.raises(RuntimeError, match="only supports floating-point dtypes"):
        fl_call(aten.frexp.Tensor, torch.tensor([4]), out_like=(torch.empty(1), torch.empty(1, dtype=torch.int32)))


# ---------------------------------------------------------------- declines and the shared header
def test_declines_half_where_pytorch_has_none():
    # torch.special's newer functions have no float16/bfloat16 kernel in PyTorch: nor here
    assert "aten::special_bessel_j0" in harness.kernels()
    for op, args in [
        (aten.special_bessel_j0, (torch.ones(3, dtype=torch.int64),)),
        (aten.special_zeta, (torch.ones(3, dtype=torch.int64), torch.ones(3, dtype=torch.float16))),
    ]:
        st, _ = fl_call(op, *args, out_like=torch.empty(3, dtype=torch.float16))
        assert st == 3


@pytest.mark.slow  # a subprocess
def test_header_is_self_contained(tmp_path):
    """The JIT pastes fl_special_math.h and fl_special_bessel.h into generated C: they must compile alone,
    warning-free, in plain C99."""
    folder = os.path.join(harness.ROOT, "plugins_cffi", "host")
    src = tmp_path / "use.c"
    src.write_text(
        f'#include "{folder}/fl_special_math.h"\n#include "{folder}/fl_special_bessel.h"\n'
        "double use(double x) { return fl_sp_digamma(x) + fl_sp_igamma(x, 1.0) + fl_sp_erfcx(x) +\n"
        "    fl_sp_chebyshev_polynomial_t(x, 3.0) + fl_sp_airy_ai(x) + fl_sp_polygamma(2, x); }\n"
    )
    r = subprocess.run(
        [
            "cc",
            "-std=c99",
            "-Wall",
            "-Wextra",
            "-Wpedantic",
            "-Werror",
            "-O1",
            "-c",
            str(src),
            "-o",
            str(tmp_path / "use.o"),
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
