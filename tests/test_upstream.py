"""PyTorch's own device-generic tests on fl, a fast selection on every backend (scripts/upstream_tests.py).

Test code nobody here wrote: PyTorch's test files (../shared/upstream-tests, or FL_UPSTREAM_TESTS) run on the fl
device exactly as PyTorch runs them on CUDA, with native CPU as the baseline. Every test in the selection that
passes on the CPU must pass on fl, or be in the runner's SKIPS with the reason fl deliberately differs. The
selection is one test in SAMPLE of every file, the same tests each run (a hash of the test's name), without
test_modules' second-order gradient and non-contiguous checks, which take minutes each on a 2-core machine (one
float16 LinearCrossEntropyLoss case: 130 s on minimal); the full run is one command:

    python scripts/upstream_tests.py --backends cpu minimal --out upstream-results   (docs/coverage.md)
"""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLE = 50
SELECT = "not gradgrad and not non_contiguous_tensors"
BACKENDS = ["cpu", "rocm", "ascend", "minimal"]


def _runner():
    spec = importlib.util.spec_from_file_location("upstream_tests", os.path.join(ROOT, "scripts", "upstream_tests.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules["upstream_tests"] = module  # dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


RUNNER = _runner()
FOLDER = RUNNER.default_folder()
pytestmark = [
    pytest.mark.slow,  # PyTorch's own test files on every backend
    pytest.mark.skipif(
        FOLDER is None or not os.path.isdir(FOLDER),
        reason="PyTorch's test files are not on this machine (set FL_UPSTREAM_TESTS to a folder of them, e.g. a copy "
        "of PyTorch's test/ of the installed torch's release); the project's checkout has them in "
        "../shared/upstream-tests",
    ),
]
FILES = sorted(f[:-3] for f in os.listdir(FOLDER) if f.startswith("test_") and f.endswith(".py")) if FOLDER else []


@pytest.fixture(scope="module")
def out_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("upstream"))


@pytest.fixture(scope="module")
def native(out_dir):
    return RUNNER.run_files(FOLDER, FILES, "native", out_dir, 240, SELECT, SAMPLE, False)


@pytest.mark.parametrize("backend", BACKENDS)
def test_pytorch_device_tests_pass_on_fl(backend, native, out_dir):
    runs = RUNNER.run_files(FOLDER, FILES, backend, out_dir, 240, SELECT, SAMPLE, False)
    comparisons = [RUNNER.compare(name + ".py", backend, native[name], runs[name]) for name in FILES]
    compared = sum(c.compared for c in comparisons)
    # the selection really ran: a broken collection (an import error in a test file, pytest-timeout missing)
    # must not pass as "no defects"
    assert all(not r.note for r in runs.values()) and all(not r.note for r in native.values()), [
        r.note for r in [*runs.values(), *native.values()] if r.note
    ]
    assert compared >= 10 * len(FILES), f"only {compared} tests compared on {backend}"
    defects = [(c.file, test, outcome, why) for c in comparisons for test, outcome, why in c.defects]
    assert not defects, "\n".join(
        [f"{len(defects)} of {compared} PyTorch tests pass on native CPU, not on fl '{backend}':"]
        + [f"  {o} {t}: {w[:200]}" for _, t, o, w in defects[:30]]
    )
