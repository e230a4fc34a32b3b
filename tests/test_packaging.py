"""What a user installs: the wheel and the sdist carry the whole package, and an
installed torch_fl imports cleanly.

scripts/test.sh (the README's test command) builds an sdist from the tree and a
wheel from that sdist, installs the wheel in a fresh virtual environment and
passes both archives here (FL_TEST_SDIST, FL_TEST_WHEEL). Run outside it, the
tests build their own archives (the wheel compiles every plugin: minutes)."""

from __future__ import annotations

import email.parser
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile

import pytest

pytestmark = pytest.mark.slow  # wheel and sdist checks in subprocesses

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PACKAGES = ("torch_fl", "fl_magics")


def _source_files(top: str, suffixes: tuple[str, ...]) -> set[str]:
    """Paths (relative to ROOT, '/'-separated) of the tree's files under top with these suffixes."""
    found = set()
    for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, top)):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        for name in filenames:
            if name.endswith(suffixes):
                found.add(os.path.relpath(os.path.join(dirpath, name), ROOT).replace(os.sep, "/"))
    return found


def _bundled_plugins() -> set[str]:
    """The plugins setup.py builds: the host plugin and one emulator per device-class profile."""
    profiles = os.listdir(os.path.join(ROOT, "plugins_cffi", "emulated", "profiles"))
    names = ["cpu"] + sorted(p[:-2] for p in profiles if p.endswith(".c"))
    return {f"torch_fl/runtime/plugins/libfl_{n}.so" for n in names}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> str:
    given = os.environ.get("FL_TEST_WHEEL")
    if given:
        return given
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), ROOT],
        check=True,
        capture_output=True,
        timeout=1800,
    )
    return str(next(out.glob("torch_fl-*.whl")))


@pytest.fixture(scope="module")
def sdist(tmp_path_factory) -> str:
    given = os.environ.get("FL_TEST_SDIST")
    if given:
        return given
    out = tmp_path_factory.mktemp("sdist")
    subprocess.run(
        [sys.executable, "setup.py", "-q", "sdist", "-d", str(out)],
        cwd=ROOT,
        check=True,
        capture_output=True,
        timeout=600,
    )
    return str(next(out.glob("torch_fl-*.tar.gz")))


def test_wheel_carries_every_module_plugin_header_and_source(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = set()
    for package in PACKAGES:
        expected |= _source_files(package, (".py",))
    # compiled at first use, against the installed torch
    expected |= _source_files("torch_fl/runtime/csrc", (".cpp", ".h"))
    expected |= _bundled_plugins()
    expected |= {
        "torch_fl/runtime/include/fl_plugin.h",
        "torch_fl/runtime/include/fl_kernel_util.h",
        "torch_fl/runtime/include/fl_special_math.h",
        "torch_fl/runtime/include/fl_special_bessel.h",
        "torch_fl_autoload.py",
    }
    missing = sorted(expected - names)
    assert not missing, f"the wheel lacks {missing}"
    stray = sorted(n for n in names if n.split("/")[0] in ("tests", "notebooks", "bench", "plugins_cffi"))
    assert not stray, f"the wheel carries files that are not part of the package: {stray[:10]}"


def test_wheel_declares_its_dependencies_and_command(wheel):
    z = zipfile.ZipFile(wheel)
    info = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    meta = email.parser.Parser().parsestr(z.read(info).decode())
    requires = [r.split(";")[0].replace(" ", "") for r in meta.get_all("Requires-Dist")]
    for dep in ("torch>=2.9", "numpy", "cffi", "scipy-openblas32", "expecttest"):
        assert any(r.startswith(dep) for r in requires), f"{dep} not declared: {requires}"
    test_extra = [r for r in meta.get_all("Requires-Dist") if 'extra == "test"' in r]
    for dep in ("pytest", "nbval", "transformers", "hypothesis"):
        assert any(r.startswith(dep) for r in test_extra), f"{dep} not in the test extra"
    entry_points = z.read(info.replace("METADATA", "entry_points.txt")).decode()
    assert "torch-fl = torch_fl.cli:main" in entry_points
    assert "[torch.backends]" in entry_points and "torch_fl = torch_fl_autoload:load" in entry_points


def test_sdist_carries_what_the_build_compiles(sdist):
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    expected = _source_files("plugins_cffi", (".c", ".h")) | _source_files("torch_fl", (".py", ".cpp"))
    expected |= _source_files("fl_magics", (".py",)) | {
        "setup.py",
        "pyproject.toml",
        "README.md",
        "torch_fl_autoload.py",
    }
    missing = sorted(expected - names)
    assert not missing, f"the sdist lacks {missing}"


def test_reading_setup_py_writes_nothing(tmp_path):
    """setup.py copies the shipped headers in its build commands only (build_py into the wheel's folder,
    build_ext --inplace into the checkout): a command that builds nothing, as a tool that reads the project's
    metadata runs, leaves the tree as it was."""
    built = {os.path.join(ROOT, "torch_fl", "runtime", d) for d in ("include", "plugins")}

    def ignore(folder, names):  # what builds leave in a checkout
        return [n for n in names if n == "__pycache__" or os.path.join(folder, n) in built]

    for name in ("setup.py", "pyproject.toml", "MANIFEST.in", "README.md", "torch_fl_autoload.py"):
        shutil.copy(os.path.join(ROOT, name), tmp_path / name)
    for name in ("plugins_cffi", *PACKAGES):
        shutil.copytree(os.path.join(ROOT, name), tmp_path / name, ignore=ignore)
    before = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    r = subprocess.run(
        [sys.executable, "setup.py", "--version"], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr[-3000:]
    after = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    assert after == before, f"setup.py --version wrote {sorted(set(after) - set(before))[:10]}"


def test_every_module_imports_without_a_warning():
    """Every module of the installed package (and fl_magics) imports with warnings as errors, in a fresh
    interpreter: a missing dependency (NumPy: torch warns 'Failed to initialize NumPy') or a module the
    package left out shows here."""
    code = (
        "import gc, importlib, pkgutil, warnings\n"
        "warnings.simplefilter('error')\n"
        "import torch_fl, fl_magics\n"
        "names = [m.name for m in pkgutil.walk_packages(torch_fl.__path__, 'torch_fl.')]\n"
        "for name in names: importlib.import_module(name)\n"
        "gc.collect()\n"
        "print(len(names))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=HERE)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Warning" not in r.stderr, r.stderr[-3000:]  # warnings raised in __del__ are only printed
    assert int(r.stdout.split()[-1]) >= 20


@pytest.mark.skipif(
    not os.environ.get("FL_TEST_INSTALLED"),
    reason="only meaningful for a non-editable install (scripts/test.sh sets FL_TEST_INSTALLED)",
)
def test_tests_run_against_the_installed_package():
    import torch_fl

    site = os.path.realpath(os.path.dirname(torch_fl.__file__))
    assert not site.startswith(os.path.realpath(ROOT) + os.sep), site
    plugins = {f"torch_fl/runtime/plugins/{n}" for n in os.listdir(os.path.join(site, "runtime", "plugins"))}
    assert _bundled_plugins() <= plugins
