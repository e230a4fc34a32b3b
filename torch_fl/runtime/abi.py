"""The plugin ABI as cffi sees it, parsed from the one C header vendors compile
against, so Python and C can never disagree about a struct layout."""

from __future__ import annotations

import os
import re

import cffi

_HERE = os.path.dirname(os.path.abspath(__file__))
_CANDIDATES = (
    os.path.join(_HERE, "include", "fl_plugin.h"),  # shipped by setup.py
    os.path.join(os.path.dirname(os.path.dirname(_HERE)), "plugins_cffi", "include", "fl_plugin.h"),  # a checkout
)


def header_path() -> str:
    for path in _CANDIDATES:
        if os.path.exists(path):
            return path
    raise FileNotFoundError("fl_plugin.h not found; reinstall torch_fl (pip install .)")


def get_include() -> str:
    """The folder that holds fl_plugin.h and fl_kernel_util.h, the headers a plugin compiles against
    (cc -I"$(python -c 'import torch_fl; print(torch_fl.get_include())')")."""
    return os.path.dirname(header_path())


SPECIAL_MATH_HEADERS = ("fl_special_math.h", "fl_special_bessel.h")  # in this order: the second uses the first


def special_math_paths() -> tuple[str, ...] | None:
    """The special functions' C (SPECIAL_MATH_HEADERS) the host plugin's kernels are built from and the JIT
    pastes into the kernels it generates, in order: shipped beside fl_plugin.h, or in a checkout's
    plugins_cffi/host. None when either is missing."""
    for folder in (
        os.path.join(_HERE, "include"),
        os.path.join(os.path.dirname(os.path.dirname(_HERE)), "plugins_cffi", "host"),
    ):
        paths = tuple(os.path.join(folder, name) for name in SPECIAL_MATH_HEADERS)
        if all(os.path.exists(p) for p in paths):
            return paths
    return None


def cdef_source(text: str, export_macro: str = "FL_EXPORT") -> str:
    """A C header as cffi's cdef takes it (cffi has no preprocessor): its comments, its C++ guard (the lines
    between `#ifdef __cplusplus` and `#endif`) and its export macro left out, and of the preprocessor lines
    only the FL_ integer constants kept. fl_plugin.h and the core's fl_core.h are both read this way."""
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    keep = []
    cplusplus = False
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            cplusplus = stripped == "#ifdef __cplusplus" or (cplusplus and not stripped.startswith("#endif"))
            # integer constants are the only preprocessor lines cffi understands
            m = re.match(r"#define\s+(FL_[A-Z0-9_]+)\s+(\d+)u?$", stripped)
            if m:
                keep.append(f"#define {m.group(1)} {m.group(2)}")
            continue
        if not cplusplus:
            keep.append(line.replace(export_macro + " ", ""))
    return "\n".join(keep)


ffi = cffi.FFI()
with open(header_path(), encoding="utf-8") as _header:
    ffi.cdef(cdef_source(_header.read()))

# The header's integer constants (its #defines and enum values), as cffi read them: no value of
# fl_plugin.h is restated in Python. Any library object carries the cdef's constants; the C library
# (dlopen(None)) is one that is always there.
_HEADER = ffi.dlopen(None)


def enum_values(ctype: str, prefix: str) -> dict[str, int]:
    """The constants of one of fl_plugin.h's enums, by name without the prefix: enum_values("fl_feature_t",
    "FL_FEATURE_") == {"HOST_ACCESSIBLE": 1, ...}."""
    return {
        name[len(prefix) :]: value for name, value in ffi.typeof(ctype).relements.items() if name.startswith(prefix)
    }


ABI_VERSION: int = _HEADER.FL_ABI_VERSION
ABI_VERSION_MIN: int = _HEADER.FL_ABI_VERSION_MIN
MAX_DIMS: int = _HEADER.FL_MAX_DIMS

FL_OK, FL_ERR_OOM, FL_ERR_INVALID, FL_ERR_UNSUPPORTED, FL_ERR_INTERNAL = (
    _HEADER.FL_OK,
    _HEADER.FL_ERR_OOM,
    _HEADER.FL_ERR_INVALID,
    _HEADER.FL_ERR_UNSUPPORTED,
    _HEADER.FL_ERR_INTERNAL,
)
STATUS_NAMES: dict[int, str] = dict(ffi.typeof("fl_status_t").elements)

ARG_NONE, ARG_TENSOR, ARG_TENSOR_LIST, ARG_INT, ARG_FLOAT, ARG_BOOL, ARG_INT_LIST, ARG_DTYPE, ARG_OTHER = (
    _HEADER.FL_ARG_NONE,
    _HEADER.FL_ARG_TENSOR,
    _HEADER.FL_ARG_TENSOR_LIST,
    _HEADER.FL_ARG_INT,
    _HEADER.FL_ARG_FLOAT,
    _HEADER.FL_ARG_BOOL,
    _HEADER.FL_ARG_INT_LIST,
    _HEADER.FL_ARG_DTYPE,
    _HEADER.FL_ARG_OTHER,
)

FEATURES: dict[str, int] = enum_values("fl_feature_t", "FL_FEATURE_")
FEATURE_HOST_ACCESSIBLE = FEATURES["HOST_ACCESSIBLE"]
FEATURE_ASYNC_COPY = FEATURES["ASYNC_COPY"]
FEATURE_FP16_STABLE = FEATURES["FP16_STABLE"]
FEATURE_COLLECTIVES = FEATURES["COLLECTIVES"]
FEATURE_CHANNELS_LAST = FEATURES["CHANNELS_LAST"]
FEATURE_ASYNC_KERNELS = FEATURES["ASYNC_KERNELS"]
FEATURE_HOST_CPU = FEATURES["HOST_CPU"]
KERNEL_FUSED: int = _HEADER.FL_KERNEL_FUSED
KERNEL_ANY_OUT_LAYOUT: int = _HEADER.FL_KERNEL_ANY_OUT_LAYOUT

# The strings kernels read, passed as FL_ARG_OTHER with their code in `i`: fl_string_code_t names each one
# FL_STR_<the string>, so "amax" -> FL_STR_amax. Any other string is STRING_UNKNOWN.
STRING_UNKNOWN: int = _HEADER.FL_STR_UNKNOWN
STRING_CODES: dict[str, int] = {
    name: code for name, code in enum_values("fl_string_code_t", "FL_STR_").items() if code != STRING_UNKNOWN
}

# Entry points a plugin must provide; the rest may be NULL.
REQUIRED_ENTRIES = (
    "device_count",
    "device_props",
    "malloc",
    "free",
    "copy_h2d",
    "copy_d2h",
    "copy_d2d",
    "kernel_count",
    "kernel_get",
    "last_error",
)
OPTIONAL_ENTRIES = (
    "memory_used",
    "stream_create",
    "stream_destroy",
    "stream_synchronize",
    "event_create",
    "event_destroy",
    "event_record",
    "event_synchronize",
    "event_query",
    "synchronize",
    "rng_set_state",
    "rng_get_state",
    "comm_init",
    "comm_destroy",
    "comm_all_reduce",
    "comm_broadcast",
    "comm_all_gather",
    "comm_reduce_scatter",
    "comm_send",
    "comm_recv",
    "comm_barrier",
    "jit_compile",
    # version 2
    "event_elapsed",
    "mem_set",
    "host_alloc",
    "host_free",
    "copy_d2h_async",
    "jit_build",
    "jit_launch",
    "stream_wait_event",
)
# Device JIT languages (fl_jit_language_t) by value, and the ones torch_fl's generators emit.
JIT_LANGUAGES: dict[int, str] = {
    code: name.lower() for name, code in enum_values("fl_jit_language_t", "FL_JIT_").items()
}
JIT_HOST_C: int = _HEADER.FL_JIT_HOST_C
JIT_OPENCL_C: int = _HEADER.FL_JIT_OPENCL_C
JIT_META_TENSOR: int = _HEADER.FL_JIT_META_TENSOR
JIT_META_ARG: int = _HEADER.FL_JIT_META_ARG
# The first field each version added to fl_plugin_t: a plugin of version v fills the table up to the first
# field of version v + 1, and says so in struct_size.
_FIRST_FIELD = {2: "event_elapsed"}
# Fields appended to a version after plugins were built against it: a plugin of that version may end its
# table just before any of them (its struct_size says where), and the rest reads as NULL.
_APPENDED = {2: ("stream_wait_event",)}
# What a device that declares FL_FEATURE_ASYNC_KERNELS must provide: the runtime waits and times with these.
ASYNC_REQUIRED = (
    "stream_create",
    "stream_destroy",
    "stream_synchronize",
    "event_create",
    "event_destroy",
    "event_record",
    "event_synchronize",
    "event_query",
    "synchronize",
    "event_elapsed",
)


def struct_size(version: int) -> int:
    """sizeof(fl_plugin_t) as a plugin built against `version` of fl_plugin.h has it."""
    if version >= ABI_VERSION:
        return ffi.sizeof("fl_plugin_t")
    return ffi.offsetof("fl_plugin_t", _FIRST_FIELD[version + 1])


def earlier_struct_sizes(version: int) -> tuple[int, ...]:
    """The sizes a plugin built against an earlier header of `version` has (before fields were appended)."""
    return tuple(ffi.offsetof("fl_plugin_t", name) for name in _APPENDED.get(version, ()))
