"""OpInfo coverage: a fixed subset of PyTorch's OpInfo ops on every backend
(forward and backward against CPU), the no-fallback mode, resuming, model
coverage and the CLI. The full run is `torch-fl coverage` (docs/coverage.md)."""

import json
import subprocess
import sys

import pytest
import torch

import torch_fl as fl
from torch_fl import opcoverage
from torch_fl.opcoverage import model_coverage, run_coverage

SUBSET = ["add", "mul", "div.no_rounding_mode", "exp", "tanh", "sum", "mean", "softmax", "matmul",
          "nn.functional.gelu", "nn.functional.layer_norm", "nn.functional.conv2d", "nn.functional.relu",
          "cumsum", "where", "cat", "transpose", "nn.functional.embedding", "empty_like", "bernoulli", "flip",
          "narrow"]


@pytest.mark.parametrize("backend", ["cpu", "rocm", "ascend", "minimal"])
def test_subset_passes_forward_and_backward_on_every_backend(backend):
    report = run_coverage(backend, SUBSET, samples=2)
    assert [r.op for r in report.results if r.status == "skip"] == []
    assert report.failures() == [], report.render()
    s = report.summary()
    assert s["forward_pass"] == s["forward_total"] == len(SUBSET)
    assert s["backward_total"] >= 14 and s["backward_pass"] == s["backward_total"]
    conv = next(r for r in report.results if r.op == "nn.functional.conv2d")
    assert conv.paths.get("fallback", 0) == 0
    if backend == "minimal":  # no convolution kernel: im2col views and bmm (torch_fl/_decompositions_nn.py)
        assert conv.paths.get("decomposition", 0) > 0


def test_no_fallback_mode_names_what_is_missing():
    report = run_coverage("minimal", ["linalg.eig", "add", "nn.functional.gelu"], samples=1,
                          cpu_fallback=False)
    by = {r.op: r for r in report.results}
    assert by["add"].status == "pass" and by["nn.functional.gelu"].status == "pass"  # native / decomposition
    inv = by["linalg.eig"]  # no kernel, and no decomposition: _decompositions_linalg has no general eigensolver
    assert inv.status == "fail" and "aten::linalg_eig (float32) cannot run on fl backend 'minimal'" in inv.reason
    assert "CPU fallback is switched off" in inv.reason
    assert fl.cpu_fallback_enabled()  # restored


def test_resume_from_state_file(tmp_path, monkeypatch):
    state = str(tmp_path / "state.jsonl")
    first = run_coverage("rocm", ["add", "exp"], samples=1, state_file=state)
    assert len(open(state).readlines()) == 2

    def boom(*a, **k):
        raise AssertionError("finished ops must not run again")

    monkeypatch.setattr(opcoverage, "run_one", boom)
    again = run_coverage("rocm", ["add", "exp"], samples=1, state_file=state)
    assert [r.op for r in again.results] == [r.op for r in first.results]


def test_model_coverage_lists_paths_per_backend():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.LayerNorm(8), torch.nn.GELU())
    cov = model_coverage(model, torch.randn(3, 4), backends=["rocm", "minimal"])
    assert cov["rocm"]["aten::native_layer_norm"]["path"] == "native"
    assert cov["minimal"]["aten::native_layer_norm"]["path"] == "decomposition"
    assert cov["minimal"]["aten::native_layer_norm"]["kernels"] > cov["rocm"]["aten::native_layer_norm"]["kernels"]


def test_cli_reports_json():
    r = subprocess.run([sys.executable, "-m", "torch_fl.cli", "coverage", "--backend", "ascend", "--ops", "exp",
                        "--samples", "1", "--json"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["summary"]["forward_pass"] == 1 and data["results"][0]["op"] == "exp"
    assert data["results"][0]["paths"]["native"] >= 1


def test_settings_restored_when_opinfo_import_fails(monkeypatch):
    """Issue 13: a failed OpInfo import (numpy missing) left the fallback off for the rest of the process."""
    monkeypatch.setitem(sys.modules, "torch.testing._internal.common_methods_invocations", None)
    assert fl.cpu_fallback_enabled()
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    with pytest.raises(ImportError):
        run_coverage("minimal", ["add"], cpu_fallback=False)
    assert fl.cpu_fallback_enabled()
    assert torch.equal(torch.rand(3), expected)  # the random state too
