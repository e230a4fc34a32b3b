"""The committed notebooks: built from their sources (notebooks/NN_name.py, by
notebooks/build.py), executed (every code cell has run, none raised), stored with
widget state, and they render to HTML with nbconvert so the docs can link them.
(`pytest notebooks` re-executes them with nbval and compares outputs.)"""

import glob
import importlib.util
import os
import sys

import nbformat
import pytest
from nbconvert import HTMLExporter

pytestmark = pytest.mark.slow  # builds and renders every notebook

# nbconvert looks for its templates under sys.prefix; a virtual environment made with
# --system-site-packages has them under the base interpreter's prefix instead
_share = os.path.join(sys.base_prefix, "share", "jupyter")
if os.path.isdir(_share) and _share not in os.environ.get("JUPYTER_PATH", ""):
    os.environ["JUPYTER_PATH"] = os.pathsep.join(filter(None, [os.environ.get("JUPYTER_PATH"), _share]))

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NOTEBOOKS = sorted(glob.glob(os.path.join(ROOT, "notebooks", "*.ipynb")))


def _load_build():
    spec = importlib.util.spec_from_file_location("notebook_build", os.path.join(ROOT, "notebooks", "build.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


build = _load_build()


def test_the_notebooks_exist():
    names = [os.path.basename(p) for p in NOTEBOOKS]
    assert names == [
        "01_quickstart.ipynb",
        "02_switching_backends.ipynb",
        "03_capability_explorer.ipynb",
        "04_profiling_and_fallbacks.ipynb",
        "05_precision_alignment.ipynb",
        "06_writing_a_plugin.ipynb",
        "07_fusion.ipynb",
        "08_distributed.ipynb",
        "09_cuda_code.ipynb",
    ]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_notebook_is_executed_and_renders(path):
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(c.execution_count for c in code), "build it: python notebooks/build.py"
    assert not [o for c in code for o in c.outputs if o.output_type == "error"]
    body, _ = HTMLExporter().from_notebook_node(nb)
    assert "<html" in body and len(body) > 10000


def test_widget_state_is_stored():
    nb = nbformat.read([p for p in NOTEBOOKS if "capability" in p][0], as_version=4)
    state = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    assert any(m["model_name"] == "DropdownModel" for m in state.values())
    html, _ = HTMLExporter().from_notebook_node(nb)
    assert "application/vnd.jupyter.widget-state+json" in html


def _cells(nb):
    return [(c.cell_type, c.source, c.metadata.get("tags", [])) for c in nb.cells]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_notebook_is_built_from_its_source(path):
    """A source edited without a rebuild (or a notebook edited by hand) fails here: python notebooks/build.py."""
    source = os.path.splitext(path)[0] + ".py"
    assert source in build.sources()
    assert _cells(nbformat.read(path, as_version=4)) == _cells(build.read_source(source))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_test_plumbing_stays_out_of_sight(path):
    """What the reader sees carries no test plumbing: nbval's marker is a cell tag, and Plotly's renderer
    for nbval comes from the environment (tests/conftest.py, scripts/test.sh, build.py), not from a cell."""
    nb = nbformat.read(path, as_version=4)
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert "NBVAL" not in code and "plotly_mimetype" not in code and "pio.renderers" not in code
    source = open(os.path.splitext(path)[0] + ".py").read()
    tagged = [c for c in nb.cells if "nbval-ignore-output" in c.metadata.get("tags", [])]
    assert len(tagged) == source.count("# NBVAL_IGNORE_OUTPUT")


def test_every_source_has_its_notebook():
    assert [os.path.splitext(p)[0] for p in build.sources()] == [os.path.splitext(p)[0] for p in NOTEBOOKS]


def test_percent_format(tmp_path):
    src = tmp_path / "01_t.py"
    src.write_text(
        "# %% [markdown]\n# # Title\n#\n# text with `# %%` in it\n\n"
        "# %%\nimport os\n# %load_ext fl_magics\n\n\n"
        '# %% tags=["raises-exception", "x"]\n# %%fl_profile -o p\n# a comment\nos.sep\n'
    )
    nb = build.read_source(str(src))
    assert _cells(nb) == [
        ("markdown", "# Title\n\ntext with `# %%` in it", []),
        ("code", "import os\n%load_ext fl_magics", []),
        ("code", "%%fl_profile -o p\n# a comment\nos.sep", ["raises-exception", "x"]),
    ]
    assert [c.id for c in nb.cells] == ["cell-0", "cell-1", "cell-2"]  # stable across rebuilds
    nbformat.validate(nb)


@pytest.mark.parametrize(
    "text, message",
    [
        ("x = 1\n# %%\ny = 2\n", "before the first cell marker"),
        ("# %% [markdown]\nnot commented\n", "a line without '# '"),
        ("# %% tags=[oops]\nx = 1\n", "is not JSON"),
        ("# %% tags\nx = 1\n", "cannot read the cell metadata"),
        ("\n\n", "no cells"),
    ],
)
def test_percent_format_errors(tmp_path, text, message):
    src = tmp_path / "01_bad.py"
    src.write_text(text)
    with pytest.raises(build.SourceError, match=message):
        build.read_source(str(src))


def test_build_fails_on_a_cell_error_and_writes_nothing(tmp_path):
    from nbclient.exceptions import CellExecutionError

    src = tmp_path / "01_fails.py"
    src.write_text("# %%\nx = 1\n\n# %%\n# %no_such_magic\n\n# %%\n1 / 0\n")
    with pytest.raises(CellExecutionError, match="UsageError"):  # a magic's UsageError fails the build too
        build.build(str(src))
    assert not (tmp_path / "01_fails.ipynb").exists()
    assert build.main(["99"]) == 2  # no such notebook
    src.write_text('# %%\nx = 1\n\n# %% tags=["raises-exception"]\n1 / 0\n\n# %%\nprint(x + 1)\n')
    nb = nbformat.read(build.build(str(src)), as_version=4)
    assert nb.cells[1].outputs[0].ename == "ZeroDivisionError"  # the cell meant to fail, and the build went on
    assert nb.cells[2].outputs[0].text == "2\n"
