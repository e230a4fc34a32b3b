"""The Torch-FL article's two scripts on every backend, judged against float64: each
backend's error no worse than 10x native float32's.

* Transformer: 6 x nn.TransformerEncoderLayer(d_model=512, nhead=8,
  batch_first=True, dropout=0.0), input 4 x 64 x 512, loss (out * R).sum().
  Measured naively, rocm/ascend/minimal looked 1e-2 off in their gradients
  (native float32: 5e-7): one ReLU input 1e-7 from 0 rounds to the other side
  on their GEMM, and that element's gradient changes by O(1). Native float32
  does the same with other seeds (seed 4: 1.2e-2, where rocm is at 8e-7).
  `torch_fl.tools.numerics` judges against a float64 run that takes the float32
  run's branch where float64's value is within rounding of it; then every
  backend is at native level, and a flip beyond rounding would still fail.
* ResNet-50-style: Bottleneck blocks [3, 4, 6, 3] (torch_fl.tools.zoo.ResNet,
  width 8), batch norm in training mode, max pooling, input 4 x 3 x 64 x 64."""

import copy

import pytest
import torch
from torch import nn

import torch_fl as fl
from torch_fl.tools.numerics import Float64Comparison, Float64Reference, record
from torch_fl.tools.zoo import ResNet

pytestmark = pytest.mark.slow  # the Torch-FL article's two scripts on every backend

BACKENDS = ["cpu", "rocm", "ascend", "minimal"]


def _transformer():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(d_model=512, nhead=8, batch_first=True, dropout=0.0)
    model = nn.TransformerEncoder(layer, num_layers=6, enable_nested_tensor=False)
    return model, torch.randn(4, 64, 512), torch.randn(4, 64, 512)


def _resnet():
    torch.manual_seed(0)
    return ResNet((3, 4, 6, 3), num_classes=10, width=8), torch.randn(4, 3, 64, 64), torch.randn(4, 10)


class _Script:
    """One script's run(device, dtype) and its backend-independent native float32 baseline."""

    def __init__(self, build):
        self.model, self.x, self.weights = build()
        self.reference = Float64Reference(self.run)
        self.native = self.reference.against(record(self.run, "cpu"))

    def run(self, device, dtype):
        m = copy.deepcopy(self.model).to(dtype).to(device)
        out = m(self.x.to(dtype).to(device))
        (out * self.weights.to(dtype).to(device)).sum().backward()
        return {"output": out, **{f"grad.{n}": p.grad for n, p in m.named_parameters()}}


_SCRIPTS: dict = {}


def _script(name):
    if name not in _SCRIPTS:
        _SCRIPTS[name] = _Script({"transformer": _transformer, "resnet": _resnet}[name])
    return _SCRIPTS[name]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", ["transformer", "resnet"])
def test_article_script_within_10x_of_native_float32(name, backend):
    script = _script(name)
    fl.set_backend(backend)
    cmp = Float64Comparison(script.reference.against(record(script.run, "fl")), script.native)
    assert cmp.ok, cmp.summary()
    assert cmp.device.unmatched_flips == 0 and cmp.device.aligned


def test_without_branch_matching_one_rounding_flip_looks_like_a_1e2_error():
    """Why the comparison matches branches: with the band at 0 (float64 keeps its own ReLU decisions),
    rocm's run of the Transformer is 1e-2 off float64 in one layer's gradients while native float32
    is at 5e-7; matched, rocm is at native level (the test above)."""
    script = _script("transformer")
    fl.set_backend("rocm")
    rec = record(script.run, "fl")
    naive = Float64Reference(script.run, band=0.0).against(rec)
    matched = script.reference.against(rec)
    assert naive.worst > 1e-3 and naive.unmatched_flips == 1 and naive.flips == 0
    assert matched.flips == 1 and matched.unmatched_flips == 0 and matched.worst < 1e-5
    assert naive.worst_name.startswith("grad.layers.4.linear1.")
