"""The bundled OpenCL plugin (plugins_cffi/opencl/): a real device through the system's OpenCL driver.

On a machine with a driver (the test command installs pocl, OpenCL on the CPU, where it can) it must pass
the plugin checker, train against float64 with the CPU fallback off, time a long matmul on the device,
and keep its memory out of the host's reach. Without a driver it is listed as unavailable, with the
reason and the fix, and these tests say so and skip."""

import json
import os
import signal
import subprocess
import sys

import pytest
from conftest import HERE, run_py

import torch_fl as fl

pytestmark = pytest.mark.slow  # OpenCL programs built by the driver, fresh processes


def _opencl_row() -> dict | None:
    return next((r for r in fl.list_backends() if r["name"] == "opencl"), None)


def _require_opencl():
    row = _opencl_row()
    if row is None or row["status"] != "loaded":
        pytest.skip(
            f"no OpenCL device on this machine: {row['reason'] if row else 'the opencl plugin was not built'}"
            " (scripts/test.sh installs pocl where it can: apt-get install pocl-opencl-icd "
            "ocl-icd-libopencl1)"
        )


def test_without_a_driver_the_backend_is_listed_as_unavailable_with_the_fix():
    """OCL_ICD_VENDORS pointing nowhere: the ICD loader finds no platform (as on a machine with
    libOpenCL but no driver)."""
    r = run_py(
        """
        import torch_fl as fl
        row = next(r for r in fl.list_backends() if r["path"].endswith("libfl_opencl.so"))
        print("ROW", row["name"], row["status"], row["reason"])
        print("AVAILABLE", "opencl" in fl.available_backends())
        try:
            fl.initialize("opencl")
        except fl.BackendNotFoundError as e:
            print("ERR", str(e).splitlines()[1])
    """,
        env={"OCL_ICD_VENDORS": "/nonexistent"},
    )
    assert r.returncode == 0, r.stderr
    assert "ROW opencl unavailable no OpenCL" in r.stdout and "install" in r.stdout, r.stdout
    assert "AVAILABLE False" in r.stdout
    assert "libfl_opencl.so was unavailable: no OpenCL" in r.stdout, r.stdout


def test_capabilities_come_from_the_device():
    _require_opencl()
    caps = fl.capabilities("opencl")
    assert not caps.emulated and caps.abi_version == 2 and caps.devices
    for d in caps.devices:
        assert d.async_kernels and not d.host_accessible
        assert d.total_memory > 0 and d.compute_units > 0 and "float32" in d.dtypes
    assert caps.supports("aten::mm") and caps.supports("aten::native_layer_norm")


def test_plugin_check_passes():
    _require_opencl()
    r = subprocess.run(
        [sys.executable, "-m", "torch_fl.cli", "plugin", "check", "opencl"],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=HERE,
    )
    assert r.returncode == 0 and "PASSED" in r.stdout, r.stdout[-3000:] + r.stderr[-2000:]


_TRAIN = """
import json, torch, torch_fl as fl
from torch_fl.tools import numerics
fl.initialize("opencl")
torch.manual_seed(0)
def make():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(24, 48), torch.nn.GELU(), torch.nn.LayerNorm(48),
                               torch.nn.Linear(48, 6))
x, y = torch.randn(32, 24), torch.randint(0, 6, (32,))
def train(model, device, dtype):
    model = model.to(device=device, dtype=dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(4):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x.to(device, dtype)), y.to(device))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, [p.detach().to("cpu", torch.float64) for p in model.parameters()]
ref, p64 = train(make(), "cpu", torch.float64)
cpu, p32 = train(make(), "cpu", torch.float32)
dev, pfl = train(make(), "fl", torch.float32)
err = lambda ps: max((a - b).abs().max().item() for a, b in zip(ps, p64))
print("RESULT", json.dumps({"loss_fl": max(abs(a - b) for a, b in zip(dev, ref)),
                            "loss_cpu": max(abs(a - b) for a, b in zip(cpu, ref)),
                            "param_fl": err(pfl), "param_cpu": err(p32)}))
"""


def _result(r):
    lines = [line for line in r.stdout.splitlines() if line.startswith("RESULT ")]
    assert r.returncode == 0 and lines, r.stdout[-3000:] + r.stderr[-3000:]
    return json.loads(lines[-1][7:])


def test_training_with_the_cpu_fallback_off_follows_float64():
    """Linear, GELU, LayerNorm, cross-entropy and AdamW, every op on the device (FL_CPU_FALLBACK=0): the
    device's float32 is no further from float64 than native float32 is (judged with a margin)."""
    _require_opencl()
    out = _result(run_py(_TRAIN, env={"FL_CPU_FALLBACK": "0"}))
    assert out["loss_fl"] <= 10 * out["loss_cpu"] + 1e-6, out
    assert out["param_fl"] <= 10 * out["param_cpu"] + 1e-6, out


def test_a_long_matmul_is_timed_on_the_device():
    """Kernels are queued: the host clock would book the matmuls on the .item() that waits for them.
    torch.Event and fl.profile must give the time to the matmuls."""
    _require_opencl()
    out = _result(
        run_py("""
        import json, torch, torch_fl as fl
        fl.initialize("opencl")
        a = torch.randn(768, 768, device="fl")
        (a @ a).sum().item()                       # programs built, caches warm
        s, e, s2, e2 = (torch.Event(device="fl", enable_timing=True) for _ in range(4))
        s.record(); c = a @ a @ a @ a; e.record(); e.synchronize()
        s2.record(); e2.record(); e2.synchronize()
        with fl.profile() as prof:
            c = a @ a @ a @ a
            c.sum().item()
        ops = {o.op: o.total_s for o in prof.ops()}
        print("RESULT", json.dumps({"matmuls": s.elapsed_time(e), "nothing": s2.elapsed_time(e2),
                                    "mm_share": ops.get("aten::mm", 0) / sum(ops.values())}))
    """)
    )
    assert out["matmuls"] > out["nothing"] >= 0, out
    assert out["mm_share"] > 0.5, out


def test_streams_are_queues_of_their_own():
    """Each torch.fl.Stream is an OpenCL command queue: work on it is ordered after the default queue by
    wait_stream (a marker with a wait list, on the device), and a block used there is reused only once
    the queue has passed its free."""
    _require_opencl()
    from test_streams import streams_script

    r = run_py(streams_script("opencl"))
    assert r.returncode == 0 and "STREAMS-OK" in r.stdout, r.stdout[-2000:] + r.stderr[-4000:]


def test_non_blocking_copies_overlap_and_kernels_wait_for_them_on_the_device():
    """opencl declares asynchronous copies: `pinned.to("fl", non_blocking=True)` is a non-blocking write on a
    copy queue, and the kernel that uses it waits for its event on the device (a marker with a wait list);
    the host does not."""
    _require_opencl()
    from test_async import ASYNC_PIPELINE, pipeline_result

    assert all(d.async_copy for d in fl.capabilities("opencl").devices)
    r = run_py(ASYNC_PIPELINE.format(backend="opencl"))
    worst, copies, _host_waits, device_waits, left = pipeline_result(r)
    assert worst <= 3.0 and copies == 4 and device_waits >= 4 and left == 0, (worst, copies, device_waits)


def test_gemm_through_clblast_follows_float64():
    """With CLBlast installed (scripts/test.sh installs libclblast1 beside pocl), FL_OPENCL_CLBLAST=1 sends
    every GEMM through it: plain, transposed, batched and addmm views, float32 and float64, each judged
    against float64 with native float32's own error as the yardstick. Without it, 1 is refused politely:
    the plugin says why in its description and keeps its own kernel."""
    _require_opencl()
    import ctypes.util

    r = run_py(
        """
        import json, torch, torch_fl as fl
        from torch_fl.runtime import REGISTRY
        fl.initialize("opencl")
        torch.manual_seed(0)
        a, b, c = torch.randn(5, 40, 36), torch.randn(5, 36, 28), torch.randn(40, 28)
        cases = {
            "mm": lambda t, d: t(a[0], d) @ t(b[0], d),
            "mm_transposed": lambda t, d: t(a[0].t().contiguous(), d).t() @ t(b[0].t().contiguous(), d).t(),
            "bmm": lambda t, d: torch.bmm(t(a, d), t(b, d)),
            "addmm": lambda t, d: torch.addmm(t(c, d), t(a[1], d), t(b[1], d), beta=0.5, alpha=2.0),
        }
        out = {"description": REGISTRY.get("opencl").plugin.description}
        for name, f in cases.items():
            for dt in (torch.float32, torch.float64):
                truth = f(lambda x, d: x.double(), "cpu")
                got = f(lambda x, d: x.to(d, dt), "fl").cpu().double()
                native = f(lambda x, d: x.to(dt), "cpu").double()
                scale = truth.abs().max().item()
                out[f"{name}/{dt}"] = [(got - truth).abs().max().item() / scale,
                                       (native - truth).abs().max().item() / scale]
        print("RESULT", json.dumps(out))
    """,
        env={"FL_OPENCL_CLBLAST": "1"},
    )
    out = _result(r)
    if ctypes.util.find_library("clblast") is None:
        assert "CLBlast not installed" in out["description"], out
        pytest.skip("CLBlast is not installed (apt-get install libclblast1); the plugin's own kernel ran")
    assert "GEMM: CLBlast on every device (FL_OPENCL_CLBLAST=1)" in out["description"], out
    for case, errors in out.items():
        if case != "description":
            err, native = errors
            assert err <= 10 * max(native, 1e-7 if "float32" in case else 1e-15), (case, err, native)


def test_device_memory_is_not_readable_from_the_host():
    _require_opencl()
    r = run_py("""
        import ctypes, torch, torch_fl as fl
        fl.initialize("opencl")
        x = torch.arange(4.0, device="fl")
        print("VALUE", x.cpu().tolist(), flush=True)
        ctypes.string_at(x.data_ptr(), 4)
        print("READ", flush=True)
    """)
    assert "VALUE [0.0, 1.0, 2.0, 3.0]" in r.stdout, r.stdout + r.stderr
    assert r.returncode == -signal.SIGSEGV and "READ" not in r.stdout


def test_auto_keeps_the_cpu_backend_over_an_opencl_cpu_device():
    _require_opencl()
    if not any(d.host_cpu for d in fl.capabilities("opencl").devices):
        pytest.skip("the OpenCL device here is not the host's CPU")
    r = run_py("from torch_fl.runtime import REGISTRY; print('AUTO', REGISTRY.auto().name)")
    assert "AUTO cpu" in r.stdout, r.stdout + r.stderr


def test_scripts_see_the_device():
    _require_opencl()
    env = dict(os.environ)
    r = subprocess.run(
        [sys.executable, "-m", "torch_fl.cli", "backends"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=HERE,
    )
    assert r.returncode == 0
    assert any(line.split()[:2] == ["opencl", "loaded"] for line in r.stdout.splitlines()), r.stdout


def test_tiny_bert_trains_with_the_cpu_fallback_off():
    """Hugging Face BertForMaskedLM (random init, attention mask, ignored labels), three AdamW steps, every op
    on the OpenCL device (FL_CPU_FALLBACK=0); each loss within 1e-4 (relative) of the CPU's."""
    _require_opencl()
    pytest.importorskip("transformers")
    out = _result(
        run_py(
            """
        import json, torch, torch_fl as fl
        from transformers import BertConfig, BertForMaskedLM
        fl.initialize("opencl")
        cfg = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
        torch.manual_seed(0)
        ids = torch.randint(0, 100, (4, 16))
        mask = torch.ones(4, 16, dtype=torch.long); mask[:, 12:] = 0
        labels = ids.clone(); labels[:, ::3] = -100
        def run(device):
            torch.manual_seed(0)
            model = BertForMaskedLM(cfg).to(device)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
            losses = []
            for _ in range(3):
                opt.zero_grad()
                loss = model(input_ids=ids.to(device), attention_mask=mask.to(device), labels=labels.to(device)).loss
                loss.backward()
                opt.step()
                losses.append(loss.item())
            return losses
        cpu, dev = run("cpu"), run("fl")
        print("RESULT", json.dumps({"cpu": cpu, "fl": dev}))
    """,
            env={"FL_CPU_FALLBACK": "0"},
        )
    )
    for a, b in zip(out["fl"], out["cpu"], strict=True):
        assert abs(a - b) <= 1e-4 * abs(b), out
    assert out["fl"][-1] < out["fl"][0]


def test_the_zoo_runs_with_the_cpu_fallback_off():
    """Every model of the zoo (transformers encoders, decoders, vision, audio, RNNs), forward, backward,
    AdamW and generate, on the OpenCL device with FL_CPU_FALLBACK=0."""
    _require_opencl()
    pytest.importorskip("transformers")
    r = subprocess.run(
        [sys.executable, "-m", "torch_fl.cli", "zoo", "--backends", "opencl"],
        capture_output=True,
        text=True,
        timeout=1800,
        cwd=HERE,
        env={**os.environ, "FL_CPU_FALLBACK": "0"},
    )
    last = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ""
    passed, _, total = last.partition(" rows pass")[0].partition("/")
    assert r.returncode == 0 and passed == total and int(total) >= 25, r.stdout[-3000:] + r.stderr[-2000:]


def test_another_backends_path_table_does_not_depend_on_the_driver():
    """fl.path_table('minimal') lists the ops the host plugin and the emulators have kernels for: a machine with
    an OpenCL driver must print the same table as one without (notebook 03 stores it)."""
    code = "import torch_fl as fl; c = fl.path_table('minimal'); print('ROWS', len(c.rows), sorted(c.counts().items()))"
    with_driver = run_py(code)
    without = run_py(code, env={"OCL_ICD_VENDORS": "/nonexistent"})
    assert with_driver.returncode == 0 and without.returncode == 0, with_driver.stderr + without.stderr
    rows = [line for line in with_driver.stdout.splitlines() if line.startswith("ROWS")]
    assert rows and rows == [line for line in without.stdout.splitlines() if line.startswith("ROWS")]
