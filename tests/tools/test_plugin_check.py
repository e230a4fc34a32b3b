"""`torch-fl plugin check`: the template passes; each deliberately broken
plugin is reported by name, with the reason, and never crashes the checker."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from torch_fl.runtime import get_include
from torch_fl.tools.checker import check_plugin

pytestmark = pytest.mark.slow  # compiles a plugin per case

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _rows(report) -> dict:
    return {r.check: r for r in report.rows}


@pytest.fixture(scope="module")
def template_lib(tmp_path_factory):
    """Builds plugins_cffi/template the way its README says (make, FL_INCLUDE)."""
    out = tmp_path_factory.mktemp("template")
    for name in ("fl_template.c", "Makefile"):
        shutil.copy(os.path.join(ROOT, "plugins_cffi", "template", name), out / name)
    subprocess.run(["make", "-C", str(out), f"FL_INCLUDE={get_include()}"], check=True, capture_output=True)
    return out / "libfl_template.so"


def test_template_plugin_passes(template_lib):
    r = subprocess.run(
        [sys.executable, "-m", "torch_fl.cli", "plugin", "check", str(template_lib)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "PASSED" in r.stdout
    for check in (
        "load",
        "copy round trip h2d->d2d->d2h",
        "allocation beyond capacity",
        "kernel aten::mm",
        "kernel aten::add.Tensor",
    ):
        assert any(line.startswith(check) and " PASS " in line for line in r.stdout.splitlines()), check
    # each check is said on stderr as it is decided: minutes of checking are not silent
    progress = [line for line in r.stderr.splitlines() if line.startswith("[")]
    assert progress[0] == "[1] plugin check: PASS load", r.stderr[-2000:]
    assert len(progress) == len(r.stdout.strip().splitlines()) - 3, r.stderr[-2000:]


def test_wrong_answers_crashes_duplicates_and_contract_violations(test_plugins):
    report = check_plugin(str(test_plugins / "libwrongplugin.so"))
    rows = _rows(report)
    assert not report.passed
    assert rows["kernel aten::add.Tensor"].status == "FAIL" and "max error" in rows["kernel aten::add.Tensor"].detail
    assert rows["kernel aten::relu"].status == "FAIL" and "SIGSEGV" in rows["kernel aten::relu"].detail
    assert rows["kernel aten::mm"].status == "FAIL" and "mm unit offline" in rows["kernel aten::mm"].detail
    assert rows["kernel table duplicates"].status == "FAIL" and "aten::mm" in rows["kernel table duplicates"].detail
    assert rows["copy with a NULL pointer"].status == "FAIL"
    assert rows["mem_set"].status == "FAIL" and "bytes as expected: False" in rows["mem_set"].detail
    assert rows["copy round trip h2d->d2d->d2h"].status == "PASS"  # the checks after the crash still ran


def test_kernel_errors_and_declines_are_reported(test_plugins):
    rows = _rows(check_plugin(str(test_plugins / "liberrplugin.so")))
    assert rows["kernel aten::mul.Tensor"].status == "FAIL"
    assert "the multiplier unit is on fire" in rows["kernel aten::mul.Tensor"].detail
    assert rows["kernel aten::add.Tensor"].status == "FAIL"
    assert "declined all" in rows["kernel aten::add.Tensor"].detail


@pytest.mark.parametrize(
    "lib,reason",
    [
        ("libbad_abi.so", "ABI version"),
        ("libmissing_symbol.so", "missing exported symbol"),
        ("libnot_a_plugin.so", "not a loadable shared library"),
    ],
)
def test_unloadable_plugins_fail_at_load(test_plugins, lib, reason):
    r = subprocess.run(
        [sys.executable, "-m", "torch_fl.cli", "plugin", "check", str(test_plugins / lib), "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 1, r.stdout + r.stderr
    report = json.loads(r.stdout)
    assert report["passed"] is False
    assert report["rows"][0]["check"] == "load" and report["rows"][0]["status"] == "FAIL"
    assert reason in report["rows"][0]["detail"]


def test_check_by_backend_name_and_bad_targets():
    report = check_plugin("minimal", ops="aten::exp")
    rows = _rows(report)
    assert report.passed and rows["kernel aten::exp"].status == "PASS"
    assert "float32,bfloat16" in rows["kernel aten::exp"].detail
    missing = check_plugin("/nonexistent/libnothing.so")
    assert not missing.passed and "no such file" in missing.rows[0].detail
    unknown = check_plugin("no_such_backend")
    assert not unknown.passed and "unknown fl backend" in unknown.rows[-1].detail


def test_the_channels_last_convolution_kernels_are_checked():
    """ascend's fl::conv2d_nhwc and its backward against the CPU references, NHWC and NCHW inputs, every
    output_mask the layout pass passes."""
    rows = _rows(check_plugin("ascend", ops="fl::conv2d_nhwc*", progress=False))
    for op in ("fl::conv2d_nhwc", "fl::conv2d_nhwc_backward"):
        assert rows[f"kernel {op}"].status == "PASS" and "match PyTorch CPU" in rows[f"kernel {op}"].detail, op


def test_a_folder_named_like_a_backend_does_not_hide_it(tmp_path, monkeypatch):
    # found when the tests moved into tests/opencl/: `torch-fl plugin check opencl` run from tests/ checked the
    # folder ./opencl ("not found by discovery") instead of the opencl backend
    (tmp_path / "minimal").mkdir()
    monkeypatch.chdir(tmp_path)
    report = check_plugin("minimal", ops="aten::exp", progress=False)
    assert report.passed, report.render() if hasattr(report, "render") else report.rows
    assert _rows(report)["kernel aten::exp"].status == "PASS"


def test_missing_python_module_is_blamed_on_the_environment(tmp_path):
    """Issue 13: without numpy (OpInfo's samples import it) the checker said 'the plugin crashed the process'
    and cut the message before the module's name. A package that raises what a missing one does stands in."""
    (tmp_path / "numpy").mkdir()
    (tmp_path / "numpy" / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'numpy'\", name='numpy')\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p)}
    r = subprocess.run(
        [sys.executable, "-m", "torch_fl.cli", "plugin", "check", "minimal", "--ops", "aten::mm"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    out = " ".join(r.stdout.split())
    assert r.returncode == 1, r.stdout + r.stderr
    assert "crashed" not in out, out
    assert (
        "recording samples FAIL the environment, not the plugin: Python module 'numpy' is not installed" in out
        and "pip install numpy" in out
    ), out


def test_writes_past_the_output_fail_with_the_op_and_the_size(test_plugins):
    """sloppydev's add and mul compute the right values but write 4 and 64 floats past their output:
    that passed the checker, then corrupted the heap of a real run."""
    report = check_plugin(str(test_plugins / "libsloppyplugin.so"), ops="aten::[amn]*")
    rows = _rows(report)
    assert not report.passed
    assert rows["kernel aten::add.Tensor"].status == "FAIL"
    assert "the kernel wrote 16 bytes past the end of output 0" in rows["kernel aten::add.Tensor"].detail
    assert rows["kernel aten::mul.Tensor"].status == "FAIL"
    assert "the kernel wrote 256 bytes past the end of output 0" in rows["kernel aten::mul.Tensor"].detail
    assert rows["kernel aten::neg"].status == "PASS"  # a kernel that stays in bounds passes


def test_optional_rng_left_null_is_skipped_with_a_note(test_plugins):
    rows = _rows(check_plugin(str(test_plugins / "libsloppyplugin.so"), ops="aten::neg"))
    assert rows["rng state round trip"].status == "SKIP"
    assert "not provided (optional" in rows["rng state round trip"].detail


def test_hanging_kernel_is_stopped_by_the_timeout(test_plugins):
    """sloppydev's relu never returns: the check of it fails after --timeout seconds and the
    checks after it still run (the stdout read used to block before the timeout was looked at)."""
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch_fl.cli",
            "plugin",
            "check",
            str(test_plugins / "libsloppyplugin.so"),
            "--ops",
            "aten::[nr]e*",
            "--timeout",
            "20",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 1, r.stdout + r.stderr
    rows = {row["check"]: row for row in json.loads(r.stdout)["rows"]}
    assert rows["kernel aten::relu"]["status"] == "FAIL"
    assert rows["kernel aten::relu"]["detail"].startswith("did not finish within 20 s")
    assert rows["kernel aten::neg"]["status"] == "PASS"


def test_timeout_must_be_positive():
    r = subprocess.run(
        [sys.executable, "-m", "torch_fl.cli", "plugin", "check", "minimal", "--timeout", "0"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 2 and "argument --timeout: '0' is not a positive number of seconds" in r.stderr


def test_ops_matching_nothing_is_an_error():
    report = check_plugin("minimal", ops="aten::no_such_op*")
    rows = _rows(report)
    assert not report.passed
    assert rows["kernel selection"].status == "FAIL"
    assert "--ops 'aten::no_such_op*' matches none of the plugin's" in rows["kernel selection"].detail


def test_a_freed_guarded_block_is_forgotten():
    """The checker reads a guarded tensor's canary zones by its block's address. Once the tensor is gone the
    address belongs to the next allocation (often smaller, unguarded): reading "its guards" then ran past
    that allocation (a plugin error on opencl) or reported damage that was not there."""
    import torch

    import torch_fl as fl
    from torch_fl.runtime import REGISTRY, base_ptr
    from torch_fl.tools.checker.guarded import GuardedMemory

    fl.initialize("minimal")
    dev = REGISTRY.current_device
    guard = GuardedMemory(dev.plugin)
    g = guard.empty(dev, (64,), (1,), 0, torch.float32)
    ptr = base_ptr(g)
    assert ptr in guard.blocks and guard.damage(g) is None
    g.fill_(1.0)
    assert guard.damage(g) is None
    del g
    assert ptr not in guard.blocks
    plain = torch.ones(8, device="fl")
    assert guard.damage(plain) is None


def test_tie_order_is_free_but_indices_must_pick_the_values():
    """An unstable sort or topk may order equal values its own way: the checker compares the values, and
    checks that the indices pick those values out of the input, instead of PyTorch's positions."""
    import torch

    from torch_fl.dispatch import facts
    from torch_fl.tools.checker.kernels import Outcome, _check_indices, _tie_free_indices

    x = torch.tensor([[3.0, 1.0, 3.0, 2.0], [5.0, 5.0, float("nan"), 0.0]])
    f = facts(torch.ops.aten.topk.default)
    vals = [x.to("fl"), 2, 1, True, True]
    values, expected = torch.topk(x, 2, 1)
    assert _tie_free_indices(f, vals, (values, expected), (values, expected))
    tie_swapped = torch.tensor([[2, 0], [2, 1]])  # the other 3.0 first; nan, then the other 5.0
    out = Outcome()
    _check_indices(f, vals, values, tie_swapped, expected, "topk", out)
    assert not out.failures and not torch.equal(tie_swapped, expected)
    _check_indices(f, vals, values, torch.tensor([[0, 3], [2, 0]]), expected, "topk", out)
    assert out.failures == ["topk: 1 of 4 indices do not point at the value returned beside them"]
    out = Outcome()
    _check_indices(f, vals, values, torch.tensor([[0, 4], [2, 0]]), expected, "topk", out)
    assert out.failures == ["topk: indices out of range for dim 1 of size 4"]
    stable = facts(torch.ops.aten.sort.stable)
    assert not _tie_free_indices(stable, [x.to("fl"), True, 1, False], (values, expected), (values, expected))
    assert _tie_free_indices(stable, [x.to("fl"), None, 1, False], (values, expected), (values, expected))
    median = facts(torch.ops.aten.median.dim)
    v, i = torch.median(x[:1], 1)  # keepdim=False: the indices lack dim
    out = Outcome()
    _check_indices(median, [x[:1].to("fl"), 1, False], v, torch.tensor([3]), i, "median", out)
    assert not out.failures
