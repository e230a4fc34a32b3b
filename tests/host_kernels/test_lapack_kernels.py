"""Host-plugin LAPACK kernels (k_lu.c, k_cholesky.c, k_eigh_svd.c, k_qr.c, k_triangular.c, k_matrix_exp.c;
k_lapack.h) against PyTorch's own CPU ops.

Outputs are preallocated from the meta function as the runtime does (often
column-major), inputs are tried contiguous and as strided views. Where a
decomposition is unique only up to signs (SVD, eigenvectors, QR), or where
PyTorch's CPU LAPACK (MKL) and OpenBLAS may round differently, the test checks
what must hold (reconstruction, orthogonality) as well as what PyTorch gives."""

from __future__ import annotations

import harness
import pytest
import torch

from torch_fl.runtime import STRING_CODES

A = torch.ops.aten
STRINGS = dict(STRING_CODES)  # fl_plugin.h's fl_string_code_t, as the runtime reads it (a test may drop one)
DTYPES = [torch.float32, torch.float64]


def run(op, *args, **kwargs):
    """Calls the plugin kernel of `op` (harness.call); returns the outputs, None when it declines."""
    inputs, cargs = harness.to_specs(harness.bind(op, args, kwargs, required=False), STRINGS)
    outs = harness.meta_outputs(op, args, kwargs, fill=-7, int_fill=-7)
    if harness.call(harness.entry_name(op), inputs, outs, cargs) == 3:
        return None
    return outs


def strided(t):
    """The same values as a non-contiguous view (every dim strided by 2)."""
    big = torch.zeros([2 * s for s in t.shape], dtype=t.dtype)
    v = big[tuple(slice(None, None, 2) for _ in t.shape)]
    v.copy_(t)
    return v


def close(got, want, dtype):
    tol = 2e-4 if dtype == torch.float32 else 1e-10
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)


def same(got, want, dtype):
    if got.is_floating_point():
        close(got, want, dtype)
    else:
        assert torch.equal(got, want)


def rand(*shape, dtype):
    return torch.randn(*shape, dtype=dtype)


def spd(*shape, dtype):
    x = torch.randn(*shape, dtype=dtype)
    return x @ x.mT + shape[-1] * torch.eye(shape[-1], dtype=dtype)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


# ---------------------------------------------------------------- LU family


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(4, 4), (2, 5, 3), (3, 2, 4), (0, 3, 3), (2, 0, 0)])
def test_lu_factor_lu_unpack(dtype, shape):
    for a in (rand(*shape, dtype=dtype), strided(rand(*shape, dtype=dtype))):
        LU, piv, info = run(A.linalg_lu_factor_ex.default, a)
        want = A.linalg_lu_factor_ex(a)
        close(LU, want[0], dtype)
        assert torch.equal(piv, want[1]) and torch.equal(info, want[2])
        for got, exp in zip(run(A.linalg_lu.default, a), A.linalg_lu(a), strict=True):
            close(got, exp, dtype)
        for got, exp in zip(run(A.lu_unpack.default, want[0], want[1]), A.lu_unpack(want[0], want[1]), strict=True):
            close(got, exp, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("left,adjoint", [(True, False), (True, True), (False, False), (False, True)])
def test_lu_solve_and_solve_ex(dtype, left, adjoint):
    a = rand(2, 4, 4, dtype=dtype)
    b = rand(3, 1, 4, 2, dtype=dtype) if left else rand(2, 3, 4, dtype=dtype)  # broadcast batches
    LU, piv = torch.linalg.lu_factor(a)
    got = run(A.linalg_lu_solve.default, LU, piv, strided(b), left=left, adjoint=adjoint)[0]
    close(got, torch.linalg.lu_solve(LU, piv, b, left=left, adjoint=adjoint), dtype)
    if not adjoint:
        for g, w in zip(
            run(A._linalg_solve_ex.default, strided(a), b, left=left), A._linalg_solve_ex(a, b, left=left), strict=True
        ):
            same(g, w, dtype)
    # a batch of vectors on the right-hand side
    v = rand(2, 4, dtype=dtype)
    close(run(A._linalg_solve_ex.default, a, v)[0], A._linalg_solve_ex(a, v)[0], dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_inv_det_slogdet(dtype):
    a = rand(3, 4, 4, dtype=dtype)
    a[1] = 0  # a singular matrix: info > 0, det 0, slogdet (0, -inf)
    inv, info = run(A.linalg_inv_ex.default, a)
    close(inv[0], torch.linalg.inv(a[0]), dtype)
    assert info.tolist() == [0, 1, 0]
    for x in (a, strided(a)):  # PyTorch factors A^T when A is contiguous: so must the kernel
        for g, w in zip(run(A._linalg_det.default, x), A._linalg_det(x), strict=True):
            same(g, w, dtype)
        for g, w in zip(run(A._linalg_slogdet.default, x), A._linalg_slogdet(x), strict=True):
            same(g, w, dtype)


def test_lu_errors():
    a = torch.zeros(3, 3)
    with pytest.raises(RuntimeError, match="LU without pivoting"):
        run(A.linalg_lu_factor_ex.default, a, pivot=False)
    with pytest.raises(RuntimeError, match=r"U\[1,1\] is zero"):
        run(A.linalg_lu_factor_ex.default, a, check_errors=True)
    with pytest.raises(RuntimeError, match="singular"):
        run(A.linalg_inv_ex.default, a, check_errors=True)
    bad = torch.tensor([4, 1, 1], dtype=torch.int32)
    with pytest.raises(RuntimeError, match="between 1 and LU.size"):
        run(A.lu_unpack.default, torch.randn(3, 3), bad)
    with pytest.raises(RuntimeError, match="Pivots given to lu_solve"):
        run(A.linalg_lu_solve.default, torch.randn(3, 3), bad, torch.randn(3, 2))


def test_singular_matrix_on_fl_raises_pytorchs_linalg_error():
    """_linalg_check_errors runs PyTorch's own check on a host copy of info: same type, same words."""
    import torch_fl as fl

    before = fl.get_current_backend_name()
    fl.set_backend("rocm")
    try:
        with pytest.raises(torch.linalg.LinAlgError, match="linalg.inv: The diagonal element 2 is zero"):
            torch.linalg.inv(torch.tensor([[1.0, 2.0], [2.0, 4.0]], device="fl"))
        inv = torch.linalg.inv(torch.tensor([[1.0, 2.0], [3.0, 4.0]], device="fl"))
        assert torch.allclose(inv.cpu(), torch.tensor([[-2.0, 1.0], [1.5, -0.5]]))
    finally:
        fl.set_backend(before)


# ---------------------------------------------------------------- Cholesky


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("upper", [False, True])
def test_cholesky_family(dtype, upper):
    a = spd(2, 4, 4, dtype=dtype)
    L, info = run(A.linalg_cholesky_ex.default, strided(a), upper=upper)
    close(L, torch.linalg.cholesky(a, upper=upper), dtype)
    assert info.tolist() == [0, 0]
    close(run(A.cholesky.default, a, upper)[0], torch.linalg.cholesky(a, upper=upper), dtype)
    b = rand(3, 1, 4, 2, dtype=dtype)
    close(run(A.cholesky_solve.default, strided(b), L, upper)[0], torch.cholesky_solve(b, L, upper), dtype)
    close(run(A.cholesky_inverse.default, L, upper)[0], torch.cholesky_inverse(L, upper), dtype)


def test_cholesky_errors():
    a = -torch.eye(3).expand(2, 3, 3)
    assert run(A.linalg_cholesky_ex.default, a)[1].tolist() == [1, 1]
    with pytest.raises(RuntimeError, match=r"\(Batch element 0\).*leading minor of order 1"):
        run(A.cholesky.default, a)
    with pytest.raises(RuntimeError, match="not positive-definite"):
        run(A.linalg_cholesky_ex.default, a[0], check_errors=True)


# ---------------------------------------------------------------- eigh, SVD, pinv


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("uplo", ["L", "U"])
def test_eigh(dtype, uplo):
    a = rand(2, 5, 5, dtype=dtype)  # not symmetric: only the UPLO triangle counts
    w, v = run(A._linalg_eigh.default, strided(a), uplo)
    ew, ev = torch.linalg.eigh(a, UPLO=uplo)
    close(w, ew, dtype)
    sym = a.tril() + a.tril(-1).mT if uplo == "L" else a.triu() + a.triu(1).mT
    close(v @ torch.diag_embed(w) @ v.mT, sym, dtype)
    close(v.abs(), ev.abs(), dtype)
    w2, v2 = run(A._linalg_eigh.default, a, uplo, False)
    close(w2, ew, dtype)
    assert v2.numel() == 0


def test_eigh_unknown_uplo(monkeypatch):
    """A runtime without the UPLO codes passes -1: the kernel then serves only exactly symmetric input."""
    monkeypatch.delitem(STRINGS, "L")
    a = torch.randn(4, 4, dtype=torch.float64)
    assert run(A._linalg_eigh.default, a, "L") is None
    s = a + a.mT
    close(run(A._linalg_eigh.default, s, "L")[0], torch.linalg.eigvalsh(s), torch.float64)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(5, 3), (2, 3, 5), (4, 4), (0, 3), (2, 3, 0)])
@pytest.mark.parametrize("full", [False, True])
def test_svd(dtype, shape, full):
    a = rand(*shape, dtype=dtype)
    U, S, Vh = run(A._linalg_svd.default, strided(a) if a.numel() else a, full)
    eU, eS, eVh = A._linalg_svd(a, full)
    close(S, eS, dtype)
    assert U.shape == eU.shape and Vh.shape == eVh.shape
    k = min(shape[-2:])
    close(U[..., :k] @ torch.diag_embed(S) @ Vh[..., :k, :], a, dtype)
    if not k:
        close(U, eU, dtype)  # identities for full_matrices
        close(Vh, eVh, dtype)
    _, S2, _ = run(A._linalg_svd.default, a, full, False)
    close(S2, eS, dtype)


def test_svd_errors():
    with pytest.raises(RuntimeError, match="non-finite"):
        run(A._linalg_svd.default, torch.full((3, 3), float("nan")))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hermitian", [False, True])
def test_pinv(dtype, hermitian):
    a = rand(2, 4, 4, dtype=dtype) if hermitian else rand(2, 5, 3, dtype=dtype)
    if hermitian:
        a = a + a.mT
    a[0, :, 0] = 0  # rank-deficient: the tolerance matters
    op = A.linalg_pinv.atol_rtol_tensor
    close(run(op, strided(a), hermitian=hermitian)[0], op(a, hermitian=hermitian), dtype)
    atol = torch.tensor([0.5, 0.0], dtype=torch.float64)
    close(run(op, a, atol=atol, hermitian=hermitian)[0], op(a, atol=atol, hermitian=hermitian), dtype)


# ---------------------------------------------------------------- QR


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(5, 3), (2, 3, 5), (4, 4), (0, 2)])
@pytest.mark.parametrize("mode", ["reduced", "complete", "r"])
def test_qr(dtype, shape, mode):
    a = rand(*shape, dtype=dtype)
    Q, R = run(A.linalg_qr.default, strided(a) if a.numel() else a, mode)
    eQ, eR = torch.linalg.qr(a, mode=mode)
    close(Q, eQ, dtype)
    close(R, eR, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("left,transpose", [(True, False), (True, True), (False, False), (False, True)])
def test_householder_ormqr(dtype, left, transpose):
    a = rand(2, 5, 3, dtype=dtype)
    h, tau = torch.geqrf(a)
    close(
        run(A.linalg_householder_product.default, strided(h), tau)[0], torch.linalg.householder_product(h, tau), dtype
    )
    c = rand(2, 5, 4, dtype=dtype) if left else rand(2, 4, 5, dtype=dtype)
    close(run(A.ormqr.default, h, tau, strided(c), left, transpose)[0], torch.ormqr(h, tau, c, left, transpose), dtype)


# ---------------------------------------------------------------- triangular, LDL, matrix_exp


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("upper,left,unit", [(True, True, False), (False, False, True), (False, True, False)])
def test_triangular(dtype, upper, left, unit):
    a = rand(2, 4, 4, dtype=dtype) + 4 * torch.eye(4, dtype=dtype)
    b = rand(3, 1, 4, 2, dtype=dtype) if left else rand(2, 3, 4, dtype=dtype)
    got = run(A.linalg_solve_triangular.default, strided(a), b, upper=upper, left=left, unitriangular=unit)[0]
    close(got, torch.linalg.solve_triangular(a, b, upper=upper, left=left, unitriangular=unit), dtype)
    if left:
        for g, w in zip(
            run(A.triangular_solve.default, b, a, upper, True, unit),
            torch.triangular_solve(b, a, upper, True, unit),
            strict=True,
        ):
            close(g, w, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_ldl(dtype):
    a = rand(2, 5, 5, dtype=dtype)
    a = a + a.mT
    LD, piv, info = run(A.linalg_ldl_factor_ex.default, strided(a))
    eLD, epiv, einfo = torch.linalg.ldl_factor_ex(a)
    close(LD, eLD, dtype)
    assert torch.equal(piv, epiv) and torch.equal(info, einfo)
    b = rand(2, 5, 3, dtype=dtype)
    close(run(A.linalg_ldl_solve.default, LD, piv, strided(b))[0], torch.linalg.ldl_solve(eLD, epiv, b), dtype)
    with pytest.raises(RuntimeError, match="ldl_solve"):
        run(A.linalg_ldl_solve.default, LD, torch.full_like(piv, 9), b)
    with pytest.raises(RuntimeError, match="2x2 block"):
        run(A.linalg_ldl_solve.default, LD[0], torch.tensor([1, 2, 3, 4, -5], dtype=torch.int32), b[0])


@pytest.mark.parametrize("dtype", DTYPES)
def test_matrix_exp(dtype):
    a = torch.stack([rand(4, 4, dtype=dtype) * 0.1, rand(4, 4, dtype=dtype) * 5, torch.zeros(4, 4, dtype=dtype)])
    close(run(A.linalg_matrix_exp.default, strided(a))[0], torch.linalg.matrix_exp(a), dtype)


def test_declined_dtypes():
    """Half inputs are not served: the kernels decline instead of misreading memory."""
    assert run(A.linalg_qr.default, torch.ones(3, 3, dtype=torch.float16)) is None
