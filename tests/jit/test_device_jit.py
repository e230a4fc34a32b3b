"""The device JIT (fl_plugin.h, "Device JIT"): kernels generated in the plugin's own language, built with
jit_build and run with jit_launch, for a chip whose memory the host cannot touch.

On the bundled opencl backend (a real OpenCL driver: pocl on the test machines) the ops it has no kernel
for must run as generated OpenCL C, with the CPU fallback off, and agree with float64 as closely as
native float32 does; an index or divisor the generated kernel finds wrong raises at the call as on the
CPU; a kernel graph replays generated kernels through (jit_launch, handle) pairs. The generators' OpenCL C
is also checked against the host C they emit for the same ops, on the same inputs."""

import json

import pytest
import torch
from conftest import run_py

import torch_fl as fl
from torch_fl import jit
from torch_fl.dispatch import facts
from torch_fl.jit import render
from torch_fl.runtime import abi

aten = torch.ops.aten


def _require_opencl():
    row = next((r for r in fl.list_backends() if r["name"] == "opencl"), None)
    if row is None or row["status"] != "loaded":
        pytest.skip(
            f"no OpenCL device on this machine: {row['reason'] if row else 'the opencl plugin was not built'}"
            " (scripts/test.sh installs pocl where it can)"
        )


def _result(r) -> dict:
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    line = next(x for x in r.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :])


_OPS = """
import json, torch, torch_fl as fl
from torch_fl import jit
fl.set_backend("opencl")
torch.manual_seed(0)
a, b = torch.randn(37, 53), torch.randn(37, 53)
cases = {
    "atan2": lambda x, y: torch.atan2(x, y),
    "hypot": lambda x, y: torch.hypot(x, y),
    "log1p": lambda x, y: torch.log1p(x.abs()),
    "prod over a transposed dim": lambda x, y: (x * 0.5 + 1).t().prod(0),
    "pow of a broadcast row": lambda x, y: x.abs().pow(y[:1]),
}
out = {}
for name, fn in cases.items():
    with fl.profile() as prof:
        got = fn(a.to("fl"), b.to("fl")).cpu()
    truth = fn(a.double(), b.double())
    f32 = fn(a, b)
    scale = truth.abs().max().item()
    out[name] = {"paths": sorted({e.path for e in prof.events}),
                 "err": (got.double() - truth).abs().max().item() / scale,
                 "f32_err": (f32.double() - truth).abs().max().item() / scale}
out["compiled"] = jit.STATS["compiled"]
print("RESULT", json.dumps(out))
"""


@pytest.mark.slow  # a subprocess
def test_ops_without_an_opencl_kernel_run_as_generated_opencl_c():
    _require_opencl()
    out = _result(run_py(_OPS, env={"FL_CPU_FALLBACK": "0"}))
    assert out.pop("compiled") >= 5
    for name, row in out.items():
        assert "jit" in row["paths"] and "fallback" not in row["paths"], (name, row)
        # the device may differ from native float32, but not by much more than float32 differs from the truth
        assert row["err"] <= 4 * row["f32_err"] + 1e-7, (name, row)


_CHECKED = """
import torch, torch_fl as fl
from torch_fl.runtime import disabled_paths
fl.set_backend("opencl")
x = torch.arange(12.0).reshape(3, 4).to("fl")
with disabled_paths("native", "decomposition"):
    good = torch.gather(x, 1, torch.tensor([[3, 0], [1, 1], [2, 0]]).to("fl"))
    print("GATHER", good.cpu().tolist())
    try:
        torch.gather(x, 1, torch.tensor([[4, 0], [1, 1], [2, 0]]).to("fl"))
    except Exception as e:
        print("BAD", type(e).__name__, str(e).splitlines()[0])
    n = torch.tensor([7, -7, 9]).to("fl")
    print("DIV", torch.floor_divide(n, torch.tensor([2, 2, -4]).to("fl")).cpu().tolist())
    try:
        torch.floor_divide(n, torch.tensor([2, 0, 1]).to("fl")).cpu()
    except Exception as e:
        print("ZERO", type(e).__name__, str(e).splitlines()[0])
print("STILL", (x + 1).sum().item())
"""


@pytest.mark.slow  # a subprocess
def test_a_generated_kernel_that_finds_a_bad_index_or_divisor_raises_at_the_call():
    _require_opencl()
    r = run_py(_CHECKED)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "GATHER [[3.0, 0.0], [5.0, 5.0], [10.0, 8.0]]" in r.stdout, r.stdout
    assert (
        "BAD KernelError aten::gather: an index in `index` is out of bounds for dimension 1 with size 4" in r.stdout
    ), r.stdout
    assert "DIV [3, -4, -3]" in r.stdout, r.stdout
    assert "ZERO RuntimeError ZeroDivisionError" in r.stdout, r.stdout
    assert "STILL 78.0" in r.stdout, r.stdout


_REPLAY = """
import copy, json, torch, torch_fl as fl
from torch import nn
from torch_fl.compile import dynamo as fl_dynamo
fl.set_backend("opencl")
torch.manual_seed(0)

class M(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 16)
    def forward(self, x):
        h = self.lin(x)
        return torch.atan2(h, x) + torch.hypot(h, x)

model = M().eval()
truth = copy.deepcopy(model).double()
model = model.to("fl")
replayed = torch.compile(model, backend="fl", options={"replay": True})
errs = []
with torch.no_grad():
    for _ in range(4):
        x = torch.randn(8, 16)
        got = replayed(x.to("fl")).cpu()
        ref = truth(x.double())
        errs.append((got.double() - ref).abs().max().item())
status = [g.replay for g in fl_dynamo.fusion_report(replayed).graphs if g.replay is not None][0]
print("RESULT", json.dumps({"errs": errs, "replayed": status.replayed, "replays": status.replays,
                            "reason": status.reason}))
"""


@pytest.mark.slow  # a subprocess
def test_generated_kernels_replay_in_a_kernel_graph():
    _require_opencl()
    out = _result(run_py(_REPLAY, env={"FL_CPU_FALLBACK": "0"}))
    assert out["replayed"] and out["replays"] >= 2, out
    assert max(out["errs"]) < 1e-4, out


@pytest.mark.parametrize(
    "op,vals",
    [
        ("elu", lambda x: [x, 1.5, 1.0, 1.0]),
        ("add", lambda x: [x, x, 2.0]),
        ("floor_divide", lambda x: [x, x]),
    ],
)
def test_the_two_languages_share_one_body(op, vals):
    """The same generator call in host C and in OpenCL C: the same computation, only the frame differs
    (the OpenCL C source has no host header and a __kernel entry of the launch convention)."""
    x = torch.ones(2, 3, device="fl")
    f = facts(getattr(aten, op).default if op != "add" else aten.add.Tensor)
    host, sym = jit.generate(f, vals(x), torch.float32)
    with render.language(abi.JIT_OPENCL_C):
        dev, sym2 = jit.generate(f, vals(x), torch.float32)
    assert sym == sym2
    assert f"__kernel void {sym}(__global const long *meta, __global int *status, __global uchar *t0" in dev
    assert "#include" not in dev and "fl_plugin_t" not in dev and f"__kernel void {sym}" not in host
    body = host[host.index("int err = 0;") :].split("\n")[0]
    assert body in dev


def test_an_unknown_language_is_refused_by_the_generators():
    cuda = next(code for code, name in abi.JIT_LANGUAGES.items() if name == "cuda_c")
    with pytest.raises(render.Unsupported, match="JIT language cuda_c"), render.language(cuda):
        pass


_RENAMED = """
import torch, torch_fl as fl
from torch_fl.runtime import disabled_paths
fl.set_backend("opencl")
x = torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5, 2.4, 1e-40])
y = torch.tensor([1.0, 0.0, 3.0, -1.0, 2.0, 0.0, 0.0])
with disabled_paths("native", "decomposition"), fl.profile() as prof:
    r, n = torch.round(x.to("fl")).cpu(), torch.nextafter(x.to("fl"), y.to("fl")).cpu()
print("PATHS", sorted({e.path for e in prof.events if e.op != "aten::copy_"}))
print("EQUAL", torch.equal(r, torch.round(x)), torch.equal(n, torch.nextafter(x, y)))
"""


@pytest.mark.slow  # a subprocess
def test_math_that_opencl_c_spells_differently_is_generated_right():
    """round (C99 nearbyint: OpenCL C's rint) and float32 nextafter (nextafterf: OpenCL C's overloaded
    nextafter) failed to build on the device before the OpenCL prelude mapped them; results bit-exact."""
    _require_opencl()
    r = run_py(_RENAMED, env={"FL_CPU_FALLBACK": "0"})
    assert r.returncode == 0, r.stderr[-3000:]
    assert "PATHS ['jit', 'jit-compile']" in r.stdout and "EQUAL True True" in r.stdout, r.stdout + r.stderr[-2000:]
