"""The OpenCL plugin's device JIT (jit_build / jit_launch, the FL_JIT_OPENCL_C convention of fl_plugin.h) and
its on-disk cache of program binaries, driven through cffi with hand-written kernels: no generator, no runtime.

The cache tests run in fresh processes with FL_JIT_CACHE pointing at a temporary folder and FL_OPENCL_CACHE=1
(every program cached, whatever the driver)."""

import json
import os
import stat
import struct
import threading

import pytest
from conftest import run_py

import torch_fl as fl
from torch_fl.runtime.abi import FL_ERR_INTERNAL, FL_ERR_INVALID, FL_OK, ffi

pytestmark = pytest.mark.slow  # fresh processes, OpenCL builds

FLOAT32, INT64 = 0, 4
ARG_INT, ARG_FLOAT, ARG_INT_LIST = 3, 4, 6
META_TENSOR, META_ARG = 20, 12

# out = in * 2 + args[0].i over 2-D strided views, its work shared out by global id and size
SCALE_ADD = b"""
__kernel void scale_add(__global const long *meta, __global int *status, __global uchar *t0, __global uchar *t1) {
    __global const long *mi = meta, *mo = meta + 20, *ma = meta + 40;
    __global const float *x = (__global const float *)(t0 + mi[0]);
    __global float *y = (__global float *)(t1 + mo[0]);
    long rows = mo[4], cols = mo[5];
    for (long g = get_global_id(0); g < rows * cols; g += get_global_size(0)) {
        long r = g / cols, c = g % cols;
        y[mo[1] + r * mo[12] + c * mo[13]] = x[mi[1] + r * mi[12] + c * mi[13]] * 2.0f + (float)ma[2];
    }
}
"""
# copies the whole meta array (3 tensors, 2 arguments) into the second tensor
ECHO = b"""
__kernel void echo(__global const long *meta, __global int *status, __global uchar *t0, __global uchar *t1,
                   __global uchar *t2) {
    __global long *o = (__global long *)(t1 + meta[20]) + meta[21];
    if (get_global_id(0) == 0)
        for (int k = 0; k < 3 * 20 + 2 * 12; k++) o[k] = meta[k];
}
"""
# stores FL_ERR_INVALID when args[0].i is nonzero
CHECKED = b"""
#define FL_JIT_CHECKED 1
__kernel void checked(__global const long *meta, __global int *status, __global uchar *t0) {
    if (get_global_id(0) == 0 && meta[20 + 2] != 0) *status = 2;
}
"""


@pytest.fixture(scope="module")
def ocl():
    row = next((r for r in fl.list_backends() if r["name"] == "opencl"), None)
    if row is None or row["status"] != "loaded":
        pytest.skip(
            f"no OpenCL device on this machine: {row['reason'] if row else 'the opencl plugin was not built'}"
            " (apt-get install pocl-opencl-icd ocl-icd-libopencl1)"
        )
    lib = ffi.dlopen(row["path"])
    table = ffi.new("fl_plugin_t *")
    assert lib.fl_plugin_init(table) == FL_OK
    assert table.jit_language == 2 and table.jit_build != ffi.NULL and table.jit_launch != ffi.NULL
    return Ocl(lib, table, row["path"])


class Ocl:
    def __init__(self, lib, table, path):
        self.lib, self.t, self.path = lib, table, path
        self._keep = []

    def error(self) -> str:
        return ffi.string(self.t.last_error()).decode()

    def alloc(self, values, fmt="f"):
        data = struct.pack(f"{len(values)}{fmt}", *values)
        ptr = ffi.new("void **")
        assert self.t.malloc(0, len(data), ptr) == FL_OK, self.error()
        assert self.t.copy_h2d(0, ptr[0], data, len(data), ffi.NULL) == FL_OK, self.error()
        self._keep.append(ptr[0])
        return ptr[0]

    def read(self, p, n, fmt="f"):
        buf = ffi.new("char[]", struct.calcsize(f"{n}{fmt}"))
        assert self.t.copy_d2h(0, buf, p, len(buf), ffi.NULL) == FL_OK, self.error()
        return list(struct.unpack(f"{n}{fmt}", ffi.buffer(buf)))

    def build(self, source, symbol):
        h = ffi.new("void **")
        st = self.t.jit_build(0, source, symbol.encode(), h)
        return st, h[0]

    def launch(self, handle, inputs, outputs, args=(), stream=ffi.NULL):
        ins, outs = _descs(inputs), _descs(outputs)
        a = ffi.new("fl_arg_t[]", max(len(args), 1))
        for k, (kind, value) in enumerate(args):
            a[k].kind = kind
            if kind == ARG_FLOAT:
                a[k].f = value
            elif kind == ARG_INT_LIST:
                a[k].len = len(value)
                for j, v in enumerate(value):
                    a[k].list[j] = v
            else:
                a[k].i = value
        return self.t.jit_launch(handle, stream, 0, ins, len(inputs), outs, len(outputs), a, len(args))


def _descs(specs):
    """(data, dtype, sizes, strides, offset) -> an fl_tensor_t array; data None: an undefined tensor"""
    d = ffi.new("fl_tensor_t[]", max(len(specs), 1))
    for k, (data, dtype, sizes, strides, offset) in enumerate(specs):
        d[k].data = data if data is not None else ffi.NULL
        d[k].dtype, d[k].offset = dtype, offset
        d[k].ndim = len(sizes) if data is not None else -1
        for j, (s, st) in enumerate(zip(sizes, strides, strict=True)):
            d[k].sizes[j], d[k].strides[j] = s, st
    return d


def test_a_hand_written_kernel_runs_over_strided_views(ocl):
    st, h = ocl.build(SCALE_ADD, "scale_add")
    assert st == FL_OK, ocl.error()
    x = ocl.alloc([float(v) for v in range(24)])
    y = ocl.alloc([0.0] * 20)
    # x viewed as a 3x4 matrix, transposed and offset (x[2 + r + 6c]); y a 3x4 block at element 5
    assert ocl.launch(h, [(x, FLOAT32, [3, 4], [1, 6], 2)], [(y, FLOAT32, [3, 4], [4, 1], 5)], [(ARG_INT, 7)]) == FL_OK
    got = ocl.read(y, 20)
    want = [0.0] * 5 + [(2 + r + 6 * c) * 2.0 + 7 for r in range(3) for c in range(4)] + [0.0] * 3
    assert got == want


def test_meta_holds_every_descriptor_and_argument_in_order(ocl):
    st, h = ocl.build(ECHO, "echo")
    assert st == FL_OK, ocl.error()
    x = ocl.alloc([1.0] * 64)
    out = ocl.alloc([0] * 100, "q")
    inputs = [(x, FLOAT32, [4, 3], [3, 1], 8)]
    outputs = [(out, INT64, [90], [1], 2), (None, 0, [], [], 0)]  # the second output is undefined
    args = [(ARG_FLOAT, 2.5), (ARG_INT_LIST, [3, -1, 7])]
    assert ocl.launch(h, inputs, outputs, args) == FL_OK, ocl.error()
    meta = ocl.read(out, 100, "q")[2 : 2 + 3 * META_TENSOR + 2 * META_ARG]
    tensors = [meta[k * META_TENSOR : (k + 1) * META_TENSOR] for k in range(3)]
    assert tensors[0][:6] == [0, 8, FLOAT32, 2, 4, 3] and tensors[0][12:14] == [3, 1]
    assert tensors[1][:5] == [0, 2, INT64, 1, 90] and tensors[1][12] == 1
    assert tensors[2][3] == -1  # undefined: ndim -1, bound to a scratch buffer
    a0, a1 = (meta[3 * META_TENSOR + k * META_ARG : 3 * META_TENSOR + (k + 1) * META_ARG] for k in range(2))
    assert a0[0] == ARG_FLOAT and struct.unpack("d", struct.pack("q", a0[3]))[0] == 2.5
    assert a1[:2] == [ARG_INT_LIST, 3] and a1[4:7] == [3, -1, 7]


def test_a_checked_kernel_returns_the_status_it_stores(ocl):
    st, h = ocl.build(CHECKED, "checked")
    assert st == FL_OK, ocl.error()
    x = ocl.alloc([0.0])
    assert ocl.launch(h, [(x, FLOAT32, [1], [1], 0)], [], [(ARG_INT, 0)]) == FL_OK
    assert ocl.launch(h, [(x, FLOAT32, [1], [1], 0)], [], [(ARG_INT, 1)]) == FL_ERR_INVALID
    assert ocl.error() == "jit kernel checked: an index out of range or an integer division by zero"
    assert ocl.launch(h, [(x, FLOAT32, [1], [1], 0)], [], [(ARG_INT, 0)]) == FL_OK  # a fresh status each time


def test_a_build_error_returns_the_compiler_log(ocl):
    st, h = ocl.build(
        b"__kernel void broken(__global const long *meta, __global int *status) { no_such_name = 1; }", "broken"
    )
    assert st == FL_ERR_INTERNAL and h == ffi.NULL
    assert "no_such_name" in ocl.error() and "error" in ocl.error(), ocl.error()
    st, h = ocl.build(SCALE_ADD, "not_there")
    assert st == FL_ERR_INTERNAL and "not_there" in ocl.error()


def test_a_launch_that_does_not_fit_the_kernel_is_refused(ocl):
    st, h = ocl.build(SCALE_ADD, "scale_add")
    assert st == FL_OK, ocl.error()
    x = ocl.alloc([1.0] * 4)
    view = (x, FLOAT32, [2, 2], [2, 1], 0)
    assert ocl.launch(h, [view], [], [(ARG_INT, 0)]) == FL_ERR_INVALID
    assert "takes 2 tensor buffers, the launch passes 1" in ocl.error(), ocl.error()
    # a view past the end of its allocation never reaches the device
    assert ocl.launch(h, [view], [(x, FLOAT32, [2, 2], [2, 1], 1)], [(ARG_INT, 0)]) == FL_ERR_INVALID
    assert "outside its allocation" in ocl.error(), ocl.error()
    assert ocl.t.jit_launch(ffi.NULL, ffi.NULL, 0, ffi.NULL, 0, ffi.NULL, 0, ffi.NULL, 0) == FL_ERR_INVALID


def test_threads_and_streams_share_one_handle(ocl):
    st, h = ocl.build(SCALE_ADD, "scale_add")
    assert st == FL_OK, ocl.error()
    x = ocl.alloc([float(v) for v in range(16)])
    outs = [ocl.alloc([0.0] * 16) for _ in range(4)]
    streams = [ffi.new("fl_stream_t *") for _ in range(4)]
    for s in streams:
        assert ocl.t.stream_create(0, s) == FL_OK
    failures = []

    def work(k):
        for i in range(40):
            st = ocl.launch(
                h,
                [(x, FLOAT32, [4, 4], [4, 1], 0)],
                [(outs[k], FLOAT32, [4, 4], [4, 1], 0)],
                [(ARG_INT, k * 100 + i)],
                stream=streams[k][0],
            )
            if st:
                failures.append(ocl.error())

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures
    for k, s in enumerate(streams):
        assert ocl.t.stream_synchronize(0, s[0]) == FL_OK
        assert ocl.read(outs[k], 16) == [v * 2.0 + k * 100 + 39 for v in range(16)]
        assert ocl.t.stream_destroy(0, s[0]) == FL_OK


# ---- the binary cache, across processes ----

_SNIPPET = r"""
import json, struct
from torch_fl.runtime.abi import ffi
lib = ffi.dlopen(PATH)
t = ffi.new("fl_plugin_t *")
assert lib.fl_plugin_init(t) == 0
h = ffi.new("void **")
st = t.jit_build(0, SOURCE, b"scale_add", h)
assert st == 0, ffi.string(t.last_error())
for source, symbol in EXTRA:
    assert t.jit_build(0, source, symbol, ffi.new("void **")) == 0, ffi.string(t.last_error())
def dev(values):
    p = ffi.new("void **")
    data = struct.pack(f"{len(values)}f", *values)
    assert t.malloc(0, len(data), p) == 0 and t.copy_h2d(0, p[0], data, len(data), ffi.NULL) == 0
    return p[0]
x, y = dev([float(v) for v in range(6)]), dev([0.0] * 6)
d = ffi.new("fl_tensor_t[2]")
for k, p in enumerate((x, y)):
    d[k].data, d[k].dtype, d[k].ndim = p, 0, 2
    d[k].sizes[0], d[k].sizes[1], d[k].strides[0], d[k].strides[1] = 2, 3, 3, 1
a = ffi.new("fl_arg_t[1]")
a[0].kind, a[0].i = 3, 1
assert t.jit_launch(h[0], ffi.NULL, 0, d, 1, d + 1, 1, a, 1) == 0, ffi.string(t.last_error())
buf = ffi.new("float[6]")
assert t.copy_d2h(0, buf, y, 24, ffi.NULL) == 0
print("RESULT", json.dumps(list(buf)))
"""


def _run(ocl, cache, extra=(), **env):
    code = _SNIPPET.replace("PATH", repr(ocl.path)).replace("SOURCE", repr(SCALE_ADD)).replace("EXTRA", repr(extra))
    r = run_py(code, env={"FL_JIT_CACHE": str(cache), "FL_OPENCL_CACHE": "1", **env})
    lines = [line for line in r.stdout.splitlines() if line.startswith("RESULT ")]
    assert r.returncode == 0 and lines, r.stdout + r.stderr
    assert json.loads(lines[-1][7:]) == [v * 2.0 + 1 for v in range(6)]
    return r.stderr


def _entries(cache):
    folder = cache / "opencl"
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in folder.iterdir()} if folder.exists() else {}


def test_a_built_kernel_is_cached_and_the_next_process_loads_it(ocl, tmp_path):
    assert "torch_fl OpenCL" not in _run(ocl, tmp_path)
    first = _entries(tmp_path)
    bins = [n for n in first if n.endswith(".bin")]
    assert len(bins) == 1 and bins[0] + ".sha256" in first and len(first) == 2, first
    assert stat.S_IMODE((tmp_path / "opencl").stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "opencl" / bins[0]).stat().st_mode) == 0o600
    assert "torch_fl OpenCL" not in _run(ocl, tmp_path)
    assert _entries(tmp_path) == first  # loaded, not built and written again


def test_a_tampered_binary_is_reported_and_rebuilt(ocl, tmp_path):
    _run(ocl, tmp_path)
    (binary,) = (tmp_path / "opencl").glob("*.bin")
    data = bytearray(binary.read_bytes())
    data[len(data) // 2] ^= 0xFF
    binary.write_bytes(bytes(data))
    err = _run(ocl, tmp_path)
    assert "not loading the cached program" in err and "do not match the digest" in err, err
    assert binary.read_bytes() != bytes(data)  # rebuilt and stored again
    assert "torch_fl OpenCL" not in _run(ocl, tmp_path)


def test_a_binary_others_can_write_is_not_loaded(ocl, tmp_path):
    _run(ocl, tmp_path)
    (binary,) = (tmp_path / "opencl").glob("*.bin")
    binary.chmod(0o666)
    err = _run(ocl, tmp_path)
    assert "not loading the cached program" in err and "only you can write" in err, err
    assert stat.S_IMODE(binary.stat().st_mode) == 0o600


def test_a_loose_cache_folder_of_ours_is_tightened(ocl, tmp_path):
    (tmp_path / "opencl").mkdir()
    (tmp_path / "opencl").chmod(0o777)
    assert "torch_fl OpenCL" not in _run(ocl, tmp_path)
    assert stat.S_IMODE((tmp_path / "opencl").stat().st_mode) == 0o700
    assert len(_entries(tmp_path)) == 2


@pytest.mark.skipif(os.geteuid() != 0, reason="making a folder another user's takes root")
def test_a_foreign_cache_folder_is_refused_and_kernels_still_run(ocl, tmp_path):
    (tmp_path / "opencl").mkdir(mode=0o777)
    os.chown(tmp_path / "opencl", 12345, 12345)
    err = _run(ocl, tmp_path)
    assert err.count("not using the program cache") == 1 and "owned by another user" in err, err
    assert not _entries(tmp_path)


def test_fl_opencl_cache_0_writes_nothing(ocl, tmp_path):
    assert "torch_fl OpenCL" not in _run(ocl, tmp_path, FL_OPENCL_CACHE="0")
    assert not _entries(tmp_path)


def test_unset_pocl_keeps_the_programs_of_many_kernels_itself(ocl, tmp_path):
    """pocl keeps built programs itself (POCL_KERNEL_CACHE), and asking it for a binary compiles every kernel of
    the program: unset, the plugin stores only programs of a few kernels there (the JIT's), unless pocl's cache
    is off."""
    if "pocl" not in ffi.string(ocl.t.vendor).decode():
        pytest.skip("the OpenCL driver here is not pocl")
    kernels = (b"__kernel void k%d(__global const long *meta, __global int *status) {}\n" % k for k in range(9))
    many = [(b"".join(kernels), b"k0")]
    _run(ocl, tmp_path / "a", many, FL_OPENCL_CACHE="", POCL_KERNEL_CACHE="1")
    assert len(_entries(tmp_path / "a")) == 2  # scale_add alone
    _run(ocl, tmp_path / "b", many, FL_OPENCL_CACHE="", POCL_KERNEL_CACHE="0")
    assert len(_entries(tmp_path / "b")) == 4
