"""fl_core.h is the one declaration of the C++ core's C API (issue 28): Python binds the library through cffi
with that header's text, so the header, the built library and the sources must agree — every entry point the
header declares is exported, every one exported is declared, the header is plain C, and the core's cache key
covers every file it is built from."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

import torch_fl  # noqa: F401  (builds and loads the core)
from torch_fl.runtime import core, get_include

CC = shutil.which(os.environ.get("CC", "cc"))
NM = shutil.which("nm")
CSRC = os.path.dirname(core.HEADER)


def _declared() -> dict[str, str]:
    """name -> "function" or "variable", for each FL_CORE_API declaration of fl_core.h, read from its text."""
    text = re.sub(r"/\*.*?\*/", "", open(core.HEADER, encoding="utf-8").read(), flags=re.S)
    text = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    out = {}
    for decl in re.findall(r"FL_CORE_API\s+([^;]*);", text):
        if decl.startswith("extern "):
            out[re.findall(r"(\w+)\s*$", decl)[0]] = "variable"
        else:
            out[re.findall(r"(\w+)\s*\(", decl)[0]] = "function"
    return out


def test_the_header_declares_the_whole_api():
    declared = _declared()
    assert len(declared) >= 40
    assert {"fl_core_abi", "fl_core_fast_commit", "fl_core_graph_replay", "fl_devcheck_install"} <= set(declared)
    assert {name for name, kind in declared.items() if kind == "variable"} == {
        "fl_core_streams_made",
        "fl_core_watched_writes",
        "fl_core_tracing",
    }


def test_cffi_reads_every_declaration_and_the_library_has_it():
    """cffi parsed each declaration (its type is the header's), and the loaded library resolves each name."""
    lib = core.lib()
    for name, kind in _declared().items():
        if kind == "function":
            t = core.ffi.typeof(getattr(lib, name))
            assert t.kind == "function", name
        else:
            assert core.ffi.typeof(core.ffi.addressof(lib, name)).kind == "pointer", name


def test_long_argument_lists_travel_as_structs():
    """No entry point takes more than six arguments: a call's marshalling, a device, a kernel call are structs
    whose fields have names and types (the fast-path commit took 20 positional arguments)."""
    lib = core.lib()
    for name, kind in _declared().items():
        if kind == "function":
            assert len(core.ffi.typeof(getattr(lib, name)).args) <= 6, name
    plan = core.ffi.typeof("fl_core_fast_plan_t")
    assert dict(plan.fields)["call"].type is core.ffi.typeof("fl_core_kernel_call_t")


def test_the_structs_the_api_takes_are_the_headers():
    """A descriptor array made with the plugin ABI's ffi is what the core's ffi passes: one type, shared."""
    from torch_fl.runtime import abi

    assert core.ffi.typeof("fl_tensor_t") is abi.ffi.typeof("fl_tensor_t")
    assert core.ffi.sizeof("fl_arg_t") == abi.ffi.sizeof("fl_arg_t")


@pytest.mark.skipif(NM is None, reason="no nm")
def test_the_library_exports_exactly_the_declared_names():
    """Nothing the core exports under torch_fl's prefixes is missing from the header (an entry point a caller
    could only reach by re-declaring it by hand), and nothing declared is missing from the library."""
    r = subprocess.run([NM, "-D", "--defined-only", core.library_path()], capture_output=True, text=True, check=True)
    exported = {line.split()[-1] for line in r.stdout.splitlines() if line.strip()}
    ours = {name for name in exported if name.startswith(("fl_core_", "fl_devcheck_", "fl_fallback_"))}
    assert ours == set(_declared())


@pytest.mark.skipif(CC is None, reason="no C compiler")
def test_the_header_is_plain_c(tmp_path):
    src = tmp_path / "uses_core.c"
    src.write_text(
        '#include "fl_core.h"\n'
        "int main(void) {\n"
        "  fl_core_fast_plan_t plan = {0};\n"
        "  fl_core_graph_t *g = 0;\n"
        "  return plan.call.n_inputs + (g != 0) + fl_core_fast_commit(&plan);\n"
        "}\n"
    )
    r = subprocess.run(
        [CC, "-std=c11", "-Wall", "-Werror", "-pedantic", "-fsyntax-only", "-I", CSRC, "-I", get_include(), str(src)],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr


def test_the_cache_key_covers_every_source_and_header():
    """A file of csrc/ the build or the key leaves out would be a change that reuses a stale cached core."""
    on_disk = {os.path.join(CSRC, n) for n in os.listdir(CSRC) if n.endswith((".cpp", ".h"))}
    assert set(core.SOURCES) == {p for p in on_disk if p.endswith(".cpp")}
    assert set(core.HEADERS) == {p for p in on_disk if p.endswith(".h")}


def test_no_source_is_over_a_thousand_lines():
    for path in (*core.SOURCES, *core.HEADERS):
        with open(path, encoding="utf-8") as f:
            assert sum(1 for _ in f) <= 1000, path
