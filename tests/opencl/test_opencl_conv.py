"""The OpenCL plugin's convolution kernels (aten::convolution, aten::convolution_backward in
plugins_cffi/opencl/ocl_conv.c, im2col / col2im / gemm_nt in kernels_cl.h).

Each case runs forward and backward on the opencl device in float32 and is judged against float64 on the CPU,
relative to what native float32 CPU PyTorch gets wrong on the same case: the device's error (output and every
gradient) must stay within ten times native float32's, with a floor at a few float32 roundings. Each case must
also have run as the plugin's kernels (fl.profile says "native" for both ops), not the runtime's decomposition.
The cases run in one fresh process (plugin discovery happens once per process) and report as JSON."""

import ctypes.util
import json
import subprocess
import sys

import pytest
from conftest import HERE, run_py
from test_opencl import _require_opencl

pytestmark = pytest.mark.slow  # OpenCL programs built by the driver, fresh processes

_CASES = """
import json, torch, torch_fl as fl
import torch.nn.functional as F
fl.initialize("opencl")

def conv(stride=1, padding=0, dilation=1, groups=1, view=None, transposed=False, output_padding=0):
    def fn(x, w, b=None):
        if view is not None:
            x = view(x)
        if transposed:
            f = F.conv_transpose1d if x.dim() == 3 else F.conv_transpose2d
            return f(x, w, b, stride, padding, output_padding, groups, dilation)
        f = {3: F.conv1d, 4: F.conv2d, 5: F.conv3d}[x.dim()]
        return f(x, w, b, stride, padding, dilation, groups)
    return fn

# name: (input leaf shape, weight shape, bias?, forward)
CASES = {
    "3x3 padding 1, bias, batch 3": ((3, 4, 9, 9), (6, 4, 3, 3), True, conv(padding=1)),
    "stride 2, padding 3, 7x7": ((2, 3, 20, 20), (5, 3, 7, 7), True, conv(stride=2, padding=3)),
    "dilation 2, stride (2, 1)": ((2, 4, 12, 11), (6, 4, 3, 2), True, conv(stride=(2, 1), padding=(2, 1), dilation=2)),
    "groups 2": ((3, 4, 10, 11), (6, 2, 3, 3), True, conv(stride=2, padding=1, groups=2)),
    "depthwise": ((2, 8, 9, 9), (8, 1, 3, 3), True, conv(padding=1, groups=8)),
    "no bias, batch 1": ((1, 5, 8, 7), (4, 5, 3, 3), False, conv(padding=(0, 1))),
    "1x1 over a 16x16 image (straight from X)": ((2, 8, 16, 16), (16, 8, 1, 1), True, conv()),
    "1x1 over a 2x2 image (ResNet's last stage)": ((2, 64, 2, 2), (128, 64, 1, 1), False, conv()),
    "non-contiguous input (every other column)": ((2, 4, 9, 18), (6, 4, 3, 3), True,
                                                  conv(padding=1, view=lambda x: x[..., ::2])),
    "channels-last input": ((2, 6, 10, 10), (4, 6, 3, 3), True,
                            conv(padding=1, view=lambda x: x.contiguous(memory_format=torch.channels_last))),
    "transposed, output_padding 1, groups 2": ((2, 4, 5, 6), (4, 3, 3, 3), True,
                                               conv(stride=2, padding=1, groups=2, transposed=True, output_padding=1)),
    "1-D, stride 2, dilation 2": ((3, 4, 20), (6, 2, 3), True, conv(stride=2, padding=1, dilation=2, groups=2)),
    "samples in chunks (64 MiB of columns)": ((3, 64, 112, 112), (2, 64, 3, 3), False, conv(padding=1)),
}

def rel(a, r):
    return ((a.detach().cpu().double() - r).abs().max() / r.abs().max().clamp_min(1e-30)).item()

def step(leaves, fn, g):
    y = fn(*leaves)
    y.backward(g.to(y.device, y.dtype))
    return [y.detach()] + [t.grad for t in leaves]

out = {}
for name, (xs, ws, bias, fn) in CASES.items():
    torch.manual_seed(0)
    x, w = torch.randn(xs, dtype=torch.float64), torch.randn(ws, dtype=torch.float64)
    leaves = [x, w]
    if bias:
        o = fn(x, w).shape[1]
        leaves.append(torch.randn(o, dtype=torch.float64))
    g = torch.randn(fn(*leaves).shape, dtype=torch.float64)
    ref = step([t.clone().requires_grad_() for t in leaves], fn, g)
    f32 = step([t.float().requires_grad_() for t in leaves], fn, g)
    with fl.profile() as prof:
        dev = step([t.float().to("fl").requires_grad_() for t in leaves], fn, g)
        torch.fl.synchronize()
    paths = {s.op: s.paths for s in prof.ops() if s.op.startswith("aten::convolution")}
    out[name] = {"f32": [rel(a, r) for a, r in zip(f32, ref)], "fl": [rel(a, r) for a, r in zip(dev, ref)],
                 "paths": paths}

# float64 on the device: against the CPU's float64, a few float64 roundings
torch.manual_seed(1)
x, w, b = (torch.randn(s, dtype=torch.float64) for s in ((2, 6, 12, 12), (4, 6, 3, 3), (4,)))
fn = conv(stride=2, padding=2, dilation=2)
g = torch.randn(fn(x, w, b).shape, dtype=torch.float64)
ref = step([t.clone().requires_grad_() for t in (x, w, b)], fn, g)
dev = step([t.to("fl").requires_grad_() for t in (x, w, b)], fn, g)
out["float64"] = {"fl": [rel(a, r) for a, r in zip(dev, ref)]}

# on a stream of its own (a command queue of its own): the weight comes from a long matmul queued on that stream,
# so a kernel queued anywhere else would read it unfinished
s = torch.fl.Stream()
big, xf = torch.randn(2048, 2048).to("fl"), x.float().to("fl")
torch.fl.synchronize()
with torch.fl.stream(s):
    wf = (big @ big)[:4, :54].reshape(4, 6, 3, 3) / 45
    y = F.conv2d(xf, wf, None, 2, 2, 2)
    gi, gw, _ = torch.ops.aten.convolution_backward(y, xf, wf, None, [2, 2], [2, 2], [2, 2], False, [0, 0], 1,
                                                     [True, True, False])
s.synchronize()
wr = wf.cpu().double()
yr = F.conv2d(x, wr, None, 2, 2, 2)
gir, gwr, _ = torch.ops.aten.convolution_backward(y.cpu().double(), x, wr, None, [2, 2], [2, 2], [2, 2], False, [0, 0],
                                                  1, [True, True, False])
out["on a stream"] = {"fl": [rel(y, yr), rel(gi, gir), rel(gw, gwr)]}

# 3-D: no kernel; the kernels decline before queueing anything and the decomposition serves it
x3, w3 = torch.randn(1, 2, 4, 4, 4), torch.randn(3, 2, 2, 2, 2)
with fl.profile() as prof:
    y3 = F.conv3d(x3.to("fl"), w3.to("fl")).cpu()
out["3-D"] = {"err": (y3 - F.conv3d(x3, w3)).abs().max().item(),
              "paths": {s.op: s.paths for s in prof.ops() if s.op.startswith("aten::convolution")}}
print("RESULT", json.dumps(out))
"""

FLOOR = 5e-7  # a few float32 roundings, relative to the largest value


@pytest.fixture(scope="module", params=["plugin GEMM", "CLBlast GEMM"])
def results(request) -> dict:
    """The cases' results with the plugin's own GEMM kernels (the default on a CPU device such as pocl), and
    with FL_OPENCL_CLBLAST=1: every GEMM through CLBlast, as on a GPU by default, where it is installed."""
    _require_opencl()
    env = {}
    if request.param == "CLBlast GEMM":
        if ctypes.util.find_library("clblast") is None:
            pytest.skip("CLBlast is not installed (apt-get install libclblast1)")
        env["FL_OPENCL_CLBLAST"] = "1"
    r = run_py(_CASES, env=env, timeout=900)
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert r.returncode == 0 and line, r.stdout[-3000:] + r.stderr[-3000:]
    return json.loads(line[len("RESULT ") :])


CASE_NAMES = [
    "3x3 padding 1, bias, batch 3",
    "stride 2, padding 3, 7x7",
    "dilation 2, stride (2, 1)",
    "groups 2",
    "depthwise",
    "no bias, batch 1",
    "1x1 over a 16x16 image (straight from X)",
    "1x1 over a 2x2 image (ResNet's last stage)",
    "non-contiguous input (every other column)",
    "channels-last input",
    "transposed, output_padding 1, groups 2",
    "1-D, stride 2, dilation 2",
    "samples in chunks (64 MiB of columns)",
]
WHAT = ["output", "grad_input", "grad_weight", "grad_bias"]


@pytest.mark.parametrize("case", CASE_NAMES)
def test_follows_float64_as_closely_as_native_float32(results, case):
    res = results[case]
    for what, dev, native in zip(WHAT, res["fl"], res["f32"], strict=False):
        assert dev <= 10 * max(native, FLOOR), f"{case}: {what} off by {dev:.2e} (native float32: {native:.2e})"


@pytest.mark.parametrize("case", CASE_NAMES)
def test_runs_as_the_plugins_kernels(results, case):
    paths = results[case]["paths"]
    assert paths.get("aten::convolution") and set(paths["aten::convolution"]) == {"native"}, paths
    assert paths.get("aten::convolution_backward") and set(paths["aten::convolution_backward"]) == {"native"}, paths


def test_float64_on_the_device(results):
    assert max(results["float64"]["fl"]) < 1e-13, results["float64"]


def test_a_stream_of_its_own(results):
    assert max(results["on a stream"]["fl"]) < 1e-5, results["on a stream"]


def test_3d_declines_to_the_decomposition(results):
    res = results["3-D"]
    assert res["err"] < 1e-4 and set(res["paths"]["aten::convolution"]) == {"decomposition"}, res


def test_plugin_check_passes_for_the_convolution_kernels():
    _require_opencl()
    cmd = [sys.executable, "-m", "torch_fl.cli", "plugin", "check", "opencl", "--ops", "aten::convolution*"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=HERE)
    assert r.returncode == 0 and "PASSED" in r.stdout, r.stdout[-3000:] + r.stderr[-2000:]
    assert "kernel aten::convolution " in r.stdout and "kernel aten::convolution_backward" in r.stdout, r.stdout[-3000:]
