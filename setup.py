"""Builds the bundled plugins (plain C shared libraries loaded at run time
through cffi) as part of `pip install`. They are not Python extension modules:
the build only borrows setuptools' compiler plumbing, so wheels, editable
installs and sdists all compile them on the target machine."""

import glob
import os

from setuptools import Extension, setup
from setuptools.command.build_clib import build_clib
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
INCLUDE = os.path.join("plugins_cffi", "include")


def _openblas():
    import scipy_openblas32

    return scipy_openblas32.get_include_dir(), scipy_openblas32.get_lib_dir(), scipy_openblas32.get_library()


class BuildPlugins(build_ext):
    """Names outputs lib<name>.so instead of a CPython extension suffix. Built in place (a checkout, an editable
    install), it also refreshes the checkout's shipped headers, which the runtime reads before plugins_cffi's."""

    def run(self):
        super().run()
        if self.inplace:
            _ship_headers(HERE)

    def get_ext_filename(self, fullname):
        package, _, name = fullname.rpartition(".")
        return os.path.join(*package.split("."), f"lib{name}.so")

    def get_export_symbols(self, ext):
        return []

    def build_extension(self, ext):
        os.makedirs(os.path.dirname(self.get_ext_fullpath(ext.name)), exist_ok=True)
        # relink when the kernel library changed, not only the plugin's own sources
        clib = self.get_finalized_command("build_clib").build_clib
        ext.depends = list(ext.depends) + [os.path.join(clib, "libfl_kernels.a")]
        super().build_extension(ext)

    def copy_file(self, infile, outfile, *args, **kwargs):
        """Replace an in-place plugin by a new file, never by rewriting it: a running process
        (a notebook kernel, a test) that has the old library mapped keeps a valid copy."""
        if os.path.exists(outfile) and outfile.endswith(".so"):
            os.unlink(outfile)
        os.makedirs(os.path.dirname(outfile) or ".", exist_ok=True)  # a fresh checkout has no plugins folder yet
        return super().copy_file(infile, outfile, *args, **kwargs)


class BuildKernels(build_clib):
    """Archives the kernel library afresh: `ar` only adds and replaces members, so an object of a
    source file since renamed or deleted would stay in a reused build folder's libfl_kernels.a and
    could still be linked (or leave an undefined symbol)."""

    def build_libraries(self, libraries):
        for name, _ in libraries:
            path = self.compiler.library_filename(name, output_dir=self.build_clib)
            if os.path.exists(path):
                os.unlink(path)
        super().build_libraries(libraries)


INCLUDE_DIRS = [INCLUDE, os.path.join("plugins_cffi", "host"), os.path.join("plugins_cffi", "emulated")]
CFLAGS = ["-O3", "-std=gnu11", "-fopenmp", "-fvisibility=hidden", "-Wall", "-Wno-unused-function"]


def _plugin(name, sources, blas=False):
    include_dirs = list(INCLUDE_DIRS)
    # libm: on glibc its linker script adds libmvec, whose vector variants of erf the elementwise kernels call
    libraries, library_dirs, rpaths = ["fl_kernels", "m"], [], []
    macros = []
    if blas:
        inc, libdir, lib = _openblas()
        include_dirs.append(inc)
        library_dirs.append(libdir)
        libraries.append(lib)
        # installed layout: site-packages/torch_fl/runtime/plugins -> site-packages/scipy_openblas32/lib;
        # the loader also preloads the library, which covers editable installs
        rpaths = ["$ORIGIN/../../../scipy_openblas32/lib", libdir]
        macros.append(("FL_HAVE_BLAS", "1"))
    return Extension(
        f"torch_fl.runtime.plugins.{name}",
        sources=sources,
        include_dirs=include_dirs,
        libraries=libraries,
        library_dirs=library_dirs,
        runtime_library_dirs=rpaths,
        define_macros=macros,
        extra_compile_args=CFLAGS,
        extra_link_args=["-fopenmp"],
    )


# The runtime parses the ABI header for cffi, so the package ships a copy (torch_fl/runtime/include), with the
# kernel helpers vendors compile against beside it (torch_fl.get_include() names the folder) and the special
# functions' C, which the JIT tier pastes into the kernels it generates.
SHIPPED_HEADERS = (
    os.path.join(INCLUDE, "fl_plugin.h"),
    os.path.join(INCLUDE, "fl_kernel_util.h"),
    os.path.join("plugins_cffi", "host", "fl_special_math.h"),
    os.path.join("plugins_cffi", "host", "fl_special_bessel.h"),
)


def _ship_headers(root):
    """Copies SHIPPED_HEADERS into root/torch_fl/runtime/include. Only build commands call it (root: their
    build folder, or the checkout for an in-place build), so reading this file writes nothing."""
    import shutil

    dest = os.path.join(root, "torch_fl", "runtime", "include")
    os.makedirs(dest, exist_ok=True)
    for header in SHIPPED_HEADERS:
        shutil.copyfile(os.path.join(HERE, header), os.path.join(dest, os.path.basename(header)))


class BuildPy(build_py):
    """The package's Python files, then the shipped headers beside them (the wheel's copy)."""

    def run(self):
        super().run()
        if not self.editable_mode:  # an editable install reads the checkout (BuildPlugins copies there)
            _ship_headers(self.build_lib)


def _sources(pattern):
    return sorted(glob.glob(os.path.join("plugins_cffi", pattern)))


# The kernels are compiled once, into a static library every plugin links:
# the host plugin (its device entry points in host/plugin.c) and one emulator
# per device-class profile (the emulated-device runtime + its profile).
KERNELS = [s for s in _sources("host/*.c") if not s.endswith("plugin.c")] + _sources("emulated/fused_*.c")
PLUGINS = (
    [_plugin("fl_cpu", _sources("host/plugin.c"), blas=True)]
    + [
        _plugin(
            f"fl_{os.path.basename(p)[:-2]}",
            _sources("emulated/device.c")
            + _sources("emulated/comm_*.c")
            + _sources("emulated/streams.c")
            + _sources("emulated/async.c")
            + [p],
            blas=True,
        )
        for p in _sources("emulated/profiles/*.c")
    ]
    + [
        # the OpenCL plugin: its own kernels (OpenCL C, built by the driver at first use); libOpenCL.so.1 is
        # dlopen'ed at run time, so it builds and imports where no OpenCL is installed
        # (sha256.c and cachedir.c: the digests and the folder of its on-disk cache of program binaries)
        Extension(
            "torch_fl.runtime.plugins.fl_opencl",
            sources=_sources("opencl/*.c") + _sources("host/sha256.c") + _sources("host/cachedir.c"),
            include_dirs=[INCLUDE, os.path.join("plugins_cffi", "host")],
            depends=_sources("opencl/*.h")
            + [os.path.join(INCLUDE, "fl_plugin.h"), os.path.join("plugins_cffi", "host", "fl_host.h")],
            libraries=["dl", "pthread", "m"],
            extra_compile_args=["-O2", "-std=gnu11", "-fvisibility=hidden", "-Wall", "-Wno-unused-function"],
        ),
    ]
)
_blas_include = _openblas()[0]
KERNEL_LIBRARY = (
    "fl_kernels",
    {
        "sources": KERNELS,
        "include_dirs": INCLUDE_DIRS + [_blas_include],
        "macros": [("FL_HAVE_BLAS", "1")],
        "cflags": CFLAGS,
    },
)

setup(
    libraries=[KERNEL_LIBRARY],
    ext_modules=PLUGINS,
    cmdclass={"build_clib": BuildKernels, "build_ext": BuildPlugins, "build_py": BuildPy},
)
