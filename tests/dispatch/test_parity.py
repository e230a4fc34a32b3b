"""PyTorch parity defects found by running PyTorch's own device tests and a hostile probe on fl (issue: "PyTorch
parity"), each pinned by a test that failed before its fix. Where PyTorch raises, fl raises the same exception type
(code and tests catch IndexError, TypeError, ValueError, RuntimeError by type)."""

import warnings

import pytest
import torch

import torch_fl as fl


@pytest.fixture(params=["cpu", "minimal"])
def backend(request):
    fl.set_backend(request.param)
    yield request.param
    fl.set_backend("cpu")


def test_flip_of_a_0_dim_tensor(backend):
    x = torch.tensor(3.5, device="fl")
    assert x.flip(0).item() == 3.5 and x.flip(-1).item() == 3.5
    with pytest.raises(IndexError):
        x.flip(1)


def test_cpu_index_tensors_and_masks_index_an_fl_tensor(backend):
    """CUDA moves host index tensors (and a 0-dim value) to the device itself; PyTorch's own tests rely on it."""
    base = torch.arange(12.0).reshape(3, 4)
    x = base.to("fl")
    idx, mask = torch.tensor([2, 0]), torch.tensor([True, False, True])
    assert torch.equal(x[idx].cpu(), base[idx])
    assert torch.equal(x[mask].cpu(), base[mask])
    assert torch.equal(x[:, torch.tensor([1, 3])].cpu(), base[:, torch.tensor([1, 3])])
    y, ref = x.clone(), base.clone()
    y[idx] = torch.tensor(-1.0)
    ref[idx] = -1.0
    y[mask, 1] = 7.0
    ref[mask, 1] = 7.0
    assert torch.equal(y.cpu(), ref)
    assert torch.equal(x.index_fill(1, torch.tensor([0, 2]), 5.0).cpu(), base.index_fill(1, torch.tensor([0, 2]), 5.0))
    with pytest.raises(RuntimeError, match="same device"):  # a non-scalar value must be on the device, as on CUDA
        x.index_put_((idx.to("fl"),), torch.zeros(2, 4))


def test_indexing_errors_are_index_errors(backend):
    x = torch.zeros(3, 4, device="fl")
    with pytest.raises(IndexError, match=r"The shape of the mask \[2\] at index 0 does not match"):
        torch.arange(10.0, device="fl")[torch.tensor([True, False], device="fl")]
    with pytest.raises(
        IndexError,
        match=r"shape mismatch: indexing tensors could not be broadcast together with "
        r"shapes \[2\], \[3\]",
    ):
        x[torch.tensor([0, 1], device="fl"), torch.tensor([0, 1, 2], device="fl")]
    with pytest.raises(IndexError, match="tensors used as indices must be long, int, byte or bool"):
        torch.ops.aten.index(x, [torch.tensor([0.0], device="fl")])
    with pytest.raises(IndexError, match="too many indices"):
        torch.ops.aten.index(x, [torch.tensor([0], device="fl")] * 3)
    i = torch.tensor([5], device="fl")
    for what, call in {
        "index": lambda: x[i],
        "index_put_": lambda: x.index_put_((i,), torch.tensor(1.0)),
        "index_select": lambda: x.index_select(0, i),
        "embedding": lambda: torch.nn.functional.embedding(i, x),
        "index_copy": lambda: x.index_copy(0, i, torch.zeros(1, 4, device="fl")),
        "index_fill": lambda: x.index_fill(0, i, 1.0),
        "take": lambda: x.take(torch.tensor([50], device="fl")),
    }.items():
        with pytest.raises(IndexError):
            call()
            pytest.fail(f"{what} accepted an index out of range")
    with pytest.raises(RuntimeError) as info:  # gather: RuntimeError on CPU, so not an IndexError here either
        x.gather(0, torch.tensor([[5]], device="fl"))
    assert not isinstance(info.value, IndexError)
    assert x.sum().item() == 0  # the process stays usable


def test_out_arguments_are_judged_as_pytorch_judges_them(backend):
    x = torch.randn(3, 3, device="fl")

    def empty(*shape, dtype=torch.float32):
        return torch.empty(*shape, dtype=dtype, device="fl")

    with pytest.raises(RuntimeError, match="on the same device"):
        torch.nonzero(x, out=torch.empty([], dtype=torch.long))  # a CPU out= tensor for an fl op
    with pytest.raises(RuntimeError, match="scalar type Long"):
        torch.nonzero(x, out=empty((), dtype=torch.float32))
    with pytest.raises(RuntimeError, match="Found dtype Double but expected Float"):
        torch.neg(x, out=empty(3, 3, dtype=torch.float64))  # neg writes only its input's dtype
    with pytest.raises(RuntimeError, match="Expected out tensor to have dtype float, but got double"):
        torch.mm(x, x, out=empty(3, 3, dtype=torch.float64))  # structured ops: exactly the result's dtype
    with pytest.raises(RuntimeError, match="can't be cast to the desired output type Long"):
        empty(3, dtype=torch.int64).add_(torch.ones(3, device="fl"))
    # where CPU casts, fl casts: sin and sum write a wider out= tensor
    wide = torch.sin(x, out=empty(3, 3, dtype=torch.float64))
    assert torch.allclose(wide.cpu(), torch.sin(x.cpu()).double())
    assert torch.allclose(torch.sum(x, 0, out=empty(3, dtype=torch.float64)).cpu(), x.cpu().double().sum(0))
    t = torch.tensor(1, device="fl")
    for call in (lambda: torch.addcdiv(t, t, t), lambda: torch.addcdiv(t, t, t, out=t), lambda: t.addcdiv_(t, t)):
        with pytest.raises(RuntimeError, match="^Integer division.+is no longer supported"):
            call()


def test_list_out_arguments_are_written_and_nothing_is_returned(backend):
    """split_copy(out=[...]) returned a value PyTorch refuses, and left the out= tensors unwritten."""
    x = torch.arange(6.0, device="fl")
    parts = [torch.empty(3, device="fl"), torch.empty(3, device="fl")]
    assert torch.split_copy(x, 3, out=parts) is None
    assert [p.cpu().tolist() for p in parts] == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]


def test_searchsorted_and_bucketize_place_nan_as_cpu_does(backend):
    nan = float("nan")
    values = torch.tensor([nan, 0.5, 1.0, 2.0, 2.5, 10.0, -1.0, 7.0])
    for boundaries in (
        torch.tensor([1.0, 2.0, 3.0]),
        torch.tensor([1.0, 2.0, nan]),
        torch.tensor([1.0, 2.0, nan, nan]),
        torch.tensor([1.0, 1.0, 2.0, 7.0]),
        torch.tensor([]),
    ):
        for dtype in (torch.float32, torch.float64):
            b, v = boundaries.to(dtype), values.to(dtype)
            for right in (False, True):
                assert torch.equal(
                    torch.bucketize(v.to("fl"), b.to("fl"), right=right).cpu(), torch.bucketize(v, b, right=right)
                ), (boundaries, dtype, right)
                assert torch.equal(
                    torch.searchsorted(b.to("fl"), v.to("fl"), right=right).cpu(), torch.searchsorted(b, v, right=right)
                ), (boundaries, dtype, right)


def test_factories_follow_the_default_dtype(backend):
    """The output layout cache keyed a factory's result on its arguments only: torch.arange(0., 3.) kept
    float32 after torch.set_default_dtype(torch.float64)."""
    assert torch.arange(0.0, 3.0, device="fl").dtype == torch.float32
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        assert torch.arange(0.0, 3.0, device="fl").dtype == torch.float64
        assert torch.linspace(0, 1, 3, device="fl").dtype == torch.float64
    finally:
        torch.set_default_dtype(before)


def test_result_shapes_match_the_cpu_kernels(backend):
    x = torch.randn(2, 3, 4)
    args = (torch.ones(3), torch.zeros(3), torch.zeros(3), torch.ones(3))
    for op in (torch.ops.aten.native_batch_norm, torch.ops.aten._native_batch_norm_legit):
        want = [o.shape for o in op(x, *args, False, 0.1, 1e-5)]
        got = [o.shape for o in op(x.to("fl"), *(a.to("fl") for a in args), False, 0.1, 1e-5)]
        assert got == want, op  # inference: empty saved statistics, not [C]
    loss = torch.nn.MultiLabelMarginLoss(reduction="none")
    x1, y1 = torch.randn(4), torch.tensor([3, 0, -1, 1])
    assert loss(x1.to("fl"), y1.to("fl")).shape == loss(x1, y1).shape == torch.Size([])


def test_index_copy_takes_a_0_dim_source_for_a_1_d_self(backend):
    for dtype in (torch.complex128, torch.float32, torch.int64):
        got = torch.zeros(3, dtype=dtype, device="fl").index_copy(
            0, torch.tensor(1, device="fl"), torch.tensor(2, dtype=dtype, device="fl")
        )
        assert torch.equal(
            got.cpu(), torch.zeros(3, dtype=dtype).index_copy(0, torch.tensor(1), torch.tensor(2, dtype=dtype))
        )


def test_lazy_modules_convert_dtype_before_their_first_call(backend):
    for module, x in (
        (torch.nn.LazyConv1d(4, 2), torch.randn(1, 3, 5)),
        (torch.nn.LazyLinear(4), torch.randn(2, 3)),
        (torch.nn.LazyBatchNorm1d(), torch.randn(4, 3)),
    ):
        m = module.to("fl").to(torch.float64)
        y = m(x.double().to("fl"))
        assert y.dtype == torch.float64 and m.weight.dtype == torch.float64 and m.weight.device.type == "fl"


def test_loss_and_embedding_arguments_are_checked_as_on_cpu(backend):
    """PyTorch's ModuleInfo error inputs: checks CPU's kernels make that fl's kernels and decompositions skipped
    or worded otherwise."""
    with pytest.raises(RuntimeError, match="Expected tensor for argument.*indices.*to have.*scalar type.*Long.*Int"):
        torch.nn.Embedding(10, 3).to("fl")(torch.tensor([1.5, 2.5], device="fl"))
    with pytest.raises(
        RuntimeError,
        match=r"target tensor should be 1-D with size equal to.*Expected target size "
        r"\[5\].*but got \[3\]",
    ):
        torch.nn.MultiMarginLoss()(torch.randn(5, 10, device="fl"), torch.tensor([0, 1, 2], device="fl"))
    empty = torch.tensor([], device="fl")
    with pytest.raises(RuntimeError, match="expected scalar type Float but found Half"):
        torch.nn.NLLLoss(weight=empty.half())(empty.reshape(0, 0), empty.long())


def test_fractional_max_pool_takes_more_random_samples_than_it_needs(backend):
    """An unbatched input with samples shaped (2, C, 3) (ModuleInfo's) uses the first row, as on CPU."""
    samples = torch.rand(2, 4, 3, dtype=torch.float64)
    x = torch.randn(4, 5, 5, 5, dtype=torch.float64)
    pool = torch.nn.FractionalMaxPool3d(2, output_ratio=0.5, _random_samples=samples)
    want = pool(x)
    pool_fl = torch.nn.FractionalMaxPool3d(2, output_ratio=0.5, _random_samples=samples.to("fl"))
    assert torch.equal(pool_fl(x.to("fl")).cpu(), want)


@pytest.mark.parametrize(
    "module",
    [
        "conv2d",
        "conv_transpose2d",
        "conv3d",
        "group_norm",
        "reflection_pad2d",
        "replication_pad2d",
        "reflection_pad3d",
        "replication_pad3d",
        "avg_pool2d",
        "lp_pool2d",
        "adaptive_avg_pool2d",
        "max_pool3d",
        "avg_pool3d",
    ],
)
def test_channels_last_modules_keep_the_format_cpu_gives(backend, module):
    """Conv2d, ConvTranspose2d and the reflection/replication pads gave contiguous outputs for channels-last
    inputs (PyTorch's meta functions pick contiguous for a PrivateUse1 convolution), and 2-D average / LP / adaptive
    pooling and 3-D max pooling did on minimal (decomposed into views and sums); CPU keeps channels-last."""
    import copy

    make = {
        "conv2d": lambda: torch.nn.Conv2d(4, 6, 3),
        "conv_transpose2d": lambda: torch.nn.ConvTranspose2d(4, 6, 3),
        "conv3d": lambda: torch.nn.Conv3d(4, 6, 3),
        "group_norm": lambda: torch.nn.GroupNorm(2, 4),
        "reflection_pad2d": lambda: torch.nn.ReflectionPad2d(1),
        "replication_pad2d": lambda: torch.nn.ReplicationPad2d(1),
        "reflection_pad3d": lambda: torch.nn.ReflectionPad3d(1),
        "replication_pad3d": lambda: torch.nn.ReplicationPad3d(1),
        "avg_pool2d": lambda: torch.nn.AvgPool2d(2),
        "lp_pool2d": lambda: torch.nn.LPPool2d(2, 3),
        "adaptive_avg_pool2d": lambda: torch.nn.AdaptiveAvgPool2d(3),
        "max_pool3d": lambda: torch.nn.MaxPool3d(2),
        "avg_pool3d": lambda: torch.nn.AvgPool3d(2),
    }[module]
    torch.manual_seed(0)
    m = make()
    five = module.endswith("3d")  # (CPU's 3-D average pooling gives a contiguous result: so must fl)
    fmt = torch.channels_last_3d if five else torch.channels_last
    x = (torch.randn(2, 4, 5, 6, 6) if five else torch.randn(2, 4, 8, 8)).contiguous(memory_format=fmt)
    xc = x.clone().requires_grad_()
    yc = m(xc)
    yc.backward(torch.ones_like(yc))
    mf = copy.deepcopy(m).to("fl")
    xf = x.to("fl").contiguous(memory_format=fmt).requires_grad_()
    yf = mf(xf)
    yf.backward(torch.ones_like(yf))
    assert yf.stride() == yc.stride() and xf.grad.stride() == xc.grad.stride(), module
    for p, q in zip(mf.parameters(), m.parameters(), strict=True):
        assert p.grad.stride() == q.grad.stride(), f"{module} weight gradient"
    torch.testing.assert_close(yf.cpu(), yc.detach(), rtol=1e-4, atol=1e-4)


def test_an_out_tensor_of_the_right_size_keeps_its_memory(backend):
    """On minimal (stack by decomposition) the out= tensor took the result's storage: its data_ptr changed."""
    a, b = torch.randn(3, device="fl"), torch.randn(3, device="fl")
    out = torch.empty(2, 3, device="fl")
    ptr = out.data_ptr()
    torch.stack([a, b], out=out)
    assert out.data_ptr() == ptr and torch.equal(out.cpu(), torch.stack([a.cpu(), b.cpu()]))
    wrong = torch.empty(0, device="fl")
    assert torch.equal(torch.stack([a, b], out=wrong).cpu(), out.cpu())  # an empty one is resized


@pytest.mark.parametrize("backend", ["cpu", "minimal"])
def test_histc_and_searchsorted_check_their_arguments_as_the_cpu(backend):
    """PyTorch's test_reductions: histc's bins and range checks (ATen's CPU kernel makes them; fl said
    "zeros: Dimension size must be non-negative" or nothing), and searchsorted's once-per-program warning
    about non-contiguous operands."""
    import warnings

    fl.initialize(backend)
    x = torch.tensor([1.0, 2.0, 3.0])
    for kw, msg in [
        (dict(bins=-1), "bins must be > 0"),
        (dict(bins=4, min=5, max=1), "max must be larger than min"),
        (dict(bins=4, min=0, max=float("nan")), r"range of \[0, nan\] is not finite"),
    ]:
        for dt in (torch.float32, torch.int64):
            with pytest.raises(RuntimeError, match=msg):
                torch.histc(x.to(dt), **kw)
            with pytest.raises(RuntimeError, match=msg):
                torch.histc(x.to(dt).to("fl"), **kw)
    assert torch.histc(x.to("fl"), bins=4, min=0, max=4).cpu().tolist() == torch.histc(x, 4, 0, 4).tolist()
    v = torch.tensor([[[1, 3, 5], [2, 4, 6]], [[1, 2, 3], [4, 5, 6]]])
    b, q = v.permute(2, 1, 0).double(), v.permute(2, 1, 0).int()
    torch.set_warn_always(True)
    try:
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            got = torch.searchsorted(b.to("fl"), q.to("fl"))
    finally:
        torch.set_warn_always(False)
    assert any("input value tensor is non-contiguous" in str(m.message) for m in w)
    assert any("boundary tensor is non-contiguous" in str(m.message) for m in w)
    assert torch.equal(got.cpu(), torch.searchsorted(b, q))


def test_advanced_indexing_checks_each_index_without_reading_it_first(backend):
    """x[i0, i1] reads no index on the host (a compiled graph that indexes stays replayable): an index out of its
    own dim must still be PyTorch's IndexError, even where the combined linear index would land in range."""
    base = torch.arange(12.0).reshape(3, 4)
    x = base.to("fl")
    i0, i1 = torch.tensor([-1, 0, 2]), torch.tensor([-4, 3, 1])
    assert torch.equal(x[i0.to("fl"), i1.to("fl")].cpu(), base[i0, i1])
    assert torch.equal(x[i0.to("fl")].cpu(), base[i0])
    cases = (([0], [4], 1, 4, 4), ([1], [-5], 1, 4, -5), ([-4], [0], 0, 3, -4), ([3], [0], 0, 3, 3))
    for a, b, dim, size, bad in cases:
        with pytest.raises(IndexError, match=f"index {bad} is out of bounds for dimension {dim} with size {size}"):
            x[torch.tensor(a, device="fl"), torch.tensor(b, device="fl")]
        with pytest.raises(IndexError, match=f"index {bad} is out of bounds for dimension {dim} with size {size}"):
            base[torch.tensor(a), torch.tensor(b)]  # PyTorch's own words
    with pytest.raises(IndexError, match="index 3 is out of bounds for dimension 0 with size 3"):
        x[torch.tensor([0, 3], device="fl")]
    assert torch.equal(x[torch.tensor([2], device="fl")].cpu(), base[2:3])  # still usable


def test_gather_scatter_and_index_select_refuse_negative_indices(backend):
    """The host plugin's gather, scatter_add and index_select kernels wrapped an index of -1 to the last row
    (silently right-looking values); PyTorch refuses it."""
    x = torch.arange(6.0).reshape(3, 2)
    fx, neg = x.to("fl"), torch.tensor([-1], device="fl")
    with pytest.raises(RuntimeError, match="out of bounds"):
        torch.gather(fx, 0, neg.view(1, 1).expand(1, 2))
    with pytest.raises(IndexError):
        fx.index_select(0, neg)
    with pytest.raises(RuntimeError, match="out of bounds"):
        torch.zeros(3, 2, device="fl").scatter_add(0, neg.view(1, 1).expand(1, 2), fx[:1])
    assert torch.equal(fx.index_select(0, torch.tensor([2], device="fl")).cpu(), x[2:3])


def test_searchsorted_bucketize_and_histc_refuse_what_the_cpu_refuses(backend):
    """Found by test_reductions' sample: searchsorted with boundaries whose leading dims differ from the values'
    returned a result on the cpu backend (its kernel does not check); histc's range taken from data holding inf
    ended in a scatter kernel's index error on minimal."""
    b2 = torch.tensor([[1.0, 2, 3, 4], [2, 4, 6, 8], [3, 6, 9, 12]])
    v2 = torch.tensor([[1.0, 2, 3], [2, 4, 6]])
    cases = {
        "first N-1 dimensions of boundaries tensor and input value tensor must match": lambda d: torch.searchsorted(
            b2.to(d), v2.to(d)
        ),
        "input value can be a scalar only when boundaries tensor dimension is 1": lambda d: torch.searchsorted(
            b2.to(d), 1.5
        ),
        r"boundaries tensor must be 1 dimension, but got dim\(2\)": lambda d: torch.bucketize(v2.to(d), b2.to(d)),
        r"torch.histc: range of \[1, inf\] is not finite": lambda d: torch.histc(
            torch.tensor([1.0, 2.0, float("inf")], device=d), bins=10
        ),
    }
    for message, call in cases.items():
        with pytest.raises(RuntimeError, match=message):
            call("cpu")  # PyTorch's own words
        with pytest.raises(RuntimeError, match=message):
            call("fl")
    ok = torch.searchsorted(torch.tensor([1.0, 2, 3], device="fl"), torch.tensor([2.5], device="fl"))
    assert ok.cpu().tolist() == [2]


@pytest.mark.parametrize("backend", ["cpu", "rocm", "ascend", "minimal"])
def test_reductions_over_an_empty_dim_list_and_their_errors_and_warnings_as_on_the_cpu(backend):
    """Found by the full test_reductions run: all(x, dim=[]) reduced every dim on fl (a silently wrong result:
    PyTorch reduces none; the dispatcher took [] for the None default); var/std with a dim given twice said
    torch._refs' "duplicate value"; median/nanmedian/mode/kthvalue over an empty dim raised KernelError or
    the k range error instead of IndexError; var/std/var_mean/std_mean with no degrees of freedom left did
    not warn. Each side is PyTorch's own CPU behaviour."""
    fl.set_backend(backend)
    torch.manual_seed(0)
    x = torch.randn(3, 4) > 0
    for op in (torch.all, torch.any):
        for keepdim in (False, True):
            want = op(x, dim=[], keepdim=keepdim)
            got = op(x.to("fl"), dim=[], keepdim=keepdim).cpu()
            assert got.shape == want.shape == (3, 4) and torch.equal(got, want)
        assert torch.equal(op(x.to("fl"), dim=None).cpu(), op(x))  # None reduces every dim
    y = torch.randn(3, 3, 3, 3)
    for op in (torch.std, torch.var, torch.var_mean, torch.std_mean):
        for dims, named in (((0, 0), 0), ((0, -4), 0), ((1, 1), 1)):
            for d in ("cpu", "fl"):
                with pytest.raises(RuntimeError, match=rf"^dim {named} appears multiple times in the list of dims$"):
                    op(y.to(d), dim=dims)
    empty = torch.randn(2, 0, 4)
    calls = {
        "median": lambda t: torch.median(t, dim=-2),
        "nanmedian": lambda t: torch.nanmedian(t, dim=1),
        "mode": lambda t: torch.mode(t, dim=1),
        "kthvalue": lambda t: torch.kthvalue(t, 1, dim=1),
    }
    for name, call in calls.items():
        said = "median" if name == "nanmedian" else name  # ATen names nanmedian median() here
        for d in ("cpu", "fl"):
            with pytest.raises(IndexError, match=rf"^{said}\(\): Expected reduction dim 1 to have"):
                call(empty.to(d))
        other = empty.transpose(1, 2).contiguous()  # dim 1 of size 4: an empty result, no error
        assert call(other.to("fl"))[0].shape == call(other)[0].shape == (2, 0)
    t = torch.randn(10, 20)
    for op in (torch.std, torch.var, torch.var_mean, torch.std_mean):
        for correction, warns in ((20, True), (19, False), (25.5, True), (19.5, False)):
            for d in ("cpu", "fl"):
                for _ in range(2):  # every call warns, as on the CPU (never served silently by the fast path)
                    with warnings.catch_warnings(record=True) as w:
                        warnings.simplefilter("always")
                        op(t.to(d), dim=-1, correction=correction)
                    said = [str(m.message) for m in w if "degrees of freedom" in str(m.message)]
                    assert len(said) == warns, (op.__name__, correction, d, said)
                    if warns:
                        assert said[0].startswith(f"{op.__name__}(): degrees of freedom is <= 0. Correction should")


@pytest.mark.parametrize("backend", ["cpu", "minimal"])
def test_searchsorted_side_and_sorter_are_checked_as_on_the_cpu(backend):
    """Found by the full test_reductions run: a side other than 'left'/'right' and a sorter of another size
    ran on fl (the cpu backend's kernel ignored them); a float sorter said the kernel's words on cpu, nothing
    on minimal."""
    fl.set_backend(backend)
    seq = torch.tensor([0.1, 0.9, 0.3, 0.5])
    _, order = torch.sort(seq)
    values = torch.tensor([0.2, 0.6])
    cases = {
        "side can only be 'left' or 'right' but got bad": lambda d: torch.searchsorted(
            seq.to(d), values.to(d), side="bad"
        ),
        "side and right can't be set to opposites": lambda d: torch.searchsorted(
            seq.to(d), values.to(d), side="left", right=True
        ),
        r"boundary and sorter must have the same size, but got boundary tensor \[4\]and got sorter tensor \[3\]": (
            lambda d: torch.searchsorted(seq.to(d), values.to(d), sorter=order[:-1].to(d))
        ),
        "sorter must be a tensor of long dtype but got dtype Float": lambda d: torch.searchsorted(
            seq.to(d), values.to(d), sorter=order.float().to(d)
        ),
    }
    for message, call in cases.items():
        for d in ("cpu", "fl"):
            with pytest.raises(RuntimeError, match=message):
                call(d)
    want = torch.searchsorted(seq, values, sorter=order, side="right")
    assert torch.equal(
        torch.searchsorted(seq.to("fl"), values.to("fl"), sorter=order.to("fl"), side="right").cpu(), want
    )


@pytest.mark.parametrize("backend", ["cpu", "minimal"])
def test_zeros_of_every_dtype_the_device_holds(backend):
    """Found by the full test_tensor_creation_ops run: torch.zeros(dtype=torch.complex32) on minimal (zero_ as
    one device fill) raised a KeyError from inside torch_fl: the table of c10::ScalarType codes lacked complex32,
    float8 and uint16/32/64. Three calls each: the first in Python, the later ones from committed plans."""
    fl.set_backend(backend)
    dtypes = [
        torch.complex32,
        torch.float8_e5m2,
        torch.float8_e4m3fn,
        torch.float8_e5m2fnuz,
        torch.float8_e4m3fnuz,
        torch.uint16,
        torch.uint32,
        torch.uint64,
        torch.float32,
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "ComplexHalf support is experimental"
        for dtype in dtypes:
            for _ in range(3):
                z = torch.zeros(2, 3, dtype=dtype, device="fl")
                f = torch.ones(2, 3, device="fl").to(dtype).zero_()
                for t in (z, f):
                    assert t.dtype == dtype
                    assert torch.equal(t.cpu().view(torch.uint8), torch.zeros(2, 3, dtype=dtype).view(torch.uint8))


@pytest.mark.parametrize("backend", ["cpu", "minimal"])
def test_copysign_takes_a_cpu_scalar_tensor_and_heaviside_refuses_two_dtypes(backend):
    """Found by a sampled test_binary_ufuncs run: copysign with a 0-dim CPU tensor beside an fl tensor (which
    CUDA reads as a scalar) failed in torch._refs' device check, the decomposition a plugin without the kernel
    takes; heaviside with operands of two dtypes ran where PyTorch refuses it."""
    fl.set_backend(backend)
    torch.manual_seed(0)
    b = torch.randn(6)
    one, minus = torch.tensor(1.0), torch.tensor(-2.0)
    got = torch.copysign(one, b.to("fl"))
    assert got.device.type == "fl" and torch.equal(got.cpu(), torch.copysign(one, b))
    assert torch.equal(torch.copysign(b.to("fl"), minus).cpu(), torch.copysign(b, minus))
    inplace = b.to("fl")
    inplace.copysign_(minus)
    assert torch.equal(inplace.cpu(), torch.copysign(b, minus))
    for values in (torch.tensor([1]), torch.tensor([1.0], dtype=torch.float64)):
        for d in ("cpu", "fl"):
            with pytest.raises(RuntimeError, match=r"^heaviside is not yet implemented for tensors with different"):
                torch.heaviside(b.to(d), values.to(d))
    half = torch.tensor([0.5])
    assert torch.equal(torch.heaviside(b.to("fl"), half.to("fl")).cpu(), torch.heaviside(b, half))


@pytest.mark.parametrize("backend", ["cpu", "minimal"])
def test_abs_inplace_of_complex_and_nonzero_static_checks_as_on_the_cpu(backend):
    """Found by the full test_unary_ufuncs run: abs_ of a complex tensor said an out= dtype error of torch_fl's
    own; nonzero_static took a negative size and a float out= tensor."""
    fl.set_backend(backend)
    cases = {
        r"^In-place abs is not supported for complex tensors\.$": lambda d: torch.tensor([1 + 1j], device=d).abs_(),
        r"^nonzero_static: 'size' must be an non-negative integer$": lambda d: torch.nonzero_static(
            torch.tensor([8], device=d), size=-2
        ),
        r"^nonzero_static: Expected out tensor to have scalar type Long but got scalar typeFloat$": (
            lambda d: torch.nonzero_static(torch.tensor([8], device=d), size=1, out=torch.empty(1, 1, device=d))
        ),
    }
    for message, call in cases.items():
        for d in ("cpu", "fl"):
            with pytest.raises(RuntimeError, match=message):
                call(d)
    x = torch.tensor([8, 0, 3])
    assert torch.nonzero_static(x.to("fl"), size=4).cpu().tolist() == torch.nonzero_static(x, size=4).tolist()


@pytest.mark.parametrize("backend", ["cpu", "minimal"])
def test_nan_to_num_of_complex_tensors(backend):
    """Found by the full test_unary_ufuncs run: nan_to_num of a complex tensor raised "isneginf does not support
    complex inputs" (torch._refs' decomposition); ATen replaces in the real and imaginary parts apart."""
    fl.set_backend(backend)
    nan, inf = float("nan"), float("inf")
    x = torch.tensor([complex(nan, inf), complex(-inf, 2), complex(1, nan), 3 + 4j, complex(inf, -inf)])
    for dtype in (torch.complex64, torch.complex128):
        c = x.to(dtype)
        f = c.to("fl")
        assert torch.equal(torch.nan_to_num(f).cpu(), torch.nan_to_num(c))
        kw = {"nan": 1.0, "posinf": 2.0, "neginf": -3.0}
        assert torch.equal(torch.nan_to_num(f, **kw).cpu(), torch.nan_to_num(c, **kw))
        out = torch.empty(0, dtype=dtype, device="fl")
        torch.nan_to_num(f, out=out)
        assert torch.equal(out.cpu(), torch.nan_to_num(c))
        g = f.clone()
        g.nan_to_num_(nan=5.0)
        assert torch.equal(g.cpu(), torch.nan_to_num(c, nan=5.0))
    r = torch.tensor([nan, inf, -inf, 1.0])
    assert torch.equal(torch.nan_to_num(r.to("fl")).cpu(), torch.nan_to_num(r))
