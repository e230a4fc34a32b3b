"""Builds libfl_template.so into the torch_fl_template package.

The library is a plain C shared object loaded by torch_fl through cffi
(dlopen), not a CPython extension module: setuptools' Extension is only
borrowed for its compiler plumbing, so the output is named lib<name>.so and
the wheel is tagged py3-none-<platform> (any Python, this OS/CPU only).

Where the sources come from:
  fl_template.c   next to this file (your own repository), else ../fl_template.c
                  (this SDK's layout: plugins_cffi/template/packaging/..)
  fl_plugin.h     $FL_INCLUDE, else ./include, else ../../include (this SDK),
  fl_kernel_util.h  beside it.
                  An installed torch_fl ships its copies; with build isolation off
                  (pip install --no-build-isolation) you can point at them:
                  FL_INCLUDE=$(python -c 'import torch_fl; print(torch_fl.get_include())')
Keep the header you build against at the ABI version of the torch_fl your
users run: torch_fl rejects a plugin whose fl_plugin_abi_version() differs.
For a self-contained sdist, keep fl_template.c, include/fl_plugin.h and include/fl_kernel_util.h inside
this folder.
"""

import os

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools < 70.1
    from wheel.bdist_wheel import bdist_wheel

HERE = os.path.dirname(os.path.abspath(__file__))


def _first(paths, what):
    for p in paths:
        if p and os.path.exists(p):
            return os.path.relpath(p, HERE)
    raise SystemExit(f"torch-fl-template: cannot find {what}; looked in: {', '.join(p for p in paths if p)}")


SOURCE = _first([os.path.join(HERE, "fl_template.c"), os.path.join(HERE, "..", "fl_template.c")], "fl_template.c")
if os.environ.get("FL_INCLUDE"):  # an explicit choice is never silently replaced
    _HEADERS = [os.path.join(os.path.abspath(os.environ["FL_INCLUDE"]), "fl_plugin.h")]
else:
    _HEADERS = [os.path.join(HERE, "include", "fl_plugin.h"), os.path.join(HERE, "..", "..", "include", "fl_plugin.h")]
INCLUDE = os.path.dirname(_first(_HEADERS, "fl_plugin.h (set FL_INCLUDE to the folder holding it)"))


class BuildPlugin(build_ext):
    """lib<name>.so instead of <name>.cpython-3xx-<platform>.so."""

    def get_ext_filename(self, fullname):
        package, _, name = fullname.rpartition(".")
        return os.path.join(*package.split("."), f"lib{name}.so")

    def get_export_symbols(self, ext):
        return []  # no PyInit_<name>: this is not a Python module


class PlatformWheel(bdist_wheel):
    """The library does not use the Python C API: one wheel serves every Python 3."""

    def finalize_options(self):
        super().finalize_options()
        self.root_is_pure = False

    def get_tag(self):
        _, _, platform = super().get_tag()
        return "py3", "none", platform


setup(
    ext_modules=[
        Extension(
            "torch_fl_template.fl_template",
            sources=[SOURCE],
            include_dirs=[INCLUDE],
            depends=[os.path.join(INCLUDE, "fl_plugin.h"), os.path.join(INCLUDE, "fl_kernel_util.h")],
            extra_compile_args=["-O2", "-fvisibility=hidden", "-Wall", "-Wextra"],
        )
    ],
    cmdclass={"build_ext": BuildPlugin, "bdist_wheel": PlatformWheel},
)
