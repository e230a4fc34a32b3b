"""Host-plugin reduction, softmax, loss and indexing kernels against torch CPU."""

from __future__ import annotations

import pytest
import torch
from test_elementwise_kernels import check, fl_call, make

aten = torch.ops.aten

LAYOUTS = ["contig", "transposed", "sliced"]
RED_SHAPES = [
    ((4, 6, 5), [1]),
    ((4, 6, 5), [0, 2]),
    ((4, 6, 5), [-1]),
    ((4, 6, 5), [0]),
    ((7, 300), [0]),
    ((7, 300), [1]),
    ((), []),
    ((0, 5), [0]),
    ((0, 5), [1]),
    ((3, 4), []),
]


@pytest.mark.parametrize("shape,dims", RED_SHAPES, ids=str)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dt", [torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.int32, torch.bool])
def test_sum_mean(shape, dims, layout, dt):
    x = make(shape, dt, layout, lo=-50, hi=50)
    a = 1e-5 * 50 * max(1, x.numel())  # torch sums float32 in float32; the kernel in double
    for keep in (False, True):
        check(aten.sum.dim_IntList, x, dims, keep, atol=a)
        if dt.is_floating_point:
            check(aten.mean.dim, x, dims, keep, atol=a)
        else:
            check(aten.mean.dim, x, dims, keep, dtype=torch.float64)
    check(aten.sum.default, x, atol=a)
    check(aten.sum.dim_IntList, x, None, atol=a)
    if dt.is_floating_point:
        check(aten.mean.default, x, atol=a)
        check(aten.sum.dim_IntList, x, dims, dtype=torch.float64, atol=a)


def test_sum_large_accuracy():
    x = torch.rand(1_000_003) + 1000.0
    check(aten.sum.default, x)
    check(aten.mean.default, x)
    got = fl_call(aten.sum.default, x)[1]
    assert abs(got.item() - x.double().sum().item()) / x.double().sum().item() < 1e-7
    y = torch.rand(4096, 257)
    check(aten.sum.dim_IntList, y, [0])  # column path
    check(aten.sum.dim_IntList, y.t(), [1])
    check(aten.mean.dim, torch.rand(8, 64, 30, 30), [0, 2, 3], True)
    check(aten.sum.dim_IntList, torch.randint(-(2**40), 2**40, (100_000,)), [0])


@pytest.mark.parametrize("shape,dims", [s for s in RED_SHAPES if 0 not in s[0]], ids=str)
@pytest.mark.parametrize("dt", [torch.float32, torch.float64, torch.float16, torch.int64, torch.uint8])
def test_extrema(shape, dims, dt):
    x = make(shape, dt, "transposed", lo=0, hi=9)  # small ints: ties resolve to the first index
    for keep in (False, True):
        check(aten.amax.default, x, dims, keep)
        check(aten.amin.default, x, dims, keep)
        if len(dims) == 1:
            check(aten.max.dim, x, dims[0], keep)
            check(aten.min.dim, x, dims[0], keep)
            check(aten.argmax.default, x, dims[0], keep)
            check(aten.argmin.default, x, dims[0], keep)
    check(aten.max.default, x)
    check(aten.min.default, x)
    check(aten.argmax.default, x)
    check(aten.prod.default, x if not dt.is_floating_point else x / 4)
    if len(dims) == 1:
        check(aten.prod.dim_int, x, dims[0], True)
    if dt.is_floating_point and x.dim() == 3:
        y = x.clone()
        y[1, 2, 3] = float("nan")
        check(aten.amax.default, y, dims)
        check(aten.max.dim, y, 1)
        check(aten.argmin.default, y)
    big = make((3, 70_000), dt, lo=0, hi=100)
    check(aten.argmax.default, big)
    check(aten.max.default, big)


def test_extrema_empty_is_error():
    with pytest.raises(RuntimeError):
        fl_call(aten.amax.default, torch.empty(0, 3), [0], out_like=torch.empty(3))


@pytest.mark.parametrize("dt", [torch.float32, torch.float64, torch.bfloat16])
def test_var_std_any_all_norm(dt):
    for shape, dims in [((5, 40), [1]), ((6, 7, 8), [0, 2]), ((300, 200), None), ((2, 50_000), [1]), ((4,), [0])]:
        x = make(shape, dt, "transposed" if len(shape) > 1 else "contig") + 3
        for corr in (None, 0, 1, 2):
            check(aten.var.correction, x, dims, correction=corr, tol_scale=10)
        check(aten.std.correction, x, dims, keepdim=True, tol_scale=10)
        check(aten.var_mean.correction, x, dims, tol_scale=10)
        check(aten.std_mean.correction, x, dims, correction=0, tol_scale=10)
        for ordv in (2, 1, float("inf"), 3.0, 0):
            check(aten.linalg_vector_norm.default, x, ordv, dims, tol_scale=10)
        check(aten.norm.Scalar, x, 2, tol_scale=10)
        if dims:
            check(aten.norm.ScalarOpt_dim, x, 2, dims, True, tol_scale=10)
            check(aten.logsumexp.default, x, dims, tol_scale=4)
            check(aten.cumsum.default, x, dims[-1], tol_scale=10)
    b = make((6, 5), torch.bool, "transposed")
    for t in (b, make((6, 5), dt), torch.zeros(3, 4, dtype=dt), torch.ones(0, 4, dtype=dt)):
        check(aten.any.default, t)
        check(aten.all.default, t)
        check(aten.any.dim, t, 1, True)
        check(aten.all.dim, t, 0)
        check(aten.any.dims, t, [0, 1])
    check(aten.any.default, make((4, 4), torch.uint8, lo=0, hi=1))


def test_cumsum_ints_and_inplace():
    x = make((5, 9), torch.int32, "transposed", lo=-9, hi=9)
    check(aten.cumsum.default, x, 0)
    check(aten.cumsum.default, x, 1, dtype=torch.float32)
    check(aten.cumsum.default, make((5, 9), torch.bool), -1)
    check(aten.cumsum_.default, torch.randn(6, 7), 1)
    check(aten.logsumexp.default, torch.tensor([[-float("inf"), -float("inf")], [1.0, float("inf")]]), [1])


@pytest.mark.parametrize("dt", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    "shape,dim",
    [((4, 10), 1), ((4, 10), 0), ((2, 3, 5), 1), ((7,), 0), ((), 0), ((0, 4), 1), ((64, 1000), -1)],
    ids=str,
)
def test_softmax_family(dt, shape, dim):
    x = make(shape, dt, "transposed" if len(shape) == 2 else "contig", lo=-5, hi=5)
    y = check(aten._softmax.default, x, dim, False)[0]
    ly = check(aten._log_softmax.default, x, dim, False)[0]
    g = make(shape, dt, lo=-1, hi=1)
    check(aten._softmax_backward_data.default, g, y, dim, dt, tol_scale=4)
    check(aten._log_softmax_backward_data.default, g, ly, dim, dt, tol_scale=4)
    check(aten._safe_softmax.default, x, dim)


def test_safe_softmax_all_masked_rows():
    x = torch.randn(4, 6)
    x[1] = -float("inf")
    check(aten._safe_softmax.default, x, 1)
    check(aten._safe_softmax.default, x, 1, torch.float64)


@pytest.mark.parametrize("reduction", [0, 1, 2])
@pytest.mark.parametrize("weighted", [False, True])
def test_nll_loss(reduction, weighted):
    for dt in (torch.float32, torch.float64):
        x = torch.randn(8, 5, dtype=dt).log_softmax(1).t().contiguous().t()  # column-major
        t = torch.tensor([0, 4, 2, -100, 1, 1, 3, 0])
        w = torch.rand(5, dtype=dt) if weighted else None
        out, tw = check(aten.nll_loss_forward.default, x, t, w, reduction, -100)
        go = torch.rand(8, dtype=dt) if reduction == 0 else torch.tensor(0.7, dtype=dt)
        check(aten.nll_loss_backward.default, go, x, t, w, reduction, -100, tw)
        # 1-D input, 0-dim target
        x1, t1 = x[0].clone(), torch.tensor(3)
        o1, tw1 = check(aten.nll_loss_forward.default, x1, t1, w, reduction, -100)
        check(aten.nll_loss_backward.default, go[0] if reduction == 0 else go, x1, t1, w, reduction, -100, tw1)
        # 2d
        x4 = torch.randn(2, 5, 3, 4, dtype=dt)
        t4 = torch.randint(0, 5, (2, 3, 4))
        t4[0, 0, 0] = 2
        o4, tw4 = check(aten.nll_loss2d_forward.default, x4, t4, w, reduction, 2)
        go4 = torch.rand(2, 3, 4, dtype=dt) if reduction == 0 else torch.tensor(1.3, dtype=dt)
        check(aten.nll_loss2d_backward.default, go4, x4, t4, w, reduction, 2, tw4)
    with pytest.raises(RuntimeError):
        fl_call(
            aten.nll_loss_forward.default,
            torch.randn(2, 3),
            torch.tensor([0, 3]),
            None,
            1,
            -100,
            out_like=(torch.empty(()), torch.empty(())),
        )


@pytest.mark.parametrize("dt", [torch.float32, torch.float64, torch.bfloat16])
def test_embedding(dt):
    w = make((20, 7), dt)
    for idx in (
        torch.tensor([[1, 5, 19], [0, 0, 3]]),
        torch.tensor([4, 2, 2]).to(torch.int32),
        torch.tensor(3),
        torch.randint(0, 20, (5, 6)).t(),
        torch.empty(0, dtype=torch.int64),
    ):
        check(aten.embedding.default, w, idx)
        check(aten.embedding.default, w.t().contiguous().t(), idx)
        if dt != torch.bfloat16:
            g = make(tuple(idx.shape) + (7,), dt)
            check(aten.embedding_dense_backward.default, g, idx, 20, -1, False)
            check(aten.embedding_dense_backward.default, g, idx, 20, 2, True)
    big_idx = torch.randint(0, 1000, (64, 128))
    check(aten.embedding_dense_backward.default, torch.randn(64, 128, 256), big_idx, 1000, 0, False, tol_scale=5)
    with pytest.raises(RuntimeError):
        fl_call(aten.embedding.default, w, torch.tensor([20]), out_like=torch.empty(1, 7, dtype=dt))


@pytest.mark.parametrize("dt", [torch.float32, torch.int64, torch.bool, torch.bfloat16])
def test_index_select_gather_scatter(dt):
    x = make((6, 8, 5), dt, "transposed", lo=-9, hi=9)
    for dim in (0, 1, 2, -1):
        n = x.shape[dim]
        check(aten.index_select.default, x, dim, torch.tensor([n - 1, 0, 2, 2]))
        check(aten.index_select.default, x, dim, torch.tensor([], dtype=torch.int64))
        idx_shape = list(x.shape)
        idx_shape[dim] = 4
        idx = torch.randint(0, n, idx_shape)
        check(aten.gather.default, x, dim, idx)
        check(aten.gather.default, x, dim, idx[:2, :3, :2])
        if dt != torch.bool:
            src = make(tuple(idx_shape), dt, lo=-5, hi=5)
            check(aten.scatter_add.default, x, dim, idx, src, tol_scale=4)
            check(aten.scatter_add_.default, x.clone(), dim, idx, src, tol_scale=4)
    check(aten.index_select.default, make((5,), dt), 0, torch.tensor([4, 1]))
    check(aten.index_select.default, make((), dt), 0, torch.tensor([0]))


@pytest.mark.parametrize("dt", [torch.float32, torch.int64, torch.bool])
def test_cat_stack(dt):
    a, b, c = make((2, 3, 4), dt), make((2, 5, 4), dt, "transposed"), make((2, 1, 4), dt, "sliced")
    check(aten.cat.default, [a, b, c], 1)
    check(aten.cat.default, [a, a.transpose(1, 2).contiguous().transpose(1, 2)], -1)
    check(aten.cat.default, [a, torch.empty(0, dtype=dt), a], 0)
    check(aten.cat.default, [make((3,), dt), make((0,), dt), make((2,), dt)], 0)
    check(aten.cat.default, [a, make((2, 3, 4), torch.float64)], 0)  # promotion
    check(aten.stack.default, [a, a * 1, a.clone()], 0)
    check(aten.stack.default, [a, a], 2)
    check(aten.stack.default, [a, a], -1)
    big = [torch.randn(100, 700) for _ in range(3)]
    check(aten.cat.default, big, 1)
