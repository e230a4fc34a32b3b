import os
import subprocess
import sys
import textwrap

import pytest
import torch

import torch_fl as fl
from torch_fl.runtime import get_include

# nbval's kernels (the notebooks run in the same session) draw Plotly figures as their JSON mime bundle:
# deterministic and comparable; notebooks/build.py gives its kernels the same, so no notebook cell says it.
# (scripts/test.sh exports it too, for a run of the notebooks alone.)
os.environ.setdefault("PLOTLY_RENDERER", "plotly_mimetype")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The notebooks (nbval items under notebooks/, collected in the same session through pyproject's
    testpaths) are slow tests: nbval starts a Jupyter kernel per notebook and re-runs every cell, so
    `pytest -m "not slow"` (CONTRIBUTING.md) leaves them out. A bare `pytest` still runs them. (A conftest.py
    in notebooks/ would shadow this one's `from conftest import ...`: both are the module `conftest`.)"""
    for item in items:
        if item.path.suffix == ".ipynb":
            item.add_marker(pytest.mark.slow)


def pytest_configure(config):
    """scripts/test.sh installs torch_fl from a wheel and sets FL_TEST_INSTALLED: then the tests must
    be testing that installed copy, never the source tree they sit beside (a module the wheel left out
    would otherwise be found here and hide the fault)."""
    if os.environ.get("FL_TEST_INSTALLED"):
        here = os.path.realpath(os.path.dirname(fl.__file__))
        if here.startswith(os.path.realpath(ROOT) + os.sep):
            raise pytest.UsageError(
                f"FL_TEST_INSTALLED is set but torch_fl was imported from the source tree "
                f"({here}); run the tests through scripts/test.sh"
            )


def build_test_plugin(src: str, lib) -> None:
    """Compiles one test plugin (a .c file under tests/plugins) into the shared library `lib`, against the
    ABI header and tests/plugins/stub_device.h, the stub device the plugins share."""
    subprocess.run(
        [
            "cc",
            "-shared",
            "-fPIC",
            "-O1",
            "-I",
            get_include(),
            "-I",
            os.path.join(HERE, "plugins"),
            src,
            "-o",
            str(lib),
        ],
        check=True,
    )


@pytest.fixture(scope="session")
def test_plugins(tmp_path_factory):
    """Compiles the deliberately odd plugins in tests/plugins into a folder."""
    out = tmp_path_factory.mktemp("plugins")
    for src in sorted(os.listdir(os.path.join(HERE, "plugins"))):
        if src.endswith(".c"):
            build_test_plugin(os.path.join(HERE, "plugins", src), out / f"lib{src[:-2]}.so")
    (out / "libnot_a_plugin.so").write_text("this is not an ELF file\n")
    return out


def run_py(
    code: str, env: dict | None = None, timeout: int = 300, cwd: str | None = None, unset: tuple = ()
) -> subprocess.CompletedProcess:
    """Runs a snippet in a fresh interpreter (plugin discovery happens once per process), in `cwd`
    (default: tests/), with `env` added and the variables in `unset` removed."""
    full_env = dict(os.environ)
    for k in (
        "FL_BACKEND",
        "FL_PLUGIN_PATH",
        "FL_CPU_FALLBACK",
        "FL_CONFIG",
        "FL_CPU_MEMORY_LIMIT",
        "FL_MEMORY_POOL",
        "FL_MEMORY_POOL_LIMIT",
        *unset,
    ):
        full_env.pop(k, None)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
        cwd=cwd or HERE,
    )


@pytest.fixture(autouse=True)
def _cpu_backend():
    fl.initialize("cpu")
    yield


def assert_close(
    actual: torch.Tensor, expected: torch.Tensor, rel: float = 1e-4, what: str = "", scale_floor: float = 1e-6
) -> None:
    """fp32 agreement the way the project states it: max abs diff <= rel * scale of the expected values."""
    actual = actual.detach().cpu().double()
    expected = expected.detach().cpu().double()
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    scale = max(expected.abs().max().item(), scale_floor) if expected.numel() else 1.0
    diff = (actual - expected).abs().max().item() if expected.numel() else 0.0
    assert diff <= rel * scale, f"{what}: max abs diff {diff:.3g} > {rel} x scale {scale:.3g}"


@pytest.fixture
def minimal_no_fallback():
    """The bring-up chip with the CPU fallback off: an op without a device path fails loudly."""
    before = fl.get_current_backend_name()
    was = fl.cpu_fallback_enabled()
    fl.set_backend("minimal")
    fl.set_cpu_fallback(False)
    yield
    fl.set_cpu_fallback(was)
    fl.set_backend(before)


def same_as_cpu(expected, got, atol=1e-5, rtol=1e-4):
    """got (on fl) equals expected (PyTorch on the CPU): shapes, dtypes, values (NaN where NaN)."""
    if isinstance(expected, torch.Tensor):
        expected, got = (expected,), (got,)
    for a, b in zip(expected, got, strict=True):
        b = b.cpu()
        assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, b.shape, a.dtype, b.dtype)
        assert torch.allclose(a.double(), b.double(), atol=atol, rtol=rtol, equal_nan=True), (a, b)


@pytest.fixture
def fresh_dynamo():
    """Compiled graphs and backend="fl" reports start empty (torch._dynamo.reset()) and are dropped after:
    the test files of torch.compile use it for every test (pytestmark)."""
    from torch_fl.compile import dynamo

    dynamo.reset()
    yield
    dynamo.reset()


def tiny_bert(**overrides):
    """A randomly initialised 2-layer Hugging Face BERT (hidden 32, no dropout): the real model the
    torch.compile tests run; keyword arguments override the config."""
    import transformers

    cfg = dict(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=32,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return transformers.BertModel(transformers.BertConfig(**{**cfg, **overrides}))
