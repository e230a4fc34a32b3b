"""The emulated vendor backends (rocm, ascend, minimal): each is honest about
being an emulator, keeps device memory apart, trains the reference models
like CPU, and routes the same op down the path its capability table says;
backends switch live in one process."""

import copy
import os

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_close, build_test_plugin, run_py
from torch import nn

import torch_fl as fl
from torch_fl.fused import conv_bn_relu
from torch_fl.runtime import REGISTRY, events
from torch_fl.tools.zoo import resnet50, transformer_encoder

EMULATED = ["rocm", "ascend", "minimal"]
TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(params=EMULATED)
def backend(request):
    fl.set_backend(request.param)
    yield request.param
    fl.set_backend("cpu")


def _counts(backend: str, op: str) -> dict:
    return {p: n for (name, p), n in REGISTRY.get(backend).counts.items() if name == op}


def test_emulators_say_so_and_keep_memory_apart(backend):
    caps = fl.capabilities(backend)
    assert caps.emulated and "emulated" in caps.description
    assert caps.devices and not any(d.host_accessible for d in caps.devices)
    assert fl.get_current_backend_name() == backend
    x = torch.randn(256)
    before = events.STATE.bytes_copied
    xd = x.to("fl")
    assert xd.device == fl.device(backend)
    assert torch.equal(xd.cpu(), x)
    assert events.STATE.bytes_copied - before >= 2 * x.numel() * 4  # one copy in, one out, counted


def test_capability_tables_differ_as_the_device_classes_do():
    rocm, ascend, minimal = (fl.capabilities(b) for b in EMULATED)
    assert "float64" in rocm.devices[0].dtypes and "float64" not in ascend.devices[0].dtypes
    assert "float16" not in minimal.devices[0].dtypes and "bfloat16" in minimal.devices[0].dtypes
    assert (rocm.amp_dtype, ascend.amp_dtype, minimal.amp_dtype) == ("float16", "float16", "bfloat16")
    assert "aten::_scaled_dot_product_fused_attention_overrideable" in rocm.fused_kernels
    assert "fl::conv_bn_relu" in ascend.fused_kernels and not minimal.fused_kernels
    assert not any("attention" in k for k in ascend.fused_kernels)
    assert len(rocm.kernels) > len(ascend.kernels) > 3 * len(minimal.kernels)
    assert 20 <= len(minimal.kernels) <= 40
    assert len(rocm.devices) == 2


@pytest.mark.parametrize(
    "op,dtype,paths",
    [
        (
            "aten::native_layer_norm_backward",
            torch.float32,
            {"rocm": "native", "ascend": "decomposition", "minimal": "decomposition"},
        ),
        ("aten::convolution", torch.float32, {"rocm": "native", "ascend": "native", "minimal": "decomposition"}),
        ("aten::mm", torch.float64, {"rocm": "native", "ascend": "fallback", "minimal": "fallback"}),
        ("aten::gelu", torch.float32, {"rocm": "native", "ascend": "decomposition", "minimal": "decomposition"}),
        ("fl::conv_bn_relu", torch.float32, {"rocm": "decomposition", "ascend": "native", "minimal": "decomposition"}),
        (
            "aten::_scaled_dot_product_fused_attention_overrideable",
            torch.float32,
            {"rocm": "native", "ascend": "decomposition", "minimal": "decomposition"},
        ),
    ],
)
def test_same_op_takes_the_path_its_capability_table_says(op, dtype, paths):
    for b, path in paths.items():
        plan = fl.explain(op, dtype, backend=b)
        assert plan.path == path, f"{op} on {b}: {plan.render()}"
        assert fl.capabilities(b).supports(op, dtype) == (path == "native"), (op, b)


def test_paths_taken_when_training_follow_the_tables():
    x, w, b = torch.randn(4, 6, requires_grad=True), torch.randn(6), torch.randn(6)
    for name, expected in (("rocm", "native"), ("ascend", "decomposition"), ("minimal", "decomposition")):
        fl.set_backend(name)
        before = _counts(name, "aten::native_layer_norm_backward").get(expected, 0)
        xd = x.detach().to("fl").requires_grad_()
        F.layer_norm(xd, (6,), w.to("fl"), b.to("fl")).pow(2).sum().backward()
        assert _counts(name, "aten::native_layer_norm_backward").get(expected, 0) == before + 1, name
        ref = x.detach().clone().requires_grad_()
        F.layer_norm(ref, (6,), w, b).pow(2).sum().backward()
        assert_close(xd.grad, ref.grad, what=f"layer norm grad on {name}")


@pytest.mark.slow  # a model test
def test_resnet50_fp32_forward_backward_step_like_cpu(backend):
    """As tests/test_models.py: fp32 forward to 1e-4; gradients judged against
    fp64 truth (fl may be no less accurate than native fp32); one SGD step."""
    torch.manual_seed(0)
    model = resnet50(num_classes=10)
    x, y = torch.randn(4, 3, 64, 64), torch.tensor([1, 3, 5, 7])
    m64, dev = copy.deepcopy(model).double(), copy.deepcopy(model).to("fl")
    opt_dev = torch.optim.SGD(dev.parameters(), lr=0.01, momentum=0.9)
    out32, out_dev = model(x), dev(x.to("fl"))
    assert out_dev.device == fl.device(backend)
    assert_close(out_dev, out32, 1e-4, what=f"{backend} fp32 forward output")
    F.cross_entropy(out32, y).backward()
    F.cross_entropy(m64(x.double()), y).backward()
    F.cross_entropy(out_dev, y.to("fl")).backward()
    truth = torch.cat([p.grad.flatten() for p in m64.parameters()])
    native = torch.cat([p.grad.double().flatten() for p in model.parameters()])
    ours = torch.cat([p.grad.cpu().double().flatten() for p in dev.parameters()])
    native_err = ((native - truth).norm() / truth.norm()).item()
    fl_err = ((ours - truth).norm() / truth.norm()).item()
    assert fl_err <= 2 * native_err + 1e-6, f"{backend}: gradient error {fl_err:.2e} vs native {native_err:.2e}"
    # the step itself runs on the device: the first SGD step is p - lr * grad (of its own gradients,
    # which are judged above)
    before = [(p.detach().cpu().clone(), p.grad.cpu().clone()) for p in dev.parameters()]
    opt_dev.step()
    for (name, _), p_dev, (p0, g) in zip(model.named_parameters(), dev.parameters(), before, strict=True):
        assert p_dev.device == fl.device(backend)
        assert_close(p_dev, p0 - 0.01 * g, 1e-6, what=f"{backend} {name} after a step", scale_floor=1.0)


@pytest.mark.slow  # a model test
def test_resnet50_float64_trains_exactly_on_rocm():
    fl.set_backend("rocm")
    torch.manual_seed(0)
    model = resnet50(num_classes=10).double()
    x, y = torch.randn(4, 3, 64, 64, dtype=torch.float64), torch.tensor([1, 3, 5, 7])
    dev = copy.deepcopy(model).to("fl")
    opt, opt_dev = (torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for m in (model, dev))
    for step in range(2):
        F.cross_entropy(model(x), y).backward()
        F.cross_entropy(dev(x.to("fl")), y.to("fl")).backward()
        for (name, p), p_dev in zip(model.named_parameters(), dev.parameters(), strict=True):
            assert_close(p_dev.grad, p.grad, 1e-9, what=f"step {step} grad {name}")
        opt.step()
        opt_dev.step()
        opt.zero_grad()
        opt_dev.zero_grad()
    assert _counts("rocm", "aten::convolution_backward").get("native", 0) > 0


@pytest.mark.parametrize("opt_cls", [torch.optim.AdamW, torch.optim.SGD])
def test_transformer_trains_like_cpu(backend, opt_cls):
    torch.manual_seed(0)
    model = transformer_encoder(d_model=32, nhead=4, num_layers=2, dropout=0.0, dim_feedforward=64)
    x, target = torch.randn(2, 8, 32), torch.randn(2, 8, 32)
    ref, dev = copy.deepcopy(model), copy.deepcopy(model).to("fl")
    opt_ref, opt_dev = opt_cls(ref.parameters(), lr=1e-3), opt_cls(dev.parameters(), lr=1e-3)
    noise_only = {}
    for step in range(2):
        out_ref, out_dev = ref(x), dev(x.to("fl"))
        assert_close(out_dev, out_ref, what=f"{backend} step {step} output")
        F.mse_loss(out_ref, target).backward()
        F.mse_loss(out_dev, target.to("fl")).backward()
        for (name, p), p_dev in zip(ref.named_parameters(), dev.parameters(), strict=True):
            assert_close(p_dev.grad, p.grad, 5e-4, what=f"{backend} step {step} grad {name}")
            # entries whose true gradient is zero (the attention key bias): Adam turns their
            # rounding noise into full-size steps of either sign, on any two implementations
            small = p.grad.abs() <= 1e-6 * max(p.grad.abs().max().item(), 1e-30)
            noise_only[name] = small if step == 0 else noise_only[name] & small
        opt_ref.step()
        opt_dev.step()
        opt_ref.zero_grad()
        opt_dev.zero_grad()
    for (name, p), p_dev in zip(ref.named_parameters(), dev.parameters(), strict=True):
        keep = ~noise_only[name] if opt_cls is torch.optim.AdamW else torch.ones_like(p, dtype=torch.bool)
        assert_close(p_dev.cpu()[keep], p.detach()[keep], 1e-4, what=f"{backend} param {name}", scale_floor=1.0)


def test_attention_runs_the_fused_kernel_on_rocm_only():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 6, 8, requires_grad=True) for _ in range(3))
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    ref.pow(2).sum().backward()
    fwd = "aten::_scaled_dot_product_fused_attention_overrideable"
    for name in EMULATED:
        fl.set_backend(name)
        before = dict(_counts(name, fwd))
        qd, kd, vd = (t.detach().to("fl").requires_grad_() for t in (q, k, v))
        out = F.scaled_dot_product_attention(qd, kd, vd, is_causal=True)
        out.pow(2).sum().backward()
        assert_close(out, ref, what=f"sdpa on {name}")
        for a, b_ in ((qd, q), (kd, k), (vd, v)):
            assert_close(a.grad, b_.grad, what=f"sdpa grad on {name}")
        used = _counts(name, fwd).get("native", 0) - before.get("native", 0)
        assert used == (1 if name == "rocm" else 0), name
    assert _counts("rocm", fwd + "_backward").get("native", 0) >= 1


def test_conv_bn_relu_is_one_kernel_on_ascend():
    torch.manual_seed(0)
    conv, bn = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8).eval()
    with torch.no_grad():
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
    x = torch.randn(2, 3, 9, 9)
    with torch.no_grad():
        ref = torch.relu(bn(conv(x)))
        for name, path in (("ascend", "native"), ("rocm", "decomposition"), ("minimal", "decomposition")):
            fl.set_backend(name)
            c, b = copy.deepcopy(conv).to("fl"), copy.deepcopy(bn).to("fl")
            before = _counts(name, "fl::conv_bn_relu").get(path, 0)
            assert_close(conv_bn_relu(c, b, x.to("fl")), ref, what=name)
            assert _counts(name, "fl::conv_bn_relu").get(path, 0) == before + 1
    with pytest.raises(RuntimeError, match="inference kernel"):
        conv_bn_relu(conv, bn, x.requires_grad_())


def test_float64_on_ascend_falls_back_and_stays_right():
    fl.set_backend("ascend")
    a, b = torch.randn(5, 7, dtype=torch.float64), torch.randn(7, 3, dtype=torch.float64)
    assert "does not serve float64" in fl.explain("aten::mm", torch.float64).render()
    before = _counts("ascend", "aten::mm").get("fallback", 0)
    out = a.to("fl") @ b.to("fl")
    assert out.dtype == torch.float64 and out.device == fl.device("ascend")
    torch.testing.assert_close(out.cpu(), a @ b)
    assert _counts("ascend", "aten::mm").get("fallback", 0) == before + 1


def test_live_switching_keeps_tensors_on_their_backends():
    fl.set_backend("rocm")
    a = torch.randn(4, device="fl")
    fl.set_backend("ascend")
    b = torch.randn(4, device="fl")
    assert a.device == fl.device("rocm") and b.device == fl.device("ascend")
    assert torch.randn(2).to("fl").device == fl.device("ascend")  # a bare "fl" is the current device
    before = _counts("rocm", "aten::mul.Tensor").get("native", 0)
    assert_close(a * 2, a.cpu() * 2)  # still computed by rocm
    assert _counts("rocm", "aten::mul.Tensor").get("native", 0) == before + 1
    with pytest.raises(RuntimeError, match="same device"):
        a + b
    moved = a.to(b.device)
    assert moved.device == b.device and torch.equal(moved.cpu(), a.cpu())
    assert_close(moved + b, a.cpu() + b.cpu())
    second = torch.ones(3, device=fl.device("rocm", 1), requires_grad=True)
    (second * 3).sum().backward()  # backward on a second device of a second backend
    assert second.grad.device == fl.device("rocm", 1) and second.grad.cpu().tolist() == [3.0] * 3


@pytest.mark.slow  # a subprocess
def test_fl_backend_variable_selects_an_emulator():
    r = run_py(
        """
        import torch, torch_fl as fl
        fl.initialize()
        print("BACKEND", fl.get_current_backend_name(), torch.accelerator.current_accelerator())
        m = torch.nn.Linear(4, 2).to("fl")
        m(torch.randn(3, 4, device="fl")).sum().backward()
        print("GRAD", m.weight.grad.device)
    """,
        env={"FL_BACKEND": "ascend"},
    )
    assert "BACKEND ascend fl" in r.stdout, r.stdout + r.stderr
    assert "GRAD fl:1" in r.stdout, r.stdout + r.stderr


@pytest.mark.slow  # a subprocess
def test_emulator_memory_limit():
    r = run_py(
        """
        import torch, torch_fl as fl
        fl.initialize("minimal")
        try:
            torch.empty(1 << 20, device="fl")
        except torch.OutOfMemoryError as e:
            print("OOM", e)
        print("OK", torch.ones(4, device="fl").sum().item())
    """,
        env={"FL_MINIMAL_MEMORY_LIMIT": "1M"},
    )
    assert "OOM fl:" in r.stdout and "(minimal) out of memory" in r.stdout, r.stdout + r.stderr
    assert "minimal: device 0 cannot allocate" in r.stdout
    assert "OK 4.0" in r.stdout


@pytest.mark.slow  # a subprocess
def test_a_real_plugin_takes_precedence_over_the_emulator(tmp_path):
    lib = tmp_path / "librealrocm.so"
    build_test_plugin(os.path.join(TESTS, "plugins", "real", "realrocm.c"), lib)
    r = run_py(
        """
        import torch, torch_fl as fl
        print(fl.list_backends().render())
        caps = fl.capabilities("rocm")
        print("CAPS", caps.emulated, caps.plugin_path, caps.vendor)
        fl.initialize("rocm")
        x = torch.ones(3, device="fl")
        print("SUM", (x + x).cpu().tolist())
    """,
        env={"FL_PLUGIN_PATH": str(tmp_path)},
    )
    assert f"CAPS False {lib} tests (stand-in for AMD)" in r.stdout, r.stdout + r.stderr
    assert "shadowed" in r.stdout and "libfl_rocm.so" in r.stdout
    assert "SUM [2.0, 2.0, 2.0]" in r.stdout
