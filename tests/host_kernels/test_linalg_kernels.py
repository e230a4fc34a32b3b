"""Host-plugin linalg kernels (k_linalg.c, k_conv.c, k_norm.c, k_pool.c) against PyTorch's own CPU ops:
GEMM family, convolution (+ backward), batch/layer/group norm, pooling."""

from __future__ import annotations

import harness
import pytest
import torch

A = torch.ops.aten


def run_kernel(op, *args, **kwargs):
    """Returns (status, outputs) of the plugin kernel of `op`, called as the runtime does (harness: schema
    order, defaults filled, outputs preallocated from the meta function, undefined outputs as ndim -1); the
    output of an in-place op is its mutated argument."""
    bound = harness.bind(op, args, kwargs)
    inputs, cargs = harness.to_specs(bound)
    outs = harness.meta_outputs(op, args, kwargs, int_fill=None)
    schema = op._schema
    for i, r in enumerate(schema.returns):
        if r.alias_info is not None and r.alias_info.is_write:
            for j, a in enumerate(schema.arguments):
                if a.alias_info is not None and a.alias_info.before_set == r.alias_info.before_set:
                    outs[i] = bound[j]
    return harness.call(harness.entry_name(op), inputs, outs, cargs), outs


def _tol(dtype):
    return {
        torch.float32: (1e-4, 1e-4),
        torch.float64: (1e-10, 1e-10),
        torch.bfloat16: (2e-2, 2e-2),
        torch.float16: (2e-3, 2e-3),
    }[dtype]


def _close(got, want, dtype, scale=1.0):
    rtol, atol = _tol(dtype)
    torch.testing.assert_close(got, want, rtol=rtol, atol=atol * scale, equal_nan=True)


def check(op, *args, mutated=(), scale=None, skip_outputs=(), **kwargs):
    """Runs the kernel and the CPU op on separate clones and compares outputs
    (and the in-place updated arguments listed in `mutated`)."""

    def clone(v):
        return v.clone() if isinstance(v, torch.Tensor) else v

    ref_args = [clone(v) for v in args]
    ref_kw = {k: clone(v) for k, v in kwargs.items()}
    ref = op(*ref_args, **ref_kw)
    ker_args = [clone(v) for v in args]
    ker_kw = {k: clone(v) for k, v in kwargs.items()}
    # keep the layout of the original (clone keeps strides for dense tensors;
    # views are passed as they are)
    for i, v in enumerate(args):
        if isinstance(v, torch.Tensor) and not v.is_contiguous() and ker_args[i].stride() != v.stride():
            ker_args[i] = v
    st, outs = run_kernel(op, *ker_args, **ker_kw)
    assert st == 0, f"{harness.entry_name(op)} declined"
    if not isinstance(ref, (tuple, list)):
        ref = [ref]
    dtype = next(v.dtype for v in args if isinstance(v, torch.Tensor))
    for k, (g, w) in enumerate(zip(outs, ref, strict=False)):
        if k in skip_outputs or g is None or w is None or w.numel() == 0 and g.numel() != 0:
            continue
        assert g.shape == w.shape, (k, g.shape, w.shape)
        if w.dtype in (torch.int64, torch.int32):
            assert torch.equal(g, w), k
        else:
            s = scale if scale is not None else max(1.0, float(w.abs().max()) if w.numel() else 1.0)
            # meta and CPU may disagree on statistics' dtypes (float32 vs half): the kernel follows meta
            _close(g.to(w.dtype), w, dtype if w.dtype == dtype else w.dtype, s)
    for i in mutated:
        _close(ker_args[i], ref_args[i], ref_args[i].dtype)
    return outs


def rnd(*shape, dtype=torch.float32):
    return torch.randn(shape, dtype=dtype)


DTYPES = [torch.float32, torch.float64]


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def test_table_has_ops():
    names = set(harness.kernels())
    for op in [
        "aten::mm",
        "aten::addmm",
        "aten::bmm",
        "aten::baddbmm",
        "aten::convolution",
        "aten::convolution_backward",
        "aten::native_batch_norm",
        "aten::native_batch_norm_backward",
        "aten::_native_batch_norm_legit",
        "aten::_native_batch_norm_legit.no_stats",
        "aten::_native_batch_norm_legit_no_training",
        "aten::_batch_norm_with_update",
        "aten::_batch_norm_no_update",
        "aten::batch_norm_backward",
        "aten::native_layer_norm",
        "aten::native_layer_norm_backward",
        "aten::max_pool2d_with_indices",
        "aten::max_pool2d_with_indices_backward",
        "aten::avg_pool2d",
        "aten::avg_pool2d_backward",
        "aten::_adaptive_avg_pool2d",
        "aten::_adaptive_avg_pool2d_backward",
    ]:
        assert op in names, op


# ---------------------------------------------------------------------------
# GEMM family
# ---------------------------------------------------------------------------

MM_CASES = [
    # (M, K, N, transpose a, transpose b)
    (7, 5, 3, False, False),
    (64, 33, 17, True, False),
    (16, 8, 40, False, True),
    (9, 11, 13, True, True),
    (0, 4, 5, False, False),
    (4, 0, 5, False, False),
    (1, 7, 1, False, False),
    (128, 256, 64, False, False),
]


def _mat(r, c, t, dtype):
    return rnd(c, r, dtype=dtype).t() if t else rnd(r, c, dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("M,K,N,ta,tb", MM_CASES)
def test_mm(M, K, N, ta, tb, dtype):
    check(A.mm.default, _mat(M, K, ta, dtype), _mat(K, N, tb, dtype))


def test_mm_odd_strides():
    a = rnd(12, 20)[::2, ::3]  # no unit stride: packed
    b = rnd(7, 5).expand(7, 5)
    check(A.mm.default, a, b)
    check(A.mm.default, rnd(1, 6).expand(4, 6), rnd(6, 3))  # stride-0 rows


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("self_shape", [(5,), (1, 5), (4, 5), (), (4, 1)])
@pytest.mark.parametrize("beta,alpha", [(1, 1), (0.5, 2.0), (0, 1)])
def test_addmm(self_shape, beta, alpha, dtype):
    s = rnd(*self_shape, dtype=dtype)
    if beta == 0:
        s = s.fill_(float("nan"))  # beta = 0 ignores self, NaNs included
    check(A.addmm.default, s, rnd(4, 3, dtype=dtype), rnd(5, 3, dtype=dtype).t(), beta=beta, alpha=alpha)


def test_addmm_k0_and_inplace():
    check(A.addmm.default, rnd(3), rnd(2, 0), rnd(0, 3), beta=2.0)
    s = rnd(4, 5)
    a, b = rnd(4, 3), rnd(3, 5)
    want = torch.addmm(s, a, b, beta=0.5, alpha=3.0)
    st, outs = run_kernel(A.addmm_.default, s, a, b, beta=0.5, alpha=3.0)
    assert st == 0
    _close(s, want, torch.float32)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "B,M,K,N,ta,tb",
    [
        (3, 4, 5, 6, False, False),
        (8, 16, 32, 16, True, False),
        (2, 3, 4, 5, False, True),
        (0, 3, 4, 5, False, False),
        (4, 64, 64, 64, True, True),
        (2, 130, 70, 90, False, False),
    ],
)
def test_bmm(B, M, K, N, ta, tb, dtype):
    a = rnd(B, K, M, dtype=dtype).transpose(1, 2) if ta else rnd(B, M, K, dtype=dtype)
    b = rnd(B, N, K, dtype=dtype).transpose(1, 2) if tb else rnd(B, K, N, dtype=dtype)
    check(A.bmm.default, a, b)


def test_bmm_batch_noncontig():
    a = rnd(4, 5, 6).permute(1, 0, 2)  # (5, 4, 6), batch stride 6
    b = rnd(5, 6, 3)
    check(A.bmm.default, a, b)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("self_shape", [(3, 4, 5), (4, 5), (5,), (1, 4, 1)])
def test_baddbmm(self_shape, dtype):
    check(
        A.baddbmm.default,
        rnd(*self_shape, dtype=dtype),
        rnd(3, 4, 6, dtype=dtype),
        rnd(3, 6, 5, dtype=dtype),
        beta=0.5,
        alpha=1.5,
    )


@pytest.mark.parametrize("dtype", DTYPES)
def test_mv_addmv_dot(dtype):
    check(A.mv.default, rnd(5, 7, dtype=dtype), rnd(7, dtype=dtype))
    check(A.mv.default, rnd(7, 5, dtype=dtype).t(), rnd(14, dtype=dtype)[::2])
    check(A.addmv.default, rnd(5, dtype=dtype), rnd(5, 7, dtype=dtype), rnd(7, dtype=dtype), beta=2, alpha=0.5)
    check(A.addmv.default, rnd(1, dtype=dtype), rnd(5, 7, dtype=dtype), rnd(7, dtype=dtype))
    check(A.dot.default, rnd(100, dtype=dtype), rnd(200, dtype=dtype)[::2])
    check(A.dot.default, rnd(0, dtype=dtype), rnd(0, dtype=dtype))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_mm_half(dtype):
    check(A.mm.default, rnd(16, 32).to(dtype), rnd(32, 8).to(dtype), scale=8.0)
    check(A.bmm.default, rnd(2, 16, 32).to(dtype), rnd(2, 32, 8).to(dtype), scale=8.0)


# ---------------------------------------------------------------------------
# convolution
# ---------------------------------------------------------------------------

CONV_CASES = [
    # (N, C, H, W, O, kh, kw, stride, padding, dilation, groups)
    (2, 3, 9, 9, 4, 3, 3, [1, 1], [1, 1], [1, 1], 1),
    (2, 4, 8, 10, 6, 1, 1, [1, 1], [0, 0], [1, 1], 1),  # 1x1: plain GEMM
    (3, 8, 7, 7, 4, 1, 1, [2, 2], [0, 0], [1, 1], 1),  # 1x1 stride 2
    (2, 4, 11, 9, 6, 3, 2, [2, 1], [1, 0], [2, 1], 2),  # groups, dilation, mixed
    (1, 6, 12, 12, 6, 3, 3, [1, 1], [2, 2], [2, 2], 6),  # depthwise
    (2, 3, 23, 23, 8, 7, 7, [2, 2], [3, 3], [1, 1], 1),  # stem-like
    (0, 3, 5, 5, 4, 3, 3, [1, 1], [1, 1], [1, 1], 1),  # empty batch
    (2, 2, 4, 4, 3, 5, 5, [1, 1], [2, 2], [1, 1], 1),  # kernel bigger than input
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CONV_CASES)
@pytest.mark.parametrize("bias", [True, False])
def test_conv2d(case, bias, dtype):
    N, C, H, W, O, kh, kw, s, p, d, g = case
    x, w = rnd(N, C, H, W, dtype=dtype), rnd(O, C // g, kh, kw, dtype=dtype)
    b = rnd(O, dtype=dtype) if bias else None
    check(A.convolution.default, x, w, b, s, p, d, False, [0, 0], g)
    y = A.convolution.default(x, w, b, s, p, d, False, [0, 0], g)
    go = rnd(*y.shape, dtype=dtype)
    check(
        A.convolution_backward.default, go, x, w, [O] if bias else None, s, p, d, False, [0, 0], g, [True, True, bias]
    )


# the NHWC route takes groups of at least 8 channels (the others: the NCHW route, also checked here)
CONV_CASES_NHWC = CONV_CASES + [
    (2, 16, 9, 9, 16, 3, 3, [1, 1], [1, 1], [1, 1], 2),  # groups of 8
    (2, 8, 11, 9, 6, 3, 2, [2, 1], [1, 0], [2, 1], 1),  # stride, padding, dilation mixed
    (3, 8, 7, 7, 12, 1, 1, [2, 2], [0, 0], [1, 1], 1),  # strided 1x1
    (1, 16, 5, 5, 8, 3, 3, [1, 1], [0, 0], [1, 1], 1),  # some pixels in no patch's centre
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CONV_CASES_NHWC)
def test_conv2d_backward_channels_last(case, dtype):
    """The NHWC backward (input gradient scattered back into NHWC, weight gradient from NHWC patches, into the
    weight gradient's own strides) against torch's CPU kernels, for every geometry and output mask; an NCHW
    grad_output and a channels-last weight read as they are."""
    N, C, H, W, O, kh, kw, s, p, d, g = case
    cl = torch.channels_last
    x, w = rnd(N, C, H, W, dtype=dtype).contiguous(memory_format=cl), rnd(O, C // g, kh, kw, dtype=dtype)
    y = A.convolution.default(x, w, None, s, p, d, False, [0, 0], g)
    for go in (rnd(*y.shape, dtype=dtype).contiguous(memory_format=cl), rnd(*y.shape, dtype=dtype)):
        for mask in ([True, True, True], [True, False, False], [False, True, True], [True, True, False]):
            for wt in (w, w.contiguous(memory_format=cl)):
                got = check(A.convolution_backward.default, go, x, wt, [O], s, p, d, False, [0, 0], g, mask)
                if mask[0] and N:
                    assert got[0].is_contiguous(memory_format=cl)


@pytest.mark.parametrize("dtype", DTYPES)
def test_conv_masks_and_layouts(dtype):
    x, w = rnd(2, 4, 6, 6, dtype=dtype), rnd(5, 4, 3, 3, dtype=dtype)
    go = rnd(2, 5, 6, 6, dtype=dtype)
    for mask in ([True, False, False], [False, True, False], [False, False, True], [False, True, True]):
        check(A.convolution_backward.default, go, x, w, [5], [1, 1], [1, 1], [1, 1], False, [0, 0], 1, mask)
    # channels-last input and weight; a non-contiguous view
    xc, wc = x.to(memory_format=torch.channels_last), w.to(memory_format=torch.channels_last)
    check(A.convolution.default, xc, wc, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    check(
        A.convolution_backward.default,
        go.to(memory_format=torch.channels_last),
        xc,
        wc,
        [5],
        [1, 1],
        [1, 1],
        [1, 1],
        False,
        [0, 0],
        1,
        [True, True, True],
    )
    xv = rnd(2, 8, 6, 6, dtype=dtype)[:, ::2]
    check(A.convolution.default, xv, w, None, [1], [1], [1], False, [0], 1)  # one-element lists


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("s,p,d,g", [(1, 0, 1, 1), (2, 1, 1, 1), (1, 2, 2, 2), (3, 0, 1, 4)])
def test_conv1d(s, p, d, g, dtype):
    x, w, b = rnd(3, 8, 20, dtype=dtype), rnd(4, 8 // g, 3, dtype=dtype), rnd(4, dtype=dtype)
    check(A.convolution.default, x, w, b, [s], [p], [d], False, [0], g)
    y = A.convolution.default(x, w, b, [s], [p], [d], False, [0], g)
    check(
        A.convolution_backward.default,
        rnd(*y.shape, dtype=dtype),
        x,
        w,
        [4],
        [s],
        [p],
        [d],
        False,
        [0],
        g,
        [True, True, True],
    )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("s,p,op,d,g", [(1, 0, 0, 1, 1), (2, 1, 1, 1, 1), (2, 1, 0, 2, 2), (3, 2, 2, 1, 1)])
def test_conv_transposed(s, p, op, d, g, dtype):
    x, w, b = rnd(2, 4, 5, 6, dtype=dtype), rnd(4, 6 // g, 3, 3, dtype=dtype), rnd(6, dtype=dtype)
    args = ([s, s], [p, p], [d, d], True, [op, op], g)
    check(A.convolution.default, x, w, b, *args)
    y = A.convolution.default(x, w, b, *args)
    check(A.convolution_backward.default, rnd(*y.shape, dtype=dtype), x, w, [6], *args, [True, True, True])


def test_conv_declines_3d():
    x, w = rnd(1, 2, 3, 3, 3), rnd(2, 2, 1, 1, 1)
    st, _ = run_kernel(A.convolution.default, x, w, None, [1, 1, 1], [0, 0, 0], [1, 1, 1], False, [0, 0, 0], 1)
    assert st == 3


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_conv_half(dtype):
    x, w = rnd(2, 4, 6, 6).to(dtype), rnd(5, 4, 3, 3).to(dtype)
    check(A.convolution.default, x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1, scale=16.0)


# ---------------------------------------------------------------------------
# batch norm
# ---------------------------------------------------------------------------

BN_SHAPES = [(4, 3, 5, 5), (2, 6), (3, 4, 7), (1, 2, 3, 3)]


def _bn_params(C, dtype, affine=True):
    w = rnd(C, dtype=dtype) if affine else None
    b = rnd(C, dtype=dtype) if affine else None
    return w, b, rnd(C, dtype=dtype) * 0.1, torch.rand(C, dtype=dtype) + 0.5


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", BN_SHAPES)
@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("affine", [True, False])
def test_native_batch_norm(shape, training, affine, dtype):
    x = rnd(*shape, dtype=dtype) * 2 + 1
    w, b, rm, rv = _bn_params(shape[1], dtype, affine)
    skip = () if training else (1, 2)  # eval: CPU returns empty saves
    check(A.native_batch_norm.default, x, w, b, rm, rv, training, 0.1, 1e-5, mutated=(3, 4), skip_outputs=skip)
    out, sm, si = A.native_batch_norm.default(x, w, b, rm.clone(), rv.clone(), training, 0.1, 1e-5)
    go = rnd(*shape, dtype=dtype)
    if not training:
        sm, si = None, None
    check(A.native_batch_norm_backward.default, go, x, w, rm, rv, sm, si, training, 1e-5, [True, affine, affine])


@pytest.mark.parametrize("dtype", DTYPES)
def test_batch_norm_entry_points(dtype):
    shape = (3, 4, 5, 6)
    x = rnd(*shape, dtype=dtype)
    w, b, rm, rv = _bn_params(4, dtype)
    check(A._native_batch_norm_legit.default, x, w, b, rm, rv, True, 0.2, 1e-3, mutated=(3, 4))
    check(A._native_batch_norm_legit.default, x, w, b, rm, rv, False, 0.2, 1e-3, skip_outputs=(1, 2))
    check(A._native_batch_norm_legit.no_stats, x, w, b, True, 0.2, 1e-3)
    check(A._native_batch_norm_legit_no_training.default, x, w, b, rm, rv, 0.2, 1e-3, skip_outputs=(1, 2))
    check(A._batch_norm_with_update.default, x, w, b, rm, rv, 0.2, 1e-3, mutated=(3, 4), skip_outputs=(3,))
    check(A._batch_norm_no_update.default, x, w, b, rm, rv, 0.2, 1e-3, skip_outputs=(1, 2, 3))
    out, sm, si, res = A._batch_norm_with_update.default(x, w, b, rm.clone(), rv.clone(), 0.2, 1e-3)
    go = rnd(*shape, dtype=dtype)
    check(A.batch_norm_backward.default, go, x, w, rm, rv, sm, si, True, 1e-3, [True, True, True], res)
    check(A.batch_norm_backward.default, go, x, w, rm, rv, None, None, False, 1e-3, [True, True, False], res)


def test_batch_norm_layouts_and_big():
    x = (rnd(4, 8, 9, 9) * 3 + 5).to(memory_format=torch.channels_last)
    w, b, rm, rv = _bn_params(8, torch.float32)
    outs = check(A.native_batch_norm.default, x, w, b, rm, rv, True, 0.1, 1e-5, mutated=(3, 4))
    assert outs[0].stride() == x.stride()
    # large mean offset: statistics must not lose precision
    x = rnd(8, 2, 64, 64) + 1000.0
    check(A.native_batch_norm.default, x, None, None, None, None, True, 0.1, 1e-5, scale=4.0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("affine", [True, False])
def test_batch_norm_channels_last_in_place(training, affine, dtype):
    """Channels-last inputs and gradients are read where they are (rows of C channels, no packing copy): every
    output, the running statistics and every gradient against torch's CPU kernels, in torch's strides; a
    gradient of another layout than the input, and a (N, 1, H, W) input that is both layouts, take the
    NCHW route."""
    cl = torch.channels_last
    for shape in ((4, 8, 5, 3), (2, 16, 7, 7), (3, 1, 4, 4), (2, 5, 1, 1)):
        x = (rnd(*shape, dtype=dtype) * 2 + 1).contiguous(memory_format=cl)
        w, b, rm, rv = _bn_params(shape[1], dtype, affine)
        skip = () if training else (1, 2)
        outs = check(
            A.native_batch_norm.default, x, w, b, rm, rv, training, 0.1, 1e-5, mutated=(3, 4), skip_outputs=skip
        )
        assert (
            outs[0].stride()
            == A.native_batch_norm.default(x, w, b, rm.clone(), rv.clone(), training, 0.1, 1e-5)[0].stride()
        )
        out, sm, si = A.native_batch_norm.default(x, w, b, rm.clone(), rv.clone(), training, 0.1, 1e-5)
        if not training:
            sm, si = None, None
        for go in (rnd(*shape, dtype=dtype).contiguous(memory_format=cl), rnd(*shape, dtype=dtype)):
            for mask in ([True, affine, affine], [False, affine, affine], [True, False, False]):
                check(A.native_batch_norm_backward.default, go, x, w, rm, rv, sm, si, training, 1e-5, mask)
    # a large mean: the statistics (double accumulators across rows) keep their precision. Judged against
    # float64, not torch's CPU kernel: its channels-last statistics lose more here (float32 up to 8e-4 off
    # float64 where the kernel is 1e-4, as its NCHW statistics are)
    x = (rnd(8, 4, 32, 32, dtype=dtype) + 1000.0).contiguous(memory_format=cl)
    st, got = run_kernel(A.native_batch_norm.default, x, None, None, None, None, True, 0.1, 1e-5)
    assert st == 0
    truth = A.native_batch_norm.default(x.double(), None, None, None, None, True, 0.1, 1e-5)
    native_nchw = A.native_batch_norm.default(x.contiguous(), None, None, None, None, True, 0.1, 1e-5)
    for g, t, n in zip(got, truth, native_nchw, strict=True):
        err, native_err = (g.double() - t).abs().max().item(), (n.double() - t).abs().max().item()
        assert err <= 2 * native_err + 4 * torch.finfo(dtype).eps * t.abs().max().item(), (err, native_err)
    assert got[0].stride() == x.stride()


# ---------------------------------------------------------------------------
# layer norm / group norm
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "shape,nshape", [((4, 7), (7,)), ((2, 3, 16), (16,)), ((2, 3, 4, 5), (4, 5)), ((0, 8), (8,)), ((16, 512), (512,))]
)
@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm(shape, nshape, affine, dtype):
    x = rnd(*shape, dtype=dtype) * 2 + 3
    w = rnd(*nshape, dtype=dtype) if affine else None
    b = rnd(*nshape, dtype=dtype) if affine else None
    out, mean, rstd = check(A.native_layer_norm.default, x, list(nshape), w, b, 1e-5)
    mean, rstd = A.native_layer_norm.default(x, list(nshape), w, b, 1e-5)[1:]
    go = rnd(*shape, dtype=dtype)
    scale = max(1.0, shape[0] * 2.0)
    check(
        A.native_layer_norm_backward.default, go, x, list(nshape), mean, rstd, w, b, [True, affine, affine], scale=scale
    )


def test_layer_norm_noncontig_and_masks():
    x = rnd(6, 10, 8).transpose(0, 1)  # (10, 6, 8) non-contiguous
    w, b = rnd(8), rnd(8)
    check(A.native_layer_norm.default, x, [8], w, b, 1e-5)
    mean, rstd = A.native_layer_norm.default(x, [8], w, b, 1e-5)[1:]
    go = rnd(10, 6, 8)
    for mask in ([True, False, False], [False, True, True], [False, False, True]):
        check(A.native_layer_norm_backward.default, go, x, [8], mean, rstd, w, b, mask)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_layer_norm_half(dtype):
    x, w, b = rnd(4, 32).to(dtype), rnd(32).to(dtype), rnd(32).to(dtype)
    check(A.native_layer_norm.default, x, [32], w, b, 1e-5, scale=4.0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("N,C,HW,G", [(2, 6, 5, 3), (3, 4, 1, 4), (1, 8, 16, 1)])
@pytest.mark.parametrize("affine", [True, False])
def test_group_norm(N, C, HW, G, affine, dtype):
    x = rnd(N, C, HW, dtype=dtype) + 1
    w = rnd(C, dtype=dtype) if affine else None
    b = rnd(C, dtype=dtype) if affine else None
    check(A.native_group_norm.default, x, w, b, N, C, HW, G, 1e-5)
    _, mean, rstd = A.native_group_norm.default(x, w, b, N, C, HW, G, 1e-5)
    check(
        A.native_group_norm_backward.default,
        rnd(N, C, HW, dtype=dtype),
        x,
        mean,
        rstd,
        w,
        N,
        C,
        HW,
        G,
        [True, affine, affine],
        scale=4.0,
    )


# ---------------------------------------------------------------------------
# pooling
# ---------------------------------------------------------------------------

MAXPOOL_CASES = [
    # (shape, kernel, stride, padding, dilation, ceil)
    ((2, 3, 8, 8), [2], [], [0], [1], False),
    ((2, 3, 9, 11), [3, 3], [2, 2], [1, 1], [1, 1], False),
    ((1, 2, 10, 10), [3, 2], [2, 3], [1, 0], [2, 1], True),
    ((3, 7, 7), [3, 3], [2, 2], [1, 1], [1, 1], True),
    ((0, 2, 6, 6), [2, 2], [2, 2], [0, 0], [1, 1], False),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,k,s,p,d,ceil", MAXPOOL_CASES)
def test_max_pool2d(shape, k, s, p, d, ceil, dtype):
    x = rnd(*shape, dtype=dtype)
    out, ind = check(A.max_pool2d_with_indices.default, x, k, s, p, d, ceil)
    go = rnd(*out.shape, dtype=dtype)
    check(A.max_pool2d_with_indices_backward.default, go, x, k, s, p, d, ceil, ind)


def test_max_pool2d_nan_and_layout():
    x = rnd(2, 3, 6, 6)
    x[0, 0, 1, 1] = float("nan")
    out, ind = check(A.max_pool2d_with_indices.default, x, [3, 3], [2, 2], [1, 1], [1, 1], False)
    xc = rnd(2, 4, 8, 8).to(memory_format=torch.channels_last)
    out, ind = check(A.max_pool2d_with_indices.default, xc, [2, 2], [2, 2], [0, 0], [1, 1], False)
    check(
        A.max_pool2d_with_indices_backward.default,
        rnd(*out.shape).to(memory_format=torch.channels_last),
        xc,
        [2, 2],
        [2, 2],
        [0, 0],
        [1, 1],
        False,
        ind,
    )


AVG_CASES = [
    # (shape, kernel, stride, padding, ceil, count_include_pad, divisor)
    ((2, 3, 8, 8), [2], [], [0], False, True, None),
    ((2, 3, 9, 11), [3, 3], [2, 2], [1, 1], True, True, None),
    ((2, 3, 9, 11), [3, 3], [2, 2], [1, 1], True, False, None),
    ((1, 2, 7, 10), [3, 2], [1, 2], [1, 1], False, True, 5),
    ((3, 7, 7), [2, 2], [2, 2], [1, 1], True, False, None),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,k,s,p,ceil,cip,div", AVG_CASES)
def test_avg_pool2d(shape, k, s, p, ceil, cip, div, dtype):
    x = rnd(*shape, dtype=dtype)
    out = check(A.avg_pool2d.default, x, k, s, p, ceil, cip, div)[0]
    go = rnd(*out.shape, dtype=dtype)
    check(A.avg_pool2d_backward.default, go, x, k, s, p, ceil, cip, div)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "shape,osize", [((2, 3, 7, 7), [1, 1]), ((2, 3, 10, 9), [3, 4]), ((3, 5, 5), [7, 2]), ((1, 2, 8, 8), [8, 8])]
)
def test_adaptive_avg_pool2d(shape, osize, dtype):
    x = rnd(*shape, dtype=dtype)
    out = check(A._adaptive_avg_pool2d.default, x, osize)[0]
    check(A._adaptive_avg_pool2d_backward.default, rnd(*out.shape, dtype=dtype), x)
    xc = x.to(memory_format=torch.channels_last) if x.dim() == 4 else x
    check(A._adaptive_avg_pool2d.default, xc, osize)


def test_declines_unsupported_dtypes():
    st, _ = run_kernel(
        A.native_batch_norm.default, rnd(2, 3).to(torch.bfloat16), None, None, None, None, True, 0.1, 1e-5
    )
    assert st == 3
    st, _ = run_kernel(A.mm.default, torch.ones(2, 2, dtype=torch.int64), torch.ones(2, 2, dtype=torch.int64))
    assert st == 3
