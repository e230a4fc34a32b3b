"""Ops a chip without their kernels still runs on the device: the JIT reduction, gather/scatter
and row kernels (torch_fl/jit/reduce.py, index.py, rows.py) and the device-only
decompositions (dispatch/decompositions/general.py, nn.py). Everything runs on the `minimal`
emulator (a few dozen primitive kernels) with the CPU fallback off, so a missing path fails
loudly, and is compared with PyTorch on the CPU."""

import pytest
import torch
import torch.nn.functional as F
from conftest import same_as_cpu

import torch_fl as fl
from torch_fl import jit

pytestmark = pytest.mark.usefixtures("minimal_no_fallback")


def d(t):
    return t.to("fl")


def same(expected, got, atol=1e-5, rtol=1e-4):
    same_as_cpu(expected, got, atol, rtol)


def _x():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 4, 5, generator=g)
    x[1, 2, 3] = float("nan")
    x[2, 1, :2] = 0.5  # ties
    return x


REDUCTIONS = {
    "sum": lambda t: t.sum(),
    "sum_dims": lambda t: t.sum((0, 2)),
    "mean_keep": lambda t: t.mean(1, keepdim=True),
    "var": lambda t: t.var(2),
    "std0": lambda t: t.std((0, 1), correction=0),
    "amin": lambda t: t.amin(1),
    "argmax": lambda t: t.argmax(),
    "argmin": lambda t: t.argmin(1, keepdim=True),
    "max_dim": lambda t: t.max(2),
    "min_dim": lambda t: t.min(0),
    "prod": lambda t: t.prod(1),
    "var_mean": lambda t: torch.var_mean(t, 1),
    "max": lambda t: t.max(),
    "strided": lambda t: t.transpose(0, 2).sum(0),
    "layer_norm": lambda t: F.layer_norm(t, (5,)),
    "norm": lambda t: t.norm(dim=1),
    "sliced": lambda t: t[:, ::2].mean(),
}


@pytest.mark.parametrize("name", sorted(REDUCTIONS))
def test_reductions_run_as_jit_kernels(name):
    fn = REDUCTIONS[name]
    x = _x()
    clean = torch.nan_to_num(x)
    same(fn(clean), fn(d(clean)))
    same(fn(x), fn(d(x)))


def test_reduction_of_integers_promotes_like_pytorch():
    x = torch.arange(-6, 6, dtype=torch.int32).reshape(3, 4)
    same(x.sum(1), d(x).sum(1))
    same(x.amax(0), d(x).amax(0))


ROWS = {
    "cumsum": lambda t: t.cumsum(1),
    "cumprod": lambda t: t.cumprod(-1),
    "cummax": lambda t: t.cummax(2),
    "cummin": lambda t: t.cummin(0),
    "logcumsumexp": lambda t: t.logcumsumexp(1),
    "sort": lambda t: torch.sort(t, dim=1, stable=True),
    "sort_desc": lambda t: torch.sort(t, dim=-1, descending=True, stable=True),
    "topk": lambda t: t.topk(3, 1),
    "topk_small": lambda t: t.topk(2, 2, largest=False),
    "kthvalue": lambda t: t.kthvalue(2, 1),
    "kthvalue_keep": lambda t: t.kthvalue(3, 2, keepdim=True),
    "median": lambda t: t.median(),
    "median_dim": lambda t: t.median(1),
    "nanmedian": lambda t: t.nanmedian(),
    "nanmedian_dim": lambda t: t.nanmedian(2, keepdim=True),
    "argsort": lambda t: torch.argsort(t, dim=1, stable=True),
}


@pytest.mark.parametrize("name", sorted(ROWS))
def test_scans_and_sorts_run_as_jit_kernels(name):
    fn = ROWS[name]
    x = _x()
    same(fn(x), fn(d(x)))
    same(fn(x.transpose(0, 2)), fn(d(x).transpose(0, 2)))


def test_gather_and_scatter_family():
    g = torch.Generator().manual_seed(1)
    x, s = torch.randn(4, 5, 6, generator=g), torch.randn(4, 3, 6, generator=g)
    i = torch.randint(0, 5, (4, 3, 6), generator=g)
    same(x.gather(1, i), d(x).gather(1, d(i)))
    same(x.scatter_add(1, i, s), d(x).scatter_add(1, d(i), d(s)))
    for red in ("sum", "prod", "mean", "amax", "amin"):
        for include_self in (True, False):
            same(
                x.scatter_reduce(1, i, s, red, include_self=include_self),
                d(x).scatter_reduce(1, d(i), d(s), red, include_self=include_self),
            )
    unique = torch.stack([torch.randperm(5, generator=g)[:3] for _ in range(24)]).view(4, 6, 3).transpose(1, 2)
    unique = unique.contiguous()
    same(x.scatter(1, unique, s), d(x).scatter(1, d(unique), d(s)))
    same(x.scatter(1, unique, 2.5), d(x).scatter(1, d(unique), 2.5))
    y = d(x)
    y.scatter_add_(1, d(i), d(s))  # in place: the kernel writes into self
    same(x.scatter_add(1, i, s), y)


def test_indexing_decompositions():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(4, 5, 6, generator=g)
    ia, ib = torch.tensor([[0, -1], [2, 3]]), torch.tensor([1, 4])
    sel = torch.tensor([5, 0, 2])
    same(x.index_select(2, sel), d(x).index_select(2, d(sel)))
    same(x.flip(0, 2), d(x).flip(0, 2))
    same(x.roll(2, 1), d(x).roll(2, 1))
    same(x[ia, ib], d(x)[d(ia), d(ib)])
    same(x[:, ia, ib], d(x)[:, d(ia), d(ib)])
    same(x[ia, :, ib], d(x)[d(ia), :, d(ib)])
    mask = x > 0.3
    same(x[mask], d(x)[d(mask)])
    same(torch.nonzero(x > 1), torch.nonzero(d(x) > 1))
    same(torch.masked_select(x, mask), torch.masked_select(d(x), d(mask)))
    y, z = x.clone(), d(x)
    y[mask] = 7.0
    z[d(mask)] = 7.0
    same(y, z)
    acc, dacc = torch.zeros(5), d(torch.zeros(5))
    idx, val = torch.tensor([1, 1, 3]), torch.tensor([1.0, 2.0, 3.0])
    acc.index_put_((idx,), val, accumulate=True)
    dacc.index_put_((d(idx),), d(val), accumulate=True)
    same(acc, dacc)
    same(x.index_add(2, sel, torch.ones(4, 5, 3)), d(x).index_add(2, d(sel), d(torch.ones(4, 5, 3))))
    same(x.index_fill(2, sel, -1.0), d(x).index_fill(2, d(sel), -1.0))
    emb = torch.nn.Embedding(10, 4)
    tok = torch.randint(0, 10, (3, 5), generator=g)
    same(emb(tok), emb.to("fl")(d(tok)))


def test_out_of_range_indices_raise_clear_errors():
    x, i = d(torch.randn(3, 5)), d(torch.tensor([[0, 7]]))
    with pytest.raises(RuntimeError, match="out of bounds for dimension 1 with size 5"):
        x.gather(1, i)
    with pytest.raises(IndexError, match="index 9 is out of bounds for dimension 0 with size 3"):
        x[d(torch.tensor([9]))]
    with pytest.raises(RuntimeError, match="'from' to be less than 'to'"):
        torch.randint_like(x, 4, 2)
    # the process stays usable
    same(torch.randn(3, 5).sum(0) * 0, (x.sum(0) * 0))


def test_random_like_factories_stay_on_the_device():
    x = d(torch.zeros(1000))
    u = torch.rand_like(x).cpu()
    assert 0 <= u.min() and u.max() < 1 and u.std() > 0.2
    r = torch.randint_like(x, 3, 7).cpu()
    assert r.min() == 3 and r.max() == 6 and torch.equal(r, r.floor())
    n = torch.randn_like(x).cpu()
    assert abs(n.mean()) < 0.2 and 0.8 < n.std() < 1.2


@pytest.mark.parametrize("backend", ["minimal", "rocm"])
def test_factories_without_a_kernel_decompose_on_the_device(backend):
    """torch.eye has no plugin kernel and no fl tensor argument: its decomposition (arange and a
    comparison) makes it on the device, so it works with the fallback off (it raised)."""
    fl.set_backend(backend)
    for args, kw in [((3,), {}), ((3, 4), {}), ((2,), {"dtype": torch.int64}), ((0,), {})]:
        same(torch.eye(*args, **kw), torch.eye(*args, **kw, device="fl"))
    a = torch.randn(3, 3)
    same(torch.linalg.matrix_power(a, 0), torch.linalg.matrix_power(d(a), 0))
    from torch_fl.tools.profiler import profile

    with profile() as prof:  # the factory's path is reported like any op's
        torch.eye(3, device="fl")
    assert {(o.op, o.path) for o in prof.ops()} >= {("aten::eye", "decomposition")}, prof.ops()
    fl.set_cpu_fallback(True)  # a factory whose decomposition would need the host goes there whole, and says so
    with profile() as prof:
        t = torch.tril_indices(4, 3, 1, device="fl")
    same(torch.tril_indices(4, 3, 1), t)
    paths = {o.op: o.path for o in prof.ops()}
    # minimal: the decomposition's arange needs float64, so the whole op is made on the host (one copy)
    assert paths["aten::tril_indices"] == ("fallback" if backend == "minimal" else "decomposition"), paths
    assert [o.op for o in prof.fallbacks()] == (["aten::tril_indices"] if backend == "minimal" else []), paths


def test_convolution_forward_and_backward_by_decomposition():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 4, 9, 8, generator=g, requires_grad=True)
    for kw in ({}, {"stride": 2, "padding": 1}, {"dilation": 2, "padding": 2}, {"groups": 2, "stride": (2, 1)}):
        w = torch.randn(6, 4 // kw.get("groups", 1), 3, 3, generator=g, requires_grad=True)
        b = torch.randn(6, generator=g, requires_grad=True)
        y = F.conv2d(x, w, b, **kw)
        grad = torch.randn(y.shape, generator=g)
        expected = torch.autograd.grad(y, (x, w, b), grad)
        xd, wd, bd = (d(t.detach()).requires_grad_() for t in (x, w, b))
        yd = F.conv2d(xd, wd, bd, **kw)
        same(y, yd)
        for e, got in zip(expected, torch.autograd.grad(yd, (xd, wd, bd), d(grad)), strict=True):
            same(e, got, atol=1e-3, rtol=1e-3)
    xt, wt = torch.randn(2, 6, 5, 4, generator=g), torch.randn(6, 2, 3, 3, generator=g)
    kw = {"stride": 2, "padding": 1, "output_padding": 1, "groups": 3}
    same(F.conv_transpose2d(xt, wt, **kw), F.conv_transpose2d(d(xt), d(wt), **kw), atol=1e-4)


def test_avg_pool_by_decomposition():
    x = torch.randn(2, 3, 9, 7, generator=torch.Generator().manual_seed(4))
    for kw in (
        {"kernel_size": 2},
        {"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True},
        {"kernel_size": 3, "stride": 2, "padding": 1, "count_include_pad": False},
        {"kernel_size": (3, 2), "stride": (2, 3), "ceil_mode": True, "count_include_pad": False},
        {"kernel_size": 2, "divisor_override": 3},
    ):
        same(F.avg_pool2d(x, **kw), F.avg_pool2d(d(x), **kw))
        same(F.avg_pool2d(x[0], **kw), F.avg_pool2d(d(x[0]), **kw))


def test_paths_are_reported_and_compile_time_is_separate():
    x = d(torch.randn(4, 6))
    with fl.profile() as prof:
        x.argmax(1)
    paths = {op.op: op.paths for op in prof.ops()}
    assert paths["aten::argmax"].get("jit") == 1  # the first call also compiles: a separate "jit-compile" entry
    assert fl.explain("aten::argmax", backend="minimal").path == "jit"
    assert jit.STATS["compiled"] > 0


def test_search_histogram_and_distance_decompositions():
    g = torch.Generator().manual_seed(5)
    seq = torch.sort(torch.randn(3, 7, generator=g)).values
    v = torch.randn(3, 4, generator=g)
    for right in (False, True):
        same(torch.searchsorted(seq, v, right=right), torch.searchsorted(d(seq), d(v), right=right))
        same(torch.bucketize(v, seq[0], right=right), torch.bucketize(d(v), d(seq[0]), right=right))
    x = torch.randn(50, generator=g)
    same(torch.histc(x, 7, -1, 1), torch.histc(d(x), 7, -1, 1))
    same(torch.histc(x, 5), torch.histc(d(x), 5))
    reps = torch.tensor([2, 0, 3, 1])
    same(torch.repeat_interleave(reps), torch.repeat_interleave(d(reps)))
    a, b = torch.randn(2, 5, 3, generator=g), torch.randn(2, 4, 3, generator=g)
    for p in (0.0, 1.0, 2.0, 3.0, float("inf")):
        same(torch.cdist(a, b, p=p), torch.cdist(d(a), d(b), p=p), atol=1e-4)
        same(F.pdist(a[0], p=p), F.pdist(d(a[0]), p=p), atol=1e-4)
    assert torch.allclose(d(a), d(a + 1e-9)) and not torch.allclose(d(a), d(a + 1))
    bt = b.transpose(1, 2)
    same(torch.addbmm(torch.ones(5, 4), a, bt), torch.addbmm(d(torch.ones(5, 4)), d(a), d(bt)))
    probs = torch.tensor([[0.1, 0.0, 0.9], [0.5, 0.5, 0.0]])
    draw = torch.multinomial(d(probs), 2).cpu()
    assert draw.shape == (2, 2) and draw[0].tolist() in ([2, 0], [0, 2]) and sorted(draw[1].tolist()) == [0, 1]
    many = torch.multinomial(d(probs), 200, replacement=True).cpu()
    assert set(many[0].tolist()) <= {0, 2} and set(many[1].tolist()) <= {0, 1}


def test_zero_gradients_factories_and_random_fill_stay_on_the_device():
    x = d(torch.randn(4, 5)).requires_grad_()
    (g,) = torch.autograd.grad(torch.sgn(x).sum(), x)  # autograd's storage-less zero tensor, made on fl
    assert g.device.type == "fl" and torch.equal(g.cpu(), torch.zeros(4, 5))
    src = d(torch.arange(6.0))
    same(
        torch.ops.aten.copy.default(torch.zeros(2, 6, dtype=torch.int32), torch.arange(6.0)),
        torch.ops.aten.copy.default(d(torch.zeros(2, 6, dtype=torch.int32)), src),
    )  # functional copy
    r = d(torch.zeros(500)).random_(3, 9).cpu()
    assert r.min() == 3 and r.max() == 8 and torch.equal(r, r.floor())
    r = d(torch.zeros(500)).random_(4).cpu()
    assert r.min() == 0 and r.max() == 3


def test_index_put_with_an_empty_dim():
    """A -1 in a reshape is ambiguous when another dim is 0 (unfold's backward of an empty batch)."""
    x = d(torch.zeros(0, 1, 5, 5)).requires_grad_()
    (g,) = torch.autograd.grad(F.unfold(x, 2).sum(), x)
    assert g.shape == (0, 1, 5, 5)
    a, b = torch.zeros(3, 0), d(torch.zeros(3, 0))
    idx = torch.tensor([0, 2])
    a[idx] = torch.zeros(2, 0)
    b[d(idx)] = d(torch.zeros(2, 0))
    same(a, b)


def test_argument_errors_of_the_device_paths_read_like_pytorch():
    x = d(torch.randn(3, 4))
    with pytest.raises(RuntimeError, match=r"kthvalue\(\): selected number k out of range for dimension 1"):
        x.kthvalue(9, 1)
    with pytest.raises(IndexError, match=r"median\(\): Expected reduction dim 1 to have non-zero size"):
        d(torch.zeros(3, 0)).median(1)
    assert torch.isnan(d(torch.zeros(0)).median().cpu())  # PyTorch's answer for the median of nothing
    with pytest.raises(IndexError, match="Index is supposed to be a vector, got a 2-D tensor"):
        x.index_select(0, d(torch.tensor([[0, 1]])))
    with pytest.raises(RuntimeError, match="Index to scalar can have only 1 value, got 2"):
        d(torch.tensor(5.0)).index_select(0, d(torch.tensor([0, 0])))
    with pytest.raises(IndexError, match="Index is supposed to be a vector, got a 2-D tensor"):
        x.index_add(0, d(torch.tensor([[0, 1]])), d(torch.ones(2, 4)))
    with pytest.raises(RuntimeError, match="expected source to have at least 3 elements"):
        d(torch.zeros(4)).masked_scatter(d(torch.tensor([True, True, True, False])), d(torch.ones(2)))
    with pytest.raises(RuntimeError, match=r"input \[2, 2\] is smaller than the kernel \[3, 3\]"):
        F.conv2d(d(torch.randn(1, 1, 2, 2)), d(torch.randn(1, 1, 3, 3)))
    same(torch.randn(3, 4).sum() * 0, x.sum() * 0)  # the process stays usable
