"""Linear algebra on a chip without LAPACK: the decompositions in torch_fl/dispatch/decompositions/linalg.py
run on the `minimal` emulator with the CPU fallback off and are compared with PyTorch on the CPU
(LU/QR/Cholesky outputs exactly as LAPACK lays them out; eigen- and singular vectors, unique only
up to sign, through sign-free quantities)."""

import pytest
import torch
from conftest import same_as_cpu

pytestmark = pytest.mark.usefixtures("minimal_no_fallback")


def d(t):
    return t.to("fl")


def same(expected, got, atol=1e-4, rtol=1e-4):
    same_as_cpu(expected, got, atol, rtol)


def mats(*shape, seed=0):
    """Random, well-conditioned (diagonally weighted) matrices."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(*shape, generator=g)
    n = min(shape[-2:])
    return a + 2 * torch.eye(shape[-2], shape[-1]) * n**0.5 if n else a


def spd(*shape, seed=0):
    a = torch.randn(*shape, generator=torch.Generator().manual_seed(seed))
    return a @ a.mT + shape[-1] * torch.eye(shape[-1])


@pytest.mark.parametrize("shape", [(4, 4), (3, 5, 5), (2, 6, 4), (2, 3, 5), (0, 3, 3), (0, 0)])
def test_lu_factor_matches_lapack(shape):
    a = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    same(torch.linalg.lu_factor_ex(a), torch.linalg.lu_factor_ex(d(a)))
    same(torch.linalg.lu(a), torch.linalg.lu(d(a)))
    LU, piv = torch.linalg.lu_factor(a)
    same(torch.lu_unpack(LU, piv), torch.lu_unpack(d(LU), d(piv)))


def test_singular_matrix_info_and_errors():
    a = torch.tensor([[1.0, 2.0, 3.0], [2.0, 4.0, 6.0], [1.0, 0.0, 1.0]])
    batch = torch.stack([a, mats(3, 3)])
    assert torch.equal(torch.linalg.lu_factor_ex(d(batch)).info.cpu(), torch.linalg.lu_factor_ex(batch).info)
    assert torch.linalg.inv_ex(d(batch)).info.cpu().tolist() == torch.linalg.inv_ex(batch).info.tolist()
    # The first matrix is singular: float32 rounding leaves its determinant a tiny number of either sign (native
    # CPU's LAPACK gives slogdet sign 1, logabsdet -14.8; fl may give -0), so both are judged against float64's
    # determinant, within float32 rounding of the entries' scale, not against each other bit for bit.
    ref = torch.linalg.det(batch.double())
    tol = 1e-5 * batch.abs().amax(dim=(-2, -1)).double() ** 3
    det = torch.linalg.det(d(batch)).cpu().double()
    assert ((det - ref).abs() <= tol).all(), (det, ref)
    sign, logabs = torch.linalg.slogdet(d(batch))
    assert ((sign.cpu().double() * logabs.cpu().double().exp() - ref).abs() <= tol).all()
    assert sign[1].item() == torch.sign(ref[1]).item()  # the regular matrix: the sign is exact
    with pytest.raises(torch.linalg.LinAlgError) as cpu:
        torch.linalg.inv(batch)
    with pytest.raises(torch.linalg.LinAlgError) as dev:
        torch.linalg.inv(d(batch))
    assert str(dev.value) == str(cpu.value)
    with pytest.raises(torch.linalg.LinAlgError):
        torch.linalg.solve(d(a), d(torch.ones(3)))


@pytest.mark.parametrize("left", [True, False])
@pytest.mark.parametrize("adjoint", [True, False])
def test_lu_solve(left, adjoint):
    a, b = mats(2, 4, 4), torch.randn(2, 4, 3) if left else torch.randn(2, 3, 4)
    LU, piv = torch.linalg.lu_factor(a)
    same(
        torch.linalg.lu_solve(LU, piv, b, left=left, adjoint=adjoint),
        torch.linalg.lu_solve(d(LU), d(piv), d(b), left=left, adjoint=adjoint),
    )


@pytest.mark.parametrize("left", [True, False])
@pytest.mark.parametrize("adjoint", [True, False])
@pytest.mark.filterwarnings("ignore:torch.lu_solve is deprecated")
def test_lu_solve_gradients(left, adjoint):
    """The substitution runs under autograd (a CompositeImplicit override): it must not write into
    a tensor that autograd saved (it did: "modified by an inplace operation" in lu_solve's backward)."""
    a, b = mats(2, 4, 4, seed=3), torch.randn(2, 4, 3) if left else torch.randn(2, 3, 4)
    LU, piv = torch.linalg.lu_factor(a)
    grads = []
    for dev in ("cpu", "fl"):
        lu, rhs = LU.to(dev).detach().requires_grad_(), b.to(dev).detach().requires_grad_()
        if left and not adjoint:  # the deprecated torch.lu_solve: torch_fl overrides it above autograd
            x = torch.lu_solve(rhs, lu, piv.to(dev).int())
        else:
            x = torch.linalg.lu_solve(lu, piv.to(dev), rhs, left=left, adjoint=adjoint)
        (x * torch.arange(x.numel(), dtype=x.dtype).reshape(x.shape).to(dev)).sum().backward()
        grads.append((x, lu.grad, rhs.grad))
    same(grads[0], grads[1])


def test_solve_inv_det_and_their_gradients():
    a, b = mats(3, 4, 4), torch.randn(4, 2)
    same(torch.linalg.solve(a, b), torch.linalg.solve(d(a), d(b)))  # broadcast batch
    v = torch.randn(4)
    same(torch.linalg.solve(a, v), torch.linalg.solve(d(a), d(v)))
    bl = torch.randn(3, 2, 4)
    same(torch.linalg.solve(a, bl, left=False), torch.linalg.solve(d(a), d(bl), left=False))
    same(torch.linalg.inv(a), torch.linalg.inv(d(a)))
    same(torch.inverse(a), torch.inverse(d(a)))
    same(torch.linalg.det(a), torch.linalg.det(d(a)), rtol=1e-4, atol=1e-3)
    same(torch.logdet(a), torch.logdet(d(a)))
    same(torch.linalg.matrix_power(a, -2), torch.linalg.matrix_power(d(a), -2))
    for fn in (lambda x: torch.linalg.solve(x, b.to(x.device)), torch.linalg.inv, torch.linalg.det):
        x = a.clone().requires_grad_()
        xd = d(a).requires_grad_()
        g = torch.autograd.grad(fn(x).sum(), x)[0]
        gd = torch.autograd.grad(fn(xd).sum(), xd)[0]
        same(g, gd, atol=1e-3)


def test_tensorinv_tensorsolve():
    a = mats(6, 6).reshape(6, 2, 3)
    same(torch.linalg.tensorinv(a, ind=1), torch.linalg.tensorinv(d(a), ind=1))
    b = torch.randn(6)
    same(torch.linalg.tensorsolve(a, b), torch.linalg.tensorsolve(d(a), d(b)))


@pytest.mark.parametrize("upper", [False, True])
def test_cholesky_family(upper):
    a = spd(2, 5, 5)
    same(torch.linalg.cholesky(a, upper=upper), torch.linalg.cholesky(d(a), upper=upper))
    same(torch.cholesky(a, upper=upper), torch.cholesky(d(a), upper=upper))
    L = torch.linalg.cholesky(a, upper=upper)
    b = torch.randn(2, 5, 3)
    same(torch.cholesky_solve(b, L, upper=upper), torch.cholesky_solve(d(b), d(L), upper=upper))
    same(torch.cholesky_inverse(L[0], upper=upper), torch.cholesky_inverse(d(L[0]), upper=upper))


def test_cholesky_not_positive_definite():
    a = spd(3, 4, 4)
    a[1, 2, 2] = -50.0
    same(torch.linalg.cholesky_ex(a).info, torch.linalg.cholesky_ex(d(a)).info)
    with pytest.raises(torch.linalg.LinAlgError) as cpu:
        torch.linalg.cholesky(a)
    with pytest.raises(torch.linalg.LinAlgError) as dev:
        torch.linalg.cholesky(d(a))
    assert str(dev.value) == str(cpu.value)


@pytest.mark.parametrize("upper", [False, True])
@pytest.mark.parametrize("left", [False, True])
@pytest.mark.parametrize("unit", [False, True])
def test_triangular_solves(upper, left, unit):
    a = mats(2, 4, 4)
    b = torch.randn(2, 4, 3) if left else torch.randn(2, 3, 4)
    same(
        torch.linalg.solve_triangular(a, b, upper=upper, left=left, unitriangular=unit),
        torch.linalg.solve_triangular(d(a), d(b), upper=upper, left=left, unitriangular=unit),
    )
    if left:
        for transpose in (False, True):
            same(
                torch.triangular_solve(b, a, upper, transpose, unit),
                torch.triangular_solve(d(b), d(a), upper, transpose, unit),
            )


@pytest.mark.parametrize("shape", [(4, 4), (2, 6, 4), (2, 3, 5)])
def test_qr_matches_lapack_signs(shape):
    a = torch.randn(shape, generator=torch.Generator().manual_seed(2))
    for mode in ("reduced", "complete", "r"):
        same(torch.linalg.qr(a, mode=mode), torch.linalg.qr(d(a), mode=mode))
    same(torch.geqrf(a), torch.geqrf(d(a)))
    h, tau = torch.geqrf(a)
    if shape[-2] >= shape[-1]:  # householder_product takes only tall inputs
        same(torch.linalg.householder_product(h, tau), torch.linalg.householder_product(d(h), d(tau)))


@pytest.mark.parametrize("left", [False, True])
@pytest.mark.parametrize("transpose", [False, True])
def test_ormqr(left, transpose):
    h, tau = torch.geqrf(torch.randn(2, 5, 3))
    c = torch.randn(2, 5, 4) if left else torch.randn(2, 4, 5)
    same(torch.ormqr(h, tau, c, left, transpose), torch.ormqr(d(h), d(tau), d(c), left, transpose))


def test_eigh():
    a = spd(3, 5, 5) - 5 * torch.eye(5)
    for uplo in ("L", "U"):
        w, v = torch.linalg.eigh(a, UPLO=uplo)
        wd, vd = torch.linalg.eigh(d(a), UPLO=uplo)
        same(w, wd)
        same(v.abs(), vd.abs(), atol=1e-4)  # signs are not unique
        same(a, vd.cpu() @ torch.diag_embed(wd.cpu()) @ vd.cpu().mT, atol=1e-4)
    same(torch.linalg.eigvalsh(a), torch.linalg.eigvalsh(d(a)))


@pytest.mark.parametrize("shape", [(5, 5), (2, 6, 3), (2, 3, 6)])
def test_svd(shape):
    a = torch.randn(shape, generator=torch.Generator().manual_seed(3))
    u, s, vh = torch.linalg.svd(a, full_matrices=False)
    ud, sd, vhd = (t.cpu() for t in torch.linalg.svd(d(a), full_matrices=False))
    same(s, sd)
    same(u.abs(), ud.abs(), atol=1e-4)
    same(vh.abs(), vhd.abs(), atol=1e-4)
    same(a, ud @ torch.diag_embed(sd) @ vhd, atol=1e-4)
    uf, _, vhf = (t.cpu() for t in torch.linalg.svd(d(a), full_matrices=True))
    for q in (uf, vhf):
        same(torch.eye(q.shape[-1]).expand(q.shape), q.mT @ q, atol=1e-5)
    same(torch.linalg.svdvals(a), torch.linalg.svdvals(d(a)))
    same(torch.linalg.pinv(a), torch.linalg.pinv(d(a)), atol=1e-4)
    for ord in ("nuc", 2, -2):
        same(torch.linalg.matrix_norm(a, ord=ord), torch.linalg.matrix_norm(d(a), ord=ord))
    if shape[-1] == shape[-2]:
        same(torch.linalg.cond(a), torch.linalg.cond(d(a)), rtol=1e-3)


def test_matrix_exp():
    a = torch.randn(3, 4, 4, generator=torch.Generator().manual_seed(4)) * torch.tensor([0.01, 1.0, 4.0])[:, None, None]
    same(torch.linalg.matrix_exp(a), torch.linalg.matrix_exp(d(a)), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dim,p", [(0, 2), (1, 1), (2, 3.0), (-1, float("inf"))])
def test_renorm_gradient_without_float64(dim, p):
    """PyTorch's renorm backward accumulates the norm in float64 on any device but CUDA; `minimal` has
    no float64, so torch_fl composes renorm at the autograd key (gradients against float64)."""
    x, g = torch.randn(3, 4, 5, dtype=torch.float64), torch.randn(3, 4, 5)
    ref = x.clone().requires_grad_()
    torch.renorm(ref, p, dim, 1.0).backward(g.double())
    dev = d(x.float()).requires_grad_()
    y = torch.renorm(dev, p, dim, 1.0)
    y.backward(d(g))
    same(torch.renorm(x, p, dim, 1.0).float(), y)
    same(ref.grad.float(), dev.grad)
    with torch.no_grad():  # no gradient wanted: the op's own kernel
        same(torch.renorm(x, p, dim, 1.0).float(), torch.renorm(d(x.float()), p, dim, 1.0))
