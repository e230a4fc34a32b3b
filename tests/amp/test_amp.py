"""Mixed precision on fl: torch.autocast("fl") with CUDA's casting policy, the
dtype chosen from the capability table, GradScaler for fp16, and per-module
float32 overrides."""

import copy

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_close
from torch import nn

import torch_fl as fl

CHOICE = {"cpu": torch.bfloat16, "rocm": torch.float16, "ascend": torch.float16, "minimal": torch.bfloat16}


@pytest.mark.parametrize("backend", list(CHOICE))
def test_autocast_picks_the_capability_dtype_and_casts_like_cuda(backend):
    fl.set_backend(backend)
    assert fl.amp.autocast_dtype() == CHOICE[backend]
    assert CHOICE[backend] in torch.fl.get_amp_supported_dtype()
    x, w = torch.randn(4, 6, device="fl"), torch.randn(5, 6, device="fl")
    with fl.autocast():
        y = F.linear(x, w)  # lower precision
        s = torch.softmax(y, -1)  # float32
        c = torch.cat([y, x[:, :5]])  # widest input
        ln = F.layer_norm(y, (5,))  # float32
        z = x + 1  # untouched
    assert y.dtype == CHOICE[backend] and s.dtype == torch.float32
    assert c.dtype == torch.float32 and ln.dtype == torch.float32 and z.dtype == torch.float32
    assert y.device == fl.device(backend)
    ref = F.linear(x.cpu().to(CHOICE[backend]).float(), w.cpu().to(CHOICE[backend]).float())
    assert_close(y.float(), ref, 1e-2, what="autocast linear")


def test_minimal_chip_has_no_float16():
    fl.set_backend("minimal")
    assert torch.fl.get_amp_supported_dtype() == [torch.bfloat16]
    with pytest.raises(ValueError, match="does not compute in torch.float16.*bfloat16"):
        fl.autocast(dtype=torch.float16)


def test_torch_autocast_directly_and_backward():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))
    dev = copy.deepcopy(model).to("fl")
    x = torch.randn(6, 8)
    with torch.autocast("fl", dtype=torch.bfloat16):
        out = dev(x.to("fl"))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = model(x)
    assert out.dtype == torch.bfloat16
    assert_close(out.float(), ref.float(), 2e-2, what="bf16 forward vs CPU autocast")
    out.float().pow(2).mean().backward()
    ref.float().pow(2).mean().backward()
    for (name, p), p_dev in zip(model.named_parameters(), dev.parameters(), strict=True):
        assert p_dev.grad.dtype == torch.float32 and p_dev.grad.device.type == "fl"
        assert_close(p_dev.grad, p.grad, 5e-2, what=f"bf16 grad {name}")


def test_grad_scaler_fp16_on_rocm():
    fl.set_backend("rocm")  # device memory kept apart: the unscale must write back to the device
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)).to("fl")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("fl")
    assert isinstance(fl.amp.GradScaler(), torch.amp.GradScaler)
    x, y = torch.randn(32, 8, device="fl"), torch.randn(32, 1, device="fl")
    losses = []
    for _ in range(4):
        opt.zero_grad()
        with fl.autocast():
            loss = F.mse_loss(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        losses.append(loss.item())
    assert losses == sorted(losses, reverse=True) and losses[-1] < losses[0]
    assert scaler.get_scale() == 2.0**16
    # an overflowing step is skipped and the scale backs off
    opt.zero_grad()
    with fl.autocast():
        loss = F.mse_loss(model(x), y) * 1e30
    scaler.scale(loss).backward()
    before = [p.detach().cpu().clone() for p in model.parameters()]
    scaler.step(opt)
    scaler.update()
    assert all(torch.equal(b, p.detach().cpu()) for b, p in zip(before, model.parameters(), strict=True))
    assert scaler.get_scale() == 2.0**15


class Head(nn.Linear):
    """A module type a user wants kept in float32 (a linear would otherwise run in fp16)."""


def test_keep_float32_pins_module_types():
    fl.set_backend("rocm")
    model = nn.Sequential(nn.Linear(8, 8), Head(8, 8), nn.LayerNorm(8)).to("fl")
    assert fl.keep_float32(model, Head) == [model[1]]
    seen = {}
    for name, m in model.named_children():
        m.register_forward_hook(lambda mod, inp, out, name=name: seen.__setitem__(name, (inp[0].dtype, out.dtype)))
    with fl.autocast():
        model(torch.randn(2, 8, device="fl"))
    assert seen["0"][1] == torch.float16  # autocast as usual
    assert seen["1"] == (torch.float16, torch.float32)  # gets fp16, computes and returns fp32
    assert fl.keep_float32(model, Head) == []  # idempotent
    assert fl.keep_float32(model) == [model[2]]  # default: the norm layers
    out = model(torch.randn(2, 8, device="fl"))  # outside autocast nothing changes
    assert out.dtype == torch.float32
