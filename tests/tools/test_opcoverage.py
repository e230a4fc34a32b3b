"""OpInfo coverage: a fixed subset of PyTorch's OpInfo ops on every backend
(forward and backward against CPU), the no-fallback mode, resuming, model
coverage and the CLI. The full run is `torch-fl coverage` (docs/coverage.md)."""

import json
import subprocess
import sys

import pytest
import torch

import torch_fl as fl
from torch_fl.tools import coverage
from torch_fl.tools.coverage import align_vectors, model_coverage

pytestmark = pytest.mark.slow  # OpInfo ops forward and backward on every backend

SUBSET = [
    "add",
    "mul",
    "div.no_rounding_mode",
    "exp",
    "tanh",
    "sum",
    "mean",
    "softmax",
    "matmul",
    "nn.functional.gelu",
    "nn.functional.layer_norm",
    "nn.functional.conv2d",
    "nn.functional.relu",
    "cumsum",
    "where",
    "cat",
    "transpose",
    "nn.functional.embedding",
    "empty_like",
    "bernoulli",
    "flip",
    "narrow",
]


@pytest.mark.parametrize("backend", ["cpu", "rocm", "ascend", "minimal"])
def test_subset_passes_forward_and_backward_on_every_backend(backend):
    report = fl.coverage(backend, SUBSET, samples=2)
    assert [r.op for r in report.results if r.status == "skip"] == []
    assert report.failures() == [], report.render()
    s = report.summary()
    assert s["forward_pass"] == s["forward_total"] == len(SUBSET)
    assert s["backward_total"] >= 14 and s["backward_pass"] == s["backward_total"]
    conv = next(r for r in report.results if r.op == "nn.functional.conv2d")
    assert conv.paths.get("fallback", 0) == 0
    if backend == "minimal":  # no convolution kernel: im2col views and bmm (torch_fl/dispatch/decompositions/nn.py)
        assert conv.paths.get("decomposition", 0) > 0


def test_no_fallback_mode_names_what_is_missing():
    report = fl.coverage("minimal", ["linalg.eig", "add", "nn.functional.gelu"], samples=1, cpu_fallback=False)
    by = {r.op: r for r in report.results}
    assert by["add"].status == "pass" and by["nn.functional.gelu"].status == "pass"  # native / decomposition
    inv = by["linalg.eig"]  # no kernel, and no decomposition: decompositions/linalg.py has no general eigensolver
    assert inv.status == "fail" and "aten::linalg_eig (float32) cannot run on fl backend 'minimal'" in inv.reason
    assert "CPU fallback is switched off" in inv.reason
    assert fl.cpu_fallback_enabled()  # restored


def test_resume_from_state_file(tmp_path, monkeypatch):
    state = str(tmp_path / "state.jsonl")
    first = fl.coverage("rocm", ["add", "exp"], samples=1, state_file=state)
    assert len(open(state).readlines()) == 2

    def boom(*a, **k):
        raise AssertionError("finished ops must not run again")

    monkeypatch.setattr(coverage, "run_one", boom)
    again = fl.coverage("rocm", ["add", "exp"], samples=1, state_file=state)
    assert [r.op for r in again.results] == [r.op for r in first.results]


def test_model_coverage_lists_paths_per_backend():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.LayerNorm(8), torch.nn.GELU())
    cov = model_coverage(model, torch.randn(3, 4), backends=["rocm", "minimal"])
    assert cov["rocm"]["aten::native_layer_norm"]["path"] == "native"
    assert cov["minimal"]["aten::native_layer_norm"]["path"] == "decomposition"
    assert cov["minimal"]["aten::native_layer_norm"]["kernels"] > cov["rocm"]["aten::native_layer_norm"]["kernels"]


def test_cli_reports_json():
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch_fl.cli",
            "coverage",
            "--backend",
            "ascend",
            "--ops",
            "exp",
            "--samples",
            "1",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
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
        fl.coverage("minimal", ["add"], cpu_fallback=False)
    assert fl.cpu_fallback_enabled()
    assert torch.equal(torch.rand(3), expected)  # the random state too


@pytest.mark.parametrize("backend", ["cpu", "rocm", "ascend", "minimal"])
def test_sign_free_vectors_and_partial_views_pass_with_every_sample(backend):
    """Every OpInfo sample (not only the first few): eigenvectors are compared up to each vector's
    sign, and partial views keep the storage they view part of, as a sample made on the device would."""
    report = fl.coverage(backend, ["matrix_exp", "linalg.eigh", "as_strided.partial_views"], samples=1000)
    assert report.failures() == [], report.render()
    assert all(r.samples >= 2 for r in report.results), [(r.op, r.samples) for r in report.results]


@pytest.mark.parametrize("backend", ["cpu", "minimal"])  # LAPACK's SVD, and torch_fl's decomposition
def test_singular_vectors_are_compared_up_to_sign_and_completion_basis(backend):
    """The first 48 samples include full_matrices=True on 3x5 inputs: the two vectors completing
    Vh's basis span the null space, in any orthonormal basis; they are compared up to rotation."""
    report = fl.coverage(backend, ["linalg.svd", "svd"], samples=48)
    assert report.failures() == [], report.render()


@pytest.mark.parametrize("backend", ["cpu", "minimal"])
def test_bfloat16_matrix_exp_is_judged_against_float64_where_cpu_gives_nan(backend):
    """PyTorch's CPU matrix_exp returns NaN for these bfloat16 samples; float64 decides, and the
    device computes in float32 and rounds once (in bfloat16 throughout, entries changed sign)."""
    report = fl.coverage(backend, ["matrix_exp"], dtype=torch.bfloat16, samples=10)
    assert report.failures() == [], report.render()


def test_vector_alignment_excuses_signs_only():
    """align_vectors negates a vector that is the CPU's negated, and leaves a wrong one wrong."""
    torch.manual_seed(0)
    q, _ = torch.linalg.qr(torch.randn(5, 5))
    flipped = q * torch.tensor([1.0, -1.0, 1.0, -1.0, 1.0])
    torch.testing.assert_close(align_vectors(flipped, q, -2, None), q)
    wrong = flipped.clone()
    wrong[:, 2] = q[:, 3]
    assert not torch.allclose(align_vectors(wrong, q, -2, None), q, atol=1e-3)
    rows = align_vectors(flipped.mT, q.mT, -1, None)  # vectors as rows (linalg.svd's Vh)
    torch.testing.assert_close(rows, q.mT)
    # past k (full_matrices' completion): a rotation within the span is accepted, leaving it is not
    c, s = 0.6, 0.8
    rot = q.clone()
    rot[:, 3], rot[:, 4] = c * q[:, 3] + s * q[:, 4], -s * q[:, 3] + c * q[:, 4]
    torch.testing.assert_close(align_vectors(rot, q, -2, 3), q)
    assert not torch.allclose(align_vectors(rot, q, -2, 4), q, atol=1e-3)


def test_coverage_runs_opinfo_names_and_points_operator_names_to_the_path_table():
    """fl.coverage is what `torch-fl coverage` runs (OpInfo names and globs); an operator name, which the path
    table takes, is an error naming fl.path_table instead of a run that matches nothing."""
    with pytest.raises(ValueError, match=r"not operator names such as 'aten::mm'.*fl\.path_table"):
        fl.coverage("minimal", ["add", "aten::mm"])
    with pytest.raises(ValueError, match="fl.path_table"):
        fl.coverage("minimal", "exp,aten::exp")
    table = fl.path_table("minimal", ops=["aten::mm"], dtypes=("float32",))
    assert list(table.rows) == ["aten::mm"] and table.rows["aten::mm"]["float32"] in (
        "native",
        "decomposition",
        "jit",
        "fallback",
    )
