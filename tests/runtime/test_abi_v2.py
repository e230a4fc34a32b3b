"""Plugin ABI version 2 (fl_plugin.h) and the emulators' asynchronous mode (FL_EMU_ASYNC=1).

Version 2 appends fields to fl_plugin_t; a plugin built against version 1 must load unchanged
(tests/plugins/v1 holds the template and header as they were). In the asynchronous mode the emulated
chips behave like real ones where torch_fl could get it wrong: kernels finish after their call
returns, and device memory is mapped PROT_NONE for everything outside the plugin, so a host read of
device memory is a crash and a missing wait is a wrong answer. Each check runs in a fresh process,
since the mode is fixed when a plugin loads."""

import json
import os
import shutil
import signal
import subprocess

import pytest
from conftest import HERE, run_py

from torch_fl.runtime import abi
from torch_fl.runtime.abi import get_include
from torch_fl.runtime.plugin import Plugin, PluginLoadError

pytestmark = pytest.mark.slow  # compiles plugins, subprocesses

V1 = os.path.join(HERE, "plugins", "v1")
EMULATORS = ["rocm", "ascend", "minimal"]
ASYNC = {"FL_EMU_ASYNC": "1"}


def _cc(src, out, include):
    subprocess.run(
        ["cc", "-shared", "-fPIC", "-O1", "-I", str(include), str(src), "-o", str(out), "-lm"],
        check=True,
        capture_output=True,
    )
    return str(out)


def test_a_version_1_plugin_loads_and_passes_the_checker(tmp_path):
    for name in ("fl_plugin.h", "fl_template.c"):
        shutil.copy(os.path.join(V1, name), tmp_path / name)
    # fl_kernel_util.h includes "fl_plugin.h" from its own folder: beside it, the version-1 header
    shutil.copy(os.path.join(get_include(), "fl_kernel_util.h"), tmp_path / "fl_kernel_util.h")
    lib = _cc(tmp_path / "fl_template.c", tmp_path / "libfl_v1.so", tmp_path)
    p = Plugin(lib, "test")
    assert p.abi_version == 1 and p.table.struct_size == abi.struct_size(1) < abi.struct_size(2)
    assert not any(p.optional[name] for name in ("event_elapsed", "mem_set", "host_alloc", "copy_d2h_async"))
    r = subprocess.run(
        [os.sys.executable, "-m", "torch_fl.cli", "plugin", "check", lib], capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 0 and "PASSED" in r.stdout, r.stdout + r.stderr


_TABLE_PLUGIN = r"""
#include <string.h>
#include "fl_plugin.h"
static const char *err(void) { return "none"; }
static int count(int *n) { *n = 1; return FL_OK; }
static int props(int d, fl_device_props_t *p) { (void)d; memset(p, 0, sizeof *p); strcpy(p->name, "x");
    p->total_memory = 1 << 20; p->dtypes = 1; p->features = FEATURES; return FL_OK; }
static int mal(int d, size_t n, void **p) { (void)d; (void)n; static char b[1 << 16]; *p = b; return FL_OK; }
static int fre(int d, void *p) { (void)d; (void)p; return FL_OK; }
static int cp(int d, void *a, const void *b, size_t n, fl_stream_t s) {
    (void)d; (void)s; memmove(a, b, n); return FL_OK; }
static int kc(int *n) { *n = 0; return FL_OK; }
static int kg(int i, fl_kernel_entry_t *e) { (void)i; (void)e; return FL_ERR_INVALID; }
int fl_plugin_abi_version(void) { return VERSION; }
int fl_plugin_init(fl_plugin_t *p) {
    p->abi_version = VERSION; p->struct_size = SIZE; p->name = "abitest"; p->last_error = err;
    p->device_count = count; p->device_props = props; p->malloc = mal; p->free = fre;
    p->copy_h2d = cp; p->copy_d2h = cp; p->copy_d2d = cp; p->kernel_count = kc; p->kernel_get = kg;
    EXTRA
    return FL_OK;
}
"""


def _table_plugin(tmp_path, version, size, features=0, extra=""):
    src = tmp_path / f"abi_{version}_{size}_{features}_{abs(hash(extra))}.c"
    src.write_text(
        f"#define VERSION {version}\n#define SIZE {size}\n#define FEATURES {features}\n"
        + _TABLE_PLUGIN.replace("EXTRA", extra)
    )
    return _cc(src, tmp_path / f"lib{src.stem}.so", get_include())


def test_a_device_jit_language_is_checked_against_the_calls_it_needs(tmp_path):
    v2 = abi.struct_size(2)
    assert Plugin(_table_plugin(tmp_path, 2, v2), "test").jit_target == 0
    with pytest.raises(
        PluginLoadError, match="declares the device JIT language opencl_c but leaves jit_build and jit_launch NULL"
    ):
        Plugin(_table_plugin(tmp_path, 2, v2, extra="p->jit_language = FL_JIT_OPENCL_C;"), "test")
    with pytest.raises(PluginLoadError, match="jit_language is 9, which fl_plugin.h does not define"):
        Plugin(_table_plugin(tmp_path, 2, v2, extra="p->jit_language = 9;"), "test")
    builds = """static int jb(int d, const char *s, const char *y, void **h) { (void)d; (void)s; (void)y; *h = 0;
        return FL_ERR_INTERNAL; }
    static int jl(void *h, fl_stream_t s, int d, const fl_tensor_t *i, int ni, const fl_tensor_t *o, int no,
        const fl_arg_t *a, int na) { (void)h; (void)s; (void)d; (void)i; (void)ni; (void)o; (void)no; (void)a;
        (void)na; return FL_ERR_INTERNAL; }
    """
    src = _TABLE_PLUGIN.replace("int fl_plugin_abi_version", builds + "int fl_plugin_abi_version")
    path = tmp_path / "jit_ok.c"
    path.write_text(
        f"#define VERSION 2\n#define SIZE {v2}\n#define FEATURES 0\n"
        + src.replace("EXTRA", "p->jit_language = FL_JIT_OPENCL_C; p->jit_build = jb; p->jit_launch = jl;")
    )
    p = Plugin(_cc(path, tmp_path / "libjit_ok.so", get_include()), "test")
    assert p.jit_target == abi.JIT_OPENCL_C and p.jit_builds


def test_struct_size_must_be_the_size_of_the_version_the_plugin_claims(tmp_path):
    v1, v2 = abi.struct_size(1), abi.struct_size(2)
    assert Plugin(_table_plugin(tmp_path, 1, v1), "test").abi_version == 1
    assert Plugin(_table_plugin(tmp_path, 2, v2), "test").abi_version == 2
    with pytest.raises(PluginLoadError, match=f"fl_plugin_t is {v1} bytes in the plugin, {v2} in ABI version 2"):
        Plugin(_table_plugin(tmp_path, 2, v1), "test")
    with pytest.raises(PluginLoadError, match=f"fl_plugin_t is {v2} bytes in the plugin, {v1} in ABI version 1"):
        Plugin(_table_plugin(tmp_path, 1, v2), "test")
    with pytest.raises(PluginLoadError, match="loads versions 1 to 2"):
        Plugin(_table_plugin(tmp_path, 3, v2), "test")


def test_a_version_2_plugin_from_before_stream_wait_event_still_loads(tmp_path):
    """stream_wait_event was appended to version 2: a plugin built against the earlier header says so in
    struct_size, loads, and has no such entry (the runtime then waits on the host)."""
    (early,) = abi.earlier_struct_sizes(2)
    assert early == abi.ffi.offsetof("fl_plugin_t", "stream_wait_event") < abi.struct_size(2)
    p = Plugin(_table_plugin(tmp_path, 2, early), "test")
    assert p.abi_version == 2 and not p.optional["stream_wait_event"]
    with pytest.raises(PluginLoadError, match=f"{early - 8} bytes in the plugin, .* \\(or {early} from an earlier"):
        Plugin(_table_plugin(tmp_path, 2, early - 8), "test")


def test_an_async_device_without_events_is_refused(tmp_path):
    lib = _table_plugin(tmp_path, 2, abi.struct_size(2), abi.FEATURE_ASYNC_KERNELS)
    with pytest.raises(PluginLoadError, match="FL_FEATURE_ASYNC_KERNELS .* event_create.* event_elapsed"):
        Plugin(lib, "test")


def test_fl_emu_async_is_validated():
    r = run_py("import torch, torch_fl as fl; fl.initialize('minimal')", env={"FL_EMU_ASYNC": "maybe"})
    assert r.returncode != 0 and "FL_EMU_ASYNC='maybe' is not a boolean: use 1 or 0" in r.stderr, r.stderr


_WORKLOAD = """
import json, time, torch, torch_fl as fl
fl.initialize(BACKEND)
out = {}
dev = fl.runtime.REGISTRY.current_device
out["async"] = dev.props.async_kernels
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 8))
x, y = torch.randn(16, 32), torch.randint(0, 8, (16,))
ref = torch.nn.functional.cross_entropy(model.double()(x.double()), y)
ref.backward()
grads = [p.grad.clone() for p in model.parameters()]
model.zero_grad()
m = model.float().to("fl")
for _ in range(2):  # the second step runs every kernel queued (its signatures completed once)
    m.zero_grad()
    loss = torch.nn.functional.cross_entropy(m(x.to("fl")), y.to("fl"))
    loss.backward()
out["loss_err"] = abs(loss.item() - ref.item())
out["grad_err"] = max((p.grad.cpu().double() - g).abs().max().item() for p, g in zip(m.parameters(), grads))
a = torch.randn(700, 700, device="fl")
(a @ a).sum().item()
s, e, s2, e2 = (torch.Event(device="fl", enable_timing=True) for _ in range(4))
s.record(); c = a @ a @ a @ a; e.record(); e.synchronize()
out["query_after_sync"] = e.query()
s2.record(); e2.record(); e2.synchronize()
out["elapsed_matmuls"], out["elapsed_nothing"] = s.elapsed_time(e), s2.elapsed_time(e2)
with fl.profile() as prof:
    c = a @ a @ a @ a
    c.sum().item()
ops = {o.op: o.total_s for o in prof.ops()}
out["mm_share"] = ops.get("aten::mm", 0) / sum(ops.values())
print("RESULT", json.dumps(out))
"""


def _result(r):
    lines = [line for line in r.stdout.splitlines() if line.startswith("RESULT ")]
    assert r.returncode == 0 and lines, r.stdout + r.stderr
    return json.loads(lines[-1][7:])


@pytest.mark.parametrize("backend", EMULATORS)
def test_async_emulator_trains_and_times_on_the_device(backend):
    out = _result(run_py(_WORKLOAD.replace("BACKEND", repr(backend)), env=ASYNC))
    assert out["async"] is True
    assert out["loss_err"] < 1e-4 and out["grad_err"] < 1e-4, out
    assert out["query_after_sync"] is True
    # device time: the four matmuls take longer than no work at all, and the profile books the time
    # of the matmuls on aten::mm, not on the .item() that waited for them
    assert out["elapsed_matmuls"] > out["elapsed_nothing"] >= 0, out
    assert out["mm_share"] > 0.5, out


def test_without_fl_emu_async_the_emulators_stay_synchronous():
    out = _result(run_py(_WORKLOAD.replace("BACKEND", "'minimal'")))
    assert out["async"] is False and out["mm_share"] > 0.5


@pytest.mark.parametrize("backend", EMULATORS)
def test_a_host_read_of_device_memory_crashes(backend):
    r = run_py(
        f"""
        import ctypes, torch, torch_fl as fl
        fl.initialize({backend!r})
        x = torch.ones(4, device="fl")
        print("VALUE", x.cpu().tolist(), flush=True)  # through the plugin's copy: fine
        ctypes.string_at(x.data_ptr(), 4)              # the host itself: not
        print("READ", flush=True)
    """,
        env=ASYNC,
    )
    assert "VALUE [1.0, 1.0, 1.0, 1.0]" in r.stdout, r.stdout + r.stderr
    assert r.returncode == -signal.SIGSEGV and "READ" not in r.stdout


def test_a_queued_kernel_that_fails_is_reported_by_the_next_wait():
    """A JIT kernel that refuses negative data: the first call of its signature waits (and passes), the
    second is queued and fails on the device; the NULL-stream copy after it reports the failure with
    the kernel's name, once, and the device goes on working."""
    r = run_py(
        r"""
        import torch, torch_fl as fl
        from torch_fl.runtime.abi import ffi
        fl.initialize("minimal")
        dev = fl.runtime.REGISTRY.current_device
        table = dev.plugin.table
        src = b'''
        #include <stdint.h>
        typedef struct { void *data; int64_t offset; int32_t dtype, ndim; int64_t sizes[8], strides[8]; } T;
        int fl_test_positive(void *s, int d, const T *in, int ni, const T *out, int no, const void *a, int na) {
            const float *x = (const float *)in[0].data + in[0].offset;
            float *y = (float *)out[0].data + out[0].offset;
            if (x[0] < 0) return 4;
            y[0] = x[0] * 2;
            return 0;
        }
        '''
        fn = ffi.new("fl_kernel_fn *")
        assert table.jit_compile(src, b"fl_test_positive", fn) == 0
        x, y = torch.ones(1, device="fl"), torch.zeros(1, device="fl")
        t = ffi.new("fl_tensor_t[2]")
        for k, v in enumerate((x, y)):
            t[k].data, t[k].offset, t[k].dtype, t[k].ndim = ffi.cast("void *", v.data_ptr()), 0, 0, 1
            t[k].sizes[0], t[k].strides[0] = 1, 1
        print("FIRST", fn[0](ffi.NULL, dev.local, t, 1, t + 1, 1, ffi.NULL, 0), y.item())
        x.fill_(-1)
        print("SECOND", fn[0](ffi.NULL, dev.local, t, 1, t + 1, 1, ffi.NULL, 0))
        host = ffi.new("float[1]")
        status = table.copy_d2h(dev.local, host, t[1].data, 4, ffi.NULL)
        print("WAIT", status, ffi.string(table.last_error()).decode())
        print("AGAIN", table.copy_d2h(dev.local, host, t[1].data, 4, ffi.NULL), torch.arange(3., device="fl").tolist())
    """,
        env=ASYNC,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "FIRST 0 2.0" in r.stdout and "SECOND 0" in r.stdout, r.stdout
    assert "WAIT 4 minimal: an earlier asynchronous kernel failed: fl_test_positive (status 4)" in r.stdout, r.stdout
    assert "AGAIN 0 [0.0, 1.0, 2.0]" in r.stdout, r.stdout


def test_zero_is_one_mem_set_for_dense_tensors():
    """ABI v2's mem_set: zero_ of a tensor whose elements fill one byte range is one mem_set call (no fill_
    kernel); a strided slice, or a graph recording (replays run kernels only), uses fill_."""
    import torch

    import torch_fl as fl
    from torch_fl.runtime import REGISTRY
    from torch_fl.runtime.graph import recording

    fl.initialize("minimal")
    backend = REGISTRY.get("minimal")
    fills = lambda: backend.own_counts.get(("aten::fill_.Scalar", "native"), 0)  # noqa: E731
    w = torch.randn(10, 10, device="fl")
    before = fills()
    w.t().zero_()
    assert fills() == before and w.abs().sum().item() == 0
    w = torch.randn(10, 10, device="fl")
    w[:, :3].zero_()
    assert fills() == before + 1
    assert (w[:, :3] == 0).all().item() and (w[:, 3:] != 0).all().item()
    x = torch.ones(4, device="fl")
    before = fills()
    with recording():
        x.zero_()
    assert fills() == before + 1 and x.sum().item() == 0


def test_non_blocking_copy_to_the_host_returns_before_it_lands():
    r = run_py(
        """
        import torch, torch_fl as fl
        from torch_fl.runtime import async_copy
        fl.initialize("rocm")
        x = torch.randn(1 << 18, device="fl")
        h = (x * 2).to("cpu", non_blocking=True)   # queued after the multiplication; pinned, as CUDA's
        print("QUEUED", async_copy.STATS.get("async_d2h"), h.is_pinned())
        torch.fl.synchronize()
        print("EQUAL", torch.equal(h, x.cpu() * 2), len(async_copy.HOST_PENDING))
        print("BLOCKING", torch.equal((x + 1).to("cpu"), x.cpu() + 1), async_copy.STATS.get("async_d2h"))
    """,
        env=ASYNC,
    )
    assert r.returncode == 0, r.stderr
    assert "QUEUED 1 True" in r.stdout and "EQUAL True 0" in r.stdout and "BLOCKING True 1" in r.stdout, r.stdout


def test_auto_prefers_the_cpu_backend_to_a_device_made_of_host_cpu_cores(tmp_path):
    """FL_FEATURE_HOST_CPU (an OpenCL CPU driver such as pocl): the host backend is the better choice for
    "auto"; a real accelerator (the same plugin without the bit) is preferred to the host."""
    chosen = {}
    for features in (abi.FEATURE_HOST_CPU, 0):
        folder = tmp_path / f"f{features}"
        folder.mkdir()
        lib = _table_plugin(tmp_path, 2, abi.struct_size(2), features)
        shutil.copy(lib, folder / "libabitest.so")
        r = run_py(
            "from torch_fl.runtime import REGISTRY; print('AUTO', REGISTRY.auto().name)",
            env={"FL_PLUGIN_PATH": str(folder), "FL_CACHE_DIR": str(tmp_path / "cache")},
        )
        assert r.returncode == 0, r.stderr
        chosen[features] = r.stdout.split("AUTO ")[1].strip()
    assert chosen == {abi.FEATURE_HOST_CPU: "cpu", 0: "abitest"}
