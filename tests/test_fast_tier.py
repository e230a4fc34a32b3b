"""The fast tier (`pytest -m "not slow"`, scripts/fast.sh; CONTRIBUTING.md) must never pass by running
nothing: a marker put on everything, or a path that matches no test, is a failure with the reason."""

import os
import subprocess
import sys

import pytest
from conftest import ROOT


def _fast(*args: str) -> subprocess.CompletedProcess:
    # the torch_fl this test runs against (installed by scripts/test.sh, else the parent's): PYTHONPATH as given
    env = {**os.environ, "PYTHON": sys.executable}
    return subprocess.run(
        [os.path.join(ROOT, "scripts", "fast.sh"), "-o", "addopts=", "-q", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=ROOT,
    )


@pytest.mark.slow  # a pytest in a subprocess
def test_a_fast_tier_that_selects_nothing_fails():
    # every test in test_docs.py is slow (each doc's samples in a fresh interpreter): nothing is left
    r = _fast("tests/test_docs.py")
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]
    assert "collected no tests outside the slow marker" in r.stderr
