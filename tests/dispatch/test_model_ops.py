"""Ops the model zoo found running on the host (the CPU fallback) on every
backend, now with device paths: torch._grouped_mm (mixture-of-experts layers:
Mixtral, Qwen2-MoE), _weight_norm_interface_backward (Wav2Vec2's weight-normed
position convolution), and prims.sub / prims.add (what PyTorch's own
decompositions bottom out in on a chip without the fused op, e.g. Llama's
RMSNorm on the minimal chip). Each runs on the bring-up chip with the CPU
fallback off and matches PyTorch on the CPU, forward and backward."""

import torch
from conftest import same_as_cpu
from torch import nn


def _grouped_case():
    torch.manual_seed(0)
    x = torch.randn(10, 8)  # CPU's kernel wants 16-byte strides
    w = torch.randn(3, 8, 4)
    offs = torch.tensor([4, 4, 10], dtype=torch.int32)  # an empty group (rows no group covers: unspecified)
    return x, w, offs


def test_grouped_mm_forward_and_backward_stay_on_the_device(minimal_no_fallback):
    x, w, offs = _grouped_case()
    xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
    proj = torch.randn(10, 4)  # a dense gradient: CPU's kernel rejects sum()'s stride-0 one
    want = torch._grouped_mm(xs, ws.transpose(-2, -1).contiguous().transpose(-2, -1), offs)
    (want * proj).sum().backward()
    xf, wf = x.to("fl").requires_grad_(), w.to("fl").requires_grad_()
    got = torch._grouped_mm(xf, wf.transpose(-2, -1).contiguous().transpose(-2, -1), offs.to("fl"))
    (got * proj.to("fl")).sum().backward()
    same_as_cpu(want.detach(), got.detach())
    same_as_cpu(xs.grad, xf.grad)
    same_as_cpu(ws.grad, wf.grad)


def test_weight_norm_backward_stays_on_the_device(minimal_no_fallback):
    torch.manual_seed(0)
    conv = nn.utils.parametrizations.weight_norm(nn.Conv1d(4, 4, 3, padding=1, groups=2), name="weight", dim=2)
    x = torch.randn(2, 4, 7)
    conv(x).pow(2).sum().backward()
    want = [p.grad.clone() for p in conv.parameters()]
    conv.zero_grad()
    dev = conv.to("fl")
    dev(x.to("fl")).pow(2).sum().backward()
    for a, b in zip(want, (p.grad for p in dev.parameters()), strict=True):
        same_as_cpu(a, b)


def test_prims_add_and_sub_stay_on_the_device(minimal_no_fallback):
    a, b = torch.randn(5), torch.randn(5)
    same_as_cpu(a - b, torch.ops.prims.sub.default(a.to("fl"), b.to("fl")))
    same_as_cpu(a + b, torch.ops.prims.add.default(a.to("fl"), b.to("fl")))
