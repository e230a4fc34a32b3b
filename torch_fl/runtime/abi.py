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


def special_math_path() -> str | None:
    """fl_special_math.h, the special functions' C the host plugin's kernels are built from and the JIT
    pastes into the kernels it generates: shipped beside fl_plugin.h, or in a checkout's plugins_cffi/host."""
    for path in (os.path.join(_HERE, "include", "fl_special_math.h"),
                 os.path.join(os.path.dirname(os.path.dirname(_HERE)), "plugins_cffi", "host", "fl_special_math.h")):
        if os.path.exists(path):
            return path
    return None


def _cdef_source(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    keep = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            # integer constants are the only preprocessor lines cffi understands
            m = re.match(r"#define\s+(FL_[A-Z0-9_]+)\s+(\d+)u?$", stripped)
            if m:
                keep.append(f"#define {m.group(1)} {m.group(2)}")
            continue
        keep.append(line.replace("FL_EXPORT ", ""))
    return "\n".join(keep)


ffi = cffi.FFI()
with open(header_path(), encoding="utf-8") as _header:
    ffi.cdef(_cdef_source(_header.read()))

ABI_VERSION: int = 1
MAX_DIMS: int = 8

# values mirror fl_plugin.h
FL_OK, FL_ERR_OOM, FL_ERR_INVALID, FL_ERR_UNSUPPORTED, FL_ERR_INTERNAL = 0, 1, 2, 3, 4
STATUS_NAMES = {0: "FL_OK", 1: "FL_ERR_OOM", 2: "FL_ERR_INVALID", 3: "FL_ERR_UNSUPPORTED", 4: "FL_ERR_INTERNAL"}

ARG_NONE, ARG_TENSOR, ARG_TENSOR_LIST, ARG_INT, ARG_FLOAT, ARG_BOOL, ARG_INT_LIST, ARG_DTYPE, ARG_OTHER = range(9)

FEATURE_HOST_ACCESSIBLE = 1
FEATURE_ASYNC_COPY = 2
FEATURE_FP16_STABLE = 4
FEATURE_COLLECTIVES = 8
FEATURE_CHANNELS_LAST = 16
KERNEL_FUSED = 1

# Entry points a plugin must provide; the rest may be NULL.
REQUIRED_ENTRIES = (
    "device_count", "device_props", "malloc", "free", "copy_h2d", "copy_d2h", "copy_d2d",
    "kernel_count", "kernel_get", "last_error",
)
OPTIONAL_ENTRIES = (
    "memory_used", "stream_create", "stream_destroy", "stream_synchronize", "event_create", "event_destroy",
    "event_record", "event_synchronize", "event_query", "synchronize", "rng_set_state", "rng_get_state",
    "comm_init", "comm_destroy", "comm_all_reduce", "comm_broadcast", "comm_all_gather", "comm_reduce_scatter",
    "comm_send", "comm_recv", "comm_barrier", "jit_compile",
)
