"""Host-plugin sorting, scan and indexing/scatter kernels (k_sort.c, k_scatter.c, k_index.c, k_search.c,
k_layout.c, k_gather.c; shared helpers in k_index.h) against torch CPU.

Calls go through harness.bind/to_specs/call rather than test_elementwise_kernels.fl_call: outputs are
laid out like torch's results and an in-place op writes its self; string arguments (reduce=, side=) pass
as their codes and a Tensor?[] list's None entries as undefined descriptors."""

from __future__ import annotations

import harness
import pytest
import torch
from test_elementwise_kernels import make

from torch_fl.runtime import STRING_CODES

aten = torch.ops.aten
nan = float("nan")

# the string codes k_index.c reads: the runtime's own table, so the two cannot drift apart
CODES = STRING_CODES
DT_ALL = [
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
]
DT_NUM = [d for d in DT_ALL if d != torch.bool]


def run(op, *args, out_like=None, **kwargs):
    """Runs the kernel of `op` on CPU tensors; returns (status, outputs). Outputs
    are laid out like torch's results; an in-place op writes its self."""
    schema = op._schema
    vals = harness.bind(op, args, kwargs, required=False)
    if out_like is None:
        out_like = op(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args], **kwargs)
    likes = list(out_like) if isinstance(out_like, (tuple, list)) else [out_like]
    outputs = []
    for k, r in enumerate(schema.returns):
        if r.alias_info is not None and r.alias_info.is_write:
            outputs.append(vals[0])
        else:
            o = likes[k]
            outputs.append(
                torch.empty_strided(o.shape, o.stride(), dtype=o.dtype).fill_(7) if o.numel() else torch.empty_like(o)
            )
    inputs, specs = harness.to_specs(vals, CODES)
    st = harness.call(harness.entry_name(op), inputs, outputs, specs)
    return st, outputs


def check(op, *args, atol=None, values_only=False, **kwargs):
    expected = op(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args], **kwargs)
    st, got = run(op, *args, out_like=expected, **kwargs)
    assert st == 0, "kernel declined"
    exp = list(expected) if isinstance(expected, (tuple, list)) else [expected]
    if values_only:
        exp, got = exp[:1], got[:1]
    for g, e in zip(got, exp, strict=False):
        tol = {}
        if e.dtype in (torch.float16, torch.bfloat16):
            tol = dict(rtol=1e-2, atol=1e-2)
        elif atol is not None and e.is_floating_point():
            tol = dict(rtol=1e-6, atol=atol)
        elif e.is_floating_point():
            tol = dict(rtol=1e-6, atol=1e-6)
        else:
            tol = dict(rtol=0, atol=0)
        torch.testing.assert_close(g, e, equal_nan=True, **tol)
    return got


def fails(match, op, *args, out_like, **kwargs):
    with pytest.raises(RuntimeError, match=match):
        run(op, *args, out_like=out_like, **kwargs)


def distinct(shape, dt, layout="contig"):
    """Values without ties (sorting outputs then have one right index)."""
    n = 1
    for s in shape:
        n *= s
    vals = torch.randperm(n, generator=torch.Generator().manual_seed(n)).reshape(shape)
    if dt == torch.bool:
        return vals % 2 == 0
    vals = (vals % 250).to(dt) if dt in (torch.uint8, torch.int8) and n > 120 else vals.to(dt)
    if layout == "transposed" and len(shape) >= 2:
        return vals.transpose(-1, -2).contiguous().transpose(-1, -2)
    return vals


# ------------------------------------------------------------------ sorting
@pytest.mark.parametrize("dt", DT_ALL)
@pytest.mark.parametrize("layout", ["contig", "transposed", "sliced"])
def test_sort(dt, layout):
    x = make((6, 9), dt, layout, lo=-4, hi=4)  # many ties: stable order decides the indices
    for dim in (0, 1, -1):
        for desc in (False, True):
            check(aten.sort.default, x, dim, desc)
            check(aten.sort.stable, x, stable=True, dim=dim, descending=desc)
    check(aten.sort.default, make((), dt))
    check(aten.sort.default, torch.empty(0, 3, dtype=dt), 0)


def test_sort_nan_zero_and_big_ints():
    x = torch.tensor([2.0, nan, 1.0, -0.0, 0.0, nan, -float("inf"), float("inf")])
    for desc in (False, True):
        check(aten.sort.default, x, 0, desc)
    big = torch.tensor([2**62 + 1, 2**62, -(2**62), 2**62 + 3, 5])  # beyond double precision
    check(aten.sort.default, big, 0, True)
    check(aten.sort.default, torch.randn(5000), 0)  # merge path


@pytest.mark.parametrize("dt", DT_NUM)
def test_topk_kthvalue_median_mode(dt):
    x = distinct((5, 7, 4), dt, "transposed")
    for dim in (0, 1, -1):
        n = x.shape[dim]
        for k in (1, n // 2 + 1, n):
            check(aten.topk.default, x, k, dim, True, True)
            check(aten.topk.default, x, k, dim, False, True)
            check(aten.kthvalue.default, x, k, dim, False)
        check(aten.kthvalue.default, x, 1, dim, True)
        for keep in (False, True):
            check(aten.median.dim, x, dim, keep)
            check(aten.nanmedian.dim, x, dim, keep)
            check(aten.mode.default, x, dim, keep)
    check(aten.median.default, x)
    check(aten.nanmedian.default, x)
    check(aten.topk.default, x, 0, 1)


def test_selection_ties_nan_and_empty():
    t = torch.tensor([2.0, 1, 2, 2, 3])
    check(aten.kthvalue.default, t, 3)  # CPU's quickselect picks index 0 among the ties
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        r = torch.randint(0, 4, (9,), generator=gen).float()
        for k in range(1, 10):
            check(aten.kthvalue.default, r, k)
        check(aten.mode.default, r)  # smallest most-frequent value, at its last index
    y = torch.tensor([[1.0, nan, 2.0, nan], [nan, 5.0, nan, nan], [3.0, 1.0, nan, 2.0]])
    check(aten.median.dim, y, 1)  # NaN at the first NaN's index
    check(aten.nanmedian.dim, y, 1)
    # all NaN: index 0 (for n > 3, CPU's index is whatever its nth_element leaves; not compared)
    check(aten.nanmedian.dim, torch.tensor([[nan, nan], [nan, 1.0]]), 1)
    check(aten.median.default, y)
    check(aten.nanmedian.default, y)
    check(aten.topk.default, torch.tensor([2.0, nan, 1.0]), 2)
    check(aten.median.default, torch.empty(0))
    check(aten.mode.default, torch.tensor([True, False, True]))


def test_sorting_errors():
    x = torch.randn(3, 4)
    fails("selected index k out of range", aten.topk.default, x, 5, 1, out_like=(x, x.long()))
    fails("kthvalue.*out of range", aten.kthvalue.default, x, 0, 1, out_like=(x[:, 0], x[:, 0].long()))
    fails("non-zero size", aten.median.dim, torch.empty(3, 0), 1, out_like=(x[:, 0], x[:, 0].long()))
    fails("dimension out of range", aten.sort.default, x, 2, out_like=(x, x.long()))


# ------------------------------------------------------------------ scans
@pytest.mark.parametrize("dt", DT_ALL)
def test_scans(dt):
    x = make((5, 6), dt, "transposed", lo=-2, hi=2)
    for dim in (0, 1):
        check(aten.cummax.default, x, dim)
        check(aten.cummin.default, x, dim)
        if dt != torch.bool:
            check(aten.cumprod.default, x if not dt.is_floating_point else x / 2, dim)
        if dt.is_floating_point:
            check(aten.logcumsumexp.default, x, dim, atol=1e-5)
    check(aten.cumprod.default, x, 0, dtype=torch.float64)
    check(aten.cumprod_.default, make((4, 3), torch.float32).clone(), 1)
    check(aten.cummax.default, make((), dt), 0)
    check(aten.cummax.default, torch.empty(0, 2, dtype=dt), 0)


def test_scan_nan_rules():
    x = torch.tensor([1.0, 3, 3, nan, 2, nan, 5])
    check(aten.cummax.default, x, 0)  # ties: last index; NaN sticks, each NaN takes the index
    check(aten.cummin.default, x, 0)
    check(aten.logcumsumexp.default, torch.tensor([-float("inf"), -float("inf"), 0.0, float("inf"), 1.0]), 0)
    check(aten.cumprod.default, torch.tensor([3, 5, 7] * 30), 0)  # int64 overflow wraps like CPU


# ------------------------------------------------------------------ scatter
@pytest.mark.parametrize("dt", DT_NUM + [torch.bool])
def test_scatter(dt):
    x = make((4, 5), dt, "transposed", lo=1, hi=4)
    src = make((3, 5), dt, "contig", lo=1, hi=4)
    idx = torch.tensor([[0, 1, 2, 3, 0], [1, 2, 3, 0, 1], [3, 3, 1, 2, 2]])  # rows: a permutation each
    check(aten.scatter.src, x, 1, idx[:, :4] % 4, src)  # dim 1: unique per row
    check(aten.scatter.value, x, 0, torch.tensor([[0, 1, 2, 3, 0]]), 2)
    check(aten.scatter_.src, x.clone(), 0, idx[:1], src)
    if dt == torch.bool:
        return
    for reduce in ("sum", "prod", "mean", "amax", "amin"):
        for include in (True, False):
            check(aten.scatter_reduce.two, x, 0, idx, src, reduce, include_self=include)
            check(aten.scatter_reduce_.two, x.clone(), 1, idx, src, reduce, include_self=include)


def test_scatter_nan_and_errors():
    x = torch.zeros(3)
    check(aten.scatter_reduce.two, x, 0, torch.tensor([0, 0, 1]), torch.tensor([1.0, nan, 2.0]), "amax")
    idx = torch.tensor([[0, 5]])
    fails(
        "index 5 is out of bounds for dimension 1 with size 4",
        aten.scatter.src,
        torch.zeros(2, 4),
        1,
        idx,
        torch.ones(1, 2),
        out_like=torch.zeros(2, 4),
    )
    fails(
        "index -1 is out of bounds",
        aten.scatter.value,
        torch.zeros(2, 4),
        1,
        torch.tensor([[-1]]),
        1.0,
        out_like=torch.zeros(2, 4),
    )
    fails(
        "no larger than",
        aten.scatter.src,
        torch.zeros(2, 2),
        0,
        torch.zeros(2, 3, dtype=torch.long),
        torch.ones(3, 3),
        out_like=torch.zeros(2, 2),
    )
    st, _ = run(
        aten.scatter_reduce.two, torch.zeros(3), 0, torch.tensor([0]), torch.ones(1), "bogus", out_like=torch.zeros(3)
    )
    assert st == 3  # a reduce string the runtime could not name: declined, not guessed


@pytest.mark.parametrize("dt", DT_ALL)
def test_index_add_copy_fill_reduce(dt):
    x = make((5, 4), dt, "transposed", lo=1, hi=4)
    src = make((3, 4), dt, lo=1, hi=4)
    idx = torch.tensor([4, 0, 4])
    check(aten.index_add.default, x, 0, idx, src)
    check(aten.index_copy.default, x, 0, torch.tensor([4, 0, 2]), src)
    check(aten.index_fill.int_Scalar, x, 1, torch.tensor([-1, 1]), 2)
    check(aten.index_fill.int_Tensor, x, 0, torch.tensor([3]), torch.tensor(1, dtype=dt))
    check(aten.index_add_.default, x.clone(), 1, torch.tensor([3, 3]), make((5, 2), dt, lo=1, hi=3))
    check(aten.index_copy_.default, x.clone(), 1, torch.tensor([1]), make((5, 1), dt))
    check(aten.index_fill_.int_Scalar, x.clone(), 0, torch.tensor([0]), 1)
    if dt != torch.bool:
        check(aten.index_add.default, x, 0, idx, src, alpha=2)
        for reduce in ("prod", "mean", "amax", "amin"):
            for include in (True, False):
                check(aten.index_reduce.default, x, 0, idx, src, reduce, include_self=include)
        check(aten.index_reduce_.default, x.clone(), 1, torch.tensor([0, 0]), make((5, 2), dt, lo=1, hi=3), "prod")


def test_index_dim_errors():
    x = torch.zeros(5, 3)
    fails(
        "index 5 is out of bounds for dimension 0 with size 5",
        aten.index_add.default,
        x,
        0,
        torch.tensor([5]),
        torch.ones(1, 3),
        out_like=x,
    )
    fails("index -1 is out of bounds", aten.index_copy.default, x, 0, torch.tensor([-1]), torch.ones(1, 3), out_like=x)
    fails("index -6 is out of bounds", aten.index_fill.int_Scalar, x, 0, torch.tensor([-6]), 1.0, out_like=x)
    fails("Number of indices", aten.index_add.default, x, 0, torch.tensor([0, 1]), torch.ones(1, 3), out_like=x)


# ------------------------------------------------------------------ advanced indexing
I = torch.tensor


@pytest.mark.parametrize("dt", [torch.float32, torch.float16, torch.int64, torch.uint8, torch.bool])
def test_index_tensor(dt):
    x = make((4, 5, 6), dt, "transposed")
    cases = [
        [I([3, 0, -1])],
        [I([[0, 1], [2, 3]]), I([4])],  # broadcast, adjacent: stays in place
        [None, I([0, 2, 4])],  # None first
        [I([1, 2]), None, I([0, 5])],  # separated: broadcast dims go first
        [None, None, I([[1], [2]], dtype=torch.int32)],
        [I([True, False, True, True])],  # a mask
        [None, (make((5, 6), torch.bool))],  # a 2-d mask after None
        [I([0, 1, 1]), I([2, 2, 3]), I([5, 0, 1])],
        [I([], dtype=torch.long)],
    ]
    for indices in cases:
        check(aten.index.Tensor, x, indices)
    check(aten.index.Tensor, make((7,), dt, "sliced"), [I([6, 0])])


def test_index_put():
    x = make((4, 5, 6), torch.float32, "transposed")
    for indices, vshape in (
        ([I([3, 0, 1])], (3, 5, 6)),
        ([I([3, 0, 3])], (6,)),
        ([None, I([0, 2]), I([1, 1])], (4, 2)),
        ([I([1, 2]), None, I([0, 5])], (2, 5)),
        ([make((4, 5), torch.bool)], (1,)),
    ):
        v = torch.randn(vshape)
        check(aten.index_put.default, x, indices, v, True)
        if indices[0] is None or indices[0].dtype == torch.bool or indices[0].unique().numel() == len(indices[0]):
            check(aten.index_put.default, x, indices, v, False)
        check(aten.index_put_.default, x.clone(), indices, v, True)
        check(aten._index_put_impl_.default, x.clone(), indices, v, True, False)
    y = torch.zeros(5, dtype=torch.int64)
    check(aten.index_put.default, y, [I([1, 1, 1, -1])], I([2**40, 1, 1, 3]), True)  # exact int64 accumulation


def test_unsafe_masked_index():
    x = make((4, 5), torch.float32)
    idx0, idx1 = I([[-2, 0, 3, 7]]), I([[1], [4]])
    mask = I([[True, False, True, True], [False, True, True, False]])
    check(aten._unsafe_masked_index.default, x, mask, [idx1, idx0.clamp(-5, 4)], 0.5)
    check(aten._unsafe_masked_index.default, x, mask[0], [None, I([0, 9, -3, -8])], -1.0)  # clamped to [-size, size)
    check(aten._unsafe_masked_index_put_accumulate.default, x, mask, [idx1, I([[-7, 0, 9, 2]])], torch.randn(2, 4))


def test_index_errors():
    x = torch.zeros(4, 5)
    fails(
        "index 5 is out of bounds for dimension 1 with size 5",
        aten.index.Tensor,
        x,
        [None, I([5])],
        out_like=torch.zeros(4, 1),
    )
    fails(
        "index -5 is out of bounds for dimension 0 with size 4",
        aten.index.Tensor,
        x,
        [I([-5])],
        out_like=torch.zeros(1, 5),
    )
    fails("mask .* does not match", aten.index.Tensor, x, [I([True, False])], out_like=torch.zeros(1, 5))
    fails("too many indices", aten.index.Tensor, x, [I([0]), I([0]), I([0])], out_like=torch.zeros(1))
    fails("shape mismatch: value tensor of shape", aten.index_put.default, x, [I([0, 1])], torch.ones(3, 5), out_like=x)
    fails("must be long, int, byte or bool", aten.index.Tensor, x, [torch.zeros(2)], out_like=torch.zeros(2, 5))


# ------------------------------------------------------------------ flat and masked
@pytest.mark.parametrize("dt", [torch.float32, torch.bfloat16, torch.int32, torch.bool])
def test_take_put_masked_scatter(dt):
    x = make((4, 5), dt, "transposed")
    idx = I([[0, -1, 7], [19, 3, 3]])
    check(aten.take.default, x, idx)
    src = make((2, 3), dt)
    check(aten.put.default, x, I([[0, -1, 7], [19, 3, 2]]), src, False)
    if dt != torch.bool:
        check(aten.put.default, x, idx, src, True)
        check(aten.put_.default, x.clone(), idx, src, True)
    mask = make((4, 5), torch.bool, "sliced")
    check(aten.masked_scatter.default, x, mask, make((30,), dt))
    check(aten.masked_scatter.default, x, mask[0], make((4, 6), dt, "transposed"))  # mask broadcast
    check(aten.masked_scatter_.default, x.clone(), mask, make((20,), dt))
    if dt.is_floating_point:
        check(aten.masked_scatter_backward.default, make((4, 5), dt), mask, [4, 5])
    check(aten.nonzero_static.default, x, size=7)
    check(aten.nonzero_static.default, x, size=30, fill_value=-3)
    check(aten.nonzero_static.default, make((), dt), size=2)


def test_flat_errors():
    x = torch.zeros(2, 3)
    fails(
        "out of range: tried to access index 6 on a tensor of 6 elements",
        aten.take.default,
        x,
        I([6]),
        out_like=torch.zeros(1),
    )
    fails("same number of elements", aten.put.default, x, I([0, 1]), torch.ones(3), out_like=x)
    fails("at least 6 elements", aten.masked_scatter.default, x, I([True, True, True]), torch.ones(2), out_like=x)


# ------------------------------------------------------------------ search
@pytest.mark.parametrize("dt", [torch.float32, torch.float64, torch.float16, torch.int64, torch.uint8])
def test_searchsorted_bucketize(dt):
    seq = torch.sort(make((3, 8), dt, lo=0, hi=20), dim=1).values
    vals = make((3, 5), dt, "transposed", lo=-2, hi=22)
    for right in (False, True):
        check(aten.searchsorted.Tensor, seq, vals, right=right)
        check(aten.searchsorted.Tensor, seq[0], vals, out_int32=True, right=right)
        check(aten.bucketize.Tensor, vals, seq[1], right=right)
    check(aten.searchsorted.Tensor, seq, vals, side="right")
    check(aten.searchsorted.Tensor, seq, vals, side="left")
    perm = torch.argsort(make((3, 8), dt, lo=0, hi=20), dim=1)
    unsorted = torch.gather(seq, 1, torch.argsort(perm, dim=1))
    check(aten.searchsorted.Tensor, unsorted, vals, sorter=perm)
    check(aten.searchsorted.Scalar, seq[0], 5)
    check(aten.bucketize.Scalar, 3, seq[0], right=True)
    if dt.is_floating_point:
        check(aten.searchsorted.Tensor, torch.tensor([1.0, 2, nan], dtype=dt), torch.tensor([nan, 1.5], dtype=dt))


def test_search_errors_and_side():
    seq = torch.tensor([[1.0, 2.0]])
    fails("first N-1 dimensions", aten.searchsorted.Tensor, seq, torch.zeros(2, 2), out_like=torch.zeros(2, 2).long())
    fails(
        "sorter index out of range",
        aten.searchsorted.Tensor,
        seq[0],
        torch.zeros(3),
        sorter=I([0, 2]),
        out_like=torch.zeros(3).long(),
    )
    fails(
        "can't be set to opposites",
        aten.searchsorted.Tensor,
        seq[0],
        torch.zeros(3),
        right=True,
        side="left",
        out_like=torch.zeros(3).long(),
    )


@pytest.mark.parametrize("dt", [torch.float32, torch.float16, torch.int64, torch.int8])
def test_isin(dt):
    el = make((5, 6), dt, "transposed", lo=-5, hi=5)
    te = make((7,), dt, lo=-5, hi=5)
    for invert in (False, True):
        check(aten.isin.Tensor_Tensor, el, te, invert=invert)
    check(aten.isin.Tensor_Scalar, el, 2)
    check(aten.isin.Scalar_Tensor, 3, te)
    check(aten.isin.Tensor_Tensor, el, torch.empty(0, dtype=dt))
    check(aten.isin.Tensor_Tensor, torch.tensor([nan, 1.0, 2.0]), torch.tensor([nan, 2.0]))
    check(aten.isin.Tensor_Tensor, torch.tensor([2**60 + 1, 2**60]), torch.tensor([2**60]))  # exact ints


@pytest.mark.parametrize("dt", [torch.float32, torch.float64, torch.bfloat16])
def test_histc(dt):
    x = make((50, 3), dt, "transposed", lo=-3, hi=3)
    check(aten.histc.default, x)
    check(aten.histc.default, x, 7, -1, 2)
    check(aten.histc.default, x, 1, -10, 10)
    check(aten.histc.default, torch.tensor([1.0, 1.0], dtype=dt), 4)  # equal data range: widened by 1
    check(aten.histc.default, torch.linspace(0, 10, 11, dtype=dt), 10, 0, 10)  # edges land in the right bins
    check(aten.histc.default, torch.empty(0, dtype=dt), 3)
    fails("max must be larger than min", aten.histc.default, x, 3, 2, 1, out_like=torch.zeros(3, dtype=dt))
    fails("bins must be > 0", aten.histc.default, x, 0, out_like=torch.zeros(0, dtype=dt))


# ------------------------------------------------------------------ layout
@pytest.mark.parametrize("dt", [torch.float32, torch.int16, torch.bool])
def test_roll_slice_as_strided_scatter(dt):
    x = make((4, 5, 3), dt, "transposed")
    check(aten.roll.default, x, [2], [])
    check(aten.roll.default, x, [-7, 1, 2], [0, 2, 0])
    check(aten.roll.default, torch.empty(0, 3, dtype=dt), [1], [1])
    check(aten.slice_scatter.default, x, make((4, 2, 3), dt), 1, 1, 5, 2)
    check(aten.slice_scatter.default, x, make((4, 5, 1), dt), -1, -1, None)
    check(aten.slice_scatter.default, x, make((0, 5, 3), dt), 0, 9, 12)
    y = make((4, 5), dt)
    check(aten.as_strided_scatter.default, y, make((2, 3), dt), [2, 3], [5, 2], 1)
    check(aten.as_strided_scatter.default, y, make((3, 2), dt), [3, 2], [1, 3])
    check(aten.as_strided_scatter.default, y.t(), make((2, 2), dt), [2, 2], [4, 1], 3)


def test_layout_errors():
    x = torch.zeros(4, 5)
    fails("expected src to have a size equal", aten.slice_scatter.default, x, torch.zeros(4, 2), 1, 0, 5, out_like=x)
    fails(
        "out of bounds for storage",
        aten.as_strided_scatter.default,
        x,
        torch.zeros(3, 3),
        [3, 3],
        [5, 5],
        0,
        out_like=x,
    )
    fails("shifts and dimensions must align", aten.roll.default, x, [1, 2], [0], out_like=x)


def test_repeat_interleave_with_size():
    r = I([2, 0, 3, 1])
    check(aten.repeat_interleave.Tensor, r, output_size=6)
    fails("does not match", aten.repeat_interleave.Tensor, r, output_size=5, out_like=torch.zeros(5).long())
    fails("negative", aten.repeat_interleave.Tensor, I([1, -1]), output_size=0, out_like=torch.zeros(0).long())


@pytest.mark.parametrize("reduce", ["sum", "mean", "prod", "max", "min"])
def test_segment_reduce(reduce):
    data = make((6, 3), torch.float32, "transposed")
    lengths = I([2, 0, 3, 1])
    check(aten.segment_reduce.default, data, reduce, lengths=lengths)
    check(aten.segment_reduce.default, data, reduce, lengths=lengths, initial=0.5)
    check(aten.segment_reduce.default, data, reduce, offsets=I([0, 2, 2, 5, 6]))
    check(aten.segment_reduce.default, data.t().contiguous(), reduce, lengths=I([[1, 5], [6, 0], [0, 6]]), axis=1)


def test_ties_match_cpu():
    """Unstable sort, topk, median and mode pick among equal values exactly as the CPU kernels do."""
    gen = torch.Generator().manual_seed(3)
    for n in (5, 17, 40, 130, 700):
        x = torch.randint(0, 6, (n,), generator=gen).to(torch.float16)
        check(aten.sort.default, x, 0, False)
        check(aten.sort.default, x, 0, True)
        check(aten.median.dim, x, 0)
        check(aten.mode.default, x, 0)
        for k in (1, 3, n // 2):
            check(aten.topk.default, x, k, 0, True, True)
            check(aten.topk.default, x, k, 0, False, False)
        x[torch.rand(n, generator=gen) < 0.2] = nan
        check(aten.sort.default, x, 0, True)
        check(aten.nanmedian.dim, x, 0)
        check(aten.topk.default, x, 2, 0)
