"""torch_fl's C++ core (csrc/): what makes an fl tensor a real PyTorch tensor
on the PrivateUse1 device.

Why C++: PyTorch allocates, views, resizes and frees tensors without calling
an operator a Python backend could see, and it asks a device guard and hooks
(current device, streams, pinned memory) from C++. A small library compiled
against the installed torch provides those, one file per PyTorch seam (SOURCES;
csrc/fl_core_internal.h says which is which): the device table and hooks, a
caching allocator over the plugins' malloc/free, the device guard, pinned host
memory, the metadata ops, and the boxed fallback that hands every other op to
torch_fl's dispatcher.

It is compiled once per torch build with the system C++ compiler (the sources
in parallel, one per core), cached, and loaded with torch.ops.load_library. Its
plain C entry points are declared once, in csrc/fl_core.h, and called through
cffi in ABI mode: `ffi` below is cdef'd from that header's text (after
fl_plugin.h's, whose types it shares), so Python and C cannot disagree about a
signature. Without a C++ compiler torch_fl cannot give PyTorch an fl device,
and says which compiler to install."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sysconfig
import tempfile
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import cffi
import torch

from ..errors import FlError
from ..notice import notice
from . import private
from .abi import ABI_VERSION, cdef_source, header_path
from .abi import ffi as plugin_ffi

_CSRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "csrc")
# one file per PyTorch seam, as PyTorch's OpenReg backend lays its runtime out (csrc/fl_core_internal.h)
SOURCES = tuple(
    os.path.join(_CSRC, name)
    for name in (
        "fl_device.cpp",  # the device table and the PrivateUse1 hooks
        "fl_generator.cpp",  # torch.Generator("fl")
        "fl_allocator.cpp",  # the caching allocator and its pool
        "fl_guard.cpp",  # the device guard: streams and events
        "fl_pinned.cpp",  # pinned host memory
        "fl_meta_ops.cpp",  # empty, view, resize_, set_, ...
        "fl_fallback.cpp",  # the boxed fallback and its fast path
        "fl_cpu_fallback.cpp",  # the CPU fallback's fast path; same-device copies and zero_ as memory operations
        "fl_rnn.cpp",  # the fused LSTM/GRU cells as C++ composites (fl_rnn::*)
        "fl_watch.cpp",  # the write watch
        "fl_trace.cpp",  # the kernel recorder (fl kernels in torch.profiler) ...
        "fl_kineto.cpp",  # ... and Kineto's side of it
        "fl_graph.cpp",  # kernel graph replay
        "fl_decomp_plans.cpp",  # decompositions replayed as kernel graphs per signature
        "fl_devcheck.cpp",  # cross-device errors that name each fl device's backend
    )
)
HEADER = os.path.join(_CSRC, "fl_core.h")  # the C API
HEADERS = (
    HEADER,
    *(
        os.path.join(_CSRC, name)
        for name in ("fl_core_internal.h", "fl_trace.h", "fl_cpu_fallback.h", "fl_decomp_plans.h")
    ),
)

# The core's C API as cffi reads it from fl_core.h; fl_plugin.h's types (fl_tensor_t, fl_plugin_t, ...) are the
# plugin ABI's own, so a descriptor array or a plugin table made for a plugin passes to the core as it is.
ffi = cffi.FFI()
ffi.include(plugin_ffi)
with open(HEADER, encoding="utf-8") as _header:
    ffi.cdef(cdef_source(_header.read(), "FL_CORE_API"))
STATS_FIELDS = tuple(name for name, _ in ffi.typeof("fl_core_memory_stats_t").fields)  # torch.fl.memory_stats()

_lib: Any = None  # cffi's library object for the core (ffi.dlopen)
STATUS = "not built"  # for doctor / list_backends


def cache_dir() -> str:
    """The private cache folder (see private.py): the core is a library every torch_fl process loads."""
    return private.private_dir(private.cache_root())


def _key() -> str:
    h = hashlib.sha256()
    for path in (*SOURCES, *HEADERS, header_path()):
        with open(path, "rb") as f:
            h.update(f.read())
    h.update(
        torch.__version__.encode()
        + os.path.dirname(torch.__file__).encode()
        + str(torch._C._GLIBCXX_USE_CXX11_ABI).encode()
    )
    return h.hexdigest()[:16]


def library_path() -> str:
    return os.path.join(cache_dir(), f"libfl_core-{_key()}.so")


def _compiler() -> list[str]:
    """$CXX (else the compiler Python was built with) split at spaces, as make takes it: "ccache g++" runs g++
    through ccache. Never run through a shell."""
    cxx = os.environ.get("CXX") or sysconfig.get_config_var("CXX") or "c++"
    return cxx.split() or ["c++"]


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    except FileNotFoundError:
        raise FlError(
            f"torch_fl compiles a small C++ library against your torch at first use, and no C++ "
            f"compiler was found ({cmd[0]!r}). Install one (Debian/Ubuntu: apt install g++; "
            f"Fedora: dnf install gcc-c++; conda: conda install gxx_linux-64) or point CXX at "
            f"it, then import torch_fl again."
        ) from None


def _check(cmd: list[str], r: subprocess.CompletedProcess) -> None:
    if r.returncode != 0:
        raise FlError(
            f"building torch_fl's C++ core failed:\n{' '.join(cmd)}\n"
            f"{r.stderr[-3000:] or '(the compiler printed nothing)'}"
        )


def _build(path: str) -> None:
    """Compiles the core in a private temporary folder (one compiler per source, as many at once as there
    are cores), records its digest, and renames both into place (atomic: concurrent processes may build at
    once; a file planted at the name is never written through)."""
    torch_dir = os.path.dirname(torch.__file__)
    include, lib = os.path.join(torch_dir, "include"), os.path.join(torch_dir, "lib")
    # a minute or more of silence otherwise, once per torch version (the doctor's cold start)
    notice(
        f"torch_fl: compiling its C++ core against torch {torch.__version__} (first use; about a minute, "
        f"cached in {os.path.dirname(path)})"
    )
    with tempfile.TemporaryDirectory(prefix=".build-", dir=os.path.dirname(path)) as tmp_dir:
        tmp = os.path.join(tmp_dir, os.path.basename(path))
        flags = [
            "-O2",
            "-std=c++17",
            "-fPIC",
            "-fvisibility=hidden",
            f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
            "-isystem",
            include,
            "-isystem",
            os.path.join(include, "torch", "csrc", "api", "include"),
            "-isystem",
            os.path.join(include, "kineto"),
            "-I",
            os.path.dirname(header_path()),
        ]
        objects = [os.path.join(tmp_dir, os.path.basename(src)[: -len(".cpp")] + ".o") for src in SOURCES]
        compiles = [[*_compiler(), *flags, "-c", src, "-o", obj] for src, obj in zip(SOURCES, objects, strict=True)]
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        workers = max(1, min(len(compiles), cores))
        with ThreadPoolExecutor(max_workers=workers) as pool:
            results = list(pool.map(_run, compiles))
        for cmd, r in zip(compiles, results, strict=True):
            _check(cmd, r)
        link = [
            *_compiler(),
            "-shared",
            *objects,
            "-L",
            lib,
            "-lc10",
            "-ltorch_cpu",
            "-ltorch",
            f"-Wl,-rpath,{lib}",
            "-o",
            tmp,
        ]
        _check(link, _run(link))
        private.record_digest(tmp)
        os.replace(tmp + private.DIGEST_SUFFIX, path + private.DIGEST_SUFFIX)
        os.replace(tmp, path)


def _ensure_built(path: str) -> None:
    """Builds the core unless the cached copy is the one this user's compiler produced; a cached copy
    that is not (truncated, replaced, recorded by no digest) is rebuilt, with a warning."""
    if not os.path.lexists(path) or not os.path.lexists(path + private.DIGEST_SUFFIX):
        _build(path)
        return
    problem = private.digest_problem(path)
    if problem:
        warnings.warn(f"torch_fl: rebuilding the cached C++ core: {problem}", RuntimeWarning, stacklevel=4)
        _build(path)


def load() -> Any:
    """Builds (once per torch build) and loads the core; registers its kernels with PyTorch. Returns cffi's
    library object: the entry points fl_core.h declares."""
    global _lib, STATUS
    if _lib is not None:
        return _lib
    path = library_path()
    _ensure_built(path)
    torch.ops.load_library(path)
    lib = ffi.dlopen(path)  # the library just loaded: dlopen hands back the same one
    if lib.fl_core_abi() != ABI_VERSION:
        raise FlError(f"{path} was built for another plugin ABI; delete it and import torch_fl again")
    _lib = lib
    STATUS = f"torch_fl C++ core ({path})"
    return lib


def loaded() -> bool:
    return _lib is not None


def lib() -> Any:
    """The loaded core's entry points (cffi's library object for fl_core.h)."""
    if _lib is None:
        raise FlError("torch_fl's C++ core is not loaded (import torch_fl first)")
    return _lib


def pointer(address: int) -> Any:
    """An address as the `void *` the C API takes (storage bases and data pointers are ints in Python)."""
    return ffi.cast("void *", address)


_variables: dict[str, Any] = {}


def _variable(name: str) -> int:
    """One of the counters fl_core.h exports as a variable, read without a call."""
    ptr = _variables.get(name)
    if ptr is None:
        ptr = _variables[name] = ffi.addressof(lib(), name)
    return ptr[0]


def tracing() -> bool:
    """Whether torch.profiler is recording fl kernels (fl_kineto.cpp): Python's kernel calls then report theirs."""
    return bool(_variable("fl_core_tracing"))


def streams_made() -> int:
    """How many streams the core has made (torch.fl.Stream()); while none, every current stream is the
    default one and a kernel call needs not ask which."""
    return _variable("fl_core_streams_made")


def watched_writes() -> int:
    """Writes into any storage the write watch watches (runtime/watch.py), so far."""
    return _variable("fl_core_watched_writes")


def memory_stats(index: int) -> dict[str, int]:
    out = ffi.new("fl_core_memory_stats_t *")
    if lib().fl_core_memory_stats(index, out) != 0:
        raise FlError(f"fl:{index} does not exist")
    return {name: getattr(out, name) for name in STATS_FIELDS}


def add_device(dev, pool_limit: int) -> None:
    """Tell the core that fl:dev.index is dev.plugin's local device dev.local."""
    label = ffi.new("char[]", f"fl:{dev.index} ({dev.backend.name})".encode())  # the core copies it
    device = ffi.new(
        "fl_core_device_t *",
        {
            "plugin": dev.plugin.table,
            "local": dev.local,
            "features": dev.props.features,
            "total_memory": dev.props.total_memory,
            "pool_limit": pool_limit,
            "label": label,
        },
    )
    if load().fl_core_add_device(dev.index, device) != 0:
        raise FlError(f"fl:{dev.index}: the C++ core has room for 64 fl devices")
    load().fl_devcheck_label(dev.index, dev.backend.name.encode())


def name_devices_in_errors() -> int:
    """PyTorch's "found at least two devices, fl:3 and fl:2" from its shared composite kernels (a + b, mul,
    eq, ...) names each fl device's backend (fl_devcheck.cpp). Called once every torch_fl kernel is
    registered: it takes the ops that have no fl kernel of their own. Returns how many."""
    n = load().fl_devcheck_install()
    if n < 0:
        raise FlError("torch_fl's C++ core could not register its device-check kernels with PyTorch")
    return n


def set_current(index: int) -> None:
    """The device a bare "fl" means, and the one new threads start on."""
    load().fl_core_set_default(int(index))


def probe_autograd(index: int) -> str | None:
    """Runs a one-element backward on fl:index; says why it failed, if it did.

    The autograd engine sizes its device queues once, at the first backward
    of the process: if that happened before torch_fl was imported, backward
    on fl tensors cannot work in this process."""
    try:
        t = torch.ones(1, device=torch.device("fl", index), requires_grad=True)
        (t * 2).sum().backward()
    except RuntimeError as e:
        if "device_ready_queues_" in str(e):
            return (
                "PyTorch's autograd engine was started (a backward() ran) before torch_fl was imported, so it "
                "has no queue for fl devices and backward() on fl tensors fails in this process. Import "
                "torch_fl before the first backward() (e.g. at the top of the script or notebook)."
            )
        return None
    return None


# c10::ScalarType codes (c10/core/ScalarType.h's order) of every dtype an fl tensor can hold: the fast path,
# decomposition plans and graph replay allocate fresh outputs by them, and zero_ fills any dtype's bytes
_SCALAR_TYPE = {
    torch.uint8: 0,
    torch.int8: 1,
    torch.int16: 2,
    torch.int32: 3,
    torch.int64: 4,
    torch.float16: 5,
    torch.float32: 6,
    torch.float64: 7,
    torch.complex32: 8,
    torch.complex64: 9,
    torch.complex128: 10,
    torch.bool: 11,
    torch.bfloat16: 15,
    torch.float8_e5m2: 23,
    torch.float8_e4m3fn: 24,
    torch.float8_e5m2fnuz: 25,
    torch.float8_e4m3fnuz: 26,
    torch.uint16: 27,
    torch.uint32: 28,
    torch.uint64: 29,
}


def scalar_type_code(dtype: torch.dtype) -> int:
    code = _SCALAR_TYPE.get(dtype)
    if code is None:
        raise FlError(f"torch_fl does not hold {dtype} tensors on the device (no c10::ScalarType code for it here)")
    return code


# -- call counters the fast path keeps for Python: (backend, op, path) -> slot -------------------
_SLOTS: dict = {}
_SLOT_KEYS: list = []


def count_slot(backend, name: str, path: str) -> int:
    key = (backend, name, path)
    slot = _SLOTS.get(key)
    if slot is None:
        slot = _SLOTS[key] = len(_SLOT_KEYS)
        _SLOT_KEYS.append(key)
    return slot


FAST_SERVED: dict[str, int] = {}  # path -> the calls the fast path served under it, ever (as drained)


def drain_counts() -> None:
    """Add the calls the fast path served since the last drain to each backend's counts (and to FAST_SERVED:
    the dispatcher tells native calls from JIT ones the core served)."""
    if _lib is None or not _SLOT_KEYS:
        return
    n = len(_SLOT_KEYS)
    out = ffi.new("int64_t[]", n)
    m = _lib.fl_core_fast_take_counts(out, n)
    for i in range(m):
        if out[i]:
            backend, name, path = _SLOT_KEYS[i]
            counts = backend.own_counts
            counts[(name, path)] = counts.get((name, path), 0) + out[i]
            FAST_SERVED[path] = FAST_SERVED.get(path, 0) + out[i]
