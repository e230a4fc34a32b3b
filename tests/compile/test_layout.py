"""Channels-last end to end: the host convolution writing an NHWC output
(FL_KERNEL_ANY_OUT_LAYOUT), fl::conv_bn_relu.out, and backend="fl"'s `layout` pass
(torch_fl/compile/passes/layout.py), which keeps a convolution net's activations NHWC on a
device that prefers it. Numbers are judged against float64 on the host; the
compiled model must return what eager returns, in eager's strides."""

from __future__ import annotations

import copy
import operator
import re

import pytest
import torch
import torch.nn.functional as F
import transformers
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

import torch_fl as fl
from torch_fl.compile import dynamo as fl_dynamo
from torch_fl.compile.passes import layout
from torch_fl.fused import conv_nhwc

pytestmark = pytest.mark.usefixtures("fresh_dynamo")
aten = torch.ops.aten
CL = torch.channels_last


def _err(a: torch.Tensor, ref: torch.Tensor) -> float:
    return (a.detach().cpu().double() - ref.double()).abs().max().item() if ref.numel() else 0.0


# -- the kernels ------------------------------------------------------------------------------

CASES = [  # N, C, H, W, O, k, stride, padding, dilation, groups, bias, input channels-last
    (2, 3, 9, 9, 4, 3, 1, 1, 1, 1, True, False),
    (2, 8, 7, 7, 16, 1, 1, 0, 1, 1, True, True),  # 1x1: one GEMM over the input
    (3, 8, 10, 8, 8, 3, 2, 1, 2, 2, False, True),  # groups, stride, dilation
    (1, 6, 5, 5, 6, 3, 1, 0, 1, 6, True, False),  # depthwise
    (2, 4, 6, 6, 8, 1, 2, 0, 1, 1, False, True),  # strided 1x1: patches again
    (0, 4, 6, 6, 8, 1, 1, 0, 1, 1, False, True),  # empty batch
    (4, 16, 12, 12, 8, 3, 1, 1, 1, 2, True, True),  # enough rows for whole chunks per thread
    (4, 16, 10, 10, 8, 1, 1, 0, 1, 1, False, False),  # the same, 1x1 on the input itself
]


@pytest.mark.parametrize("backend", ["cpu", "rocm", "ascend"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c[:6])))
def test_convolution_writes_a_channels_last_output_in_place(backend, case):
    n, c, h, w, o, k, s, p, d, g, bias, x_cl = case
    dev = fl.device(backend)
    torch.manual_seed(0)
    dtypes = [torch.float32] + ([torch.float64] if backend != "ascend" else [])
    for dtype in dtypes:
        x, wt = torch.randn(n, c, h, w, dtype=dtype), torch.randn(o, c // g, k, k, dtype=dtype)
        b = torch.randn(o, dtype=dtype) if bias else None
        ref = F.conv2d(x.double(), wt.double(), None if b is None else b.double(), s, p, d, g)
        native = F.conv2d(x, wt, b, s, p, d, g)
        xd = x.to(dev).contiguous(memory_format=CL) if x_cl else x.to(dev)
        wd, bd = wt.to(dev), None if b is None else b.to(dev)
        out = torch.empty(ref.shape, dtype=dtype, device=dev, memory_format=CL)
        with fl.profile() as prof:
            got = aten.convolution.out(xd, wd, bd, [s, s], [p, p], [d, d], False, [0, 0], g, out=out)
        assert got is out and got.is_contiguous(memory_format=CL)
        if n:
            assert got.data_ptr() == out.data_ptr()
            rows = {e.op: e for e in prof.ops()}
            assert set(rows) == {"aten::convolution"} and rows["aten::convolution"].path == "native"
        scale = ref.abs().max().item() if ref.numel() else 1.0
        assert _err(got, ref) <= 4 * _err(native, ref) + 8 * torch.finfo(dtype).eps * scale


def test_a_half_precision_channels_last_output_is_computed_through_float32():
    dev = fl.device("ascend")
    torch.manual_seed(0)
    x, wt = torch.randn(2, 4, 6, 6), torch.randn(8, 4, 3, 3)
    ref = F.conv2d(x.double(), wt.double(), padding=1)
    out = torch.empty(2, 8, 6, 6, dtype=torch.bfloat16, device=dev, memory_format=CL)
    aten.convolution.out(
        x.bfloat16().to(dev), wt.bfloat16().to(dev), None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1, out=out
    )
    native = F.conv2d(x.bfloat16(), wt.bfloat16(), padding=1)
    assert out.is_contiguous(memory_format=CL)
    assert _err(out, ref) <= 2 * _err(native, ref) + 1e-2 * ref.abs().max().item()


@pytest.mark.parametrize("backend", ["cpu", "ascend"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_convolution_backward_writes_a_channels_last_input_gradient_in_place(backend, dtype):
    """The host kernel's FL_KERNEL_ANY_OUT_LAYOUT on aten::convolution_backward is true: its out= overload
    writes the NHWC buffers it is given (half precision through float32), within native's distance of float64,
    for every output_mask the layout pass passes."""
    dev = fl.device(backend)
    torch.manual_seed(0)
    x, wt = torch.randn(2, 4, 7, 6).to(memory_format=CL), torch.randn(6, 4, 3, 3)
    go = torch.randn(2, 6, 4, 3).to(memory_format=CL)
    args = ([6], [2, 2], [1, 1], [1, 1], False, [0, 0], 1)
    ref = aten.convolution_backward(go.double(), x.double(), wt.double(), *args, [True, True, True])
    native = aten.convolution_backward(go.to(dtype), x.to(dtype), wt.to(dtype), *args, [True, True, True])
    for mask in ([True, True, True], [True, True, False], [True, False, False]):
        gi = torch.empty(2, 4, 7, 6, dtype=dtype, device=dev, memory_format=CL)
        gw, gb = torch.empty(6, 4, 3, 3, dtype=dtype, device=dev), torch.empty(6, dtype=dtype, device=dev)
        got = aten.convolution_backward.out(
            go.to(dtype).to(dev), x.to(dtype).to(dev), wt.to(dtype).to(dev), *args, mask, out0=gi, out1=gw, out2=gb
        )
        assert got[0].data_ptr() == gi.data_ptr() and got[0].is_contiguous(memory_format=CL), mask
        for k, on in enumerate(mask):
            if on:
                scale = ref[k].abs().max().item()
                assert _err(got[k], ref[k]) <= 2 * _err(native[k], ref[k]) + 8 * torch.finfo(dtype).eps * scale, k


def test_a_kernel_without_the_flag_gets_its_usual_layout_and_a_copy():
    """minimal's convolution is a decomposition: the result is copied into the NHWC buffer."""
    dev = fl.device("minimal")
    x, wt = torch.randn(2, 3, 6, 6), torch.randn(4, 3, 3, 3)
    out = torch.empty(2, 4, 4, 4, device=dev, memory_format=CL)
    got = aten.convolution.out(x.to(dev), wt.to(dev), None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1, out=out)
    assert got.is_contiguous(memory_format=CL)
    torch.testing.assert_close(got.cpu(), F.conv2d(x, wt), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", ["cpu", "ascend"])
@pytest.mark.parametrize("window", [(3, 2, 1, 1), (2, 2, 0, 1), (3, 1, 1, 2)], ids=str)
def test_max_pooling_channels_last_in_and_out_equals_the_cpu_with_its_indices(backend, window):
    """The host kernel pools NHWC without transposing; NaNs and ties pick CPU's indices."""
    k, s, p, d = window
    torch.manual_seed(0)
    x = torch.randn(2, 8, 9, 9)
    flat = x.view(-1)
    flat[::7] = float("nan")
    flat[3::11] = flat[4::11][: flat[3::11].numel()]  # ties
    xc = x.contiguous(memory_format=CL)
    want, want_i = aten.max_pool2d_with_indices(xc, [k, k], [s, s], [p, p], [d, d])
    xd = xc.to(fl.device(backend))
    with fl.profile() as prof:
        got, got_i = aten.max_pool2d_with_indices(xd, [k, k], [s, s], [p, p], [d, d])
    assert got.is_contiguous(memory_format=CL) and got_i.is_contiguous(memory_format=CL)
    assert torch.equal(got_i.cpu(), want_i) and torch.equal(got.cpu().isnan(), want.isnan())
    assert torch.equal(got.cpu().nan_to_num(), want.nan_to_num())
    assert prof.kernels == 1


def test_the_capability_table_names_the_kernels_that_write_any_layout():
    assert "aten::convolution" in fl.capabilities("cpu").any_layout_kernels
    assert "fl::conv_bn_relu" in fl.capabilities("ascend").any_layout_kernels
    assert "aten::convolution_backward" in fl.capabilities("ascend").any_layout_kernels
    assert "any output layout: aten::convolution" in fl.capabilities("cpu").render()
    assert "prefers channels-last" in fl.capabilities("ascend").render()
    assert "prefers channels-last" not in fl.capabilities("cpu").render()


def _bn_args(dtype=torch.float32):
    torch.manual_seed(1)
    return (
        torch.randn(2, 8, 9, 9, dtype=dtype),
        torch.randn(16, 8, 3, 3, dtype=dtype),
        torch.randn(16, dtype=dtype),
        torch.rand(16, dtype=dtype) + 0.5,
        torch.randn(16, dtype=dtype),
        torch.randn(16, dtype=dtype),
        torch.rand(16, dtype=dtype) + 0.5,
        1e-5,
        [1, 1],
        [1, 1],
        [1, 1],
        1,
    )


@pytest.mark.parametrize("backend", ["ascend", "rocm"])
def test_conv_bn_relu_out_writes_nhwc(backend):
    """ascend's fused kernel writes the channels-last buffer itself; rocm has no kernel and
    its decomposition's result is copied in."""
    args = _bn_args()
    ref = torch.ops.fl.conv_bn_relu(*[a.double() if isinstance(a, torch.Tensor) else a for a in args])
    native = torch.ops.fl.conv_bn_relu(*args)
    dev = fl.device(backend)
    out = torch.empty(2, 16, 9, 9, device=dev, memory_format=CL)
    dargs = [a.to(dev) if isinstance(a, torch.Tensor) else a for a in args]
    with torch.no_grad(), fl.profile() as prof:
        got = torch.ops.fl.conv_bn_relu.out(*dargs, out=out)
    assert got.data_ptr() == out.data_ptr() and got.is_contiguous(memory_format=CL)
    assert _err(got, ref) <= 4 * _err(native, ref) + 1e-6 * ref.abs().max().item()
    path = {e.op: e.path for e in prof.ops()}["fl::conv_bn_relu"]
    assert path == ("native" if backend == "ascend" else "decomposition")


def test_conv_bn_relu_out_refuses_a_gradient():
    args = list(_bn_args())
    args[1].requires_grad_(True)
    with pytest.raises(RuntimeError, match="inference kernel and has no backward"):
        torch.ops.fl.conv_bn_relu.out(*args, out=torch.empty(2, 16, 9, 9))
    with torch.no_grad():
        got = torch.ops.fl.conv_bn_relu.out(*args, out=torch.empty(2, 16, 9, 9))
        torch.testing.assert_close(got, torch.ops.fl.conv_bn_relu(*args))


# -- fl::conv2d_nhwc, the op the pass puts in the graphs ---------------------------------------


@pytest.mark.parametrize("backend", ["cpu", "rocm", "ascend", "minimal"])
@pytest.mark.parametrize("case", CASES[:5], ids=lambda c: "x".join(map(str, c[:6])))
def test_conv2d_nhwc_and_its_gradients_match_float64_channels_last(backend, case):
    """The op's values and its three gradients within native float32's distance of float64; its output and
    the input's gradient channels-last whatever the input's layout: ascend's own kernels, elsewhere the
    decompositions (minimal's convolution is itself a decomposition: the values are copied into the NHWC
    buffers)."""
    n, c, h, w, o, k, s, p, d, g, bias, x_cl = case
    fl.set_backend(backend)
    torch.manual_seed(0)
    x, wt = torch.randn(n, c, h, w, dtype=torch.float64), torch.randn(o, c // g, k, k, dtype=torch.float64)
    b = torch.randn(o, dtype=torch.float64) if bias else None
    leaves = [t for t in (x, wt, b) if t is not None]
    go = torch.randn(F.conv2d(x, wt, b, s, p, d, g).shape, dtype=torch.float64)
    for t in leaves:
        t.requires_grad_(True)
    ref = F.conv2d(x, wt, b, s, p, d, g)
    ref_grads = torch.autograd.grad(ref, leaves, go)
    native_in = [t.detach().float().requires_grad_() for t in leaves]
    native = F.conv2d(native_in[0], native_in[1], native_in[2] if bias else None, s, p, d, g)
    native_grads = torch.autograd.grad(native, native_in, go.float())
    dev_in = [t.detach().float().to("fl") for t in leaves]
    if x_cl:
        dev_in[0] = dev_in[0].contiguous(memory_format=CL)
    dev_in = [t.requires_grad_() for t in dev_in]
    with fl.profile() as prof:
        got = fl.fused.conv2d_nhwc(dev_in[0], dev_in[1], dev_in[2] if bias else None, s, p, d, g)
        grads = torch.autograd.grad(got, dev_in, go.float().to("fl"))
    assert got.is_contiguous(memory_format=CL) and grads[0].is_contiguous(memory_format=CL)
    assert got.shape == ref.shape and [t.shape for t in grads] == [t.shape for t in leaves]
    for a, want, nat in zip((got, *grads), (ref, *ref_grads), (native, *native_grads), strict=True):
        scale = want.abs().max().item() if want.numel() else 1.0
        assert _err(a, want) <= 4 * _err(nat, want) + 8 * torch.finfo(torch.float32).eps * scale
    paths = {e.op: e.path for e in prof.ops()}
    want = "native" if backend == "ascend" else "decomposition"  # ascend's emulator has the two kernels
    assert paths["fl::conv2d_nhwc"] == paths["fl::conv2d_nhwc_backward"] == want


def test_conv2d_nhwc_on_the_cpu_is_the_reference():
    torch.manual_seed(0)
    x, wt, b = torch.randn(2, 4, 7, 6), torch.randn(6, 2, 3, 3), torch.randn(6)
    got = fl.fused.conv2d_nhwc(x, wt, b, stride=(2, 1), padding=1, groups=2)
    assert got.is_contiguous(memory_format=CL)
    assert torch.equal(got, F.conv2d(x, wt, b, (2, 1), 1, 1, 2))
    gi, gw, gb = torch.ops.fl.conv2d_nhwc_backward(
        torch.ones_like(got), x, wt, [6], [2, 1], [1, 1], [1, 1], 2, [True, False, True]
    )
    assert gi.is_contiguous(memory_format=CL) and gw.numel() == 0 and gb.shape == (6,)


def test_conv2d_nhwc_fake_implementation_gives_channels_last_strides():
    """Traced with fake tensors (what Dynamo and AOTAutograd do), the op says what it writes: channels-last
    output and input gradient, the masked-out gradients empty."""
    with FakeTensorMode():
        x, wt = torch.empty(2, 4, 7, 6, device="fl"), torch.empty(6, 4, 3, 3, device="fl")
        y = torch.ops.fl.conv2d_nhwc(x, wt, None, [2, 2], [1, 1], [1, 1], 1)
        assert isinstance(y, FakeTensor) and y.device == x.device
        assert y.shape == (2, 6, 4, 3) and y.is_contiguous(memory_format=CL) and not y.is_contiguous()
        gi, gw, gb = torch.ops.fl.conv2d_nhwc_backward(y, x, wt, None, [2, 2], [1, 1], [1, 1], 1, [True, True, False])
        assert gi.shape == x.shape and gi.is_contiguous(memory_format=CL)
        assert gw.shape == wt.shape and gw.is_contiguous() and gb.shape == (0,)


@pytest.mark.parametrize("backend", ["ascend", "minimal"])
def test_a_compiled_model_calling_conv2d_nhwc_trains_like_float64(backend):
    """A user's model calling the op, compiled (Dynamo and AOTAutograd trace it through its fake
    implementation): the output channels-last as eager's, gradients within native's distance of float64."""
    fl.set_backend(backend)
    torch.manual_seed(0)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3, padding=1)

        def forward(self, x):
            w, b = self.conv.weight, self.conv.bias
            return torch.relu(fl.fused.conv2d_nhwc(x, w, b, padding=1))

    model = Net()
    ref, native = copy.deepcopy(model).double(), copy.deepcopy(model)
    model = model.to("fl")
    compiled = torch.compile(model, backend="fl")
    x = torch.randn(2, 3, 8, 8)
    for m, arg in ((compiled, x.to("fl")), (ref, x.double()), (native, x)):
        out = m(arg)
        assert out.is_contiguous(memory_format=CL)
        out.square().sum().backward()
    for (name, p), r, n in zip(model.named_parameters(), ref.parameters(), native.parameters(), strict=True):
        assert _err(p.grad, r.grad) <= 4 * _err(n.grad, r.grad) + 1e-6 * r.grad.abs().max().item(), name


def test_conv2d_nhwc_refuses_bad_input_with_the_fix():
    dev = fl.device("ascend")
    with pytest.raises(RuntimeError, match=r"4-D input .* use F.conv1d"):
        fl.fused.conv2d_nhwc(torch.randn(2, 3, 5, device=dev), torch.randn(4, 3, 3, device=dev))
    with pytest.raises(RuntimeError, match="the input has 3 channels, the weight expects 2 x 1 group"):
        fl.fused.conv2d_nhwc(torch.randn(2, 3, 5, 5, device=dev), torch.randn(4, 2, 3, 3, device=dev))
    for backend in ("ascend", "minimal", "cpu"):  # ascend's own kernel was handed an empty output here
        with pytest.raises(RuntimeError, match=r"padded input \[2, 2\] is smaller than the kernel \[3, 3\]"):
            d = fl.device(backend)
            fl.fused.conv2d_nhwc(torch.randn(1, 3, 2, 2, device=d), torch.randn(4, 3, 3, 3, device=d))
    with pytest.raises(RuntimeError, match=r"Kernel size can't be greater"):  # CPU tensors: F.conv2d's refusal
        fl.fused.conv2d_nhwc(torch.randn(1, 3, 2, 2), torch.randn(4, 3, 3, 3))
    with pytest.raises(ValueError, match="numeric padding, not 'same'"):
        fl.fused.conv2d_nhwc(torch.randn(2, 3, 5, 5), torch.randn(4, 3, 3, 3), padding="same")
    with pytest.raises(RuntimeError, match="asks for the bias gradient but bias_sizes is None"):
        x, wt = torch.randn(2, 3, 5, 5, device=dev), torch.randn(4, 3, 3, 3, device=dev)
        torch.ops.fl.conv2d_nhwc_backward(
            torch.randn(2, 4, 3, 3, device=dev), x, wt, None, [1, 1], [0, 0], [1, 1], 1, [True, True, True]
        )
    x = torch.randn(2, 3, 5, 5, device=dev, requires_grad=True)
    w = torch.randn(4, 3, 3, 3, device=dev, requires_grad=True)
    with pytest.raises(RuntimeError, match="has no backward .* double backward"):
        torch.autograd.grad(fl.fused.conv2d_nhwc(x, w).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="has no backward .* torch.no_grad"):
        torch.ops.fl.conv2d_nhwc_backward(
            torch.ones(2, 4, 3, 3, device=dev), x, torch.randn(4, 3, 3, 3, device=dev),
            None, [1, 1], [0, 0], [1, 1], 1, [True, True, False],
        )  # fmt: skip
    y = fl.fused.conv2d_nhwc(x.detach(), torch.randn(4, 3, 3, 3, device=dev))  # still usable
    assert y.is_contiguous(memory_format=CL)


def test_conv2d_nhwc_under_autocast_runs_in_the_autocast_dtype():
    dev = fl.device("ascend")
    torch.manual_seed(0)
    x, wt = torch.randn(2, 4, 6, 6), torch.randn(8, 4, 3, 3)
    with torch.autocast("fl", dtype=torch.bfloat16):
        got = fl.fused.conv2d_nhwc(x.to(dev), wt.to(dev), padding=1)
    assert got.dtype == torch.bfloat16 and got.is_contiguous(memory_format=CL)
    ref = F.conv2d(x.double(), wt.double(), padding=1)
    native = F.conv2d(x.bfloat16(), wt.bfloat16(), padding=1)
    assert _err(got, ref) <= 2 * _err(native, ref) + 1e-2 * ref.abs().max().item()


# -- the pass ---------------------------------------------------------------------------------


class Residual(nn.Module):
    """conv -> bn -> relu, conv -> bn, residual add -> relu, a 1x1 conv, max pooling, then a
    flatten over a 6x6 map (a view that needs the traced layout back) and a second output
    that is a permuted view of an activation."""

    def __init__(self):
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.c2, self.b2 = nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8)
        self.c3, self.pool = nn.Conv2d(8, 6, 1), nn.MaxPool2d(2)
        self.fc = nn.Linear(6 * 6 * 6, 5)
        for bn in (self.b1, self.b2):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 1.5)

    def forward(self, x):
        y = torch.relu(self.b1(self.c1(x)))
        y = torch.relu(self.b2(self.c2(y)) + y)
        y = self.pool(self.c3(y))
        return self.fc(torch.flatten(y, 1)), y.permute(0, 2, 3, 1)


def _run(model: nn.Module, x: torch.Tensor, passes=None):
    compiled = fl.compile(model, passes=passes)
    with torch.no_grad():
        compiled(x)
        return compiled, compiled(x)


def _real(t) -> bool:
    return isinstance(t, torch.Tensor) and not isinstance(t, FakeTensor)


def _seen_inputs(monkeypatch) -> list[bool]:
    """Whether each channels-last convolution's input arrived channels-last: fl::conv2d_nhwc's calls (through
    its Autograd kernel, which every call passes, grad mode on or off) and the fused conv_bn_relu's."""
    seen: list[bool] = []
    real_op, real_fused = conv_nhwc.conv2d_nhwc_op, layout.ChannelsLastConvBnRelu.forward

    def spy(x, *rest):
        y = real_op(x, *rest)
        if _real(x):
            seen.append(x.is_contiguous(memory_format=CL))
            assert y.is_contiguous(memory_format=CL)
        return y

    def spy_fused(self, x, *rest):
        seen.append(x.is_contiguous(memory_format=CL))
        y = real_fused(self, x, *rest)
        assert y.is_contiguous(memory_format=CL)
        return y

    monkeypatch.setattr(conv_nhwc, "conv2d_nhwc_op", spy)
    monkeypatch.setattr(layout.ChannelsLastConvBnRelu, "forward", spy_fused)
    return seen


def test_layout_keeps_activations_nhwc_on_ascend_and_returns_eager_strides(monkeypatch):
    fl.set_backend("ascend")
    torch.manual_seed(0)
    model = Residual().eval()
    x = torch.randn(2, 3, 12, 12)
    ref = copy.deepcopy(model).double()(x.double())
    native = model(x)
    model = model.to("fl")
    with torch.no_grad():
        eager = model(x.to("fl"))
    seen = _seen_inputs(monkeypatch)
    compiled, out = _run(model, x.to("fl"))
    # three convolutions per call, two calls: the first reads the NCHW input, the others NHWC
    assert seen == [False, True, True] * 2
    for got, want, e, nat in zip(out, ref, eager, native, strict=True):
        assert got.shape == e.shape and got.stride() == e.stride()
        assert _err(got, want) <= 4 * _err(nat, want) + 1e-6 * want.abs().max().item()
    [pattern] = [p for p in fl.fusion_report(compiled).patterns(True) if p.pattern == "channels-last convolutions"]
    assert pattern.graph == "inference" and "3 convolution(s)" in pattern.note
    assert pattern.replaced == ["fl::conv_bn_relu", "fl_folded_conv_0", "aten::convolution"]


def test_layout_off_by_name_and_on_a_device_without_the_preference(monkeypatch):
    torch.manual_seed(0)
    model = Residual().eval().to("fl")
    x = torch.randn(2, 3, 12, 12).to("fl")
    seen = _seen_inputs(monkeypatch)
    fl.set_backend("ascend")
    compiled, _ = _run(model, x, passes={"layout": False})
    assert not [p for p in fl.fusion_report(compiled).patterns(None) if p.pattern.startswith("channels-last")]
    fl_dynamo.reset()
    fl.set_backend("cpu")
    model = model.to("fl")
    compiled, _ = _run(model, x.cpu().to("fl"))
    assert not [p for p in fl.fusion_report(compiled).patterns(None) if p.pattern.startswith("channels-last")]
    assert seen == []


def test_training_graphs_keep_nchw_without_a_channels_last_convolution_backward(monkeypatch):
    fl.set_backend("ascend")
    caps = fl.runtime.REGISTRY.get("ascend").capabilities
    monkeypatch.setattr(caps, "any_layout_kernels", [k for k in caps.any_layout_kernels if "backward" not in k])
    torch.manual_seed(0)
    model = Residual().to("fl")
    x = torch.randn(2, 3, 12, 12).to("fl")
    compiled = fl.compile(model)
    out, _ = compiled(x)
    out.square().mean().backward()
    kept = [p for p in fl.fusion_report(compiled).patterns(False) if p.pattern == "channels-last convolutions"]
    assert {p.graph for p in kept} == {"forward", "backward"}
    assert all("convolution_backward" in p.note and "FL_KERNEL_ANY_OUT_LAYOUT" in p.note for p in kept)


def _seen_backward(monkeypatch) -> list[tuple[bool, bool, bool]]:
    """Per fl::conv2d_nhwc_backward call: whether grad_output and input arrived channels-last and the input
    gradient left so."""
    seen: list[tuple[bool, bool, bool]] = []
    real = conv_nhwc.conv2d_nhwc_backward_op

    def spy(go, x, *rest):
        out = real(go, x, *rest)
        if _real(go):
            seen.append(tuple(t.is_contiguous(memory_format=CL) for t in (go, x, out[0])))
        return out

    monkeypatch.setattr(conv_nhwc, "conv2d_nhwc_backward_op", spy)
    return seen


@pytest.mark.parametrize("replay", [False, True])
def test_training_steps_run_nhwc_forward_and_backward_on_ascend(monkeypatch, replay):
    """A training step on a device that prefers channels-last: the forward's convolutions read and write NHWC,
    the tensors saved for the backward stay NHWC, each convolution_backward reads NHWC and writes its input
    gradient NHWC. Gradients and the SGD steps' parameters are judged against float64, step after step (the
    weight changes every step: a replayed graph converts it again each call), in eager's strides."""
    fl.set_backend("ascend")
    torch.manual_seed(0)
    model = Residual()
    ref = copy.deepcopy(model).double()
    native = copy.deepcopy(model)
    model = model.to("fl")
    compiled = fl.compile(model, replay=replay)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, ref, native)]
    seen, seen_bw = _seen_inputs(monkeypatch), _seen_backward(monkeypatch)
    for step in range(4):
        x = torch.randn(2, 3, 12, 12)
        for m, arg in ((compiled, x.to("fl")), (ref, x.double()), (native, x)):
            out, y = m(arg)
            (out.square().mean() + 0.01 * y.sum()).backward()
        for (name, p), r, n in zip(model.named_parameters(), ref.parameters(), native.parameters(), strict=True):
            assert p.grad.shape == r.grad.shape and p.grad.stride() == n.grad.stride(), name
            err, native_err = _err(p.grad, r.grad), _err(n.grad, r.grad)
            assert err <= 4 * native_err + 1e-6 * r.grad.abs().max().item(), (step, name, err, native_err)
        for opt in opts:
            opt.step()
            opt.zero_grad()
    for p, r in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.detach().cpu().double(), r.detach(), rtol=1e-4, atol=1e-5)
    for (name, b), r in zip(model.named_buffers(), ref.buffers(), strict=True):  # batch norm's running stats
        torch.testing.assert_close(b.cpu().to(r.dtype), r, rtol=1e-5, atol=1e-6, msg=name)
    ran = 4 if not replay else 2  # replayed: the warm-up and the recording run the modules, replays do not
    assert seen == [False, True, True] * ran  # forward: three convolutions a step, the first reads NCHW
    assert seen_bw == [(True, True, True)] * 2 * ran  # c3's and c2's backward (c1's computes no input gradient)
    patterns = [p for p in fl.fusion_report(compiled).patterns(True) if p.pattern == "channels-last convolutions"]
    assert [p.graph for p in patterns] == ["forward", "backward"]
    assert "saved tensor(s) left NHWC" in patterns[0].note
    assert "2 input gradient(s) written NHWC" in patterns[1].note
    left = int(re.search(r"(\d+) saved tensor\(s\) left NHWC", patterns[0].note).group(1))
    assert left > 0 and f"{left} saved tensor(s) read NHWC" in patterns[1].note  # the backward knows them all
    if replay:
        [status] = [g.replay for g in fl.fusion_report(compiled).graphs if g.replay is not None]
        assert status.replayed and status.replays == 2 * 2, status


def test_the_rewritten_graphs_metadata_is_what_runs(monkeypatch):
    """The pass's fl::conv2d_nhwc nodes (and the input gradients of its fl::conv2d_nhwc_backward nodes) carry
    the values the op's fake implementation gives, channels-last, which are the strides its calls return;
    the value each replaced node was traced with (NCHW) stays under meta[TRACED]."""
    fl.set_backend("ascend")
    graphs: list = []
    real_run = fl_dynamo.run_aten

    def keep(ctx, passes):
        real_run(ctx, passes)
        graphs.append(ctx.gm)

    monkeypatch.setattr(fl_dynamo, "run_aten", keep)
    ran: list = []
    real_fw, real_bw = conv_nhwc.conv2d_nhwc_op, conv_nhwc.conv2d_nhwc_backward_op

    def fw(*args):
        y = real_fw(*args)
        if _real(y):
            ran.append((tuple(y.shape), y.stride()))
        return y

    def bw(*args):
        out = real_bw(*args)
        if _real(out[0]):
            ran.append((tuple(out[0].shape), out[0].stride()))
        return out

    monkeypatch.setattr(conv_nhwc, "conv2d_nhwc_op", fw)
    monkeypatch.setattr(conv_nhwc, "conv2d_nhwc_backward_op", bw)
    torch.manual_seed(0)
    model = Residual().to("fl")
    out, y = fl.compile(model)(torch.randn(2, 3, 12, 12).to("fl"))
    (out.square().mean() + y.sum()).backward()
    said = []

    def is_grad_input(node):
        src = node.args[0] if node.target is operator.getitem else None
        return getattr(src, "target", None) is torch.ops.fl.conv2d_nhwc_backward.default and node.args[1] == 0

    for gm in graphs:
        for node in gm.graph.nodes:
            if node.target is torch.ops.fl.conv2d_nhwc.default:
                val = node.meta["val"]
            elif is_grad_input(node):
                val = node.meta["val"]
            else:
                continue
            assert val.is_contiguous(memory_format=CL) and not val.is_contiguous(), node
            assert node.meta[layout.TRACED].is_contiguous(), node  # what aten's rule traced
            said.append((tuple(val.shape), val.stride()))
    # three convolutions forward, c3's and c2's input gradients backward (c1's computes none)
    assert len(said) == 5 and sorted(said) == sorted(ran)


def test_cached_weights_follow_an_in_place_update():
    """A model that keeps training between inference calls: the channels-last weight copy and
    the folded batch norm are remade when a weight changes."""
    fl.set_backend("ascend")
    torch.manual_seed(0)
    model = Residual().eval().to("fl")
    x = torch.randn(2, 3, 12, 12).to("fl")
    compiled, first = _run(model, x)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.5)
        after = compiled(x)
        eager = model(x)
    assert _err(after[0], first[0].cpu()) > 1e-3
    for got, want in zip(after, eager, strict=True):
        torch.testing.assert_close(got.cpu(), want.cpu(), rtol=1e-4, atol=1e-4)


def test_traced_layout_copies_only_when_the_memory_order_differs():
    t = torch.randn(2, 4, 1, 1).contiguous(memory_format=CL)
    same = layout.traced_layout(t, (2, 4, 1, 1), (4, 1, 1, 1))
    assert same.data_ptr() == t.data_ptr() and same.stride() == (4, 1, 1, 1)
    u = torch.randn(2, 4, 3, 3).contiguous(memory_format=CL)
    fixed = layout.traced_layout(u, (2, 4, 3, 3), (36, 9, 3, 1))
    assert fixed.is_contiguous() and fixed.data_ptr() != u.data_ptr() and torch.equal(fixed, u)
    assert layout.traced_layout(u, (2, 4, 3, 3), u.stride()) is u


def test_hugging_face_resnet_training_on_ascend_runs_nhwc_and_matches_float64():
    """A model we did not write (transformers' ResNet, bottleneck blocks, batch norm in training): two compiled
    training steps on ascend with NHWC forward and backward graphs, every gradient within native float32's
    distance of float64, in native's strides."""
    fl.set_backend("ascend")
    torch.manual_seed(0)
    cfg = transformers.ResNetConfig(
        num_channels=3, embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="bottleneck"
    )
    model = transformers.ResNetModel(cfg).train()
    ref, native = copy.deepcopy(model).double(), copy.deepcopy(model)
    model = model.to("fl")
    compiled = fl.compile(model)
    for step in range(2):
        x = torch.randn(4, 3, 32, 32)
        for m, arg in ((compiled, x.to("fl")), (ref, x.double()), (native, x)):
            m(pixel_values=arg).pooler_output.square().sum().backward()
        for (name, p), r, n in zip(model.named_parameters(), ref.parameters(), native.parameters(), strict=True):
            assert p.grad.stride() == n.grad.stride(), name
            err, native_err = _err(p.grad, r.grad), _err(n.grad, r.grad)
            assert err <= 4 * native_err + 1e-6 * r.grad.abs().max().item(), (step, name, err, native_err)
            p.grad = r.grad = n.grad = None
    applied = [p for p in fl.fusion_report(compiled).patterns(True) if p.pattern == "channels-last convolutions"]
    assert [p.graph for p in applied] == ["forward", "backward"], applied
    assert "input gradient(s) written NHWC" in applied[1].note


def test_hugging_face_resnet_eval_on_ascend_matches_eager():
    fl.set_backend("ascend")
    torch.manual_seed(0)
    cfg = transformers.ResNetConfig(
        num_channels=3, embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="bottleneck"
    )
    model = transformers.ResNetModel(cfg).eval()
    x = torch.randn(2, 3, 32, 32)
    ref = copy.deepcopy(model).double()(pixel_values=x.double()).pooler_output
    native = model(pixel_values=x).pooler_output
    model = model.to("fl")
    compiled = fl.compile(model)
    with torch.no_grad():
        eager = model(pixel_values=x.to("fl")).pooler_output
        got = compiled(pixel_values=x.to("fl")).pooler_output
    assert got.stride() == eager.stride()
    assert _err(got, ref) <= 4 * _err(native, ref) + 1e-6 * ref.abs().max().item()
    applied = [p for p in fl.fusion_report(compiled).patterns(True) if p.pattern == "channels-last convolutions"]
    assert applied and applied[0].graph == "inference"


def test_graph_replay_runs_the_channels_last_graph():
    """options={"replay": True}: the NHWC graph is recorded once and replayed; new inputs and an
    in-place weight update give eager's values."""
    fl.set_backend("ascend")
    torch.manual_seed(0)
    model = Residual().eval().to("fl")
    compiled = fl.compile(model, replay=True)
    with torch.no_grad():
        for step in range(4):
            if step == 3:
                for p in model.parameters():
                    p.mul_(0.5)
            x = torch.randn(2, 3, 12, 12).to("fl")
            got, want = compiled(x), model(x)
            for a, b in zip(got, want, strict=True):
                assert a.stride() == b.stride()
                torch.testing.assert_close(a.cpu(), b.cpu(), rtol=1e-4, atol=1e-5)
    report = fl.fusion_report(compiled)
    assert "replayed" in str(report.graphs[0].replay)
    assert [p for p in report.patterns(True) if p.pattern == "channels-last convolutions"]


@pytest.mark.slow  # models (transformers, zoo), 5-13 s a case measured
@pytest.mark.parametrize("name", ["resnet", "convnext", "vit", "swin", "clip"])
def test_zoo_vision_models_compile_channels_last_and_match_float64(name):
    """Models nobody here wrote, with what follows their convolutions: ConvNeXt's permute -> LayerNorm ->
    Linear -> permute back, ViT's and CLIP's flatten(2).transpose(1, 2) patch embedding, Swin's views."""
    from torch_fl.tools.zoo import MODELS

    fl.set_backend("ascend")
    zoo = MODELS[name]
    model, inputs = zoo.build().eval(), zoo.inputs()
    as64 = {k: v.double() if v.is_floating_point() else v for k, v in inputs.items()}
    with torch.no_grad():
        ref = [t for t in copy.deepcopy(model).double()(**as64).to_tuple() if isinstance(t, torch.Tensor)]
        native = [t for t in model(**inputs).to_tuple() if isinstance(t, torch.Tensor)]
        model = model.to("fl")
        compiled = fl.compile(model)
        got = [
            t for t in compiled(**{k: v.to("fl") for k, v in inputs.items()}).to_tuple() if isinstance(t, torch.Tensor)
        ]
    assert len(got) == len(ref)
    for g, r, n in zip(got, ref, native, strict=True):
        assert g.shape == n.shape and g.stride() == n.stride()
        assert _err(g, r) <= 4 * _err(n, r) + 1e-6 * r.abs().max().item()
    applied = [p for p in fl.fusion_report(compiled).patterns(True) if p.pattern == "channels-last convolutions"]
    assert len(applied) == 1
