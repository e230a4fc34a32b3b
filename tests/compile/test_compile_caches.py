"""Values torch.compile(backend="fl") caches across calls (a Conv+BN fold, packed QKV weights, channels-last weight
copies) follow every way users change weights: p.data edits (hand-written clipping, EMA), torch.no_grad() in-place
updates, load_state_dict, optimizer steps, and models whose parameters are inference tensors. Before
runtime.watch, the caches were keyed on (data_ptr, _version), which a p.data edit does not bump (max error ~1.0
against eager) and an inference tensor does not have (a RuntimeError)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import torch_fl as fl

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


@pytest.fixture(params=["cpu", "rocm", "ascend", "minimal"])
def backend(request):
    fl.set_backend(request.param)
    yield request.param
    fl.set_backend("cpu")


class ConvBN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 4, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(4)

    def forward(self, x):
        return self.bn2(self.conv2(torch.relu(self.bn(self.conv(x)))))


class Attention(nn.Module):
    def __init__(self, d: int = 16):
        super().__init__()
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, x):
        q, k, v = self.q(x), self.k(x), self.v(x)
        return torch.softmax(q @ k.transpose(-1, -2) / 4.0, -1) @ v


def _close(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    got, want = got.detach().cpu().double(), want.detach().cpu().double()
    err = (got - want).abs().max().item()
    assert err <= 1e-4 * max(1.0, want.abs().max().item()), f"{what}: compiled differs from eager by {err:.3g}"


def _edits(model: nn.Module) -> dict:
    other = copy.deepcopy(model)
    for p in other.parameters():
        p.data.mul_(-0.7)
    state = other.state_dict()
    params = list(model.parameters())

    def sgd():
        opt = torch.optim.SGD(params, lr=0.5)
        for p in params:
            p.grad = torch.ones_like(p)
        opt.step()

    return {
        "p.data.mul_ (hand-written clipping)": lambda: [p.data.mul_(0.5) for p in params],
        "EMA through p.data": lambda: [p.data.lerp_(torch.ones_like(p.data), 0.3) for p in params],
        "in-place under torch.no_grad()": lambda: [p.add_(0.1) for p in params],
        "load_state_dict": lambda: model.load_state_dict(state),
        "optimizer step": sgd,
        "buffer through .data": lambda: [b.data.add_(0.5) for b in model.buffers() if b.is_floating_point()],
    }


@pytest.mark.parametrize("replay", [False, True], ids=["compiled", "replayed"])
@pytest.mark.parametrize("kind", ["conv_bn", "attention"])
def test_compiled_inference_sees_every_weight_change(backend, kind, replay):
    torch.manual_seed(0)
    model = (ConvBN() if kind == "conv_bn" else Attention()).to("fl").eval()
    x = torch.randn(2, 3, 8, 8).to("fl") if kind == "conv_bn" else torch.randn(2, 5, 16).to("fl")
    compiled = torch.compile(model, backend="fl", options={"replay": replay})
    for what, edit in _edits(model).items():
        with torch.no_grad():  # every edit runs under no_grad, as user code makes them
            for _ in range(3):  # the cache is filled (and, replayed, the graph recorded and replayed)
                compiled(x)
            edit()
            for _ in range(3):
                _close(compiled(x), model(x), f"{kind} on {backend} after {what}")
    if replay:
        status = fl.fusion_report(compiled).graphs[0].replay
        assert status.replays > 0, f"{kind} on {backend} was not replayed: {status}"


def test_inference_tensor_parameters(backend):
    """A model moved under torch.inference_mode() has inference tensors as parameters, which have no version
    counter; compiled Conv+BN must run on them and see their in-place updates."""
    torch.manual_seed(0)
    with torch.inference_mode():
        model = ConvBN().to("fl").eval()
        x = torch.randn(2, 3, 8, 8).to("fl")
        compiled = torch.compile(model, backend="fl")
        _close(compiled(x), model(x), f"inference tensors on {backend}")
        model.conv.weight.mul_(0.5)
        _close(compiled(x), model(x), f"inference tensors on {backend}, after an in-place update")
