"""Host-plugin nn kernels (k_nn.h and its files, k_pool.c) against PyTorch's own CPU ops: padding, upsampling,
3-D / adaptive / fractional pooling, unpooling, im2col/col2im, grid sampling, distances,
embedding bags, rrelu; forward, backward and error paths."""

from __future__ import annotations

import pytest
import torch
from test_linalg_kernels import check, run_kernel

A = torch.ops.aten
DTYPES = [torch.float32, torch.float64]


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def rnd(*shape, dtype=torch.float32):
    return torch.randn(shape, dtype=dtype)


def strided(t):
    """the same values in a non-contiguous layout"""
    big = torch.zeros([2 * s for s in t.shape], dtype=t.dtype)
    view = big[tuple(slice(None, None, 2) for _ in t.shape)]
    view.copy_(t)
    return view


@pytest.mark.parametrize("dtype", DTYPES + [torch.bfloat16])
@pytest.mark.parametrize("kind", ["reflection", "replication"])
@pytest.mark.parametrize(
    "k,shape,pad",
    [
        (1, (2, 3, 7), [2, 3]),
        (1, (3, 6), [-1, 2]),
        (2, (2, 3, 5, 6), [2, 3, 1, 4]),
        (3, (2, 2, 4, 5, 6), [1, 2, 0, 3, 2, 1]),
    ],
)
def test_padding(kind, k, shape, pad, dtype):
    fwd, bwd = getattr(A, f"{kind}_pad{k}d").default, getattr(A, f"{kind}_pad{k}d_backward").default
    x = strided(rnd(*shape, dtype=dtype))
    out = check(fwd, x, pad)[0]
    check(bwd, rnd(*out.shape, dtype=dtype), x, pad)


UPSAMPLE = [  # (op name, spatial dims, has align_corners)
    ("upsample_nearest1d", 1, False),
    ("upsample_nearest2d", 2, False),
    ("upsample_nearest3d", 3, False),
    ("_upsample_nearest_exact1d", 1, False),
    ("_upsample_nearest_exact2d", 2, False),
    ("_upsample_nearest_exact3d", 3, False),
    ("upsample_linear1d", 1, True),
    ("upsample_bilinear2d", 2, True),
    ("upsample_trilinear3d", 3, True),
    ("upsample_bicubic2d", 2, True),
    ("_upsample_bilinear2d_aa", 2, True),
    ("_upsample_bicubic2d_aa", 2, True),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name,k,has_ac", UPSAMPLE)
def test_upsample(name, k, has_ac, dtype):
    fwd, bwd = getattr(A, name).default, getattr(A, name + "_backward").default
    x = rnd(*([2, 3] + [5, 7, 4][:k]), dtype=dtype)
    for osz in ([9, 3, 11][:k], [5, 14, 2][:k], [2, 7, 8][:k]):
        for ac in [False, True] if has_ac else [None]:
            for sc in (None, 1.7):  # a scale that disagrees with the sizes: the kernels must use it as CPU does
                extra = ([ac] if has_ac else []) + [sc] * k
                out = check(fwd, x, osz, *extra)[0]
                check(bwd, rnd(*out.shape, dtype=dtype), osz, list(x.shape), *extra)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_upsample_layouts_and_halves(dtype):
    x = strided(rnd(2, 3, 6, 5)).to(dtype)
    check(A.upsample_bilinear2d.default, x, [11, 4], False, None, None)
    check(A.upsample_nearest2d.default, x.contiguous(memory_format=torch.channels_last), [12, 10], None, None)


@pytest.mark.parametrize("dtype", DTYPES)
def test_pool3d(dtype):
    x = strided(rnd(2, 3, 6, 7, 5, dtype=dtype))
    x[0, 0, 1, 1, 1] = float("nan")
    args = ([3, 2, 2], [2, 1, 2], [1, 1, 0])
    out, ind = check(A.max_pool3d_with_indices.default, x, *args, [1, 2, 1], True)
    check(A.max_pool3d_with_indices_backward.default, rnd(*out.shape, dtype=dtype), x, *args, [1, 2, 1], True, ind)
    for cip in (True, False):
        for div in (None, 3):
            out = check(A.avg_pool3d.default, x, *args, True, cip, div)[0]
            check(A.avg_pool3d_backward.default, rnd(*out.shape, dtype=dtype), x, *args, True, cip, div)
    out = check(A._adaptive_avg_pool3d.default, x, [4, 3, 2])[0]
    check(A._adaptive_avg_pool3d_backward.default, rnd(*out.shape, dtype=dtype), x)
    out, ind = check(A.adaptive_max_pool3d.default, x, [4, 3, 2])
    check(A.adaptive_max_pool3d_backward.default, rnd(*out.shape, dtype=dtype), x, ind)
    check(
        A.max_pool3d_with_indices.default,
        rnd(0, 2, 4, 4, 4, dtype=dtype),
        [2, 2, 2],
        [2, 2, 2],
        [0, 0, 0],
        [1, 1, 1],
        False,
    )


@pytest.mark.parametrize("dtype", DTYPES)
def test_adaptive_and_fractional_2d(dtype):
    x = rnd(2, 3, 9, 10, dtype=dtype)
    x[1, 1, 2:4, 2:4] = 1.0  # ties: the first maximum wins
    out, ind = check(A.adaptive_max_pool2d.default, x, [4, 3])
    check(A.adaptive_max_pool2d_backward.default, rnd(*out.shape, dtype=dtype), x, ind)
    out, ind = check(A.fractional_max_pool2d.default, x, [2, 3], [4, 5], torch.rand(2, 3, 2, dtype=dtype))
    check(A.fractional_max_pool2d_backward.default, rnd(*out.shape, dtype=dtype), x, [2, 3], [4, 5], ind)
    check(
        A.fractional_max_pool3d.default,
        rnd(2, 3, 6, 7, 5, dtype=dtype),
        [2, 3, 2],
        [3, 4, 3],
        torch.rand(2, 3, 3, dtype=dtype),
    )


def test_unpool_and_fold():
    x = rnd(2, 3, 9, 10)
    o, i = A.max_pool2d_with_indices(x, [2, 2], [2, 2])
    check(A.max_unpool2d.default, o, i, [9, 10])
    x3 = rnd(2, 3, 6, 7, 5)
    o, i = A.max_pool3d_with_indices(x3, [2, 2, 2], [2, 2, 2])
    check(A.max_unpool3d.default, o, i, [6, 7, 5], [2, 2, 2], [0, 0, 0])
    c = check(A.im2col.default, strided(x), [2, 3], [1, 2], [1, 0], [2, 1])[0]
    check(A.col2im.default, c, [9, 10], [2, 3], [1, 2], [1, 0], [2, 1])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("nd", [2, 3])
def test_grid_sampler(nd, dtype):
    x = rnd(*([2, 3] + [5, 6, 4][:nd]), dtype=dtype)
    grid = torch.rand(*([2] + [4, 3, 5][:nd] + [nd]), dtype=dtype) * 2.6 - 1.3
    grid.view(-1)[3], grid.view(-1)[5] = 1.0, -1.0  # on the border
    fwd = (A.grid_sampler_2d if nd == 2 else A.grid_sampler_3d).default
    bwd = (A.grid_sampler_2d_backward if nd == 2 else A.grid_sampler_3d_backward).default
    for mode in (0, 1, 2) if nd == 2 else (0, 1):
        for pad in (0, 1, 2):
            for ac in (False, True) if pad == 2 else (pad == 1,):  # reflection depends on align_corners most
                out = check(fwd, x, grid, mode, pad, ac)[0]
                check(bwd, rnd(*out.shape, dtype=dtype), x, grid, mode, pad, ac, [True, True])
    check(bwd, rnd(*out.shape, dtype=dtype), x, grid, 0, 0, False, [False, True])


@pytest.mark.parametrize("dtype", DTYPES)
def test_distances(dtype):
    x = rnd(7, 5, dtype=dtype)
    a, b = rnd(2, 4, 5, dtype=dtype), rnd(2, 6, 5, dtype=dtype)
    for p in (0.0, 1.0, 2.0, 3.0, 0.5, 1.5, float("inf")):
        d = check(A._pdist_forward.default, x, p)[0]
        check(A._pdist_backward.default, rnd(*d.shape, dtype=dtype), x, p, d)
        c = check(A._cdist_forward.default, a, b, p, None)[0]
        check(A._cdist_backward.default, rnd(*c.shape, dtype=dtype), a, b, p, c)


@pytest.mark.parametrize("dtype", DTYPES)
def test_embedding_bag(dtype):
    w, idx = rnd(10, 4, dtype=dtype), torch.tensor([1, 2, 4, 5, 4, 3, 2, 9, 0])
    for mode in (0, 1, 2):
        for pad in (-1, 4):
            for last in (False, True):
                off = torch.tensor([0, 2, 2, 5, 9] if last else [0, 2, 2, 5])
                psw = rnd(9, dtype=dtype) if mode == 0 and pad == -1 else None
                # meta and CPU disagree on bag_size / max_indices shapes in some modes: skip those outputs
                skip = ((2, 3) if last else ()) + ((3,) if mode != 2 else ())
                r = check(A._embedding_bag.default, w, idx, off, False, mode, False, psw, last, pad, skip_outputs=skip)
                g = rnd(*r[0].shape, dtype=dtype)
                for freq in (False, True):
                    check(A._embedding_bag_dense_backward.default, g, idx, r[1], r[2], r[3], 10, freq, mode, psw, pad)
                if psw is not None:
                    check(A._embedding_bag_per_sample_weights_backward.default, g, w, idx, off, r[1], mode, pad)


def test_rrelu():
    x = rnd(4, 5)
    check(A.rrelu_with_noise.default, x, torch.zeros_like(x), 0.1, 0.3, False)
    noise = torch.zeros_like(x)
    st, (out,) = run_kernel(A.rrelu_with_noise.default, x, noise, 0.1, 0.3, True)
    assert st == 0
    neg = x <= 0
    assert torch.all(noise[~neg] == 1) and torch.all((noise[neg] >= 0.1) & (noise[neg] <= 0.3))
    torch.testing.assert_close(out, x * noise)


def _error(op, *args):
    with pytest.raises(RuntimeError) as e:
        run_kernel(op, *args)
    return str(e.value)


def test_errors():
    o, i = A.max_pool2d_with_indices(rnd(1, 2, 4, 4), [2, 2], [2, 2])
    i[0, 0, 0, 0] = 99
    assert "invalid max index: 99" in _error(A.max_unpool2d.default, o, i, [4, 4])
    w = rnd(5, 3)
    assert "found idx to be 7" in _error(
        A._embedding_bag.default, w, torch.tensor([1, 7]), torch.tensor([0]), False, 0, False, None, False, -1
    )
    assert "offsets[0] has to be 0" in _error(
        A._embedding_bag.default, w, torch.tensor([1, 2]), torch.tensor([1]), False, 0, False, None, False, -1
    )
    go, x = rnd(1, 2, 2, 2), rnd(1, 2, 4, 4)
    bad = torch.full((1, 2, 2, 2), 16, dtype=torch.int64)
    assert "out of range" in _error(A.adaptive_max_pool2d_backward.default, go, x, bad)
