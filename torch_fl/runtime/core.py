"""torch_fl's C++ core (csrc/fl_core.cpp): what makes an fl tensor a real
PyTorch tensor on the PrivateUse1 device.

Why C++: PyTorch allocates, views, resizes and frees tensors without calling
an operator a Python backend could see, and it asks a device guard and hooks
(current device, streams, pinned memory) from C++. A small library compiled
against the installed torch provides those: the device guard, the hooks, a
caching allocator over the plugins' malloc/free, the metadata ops, and the
boxed fallback that hands every other op to torch_fl's dispatcher.

It is compiled once per torch build with the system C++ compiler (about 15 s
on two cores), cached, and loaded with torch.ops.load_library; its plain C
entry points are called through ctypes. Without a C++ compiler torch_fl
cannot give PyTorch an fl device, and says which compiler to install."""

from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
import sysconfig
import tempfile
import warnings

import torch

from ..errors import FlError
from ..notice import notice
from . import private
from .abi import header_path

_HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(_HERE, "csrc", "fl_core.cpp")
# the second: fl kernels in torch.profiler; the third: cross-device errors that name each fl device's backend;
# the fourth: the CPU fallback's fast path and same-device copies as device copies; the fifth: the fused RNN cells
SOURCES = (SOURCE, os.path.join(_HERE, "csrc", "fl_kineto.cpp"), os.path.join(_HERE, "csrc", "fl_devcheck.cpp"),
           os.path.join(_HERE, "csrc", "fl_fallback.cpp"), os.path.join(_HERE, "csrc", "fl_rnn.cpp"))
HEADERS = (os.path.join(_HERE, "csrc", "fl_trace.h"), os.path.join(_HERE, "csrc", "fl_fallback.h"))
STATS_FIELDS = ("allocated", "peak", "cached", "allocations", "hits", "misses", "limit", "device_allocs",
                "device_frees", "ooms")

_lib: ctypes.CDLL | None = None
STATUS = "not built"  # for doctor / list_backends


def cache_dir() -> str:
    """The private cache folder (see private.py): the core is a library every torch_fl process loads."""
    return private.private_dir(private.cache_root())


def _key() -> str:
    h = hashlib.sha256()
    for path in (*SOURCES, *HEADERS, header_path()):
        with open(path, "rb") as f:
            h.update(f.read())
    h.update(torch.__version__.encode() + os.path.dirname(torch.__file__).encode()
             + str(torch._C._GLIBCXX_USE_CXX11_ABI).encode())
    return h.hexdigest()[:16]


def library_path() -> str:
    return os.path.join(cache_dir(), f"libfl_core-{_key()}.so")


def _compiler() -> list[str]:
    """$CXX (else the compiler Python was built with) split at spaces, as make takes it: "ccache g++" runs g++
    through ccache. Never run through a shell."""
    cxx = os.environ.get("CXX") or sysconfig.get_config_var("CXX") or "c++"
    return cxx.split() or ["c++"]


def _build(path: str) -> None:
    """Compiles the core in a private temporary folder, records its digest, and renames both into place
    (atomic: concurrent processes may build at once; a file planted at the name is never written through)."""
    torch_dir = os.path.dirname(torch.__file__)
    include, lib = os.path.join(torch_dir, "include"), os.path.join(torch_dir, "lib")
    # a minute or more of silence otherwise, once per torch version (the doctor's cold start)
    notice(f"torch_fl: compiling its C++ core against torch {torch.__version__} (first use; about a minute, "
           f"cached in {os.path.dirname(path)})")
    with tempfile.TemporaryDirectory(prefix=".build-", dir=os.path.dirname(path)) as tmp_dir:
        tmp = os.path.join(tmp_dir, os.path.basename(path))
        cmd = [*_compiler(), "-O2", "-std=c++17", "-shared", "-fPIC", "-fvisibility=hidden",
               f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
               "-isystem", include, "-isystem", os.path.join(include, "torch", "csrc", "api", "include"),
               "-isystem", os.path.join(include, "kineto"), "-I", os.path.dirname(header_path()), *SOURCES,
               "-L", lib, "-lc10", "-ltorch_cpu", "-ltorch", f"-Wl,-rpath,{lib}", "-o", tmp]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        except FileNotFoundError:
            raise FlError(f"torch_fl compiles a small C++ library against your torch at first use, and no C++ "
                          f"compiler was found ({cmd[0]!r}). Install one (Debian/Ubuntu: apt install g++; "
                          f"Fedora: dnf install gcc-c++; conda: conda install gxx_linux-64) or point CXX at "
                          f"it, then import torch_fl again.") from None
        if r.returncode != 0:
            raise FlError(f"building torch_fl's C++ core failed:\n{' '.join(cmd)}\n"
                          f"{r.stderr[-3000:] or '(the compiler printed nothing)'}")
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


def load() -> ctypes.CDLL:
    """Builds (once per torch build) and loads the core; registers its kernels with PyTorch."""
    global _lib, STATUS
    if _lib is not None:
        return _lib
    path = library_path()
    _ensure_built(path)
    torch.ops.load_library(path)
    lib = ctypes.CDLL(path)
    _declare(lib)
    if lib.fl_core_abi() != _abi_version():
        raise FlError(f"{path} was built for another plugin ABI; delete it and import torch_fl again")
    _lib = lib
    STATUS = f"torch_fl C++ core ({path})"
    return lib


def _abi_version() -> int:
    from .abi import ABI_VERSION

    return ABI_VERSION


def _declare(lib: ctypes.CDLL) -> None:
    c_int, c_i64, c_u64, c_u32, c_void = ctypes.c_int, ctypes.c_int64, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_void_p
    sigs = {
        "fl_core_abi": ([], c_int),
        "fl_core_install": ([], c_int),
        "fl_devcheck_install": ([], c_int),
        "fl_devcheck_label": ([c_int, ctypes.c_char_p], None),
        "fl_core_add_device": ([c_int, c_void, c_int, c_u64, c_u32, c_i64, ctypes.c_char_p], c_int),
        "fl_core_set_default": ([c_int], None),
        "fl_core_current": ([], c_int),
        "fl_core_current_stream": ([c_int], c_void),
        "fl_core_trace_begin": ([c_int], None),
        "fl_core_trace_end": ([ctypes.c_char_p], None),
        "fl_core_kineto": ([], c_int),
        "fl_core_set_pool_enabled": ([c_int], None),
        "fl_core_set_pool_limit": ([c_int, c_i64], c_int),
        "fl_core_empty_cache": ([c_int], c_int),
        "fl_core_memory_stats": ([c_int, ctypes.POINTER(c_i64)], c_int),
        "fl_core_set_peak": ([c_int, c_i64], c_int),
        "fl_core_size_class": ([c_u64], c_u64),
        "fl_core_set_pending": ([c_int, c_void, c_void], c_int),
        "fl_core_wait_pending": ([c_int, c_void], c_int),
        "fl_core_is_pending": ([c_int, c_void], c_int),
        "fl_core_fast_enable": ([c_int], None),
        "fl_core_fast_clear": ([], None),
        "fl_core_fast_size": ([], c_i64),
        "fl_core_fast_hits": ([], c_i64),
        "fl_core_fast_can_commit": ([ctypes.c_char_p], c_int),
        "fl_core_route_to_fallback": ([ctypes.c_char_p, ctypes.c_char_p], c_int),
        "fl_core_fast_commit": ([ctypes.c_char_p, c_void, c_void, c_void, c_int, c_int, c_void, c_int, c_void, c_void,
                                 c_int, c_void, c_void, c_void, c_int, c_void, c_int, c_void, c_int, c_i64], c_int),
        "fl_core_fast_take_counts": ([ctypes.POINTER(c_i64), c_i64], c_i64),
        "fl_fallback_commit": ([ctypes.c_char_p, c_int, ctypes.c_char_p, c_void, c_int, c_void, c_int, c_void, c_int,
                                c_void, c_int, c_i64], c_int),
        "fl_fallback_copy_commit": ([c_int, c_i64], None),
        "fl_fallback_clear": ([], None),
        "fl_fallback_size": ([], c_i64),
        "fl_fallback_hits": ([], c_i64),
        "fl_fallback_copies": ([], c_i64),
        "fl_fallback_fills": ([], c_i64),
        "fl_fallback_zero_commit": ([c_int, c_int, c_i64], None),
        "fl_fallback_bytes": ([], c_i64),
        "fl_fallback_device_only": ([c_int], None),
        "fl_core_watch": ([c_void, c_int], None),
        "fl_core_fresh_out": ([c_void], c_int),
        "fl_core_write_generation": ([c_void], c_u64),
        "fl_core_note_write": ([c_void], None),
        "fl_core_watched": ([], c_i64),
        "fl_core_graph_new": ([c_int], c_void),
        "fl_core_graph_free": ([c_void], None),
        "fl_core_graph_add_kernel": ([c_void, c_void, c_void, c_void, c_int, c_void, c_int, c_void, c_int, c_void,
                                      c_int, c_i64],
                                     c_int),
        "fl_core_graph_add_input": ([c_void, c_void, c_u64], c_int),
        "fl_core_graph_add_output": ([c_void, c_void, c_u64], c_int),
        "fl_core_graph_size": ([c_void], c_i64),
        "fl_core_graph_replay": ([c_void, c_void, c_void, c_int, ctypes.POINTER(c_i64), c_void], c_int),
    }
    for name, (args, res) in sigs.items():
        fn = getattr(lib, name)
        fn.argtypes = args
        fn.restype = res


def loaded() -> bool:
    return _lib is not None


def lib() -> ctypes.CDLL:
    if _lib is None:
        raise FlError("torch_fl's C++ core is not loaded (import torch_fl first)")
    return _lib


_streams_made: ctypes.c_int64 | None = None


_tracing: ctypes.c_int | None = None


def tracing() -> bool:
    """Whether torch.profiler is recording fl kernels (fl_kineto.cpp): Python's kernel calls then report theirs."""
    global _tracing
    if _tracing is None:
        _tracing = ctypes.c_int.in_dll(lib(), "fl_core_tracing")
    return bool(_tracing.value)


def streams_made() -> int:
    """How many streams the core has made (torch.fl.Stream()); while none, every current stream is the
    default one and a kernel call needs not ask which."""
    global _streams_made
    if _streams_made is None:
        _streams_made = ctypes.c_int64.in_dll(lib(), "fl_core_streams_made")
    return _streams_made.value


def memory_stats(index: int) -> dict[str, int]:
    out = (ctypes.c_int64 * len(STATS_FIELDS))()
    if lib().fl_core_memory_stats(index, out) != 0:
        raise FlError(f"fl:{index} does not exist")
    return dict(zip(STATS_FIELDS, out, strict=True))


def add_device(dev, pool_limit: int) -> None:
    """Tell the core that fl:dev.index is dev.plugin's local device dev.local."""
    from .abi import ffi

    table = int(ffi.cast("uintptr_t", dev.plugin.table))
    label = f"fl:{dev.index} ({dev.backend.name})".encode()
    if load().fl_core_add_device(dev.index, table, dev.local, dev.props.total_memory, dev.props.features,
                                 pool_limit, label) != 0:
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
            return ("PyTorch's autograd engine was started (a backward() ran) before torch_fl was imported, so it "
                    "has no queue for fl devices and backward() on fl tensors fails in this process. Import "
                    "torch_fl before the first backward() (e.g. at the top of the script or notebook).")
        return None
    return None


# c10::ScalarType codes of the dtypes fl tensors hold (the fast path allocates fresh outputs by them)
_SCALAR_TYPE = {torch.uint8: 0, torch.int8: 1, torch.int16: 2, torch.int32: 3, torch.int64: 4, torch.float16: 5,
                torch.float32: 6, torch.float64: 7, torch.complex64: 9, torch.complex128: 10, torch.bool: 11,
                torch.bfloat16: 15}


def scalar_type_code(dtype: torch.dtype) -> int:
    return _SCALAR_TYPE[dtype]


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


def drain_counts() -> None:
    """Add the calls the fast path served since the last drain to each backend's counts."""
    if _lib is None or not _SLOT_KEYS:
        return
    n = len(_SLOT_KEYS)
    out = (ctypes.c_int64 * n)()
    m = _lib.fl_core_fast_take_counts(out, n)
    for i in range(m):
        if out[i]:
            backend, name, path = _SLOT_KEYS[i]
            counts = backend.own_counts
            counts[(name, path)] = counts.get((name, path), 0) + out[i]
