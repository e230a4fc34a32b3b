"""The committed notebooks: executed (every code cell has run, none raised),
stored with widget state, and they render to HTML with nbconvert so the docs
can link them. (`pytest --nbval` re-executes them and compares outputs.)"""

import glob
import os
import sys

import nbformat
import pytest
from nbconvert import HTMLExporter

# nbconvert looks for its templates under sys.prefix; a virtual environment made with
# --system-site-packages has them under the base interpreter's prefix instead
_share = os.path.join(sys.base_prefix, "share", "jupyter")
if os.path.isdir(_share) and _share not in os.environ.get("JUPYTER_PATH", ""):
    os.environ["JUPYTER_PATH"] = os.pathsep.join(filter(None, [os.environ.get("JUPYTER_PATH"), _share]))

NOTEBOOKS = sorted(glob.glob(os.path.join(os.path.dirname(os.path.dirname(__file__)), "notebooks", "*.ipynb")))


def test_the_notebooks_exist():
    names = [os.path.basename(p) for p in NOTEBOOKS]
    assert names == ["01_quickstart.ipynb", "02_switching_backends.ipynb", "03_capability_explorer.ipynb",
                     "04_profiling_and_fallbacks.ipynb", "05_precision_alignment.ipynb",
                     "06_writing_a_plugin.ipynb", "07_fusion.ipynb", "08_distributed.ipynb",
                     "09_cuda_code.ipynb"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_notebook_is_executed_and_renders(path):
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(c.execution_count for c in code), "run notebooks/build.py to execute it"
    assert not [o for c in code for o in c.outputs if o.output_type == "error"]
    body, _ = HTMLExporter().from_notebook_node(nb)
    assert "<html" in body and len(body) > 10000


def test_widget_state_is_stored():
    nb = nbformat.read([p for p in NOTEBOOKS if "capability" in p][0], as_version=4)
    state = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    assert any(m["model_name"] == "DropdownModel" for m in state.values())
    html, _ = HTMLExporter().from_notebook_node(nb)
    assert "application/vnd.jupyter.widget-state+json" in html
