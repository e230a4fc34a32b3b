"""Linear algebra from matrix products, slices and reductions, for a backend without LAPACK.

A bring-up chip has mm/bmm, elementwise ops and reductions (or the JIT makes
them), but no factorisations. These decompositions build PyTorch's linear
algebra from those pieces with the textbook unblocked algorithms: LU with
partial pivoting one column at a time (argmax picks the pivot, a gather swaps
the rows, a rank-1 update of the trailing block), substitution one row at a
time, Cholesky one column at a time, Householder QR as LAPACK's geqrf does it
(so R's diagonal has LAPACK's signs), symmetric eigenvalues by cyclic Jacobi
rotations (n/2 disjoint rotations per step, round-robin order) and the SVD by
one-sided Jacobi. Every step is a handful of small device ops, so an n x n
matrix costs O(n) to O(n^2 * sweeps) ops: fine for bringing a chip up, slow
next to a vendor's LAPACK. Batched inputs run as one batch per op.

Outputs follow PyTorch's CPU kernels: pivots 1-based int32, info int32 (the
first zero pivot or the first minor that is not positive-definite, 1-based),
LU packed in one matrix, eigenvalues ascending, singular values descending.
Eigen- and singular vectors are unique only up to sign; they are normalised so
that the largest-magnitude component of each (right) vector is positive, which
is deterministic but not LAPACK's choice. Real dtypes only: complex inputs get
NotImplemented (the next tier serves them)."""

from __future__ import annotations

import functools

import torch

aten = torch.ops.aten


def _real(*ts) -> bool:
    return all(not (isinstance(t, torch.Tensor) and t.is_complex()) for t in ts)


def _eye(n: int, m: int, like: torch.Tensor, dtype=None) -> torch.Tensor:
    i = torch.arange(n, device=like.device)
    j = torch.arange(m, device=like.device)
    return (i.unsqueeze(-1) == j).to(dtype or like.dtype)


def _eye_default(n, m=None, *, dtype=None, layout=None, device=None, pin_memory=None):
    probe = torch.empty(0, device=device)
    return _eye(n, n if m is None else m, probe, dtype or torch.get_default_dtype())


def _eye_out(n, m=None, *, out):
    m = n if m is None else m
    if tuple(out.shape) != (n, m):
        out.resize_((n, m))
    return out.copy_(_eye(n, m, out))


def _eye_m_out(n, m, *, out):
    return _eye_out(n, m, out=out)


def _broadcast_batch(a, b):
    """a and b expanded to their common batch shape (all dims but the last two)."""
    batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return a.expand(batch + a.shape[-2:]), b.expand(batch + b.shape[-2:])


def _first_true(mask, k: int):
    """1-based position of the first true element along the last dim, 0 where none (int32)."""
    pos = torch.arange(1, k + 1, device=mask.device)
    first = (
        torch.where(mask, pos, k + 1).amin(-1)
        if k
        else torch.zeros(mask.shape[:-1], dtype=torch.int64, device=mask.device)
    )
    return torch.where(first == k + 1, 0, first).to(torch.int32)


# -- LU --------------------------------------------------------------------------


def _lu_factor_ex(A, pivot=True, check_errors=False):
    """getrf: for each column, the largest-magnitude entry at or below the diagonal is swapped
    up (a gather of the rows), the column below is scaled by it and the trailing block gets a
    rank-1 update. A zero pivot leaves its column unscaled (it is all zeros) and sets info."""
    if not _real(A):
        return NotImplemented
    m, n = A.shape[-2:]
    k = min(m, n)
    lu = A.clone(memory_format=torch.contiguous_format)
    rows = torch.arange(m, device=A.device)
    pivots = []
    for j in range(k):
        if pivot:
            p = lu[..., j:, j].abs().argmax(-1) + j
            pe = p.unsqueeze(-1)
            swap = torch.where(rows == j, pe, torch.where(rows == pe, j, rows))
            lu = lu.gather(-2, swap.unsqueeze(-1).expand(lu.shape)).contiguous()
        else:
            p = torch.full(A.shape[:-2], j, dtype=torch.int64, device=A.device)
        pivots.append(p)
        if j + 1 < m:
            d = lu[..., j, j]
            mult = lu[..., j + 1 :, j] / torch.where(d == 0, 1, d).unsqueeze(-1)
            lu[..., j + 1 :, j] = mult
            if j + 1 < n:
                lu[..., j + 1 :, j + 1 :] -= mult.unsqueeze(-1) * lu[..., j, j + 1 :].unsqueeze(-2)
    if pivots:
        piv = (torch.stack(pivots, -1) + 1).to(torch.int32)
    else:
        piv = torch.zeros(A.shape[:-2] + (0,), dtype=torch.int32, device=A.device)
    info = _first_true(lu.diagonal(dim1=-2, dim2=-1) == 0, k)
    if check_errors:
        aten._linalg_check_errors.default(info, "torch.linalg.lu_factor_ex", is_matrix=A.dim() == 2)
    return lu, piv, info


def _permutation(pivots, m: int):
    """The row order (int64, ..., m) the pivots' successive swaps give: A[perm] = L U."""
    rows = torch.arange(m, device=pivots.device)
    perm = rows.expand(pivots.shape[:-1] + (m,))
    piv = pivots.to(torch.int64) - 1
    for i in range(pivots.shape[-1]):
        p = piv[..., i : i + 1]
        at_i = perm[..., i : i + 1]
        at_p = perm.gather(-1, p)
        perm = torch.where(rows == i, at_p, torch.where(rows == p, at_i, perm))
    return perm


def _lu_unpack(LU, pivots, unpack_data=True, unpack_pivots=True):
    m, n = LU.shape[-2:]
    k = min(m, n)
    empty = LU.new_empty(0)
    P = L = U = empty
    if unpack_data:
        L = LU[..., :, :k].tril(-1) + _eye(m, k, LU)
        U = LU[..., :k, :].triu()
    if unpack_pivots:
        perm = _permutation(pivots, m)
        P = (torch.arange(m, device=LU.device).unsqueeze(-1) == perm.unsqueeze(-2)).to(LU.dtype)
    return P, L, U


def _linalg_lu(A, pivot=True):
    if not _real(A):
        return NotImplemented
    LU, piv, _ = _lu_factor_ex(A, pivot)
    P, L, U = _lu_unpack(LU, piv, True, pivot)
    return P, L, U


def _trsm(A, B, upper: bool, unit: bool = False):
    """Solve A X = B for triangular A by substitution, one row of X at a time (only A's
    triangle is read). Batch dims broadcast. Rows are kept apart and joined once: writing them
    into one buffer would modify tensors autograd saved (this runs under autograd as a CIA
    override, e.g. lu_solve's backward)."""
    A, B = _broadcast_batch(A, B)
    n = A.shape[-1]
    dtype = torch.promote_types(A.dtype, B.dtype)
    if n == 0 or B.shape[-1] == 0:
        return torch.zeros(B.shape, dtype=dtype, device=B.device)
    rows: list = [None] * n
    for i in range(n - 1, -1, -1) if upper else range(n):
        r = B[..., i : i + 1, :].to(dtype)
        done = range(i + 1, n) if upper else range(0, i)
        if len(done):
            r = r - A[..., i : i + 1, done.start : done.stop] @ torch.cat([rows[j] for j in done], dim=-2)
        if not unit:
            r = r / A[..., i : i + 1, i : i + 1]
        rows[i] = r
    return torch.cat(rows, dim=-2)


def _solve_triangular(A, B, *, upper, left=True, unitriangular=False):
    if not _real(A, B):
        return NotImplemented
    if not left:
        return _trsm(A.mT, B.mT, not upper, unitriangular).mT
    return _trsm(A, B, upper, unitriangular)


def _triangular_solve(self, A, upper=True, transpose=False, unitriangular=False):
    if not _real(self, A):
        return NotImplemented
    Ab, B = _broadcast_batch(A, self)
    X = _trsm(Ab.mT, B, not upper, unitriangular) if transpose else _trsm(Ab, B, upper, unitriangular)
    return X, Ab.clone(memory_format=torch.contiguous_format)


def _lu_solve(LU, pivots, B, *, left=True, adjoint=False):
    """X from A = P L U: L and U are the triangles of the packed LU (L's diagonal is ones)."""
    if not _real(LU, B):
        return NotImplemented
    if not left:  # X A = B  <=>  A^T X^T = B^T
        return _lu_solve(LU, pivots, B.mT, left=True, adjoint=not adjoint).mT
    LU, B = _broadcast_batch(LU, B)
    n = LU.shape[-1]
    perm = _permutation(pivots.expand(LU.shape[:-2] + pivots.shape[-1:]), n)
    if not adjoint:  # X = U^-1 L^-1 P^T B, and (P^T B)[i] = B[perm[i]]
        pb = B.gather(-2, perm.unsqueeze(-1).expand(B.shape))
        return _trsm(LU, _trsm(LU, pb, upper=False, unit=True), upper=True)
    # A^T X = B: X = P L^-T U^-T B
    z = _trsm(LU.mT, _trsm(LU.mT, B, upper=False), upper=True, unit=True)
    inv = torch.empty_like(perm).scatter(-1, perm, torch.arange(n, device=perm.device).expand(perm.shape))
    return z.gather(-2, inv.unsqueeze(-1).expand(z.shape))


def _lu_solve_old(self, LU_data, LU_pivots):
    return _lu_solve(LU_data, LU_pivots, self)


def _is_vector_rhs(A, B) -> bool:
    return B.dim() == 1 or (A.dim() - 1 == B.dim() and tuple(B.shape) == tuple(A.shape[:-1]))


def _linalg_solve_ex(A, B, *, left=True, check_errors=False):
    """As PyTorch's kernel: a contiguous real A is factored transposed (its backward reads the
    LU that way), and a vector right-hand side is solved as a one-column matrix."""
    if not _real(A, B):
        return NotImplemented
    use_t = False  # PyTorch factors A^T only for plain tensors; its backward then reads A's LU
    LU, piv, info = _lu_factor_ex(A.mT if use_t else A)
    vector = _is_vector_rhs(LU, B)
    Bm = (B.unsqueeze(-1) if left else B.unsqueeze(-2)) if vector else B
    X = _lu_solve(LU, piv, Bm, left=left, adjoint=use_t)
    if vector:
        X = X.squeeze(-1) if left else X.squeeze(-2)
    if check_errors:
        aten._linalg_check_errors.default(info, "torch.linalg.solve_ex", is_matrix=A.dim() == 2)
    return X, LU, piv, info


def _inv_ex(A, check_errors=False):
    if not _real(A):
        return NotImplemented
    LU, piv, info = _lu_factor_ex(A)
    n = A.shape[-1]
    X = _lu_solve(LU, piv, _eye(n, n, A).expand(A.shape))
    if check_errors:
        aten._linalg_check_errors.default(info, "torch.linalg.inv_ex", is_matrix=A.dim() == 2)
    return X, info


def _perm_sign(piv, dtype):
    k = piv.shape[-1]
    swaps = (piv.to(torch.int64) != torch.arange(1, k + 1, device=piv.device)).to(torch.int64).sum(-1)
    return 1 - 2 * torch.remainder(swaps, 2).to(dtype)


def _det_lu(A):
    """LU of A^T where A is contiguous and real, as PyTorch's det does (its backward expects it)."""
    return _lu_factor_ex(A.mT if A.is_contiguous() else A)


def _linalg_det(A):
    if not _real(A):
        return NotImplemented
    LU, piv, _ = _det_lu(A)
    det = LU.diagonal(dim1=-2, dim2=-1).prod(-1) * _perm_sign(piv, A.dtype)
    return det, LU, piv


def _linalg_slogdet(A):
    if not _real(A):
        return NotImplemented
    LU, piv, _ = _det_lu(A)
    diag = LU.diagonal(dim1=-2, dim2=-1)
    sign = torch.sign(diag).prod(-1) * _perm_sign(piv, A.dtype)
    return sign, diag.abs().log().sum(-1), LU, piv


# -- Cholesky ------------------------------------------------------------------------


def _cholesky_ex(A, upper=False, check_errors=False):
    """potrf, one column of L at a time from A's lower triangle (its upper one for upper=True);
    info is the order of the first leading minor that is not positive-definite."""
    if not _real(A):
        return NotImplemented
    src = A.mT if upper else A
    n = A.shape[-1]
    L = torch.zeros(A.shape, dtype=A.dtype, device=A.device)
    info = torch.zeros(A.shape[:-2], dtype=torch.int32, device=A.device)
    for j in range(n):
        d = src[..., j, j]
        if j:
            d = d - (L[..., j, :j] * L[..., j, :j]).sum(-1)
        info = torch.where((info == 0) & ~(d > 0), j + 1, info)
        ljj = d.sqrt()
        L[..., j, j] = ljj
        if j + 1 < n:
            col = src[..., j + 1 :, j]
            if j:
                col = col - (L[..., j + 1 :, :j] @ L[..., j, :j].unsqueeze(-1)).squeeze(-1)
            L[..., j + 1 :, j] = col / ljj.unsqueeze(-1)
    if check_errors:
        aten._linalg_check_errors.default(info, "torch.linalg.cholesky_ex", is_matrix=A.dim() == 2)
    return (L.mT.contiguous() if upper else L), info


def _cholesky(A, upper=False):
    if not _real(A):
        return NotImplemented
    L, info = _cholesky_ex(A, upper)
    aten._linalg_check_errors.default(info, "cholesky", is_matrix=A.dim() == 2)
    return L


def _cholesky_solve(self, input2, upper=False):
    if not _real(self, input2):
        return NotImplemented
    L = input2.mT if upper else input2  # A = L L^T
    return _trsm(L.mT, _trsm(L, self, upper=False), upper=True)


def _cholesky_inverse(self, upper=False):
    if not _real(self):
        return NotImplemented
    n = self.shape[-1]
    return _cholesky_solve(_eye(n, n, self).expand(self.shape), self, upper)


# -- QR --------------------------------------------------------------------------------


def _geqrf(A):
    """LAPACK's geqrf (dlarfg's conventions: beta = -sign(alpha) * norm, tau = (beta - alpha) / beta,
    v = x / (alpha - beta) below a unit head; no reflection where the column below is zero)."""
    if not _real(A):
        return NotImplemented
    m, n = A.shape[-2:]
    k = min(m, n)
    a = A.clone(memory_format=torch.contiguous_format)
    taus = []
    for j in range(k):
        x = a[..., j:, j]
        alpha = x[..., 0]
        tail = x[..., 1:]
        xnorm = (tail * tail).sum(-1).sqrt()
        nrm = torch.hypot(alpha, xnorm)
        beta = torch.where(alpha >= 0, -nrm, nrm)
        trivial = xnorm == 0
        tau = torch.where(trivial, 0.0, (beta - alpha) / torch.where(trivial, 1.0, beta))
        vt = tail / torch.where(trivial, 1.0, alpha - beta).unsqueeze(-1)
        beta = torch.where(trivial, alpha, beta)
        if j + 1 < n:
            v = torch.cat([torch.ones_like(alpha).unsqueeze(-1), vt], -1).unsqueeze(-1)
            sub = a[..., j:, j + 1 :]
            w = (v * sub).sum(-2, keepdim=True)
            a[..., j:, j + 1 :] = sub - tau[..., None, None] * v * w
        a[..., j, j] = beta
        a[..., j + 1 :, j] = vt
        taus.append(tau)
    tau = torch.stack(taus, -1) if taus else a.new_zeros(A.shape[:-2] + (0,))
    return a, tau


def _reflectors(V, k: int):
    """The k Householder vectors stored below V's diagonal (unit head), as columns (..., m, k)."""
    m = V.shape[-2]
    return V[..., :, :k].tril(-1) + _eye(m, k, V)


def _apply_q(V, tau, C, *, left=True, transpose=False):
    """Q C, Q^T C, C Q or C Q^T with Q = H_1 ... H_k, H_i = I - tau_i v_i v_i^T."""
    k = tau.shape[-1]
    vs = _reflectors(V, k)
    forward = left == transpose  # Q^T C and C Q apply H_1 first
    C = C.clone(memory_format=torch.contiguous_format)
    for i in range(k) if forward else range(k - 1, -1, -1):
        v = vs[..., i:, i : i + 1]
        t = tau[..., i : i + 1].unsqueeze(-1)
        if left:
            sub = C[..., i:, :]
            C[..., i:, :] = sub - t * v * (v.mT @ sub)
        else:
            sub = C[..., :, i:]
            C[..., :, i:] = sub - t * (sub @ v) * v.mT
    return C


def _householder_product(input, tau):  # noqa: A002 - the schema's name
    if not _real(input, tau):
        return NotImplemented
    m, n = input.shape[-2:]
    eye = _eye(m, n, input).expand(input.shape[:-2] + (m, n))
    return _apply_q(input, tau, eye)


def _ormqr(input, input2, input3, left=True, transpose=False):  # noqa: A002 - the schema's names
    if not _real(input, input2, input3):
        return NotImplemented
    V, C = _broadcast_batch(input, input3)
    return _apply_q(V, input2.expand(V.shape[:-2] + input2.shape[-1:]), C, left=left, transpose=transpose)


def _linalg_qr(A, mode="reduced"):
    if not _real(A):
        return NotImplemented
    m, n = A.shape[-2:]
    k = min(m, n)
    a, tau = _geqrf(A)
    rows = m if mode == "complete" else k
    R = a[..., :rows, :].triu()
    if mode == "r":
        return A.new_empty(0), R
    cols = m if mode == "complete" else k
    eye = _eye(m, cols, A).expand(A.shape[:-2] + (m, cols))
    return _apply_q(a, tau, eye), R


# -- symmetric eigenvalues and the SVD (Jacobi) -------------------------------------------


@functools.lru_cache(maxsize=64)
def _rounds(n: int):
    """Round-robin pairings: every pair (p, q), p < q, once per sweep, n // 2 disjoint per round."""
    players = list(range(n)) + ([n] if n % 2 else [])
    size = len(players)
    out = []
    for _ in range(size - 1):
        pairs = [(players[i], players[size - 1 - i]) for i in range(size // 2)]
        pairs = [(min(p, q), max(p, q)) for p, q in pairs if n not in (p, q)]
        out.append(([p for p, _ in pairs], [q for _, q in pairs]))
        players = [players[0]] + [players[-1]] + players[1:-1]
    return out


def _rotation(c, s, p, q, n: int, like):
    """Identity with the plane rotations [[c, s], [-s, c]] at the (p, q) pairs (disjoint): (..., n, n)."""
    batch = c.shape[:-1]
    J = _eye(n, n, like).expand(batch + (n, n)).reshape(batch + (n * n,)).clone()
    pp = [i * n + i for i in p]
    qq = [i * n + i for i in q]
    pq = [i * n + j for i, j in zip(p, q, strict=True)]
    qp = [j * n + i for i, j in zip(p, q, strict=True)]
    idx = torch.tensor(pp + qq + pq + qp).to(like.device).expand(batch + (4 * len(p),))
    J = J.scatter(-1, idx, torch.cat([c, c, s, -s], -1))
    return J.reshape(batch + (n, n))


def _jacobi_angle(app, aqq, apq):
    """c, s zeroing apq of the symmetric 2x2 [[app, apq], [apq, aqq]] (Rutishauser's formulas)."""
    zero = apq == 0
    theta = (aqq - app) / (2 * torch.where(zero, 1.0, apq))
    t = torch.where(theta >= 0, 1.0, -1.0) / (theta.abs() + (theta * theta + 1).sqrt())
    t = torch.where(zero, 0.0, t)
    c = 1 / (t * t + 1).sqrt()
    return c, t * c


def _fix_signs(V):
    """Each column's largest-magnitude component made positive (a deterministic choice)."""
    if V.shape[-2] == 0:
        return V
    idx = V.mT.abs().argmax(-1).unsqueeze(-2)
    sign = torch.where(V.gather(-2, idx) < 0, -1.0, 1.0).to(V.dtype)
    return V * sign


def _sweeps(n: int) -> int:
    return 30 if n > 1 else 0


def _jacobi_eigh(S, compute_v: bool):
    """Cyclic Jacobi on symmetric S (..., n, n): eigenvalues ascending and the eigenvectors."""
    n = S.shape[-1]
    A = S.clone(memory_format=torch.contiguous_format)
    V = _eye(n, n, S).expand(S.shape).clone() if compute_v else None
    tol = torch.finfo(S.dtype).eps
    for _ in range(_sweeps(n)):
        off = A - torch.diag_embed(A.diagonal(dim1=-2, dim2=-1))
        if A.numel() == 0 or float((off * off).sum().item()) <= (tol * tol) * float((A * A).sum().item()) * 1e-2:
            break
        for p, q in _rounds(n):
            flat = A.reshape(A.shape[:-2] + (n * n,))
            idx = torch.tensor(
                [i * n + i for i in p] + [i * n + i for i in q] + [i * n + j for i, j in zip(p, q, strict=True)]
            ).to(S.device)
            app, aqq, apq = flat.index_select(-1, idx).split(len(p), -1)
            c, s = _jacobi_angle(app, aqq, apq)
            J = _rotation(c, s, p, q, n, S)
            A = J.mT @ A @ J
            if compute_v:
                V = V @ J
    w = A.diagonal(dim1=-2, dim2=-1)
    w, order = torch.sort(w, -1)
    if not compute_v:
        return w, None
    assert V is not None, "compute_v made V"
    V = V.gather(-1, order.unsqueeze(-2).expand(V.shape))
    return w, _fix_signs(V)


def _linalg_eigh(A, UPLO="L", compute_v=True):
    if not _real(A):
        return NotImplemented
    low = A.tril(-1) if UPLO.upper() == "L" else A.triu(1).mT
    S = low + low.mT + torch.diag_embed(A.diagonal(dim1=-2, dim2=-1))
    w, V = _jacobi_eigh(S, compute_v)
    return w, (V.contiguous() if compute_v else A.new_empty(0))


def _one_sided_jacobi(A):
    """Hestenes: rotate column pairs of A (..., m, n), m >= n, until orthogonal. Returns the
    rotated columns W = A V and V."""
    m, n = A.shape[-2:]
    W = A.clone(memory_format=torch.contiguous_format)
    V = _eye(n, n, A).expand(A.shape[:-2] + (n, n)).clone()
    tol = torch.finfo(A.dtype).eps
    for _ in range(_sweeps(n)):
        G = W.mT @ W
        off = G - torch.diag_embed(G.diagonal(dim1=-2, dim2=-1))
        if W.numel() == 0 or float((off * off).sum().item()) <= (tol * tol) * float((G * G).sum().item()) * 1e-2:
            break
        for p, q in _rounds(n):
            pi = torch.tensor(p).to(A.device)
            qi = torch.tensor(q).to(A.device)
            wp, wq = W.index_select(-1, pi), W.index_select(-1, qi)
            alpha, beta, gamma = (wp * wp).sum(-2), (wq * wq).sum(-2), (wp * wq).sum(-2)
            c, s = _jacobi_angle(alpha, beta, gamma)
            J = _rotation(c, s, p, q, n, A)
            W = W @ J
            V = V @ J
    return W, V


def _jacobi_svd(A, full_matrices: bool, compute_uv: bool):
    m, n = A.shape[-2:]
    if m < n:
        U, S, Vh = _jacobi_svd(A.mT, full_matrices, compute_uv)
        return (Vh.mT, S, U.mT) if compute_uv else (U, S, Vh)
    W, V = _one_sided_jacobi(A)
    S = (W * W).sum(-2).sqrt()
    S, order = torch.sort(S, -1, descending=True)
    if not compute_uv:
        return A.new_empty(0), S, A.new_empty(0)
    V = _fix_signs(V.gather(-1, order.unsqueeze(-2).expand(V.shape)))
    W = A @ V  # recomputed from the sign-fixed V: U = A V / S
    U = W / torch.where(S == 0, 1.0, S).unsqueeze(-2)
    if full_matrices and m > n:
        Q, _ = _linalg_qr(torch.cat([U, _eye(m, m, A).expand(A.shape[:-2] + (m, m))], -1)[..., :m], "complete")
        U = torch.cat([U, Q[..., n:]], -1)
    return U.contiguous(), S, V.mT.contiguous()


def _linalg_svd(A, full_matrices=False, compute_uv=True, driver=None):
    if not _real(A):
        return NotImplemented
    return _jacobi_svd(A, full_matrices, compute_uv)


def _linalg_pinv(self, atol=None, rtol=None, hermitian=False):
    """PyTorch's own formula: singular values (eigenvalue magnitudes for hermitian) above
    max(atol, rtol * the largest) are inverted, the rest dropped."""
    if not _real(self):
        return NotImplemented
    m, n = self.shape[-2:]
    if self.numel() == 0:
        return self.new_zeros(self.shape[:-2] + (n, m))
    dtype = self.dtype

    def scalar(v):
        return v.to(dtype) if isinstance(v, torch.Tensor) else torch.full((), float(v), dtype=dtype, device=self.device)

    zero = torch.zeros((), dtype=dtype, device=self.device)
    default = scalar(torch.finfo(dtype).eps * max(m, n))
    atol_t = zero if atol is None else scalar(atol)
    if rtol is not None:
        rtol_t = scalar(rtol)
    else:
        rtol_t = default if atol is None else torch.where(atol_t > 0, zero, default)
    if hermitian:
        S, U = torch.linalg.eigh(self)
        Sa = S.abs()
        top = Sa.amax(-1, keepdim=True)
    else:
        U, S, Vh = torch.linalg.svd(self, full_matrices=False)
        Sa = S
        top = S[..., :1]
    tol = torch.maximum(atol_t.unsqueeze(-1), rtol_t.unsqueeze(-1) * top)
    inv = torch.where(Sa > tol, 1 / S, 0.0)
    if hermitian:
        return (U * inv.unsqueeze(-2)) @ U.mT
    return (Vh.mT * inv.unsqueeze(-2)) @ U.mT


# -- matrix exponential --------------------------------------------------------------------

_PADE13 = (
    64764752532480000.0,
    32382376266240000.0,
    7771770303897600.0,
    1187353796428800.0,
    129060195264000.0,
    10559470521600.0,
    670442572800.0,
    33522128640.0,
    1323241920.0,
    40840800.0,
    960960.0,
    16380.0,
    182.0,
    1.0,
)
_THETA13 = 5.371920351148152


def _matrix_exp(A):
    """Scaling and squaring with the degree-13 Pade approximant (Higham 2005): each matrix is
    scaled by its own power of two, the Pade solve is an LU solve, the squarings are masked
    per matrix."""
    if not _real(A):
        return NotImplemented
    if A.dtype in (torch.float16, torch.bfloat16):
        # computed in float32 and rounded once, as PyTorch's kernels compute half types (in bfloat16
        # throughout, the squarings amplify each product's rounding: whole entries change sign at
        # norm 55, and PyTorch's CPU kernel returns NaN there)
        return _matrix_exp(A.float()).to(A.dtype)
    n = A.shape[-1]
    if n == 0 or A.numel() == 0:
        return A.clone()
    norm1 = A.abs().sum(-2).amax(-1)
    s = torch.ceil(torch.log2(norm1 / _THETA13)).clamp(min=0)
    s = torch.where(torch.isfinite(s), s, 0.0)
    X = A / torch.pow(2.0, s)[..., None, None]
    b = _PADE13
    eye = _eye(n, n, A).expand(A.shape)
    X2 = X @ X
    X4 = X2 @ X2
    X6 = X4 @ X2
    u = X6 @ (b[13] * X6 + b[11] * X4 + b[9] * X2) + b[7] * X6 + b[5] * X4 + b[3] * X2 + b[1] * eye
    U = X @ u
    V = X6 @ (b[12] * X6 + b[10] * X4 + b[8] * X2) + b[6] * X6 + b[4] * X4 + b[2] * X2 + b[0] * eye
    LU, piv, _ = _lu_factor_ex(V - U)
    E = _lu_solve(LU, piv, V + U)
    for i in range(int(s.amax().item())):
        E = torch.where((s > i)[..., None, None], E @ E, E)
    return E


def _pow_(self, exponent):
    """In-place pow (the vector norms' backward uses it) as the out-of-place op and a copy_:
    PyTorch's own decomposition bottoms out in prims.pow, which no plugin has."""
    return self.copy_(torch.pow(self, exponent))


def register(table: dict) -> None:
    table[aten.eye.default] = _eye_default
    table[aten.eye.m] = _eye_default
    table[aten.eye.out] = _eye_out
    table[aten.eye.m_out] = _eye_m_out
    table[aten.linalg_lu_factor_ex.default] = _lu_factor_ex
    table[aten.linalg_lu.default] = _linalg_lu
    table[aten.lu_unpack.default] = _lu_unpack
    table[aten.linalg_lu_solve.default] = _lu_solve
    table[aten.lu_solve.default] = _lu_solve_old
    table[aten._linalg_solve_ex.default] = _linalg_solve_ex
    table[aten.linalg_inv_ex.default] = _inv_ex
    table[aten._linalg_det.default] = _linalg_det
    table[aten._linalg_slogdet.default] = _linalg_slogdet
    table[aten.linalg_cholesky_ex.default] = _cholesky_ex
    table[aten.cholesky.default] = _cholesky
    table[aten.cholesky_solve.default] = _cholesky_solve
    table[aten._cholesky_solve_helper.default] = _cholesky_solve
    table[aten.cholesky_inverse.default] = _cholesky_inverse
    table[aten.linalg_solve_triangular.default] = _solve_triangular
    table[aten.triangular_solve.default] = _triangular_solve
    table[aten.geqrf.default] = _geqrf
    table[aten.linalg_qr.default] = _linalg_qr
    table[aten.linalg_householder_product.default] = _householder_product
    table[aten.ormqr.default] = _ormqr
    table[aten._linalg_eigh.default] = _linalg_eigh
    table[aten._linalg_svd.default] = _linalg_svd
    table[aten.linalg_pinv.atol_rtol_tensor] = _linalg_pinv
    table[aten.linalg_pinv.atol_rtol_float] = _linalg_pinv
    table[aten.linalg_matrix_exp.default] = _matrix_exp
    table[aten.pow_.Scalar] = _pow_
    table[aten.pow_.Tensor] = _pow_
