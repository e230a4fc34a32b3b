"""The package's annotations are checked, not just written: `mypy` over torch_fl and fl_magics with the settings
in pyproject.toml ([tool.mypy]: the public API and the tools fully annotated) is part of the test command, so
a wrong annotation or an unchecked None fails it like any other test."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.slow  # one mypy run over the package: about a minute of CPU

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def test_mypy_finds_nothing(tmp_path):
    if importlib.util.find_spec("mypy") is None:
        pytest.skip("mypy is not installed (it comes with torch_fl's test extra: pip install 'torch_fl[test]')")
    # the cache goes to a temporary folder: the source tree stays as the checkout left it
    cmd = [
        sys.executable,
        "-m",
        "mypy",
        "--config-file",
        os.path.join(ROOT, "pyproject.toml"),
        "--cache-dir",
        str(tmp_path / "mypy_cache"),
        "--no-error-summary",
        "--show-error-codes",
    ]
    start = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=ROOT)
    took = time.monotonic() - start
    assert r.returncode == 0, f"mypy found errors ({took:.0f} s):\n" + r.stdout[-6000:] + r.stderr[-2000:]
    print(f"mypy: torch_fl and fl_magics type-check clean in {took:.0f} s")
