"""Builds the bundled plugins (plain C shared libraries loaded at run time
through cffi) as part of `pip install`. They are not Python extension modules:
the build only borrows setuptools' compiler plumbing, so wheels, editable
installs and sdists all compile them on the target machine."""

import glob
import os

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
INCLUDE = os.path.join("plugins_cffi", "include")


def _openblas():
    import scipy_openblas32

    return scipy_openblas32.get_include_dir(), scipy_openblas32.get_lib_dir(), scipy_openblas32.get_library()


class BuildPlugins(build_ext):
    """Names outputs lib<name>.so instead of a CPython extension suffix."""

    def get_ext_filename(self, fullname):
        package, _, name = fullname.rpartition(".")
        return os.path.join(*package.split("."), f"lib{name}.so")

    def get_export_symbols(self, ext):
        return []

    def build_extension(self, ext):
        os.makedirs(os.path.dirname(self.get_ext_fullpath(ext.name)), exist_ok=True)
        super().build_extension(ext)


def _plugin(name, folder, blas=False):
    sources = sorted(glob.glob(os.path.join("plugins_cffi", folder, "*.c")))
    include_dirs = [INCLUDE, os.path.join("plugins_cffi", folder)]
    libraries, library_dirs, rpaths = [], [], []
    macros = []
    if blas:
        inc, libdir, lib = _openblas()
        include_dirs.append(inc)
        library_dirs.append(libdir)
        libraries.append(lib)
        # installed layout: site-packages/torch_fl/_plugins -> site-packages/scipy_openblas32/lib;
        # the loader also preloads the library, which covers editable installs
        rpaths = ["$ORIGIN/../../scipy_openblas32/lib", libdir]
        macros.append(("FL_HAVE_BLAS", "1"))
    return Extension(
        f"torch_fl._plugins.{name}",
        sources=sources,
        include_dirs=include_dirs,
        libraries=libraries,
        library_dirs=library_dirs,
        runtime_library_dirs=rpaths,
        define_macros=macros,
        extra_compile_args=["-O3", "-std=gnu11", "-fopenmp", "-fvisibility=hidden", "-Wall",
                            "-Wno-unused-function"],
        extra_link_args=["-fopenmp"],
    )


def _ship_header():
    """The runtime parses the ABI header for cffi; ship a copy inside the package."""
    import shutil

    os.makedirs(os.path.join(HERE, "torch_fl", "_include"), exist_ok=True)
    os.makedirs(os.path.join(HERE, "torch_fl", "_plugins"), exist_ok=True)  # editable installs copy here
    shutil.copyfile(os.path.join(HERE, INCLUDE, "fl_plugin.h"),
                    os.path.join(HERE, "torch_fl", "_include", "fl_plugin.h"))


_ship_header()

setup(
    ext_modules=[_plugin("fl_cpu", "host", blas=True)],
    cmdclass={"build_ext": BuildPlugins},
)
