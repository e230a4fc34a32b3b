"""One loaded plugin: the cffi handle, its entry-point table, devices and kernels.

Everything that calls into C goes through `Plugin.check`, which turns a status
code into a Python exception carrying the plugin's own message, so a plugin
error never takes the process down."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch

from ..errors import KernelError, PluginError, PluginLoadError, PluginUnavailableError
from . import abi, events
from .abi import ffi
from .dtypes import mask_to_names


@dataclass(frozen=True)
class KernelEntry:
    op: str
    dtypes: int
    flags: int
    fn: object = field(repr=False, compare=False)


@dataclass(frozen=True)
class DeviceProps:
    index: int
    name: str
    total_memory: int
    dtypes: int
    features: int
    compute_units: int

    @property
    def host_accessible(self) -> bool:
        return bool(self.features & abi.FEATURE_HOST_ACCESSIBLE)

    @property
    def async_kernels(self) -> bool:
        """Kernels may still be running when their call returns: time with events, wait before reading."""
        return bool(self.features & abi.FEATURE_ASYNC_KERNELS)

    @property
    def dtype_names(self) -> list[str]:
        return mask_to_names(self.dtypes)


_preloaded_blas = False


BLAS_CORE: str | None = None  # the kernel family torch_fl's OpenBLAS chose, for doctor


def _preload_blas() -> None:
    """Bundled plugins link scipy-openblas32; load it globally first so they
    resolve it in editable installs too, where their rpath does not reach."""
    global _preloaded_blas
    if _preloaded_blas:
        return
    _preloaded_blas = True
    try:
        import ctypes

        import scipy_openblas32

        path = os.path.join(scipy_openblas32.get_lib_dir(), f"lib{scipy_openblas32.get_library()}.so")
        if not os.path.exists(path):
            return
        lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        global BLAS_CORE
        for name in ("scipy_openblas_get_corename", "openblas_get_corename"):
            fn = getattr(lib, name, None)
            if fn is not None:
                fn.restype = ctypes.c_char_p
                BLAS_CORE = fn().decode()
                break
    except (ImportError, OSError):
        pass


def blas_hint() -> str | None:
    """Why GEMM may run at half speed: OpenBLAS reads OPENBLAS_CORETYPE from
    the environment the process started with (setting it later has no effect,
    measured), and a machine-wide value such as Haswell holds an AVX-512 CPU to
    AVX2 kernels (227 vs 424 GFLOP/s at 1024^3 on 2 cores here)."""
    forced = os.environ.get("OPENBLAS_CORETYPE")
    if not forced or BLAS_CORE is None or "skylakex" in BLAS_CORE.lower() or "cooperlake" in BLAS_CORE.lower():
        return None
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return None
    if {"avx512f", "avx512bw", "avx512dq", "avx512vl"} <= set(flags):
        return (
            f"OPENBLAS_CORETYPE={forced} in the environment keeps the host plugin's OpenBLAS on {BLAS_CORE} "
            "kernels although this CPU has AVX-512; start Python without it (env -u OPENBLAS_CORETYPE ...) "
            "for about twice the GEMM and convolution speed"
        )
    return None


class Plugin:
    """A plugin library that passed the loader's checks."""

    def __init__(self, path: str, origin: str):
        self.path = path
        self.origin = origin
        _preload_blas()
        try:
            self.lib = ffi.dlopen(path)
        except OSError as e:
            raise PluginLoadError(f"{path} is not a loadable shared library: {e}") from None
        missing = []
        for sym in ("fl_plugin_abi_version", "fl_plugin_init"):
            try:
                getattr(self.lib, sym)
            except AttributeError:
                missing.append(sym)
        if missing:
            raise PluginLoadError(
                f"{path} is not a torch_fl plugin: missing exported symbol(s) {', '.join(missing)} "
                f"(a plugin must export fl_plugin_abi_version and fl_plugin_init; see fl_plugin.h)"
            )
        version = self.lib.fl_plugin_abi_version()
        if not abi.ABI_VERSION_MIN <= version <= abi.ABI_VERSION:
            raise PluginLoadError(
                f"{path} was built for plugin ABI version {version}, this torch_fl loads versions "
                f"{abi.ABI_VERSION_MIN} to {abi.ABI_VERSION}: rebuild the plugin against torch_fl's fl_plugin.h"
            )
        # zero-filled at the current size: the fields a plugin of an older version does not know stay NULL
        self.table = ffi.new("fl_plugin_t*")
        status = self.lib.fl_plugin_init(self.table)
        if status != abi.FL_OK:
            msg = ""
            if self.table.last_error != ffi.NULL:
                raw = self.table.last_error()
                msg = ffi.string(raw).decode(errors="replace") if raw != ffi.NULL else ""
            if status == abi.FL_ERR_UNSUPPORTED:  # a sound plugin whose device this machine lacks
                name = ffi.string(self.table.name).decode(errors="replace") if self.table.name != ffi.NULL else None
                raise PluginUnavailableError(
                    msg or f"{path}: fl_plugin_init declined (FL_ERR_UNSUPPORTED) and left no message", name
                )
            raise PluginLoadError(
                f"{path}: fl_plugin_init returned {abi.STATUS_NAMES.get(status, status)}" + (f": {msg}" if msg else "")
            )
        t = self.table
        if t.abi_version != version:
            raise PluginLoadError(
                f"{path}: fl_plugin_init filled ABI version {t.abi_version}, but fl_plugin_abi_version() "
                f"says {version}: the two must agree"
            )
        expected = abi.struct_size(version)
        earlier = abi.earlier_struct_sizes(version)
        if t.struct_size != expected and t.struct_size not in earlier:
            also = f" (or {' or '.join(map(str, earlier))} from an earlier header)" if earlier else ""
            raise PluginLoadError(
                f"{path}: fl_plugin_t is {t.struct_size} bytes in the plugin, {expected} in ABI version "
                f"{version}{also}: rebuild the plugin against torch_fl's fl_plugin.h"
            )
        self.abi_version = int(version)
        size = int(t.struct_size)
        if size < ffi.sizeof("fl_plugin_t"):  # what the plugin could not have meant to set reads as NULL
            ffi.memmove(
                ffi.cast("char *", t) + size, bytes(ffi.sizeof("fl_plugin_t") - size), ffi.sizeof("fl_plugin_t") - size
            )
        missing = [name for name in abi.REQUIRED_ENTRIES if getattr(t, name) == ffi.NULL]
        if t.name == ffi.NULL:
            missing.insert(0, "name")
        if missing:
            raise PluginLoadError(f"{path}: required entry point(s) left NULL: {', '.join(missing)}")
        self.name = ffi.string(t.name).decode()
        self.vendor = ffi.string(t.vendor).decode() if t.vendor != ffi.NULL else ""
        self.version = ffi.string(t.version).decode() if t.version != ffi.NULL else ""
        self.description = ffi.string(t.description).decode() if t.description != ffi.NULL else ""
        self.emulated = bool(t.emulated)
        self.optional = {name: getattr(t, name) != ffi.NULL for name in abi.OPTIONAL_ENTRIES}
        self.jit_language = self._jit_language(path, int(t.jit_language))
        self.jit_target, self.jit_builds = self._jit_route()
        self.devices = self._probe_devices()
        if any(d.features & abi.FEATURE_ASYNC_KERNELS for d in self.devices):
            lacking = [name for name in abi.ASYNC_REQUIRED if not self.optional[name]]
            if lacking:
                raise PluginLoadError(
                    f"{path}: its devices declare FL_FEATURE_ASYNC_KERNELS (kernels may finish after their call "
                    f"returns) but entry point(s) {', '.join(lacking)} are NULL; torch_fl waits and times "
                    f'asynchronous work only through them (fl_plugin.h, "Asynchronous devices")'
                )
        self.duplicate_kernels: list[str] = []
        self.kernels = self._probe_kernels()

    def _jit_language(self, path: str, code: int) -> int:
        """The device JIT language the plugin declares (0: none), checked against what it provides."""
        if code == 0:
            return 0
        if code not in abi.JIT_LANGUAGES:
            raise PluginLoadError(
                f"{path}: jit_language is {code}, which fl_plugin.h does not define "
                f"(fl_jit_language_t: {sorted(abi.JIT_LANGUAGES)}); set FL_JIT_NONE (0) or a "
                f"defined language"
            )
        lacking = [name for name in ("jit_build", "jit_launch") if not self.optional[name]]
        if lacking:
            raise PluginLoadError(
                f"{path}: it declares the device JIT language "
                f"{abi.JIT_LANGUAGES[code]} but leaves {' and '.join(lacking)} NULL"
            )
        return code

    def _jit_route(self) -> tuple[int, bool]:
        """(jit_target, jit_builds), fixed when the plugin loads (the JIT tier asks on every call).
        jit_target: the language torch_fl's JIT generates for this plugin (0: it has no JIT): its device
        JIT language when the generators emit it (host C only when there is no jit_compile for it), else
        host C through version 1's jit_compile. jit_builds: whether generated kernels go through
        jit_build/jit_launch (handles per device) rather than jit_compile (a host function for all)."""
        compiles = self.optional["jit_compile"]
        if self.jit_language == abi.JIT_OPENCL_C or (self.jit_language == abi.JIT_HOST_C and not compiles):
            return self.jit_language, True
        return (abi.JIT_HOST_C, False) if compiles else (0, False)

    # -- errors -------------------------------------------------------------
    def last_error(self) -> str:
        try:
            msg = self.table.last_error()
            return ffi.string(msg).decode(errors="replace") if msg != ffi.NULL else ""
        except Exception:  # a broken last_error must not hide the original failure
            return ""

    def check(self, status: int, what: str) -> None:
        if status == abi.FL_OK:
            return
        msg = self.last_error() or "(the plugin gave no message)"
        if status == abi.FL_ERR_OOM:
            raise torch.OutOfMemoryError(f"fl backend '{self.name}': out of memory in {what}: {msg}")
        raise KernelError(
            f"fl backend '{self.name}': {what} failed with {abi.STATUS_NAMES.get(status, status)}: {msg}", status
        )

    # -- probing ------------------------------------------------------------
    def _probe_devices(self) -> list[DeviceProps]:
        n = ffi.new("int*")
        self.check(self.table.device_count(n), "device_count")
        out = []
        props = ffi.new("fl_device_props_t*")
        for i in range(n[0]):
            self.check(self.table.device_props(i, props), f"device_props({i})")
            out.append(
                DeviceProps(
                    i,
                    ffi.string(props.name).decode(errors="replace"),
                    int(props.total_memory),
                    int(props.dtypes),
                    int(props.features),
                    int(props.compute_units),
                )
            )
        return out

    def _probe_kernels(self) -> dict[str, KernelEntry]:
        n = ffi.new("int*")
        self.check(self.table.kernel_count(n), "kernel_count")
        entry = ffi.new("fl_kernel_entry_t*")
        kernels: dict[str, KernelEntry] = {}
        for i in range(n[0]):
            self.check(self.table.kernel_get(i, entry), f"kernel_get({i})")
            if entry.op == ffi.NULL or entry.fn == ffi.NULL:
                raise PluginLoadError(f"{self.path}: kernel table entry {i} has a NULL name or function")
            op = ffi.string(entry.op).decode()
            if op in kernels:  # the first entry serves; the checker reports the rest
                self.duplicate_kernels.append(op)
                continue
            kernels[op] = KernelEntry(op, int(entry.dtypes), int(entry.flags), entry.fn)
        return kernels

    # -- memory and copies ----------------------------------------------------
    def malloc(self, device: int, nbytes: int) -> int:
        return int(ffi.cast("uintptr_t", self.malloc_ptr(device, nbytes)))

    def free(self, device: int, ptr: int) -> None:
        self.check(self.table.free(device, ffi.cast("void*", ptr)), "free")

    # the allocator's own pair: pointers stay cdata, no int round trip
    def malloc_ptr(self, device: int, nbytes: int):
        out = ffi.new("void**")
        status = self.table.malloc(device, nbytes, out)
        if status:
            self.check(status, f"malloc({nbytes} bytes)")
        ptr = out[0]
        if ptr == ffi.NULL and nbytes:
            raise self._null_malloc(device, nbytes)
        return ptr

    def _null_malloc(self, device: int, nbytes: int) -> PluginError:
        """fl_plugin.h: malloc returns a valid pointer or an error status; a NULL with FL_OK
        would be written through by the next kernel or copy and crash the process."""
        return PluginError(
            f"fl backend '{self.name}' ({self.path}): malloc({nbytes} bytes) on device {device} returned FL_OK "
            f"with a NULL pointer, which breaks the plugin contract (fl_plugin.h: return FL_ERR_OOM with a "
            f"message when memory runs out). Report it to the plugin's vendor; `torch-fl plugin check "
            f"{self.path}` checks the contract"
        )

    def free_ptr(self, device: int, ptr) -> None:
        status = self.table.free(device, ptr)
        if status:
            self.check(status, "free")

    def memory_used(self, device: int) -> int | None:
        if not self.optional["memory_used"]:
            return None
        out = ffi.new("uint64_t*")
        self.check(self.table.memory_used(device, out), "memory_used")
        return int(out[0])

    # Copies on `stream` (NULL: the default stream, where they block: the copy contract). A registry.Device
    # copies on the thread's current stream and waits where the host needs the bytes.
    def copy_h2d(self, device: int, dst: int, src: int, nbytes: int, stream=ffi.NULL) -> None:
        events.host_access("writes device memory from the host")
        self.check(
            self.table.copy_h2d(device, ffi.cast("void*", dst), ffi.cast("void*", src), nbytes, stream), "copy_h2d"
        )

    def copy_d2h(self, device: int, dst: int, src: int, nbytes: int, stream=ffi.NULL) -> None:
        events.host_access("reads device memory on the host")
        self.check(
            self.table.copy_d2h(device, ffi.cast("void*", dst), ffi.cast("void*", src), nbytes, stream), "copy_d2h"
        )

    def copy_d2d(self, device: int, dst: int, src: int, nbytes: int, stream=ffi.NULL) -> None:
        events.host_access("copies device memory outside a kernel")
        self.check(
            self.table.copy_d2d(device, ffi.cast("void*", dst), ffi.cast("void*", src), nbytes, stream), "copy_d2d"
        )

    def stream_synchronize(self, device: int, stream) -> None:
        if self.optional["stream_synchronize"]:
            self.check(self.table.stream_synchronize(device, stream), "stream_synchronize")

    def synchronize(self, device: int) -> None:
        if self.optional["synchronize"]:
            self.check(self.table.synchronize(device), "synchronize")

    def rng_set_state(self, device: int, seed: int, offset: int) -> None:
        if self.optional["rng_set_state"]:
            self.check(self.table.rng_set_state(device, seed & 0xFFFFFFFFFFFFFFFF, offset), "rng_set_state")

    def rng_get_state(self, device: int) -> tuple[int, int]:
        if not self.optional["rng_get_state"]:
            return (0, 0)
        seed, offset = ffi.new("uint64_t*"), ffi.new("uint64_t*")
        self.check(self.table.rng_get_state(device, seed, offset), "rng_get_state")
        return int(seed[0]), int(offset[0])

    def __repr__(self) -> str:
        return f"<Plugin {self.name!r} {self.path} ({len(self.kernels)} kernels)>"
