"""Loads one plugin in a throwaway process: `python probe.py PLUGIN`.

Why: a plugin is native code; a broken one (a constructor that crashes, an
fl_plugin_init that writes through a bad pointer) takes down whatever process
loads it. The registry therefore loads each plugin it has not seen before
(not bundled with torch_fl) here first, with the same calls the loader makes
(dlopen, fl_plugin_abi_version, fl_plugin_init, device and kernel
enumeration), and only loads it into the user's process if this process
survives. It is run as a file, not as part of the torch_fl package, so it
imports nothing but cffi and never discovers plugins itself.

Prints one line: `@@PROBE ok` when every call returned, `@@PROBE error <text>`
when the plugin refused in an orderly way (the loader then says why in the
user's process). Dying by a signal or hanging is the verdict the parent reads."""

from __future__ import annotations

import importlib.util
import os
import sys


def _load_abi(here: str):
    spec = importlib.util.spec_from_file_location("torch_fl_probe_abi", os.path.join(here, "abi.py"))
    assert spec is not None and spec.loader is not None, "a .py file's spec has a loader"
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def probe(path: str) -> str:
    abi = _load_abi(os.path.dirname(os.path.abspath(__file__)))
    ffi = abi.ffi
    try:
        lib = ffi.dlopen(path)
        version = lib.fl_plugin_abi_version()
        init = lib.fl_plugin_init
    except (OSError, AttributeError) as e:
        return f"error {e}"
    if version != abi.ABI_VERSION:  # its fl_plugin_t may be larger than ours: never let it fill ours
        return f"error ABI version {version}"
    table = ffi.new("fl_plugin_t*")
    if init(table) != abi.FL_OK:
        return "error fl_plugin_init failed"
    if table.struct_size != ffi.sizeof("fl_plugin_t") or any(
        getattr(table, n) == ffi.NULL for n in abi.REQUIRED_ENTRIES
    ):
        return "error incomplete entry-point table"
    n = ffi.new("int*")
    if table.device_count(n) == abi.FL_OK:
        props = ffi.new("fl_device_props_t*")
        for i in range(n[0]):
            table.device_props(i, props)
    if table.kernel_count(n) == abi.FL_OK:
        entry = ffi.new("fl_kernel_entry_t*")
        for i in range(n[0]):
            table.kernel_get(i, entry)
    return "ok"


if __name__ == "__main__":
    print(f"@@PROBE {probe(sys.argv[1])}", flush=True)
