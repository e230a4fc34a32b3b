"""README.md's and docs/*.md's code samples run as written and print what they
say (issue 13: the README's fl.explain sample had gone stale). How samples are
written and marked: tests/doc_samples.py."""

import glob
import os
import shutil
import subprocess
import sys

import pytest
from doc_samples import samples, skip_markers

from torch_fl.runtime import get_include

pytestmark = pytest.mark.slow  # every doc's samples in a fresh interpreter

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = [
    os.path.relpath(p, ROOT)
    for p in [os.path.join(ROOT, "README.md"), *sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))]
]
WITH_SAMPLES = [d for d in DOCS if any(s.skip is None for s in samples(os.path.join(ROOT, d)))]
MAX_SKIPPED = 3  # blocks that cannot run in a test: keep them rare


@pytest.fixture(scope="module")
def template_plugin(tmp_path_factory) -> str:
    """docs/writing-a-plugin.md's samples load the template plugin, built the way its README says."""
    out = tmp_path_factory.mktemp("template")
    for name in ("fl_template.c", "Makefile"):
        shutil.copy(os.path.join(ROOT, "plugins_cffi", "template", name), out / name)
    subprocess.run(["make", "-C", str(out), f"FL_INCLUDE={get_include()}"], check=True, capture_output=True)
    return str(out / "libfl_template.so")


@pytest.mark.parametrize("doc", WITH_SAMPLES)
def test_samples_run_as_written(doc, tmp_path, request):
    env = {k: v for k, v in os.environ.items() if not k.startswith("FL_") or k in ("FL_CACHE_DIR", "FL_JIT_CACHE")}
    if doc == os.path.join("docs", "writing-a-plugin.md"):
        env["FL_PLUGIN_PATH"] = request.getfixturevalue("template_plugin")
    r = subprocess.run(
        [sys.executable, os.path.join(ROOT, "tests", "doc_samples.py"), os.path.join(ROOT, doc)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=900,
    )
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]


def test_every_doc_with_code_is_checked_and_skips_stay_rare():
    reasons = [(d, why) for d in DOCS for why in skip_markers(os.path.join(ROOT, d))]
    assert len(reasons) <= MAX_SKIPPED, reasons
    assert all(len(why.split()) >= 3 for _, why in reasons), reasons  # each says why
    blocks = [s for d in DOCS for s in samples(os.path.join(ROOT, d))]
    assert sum(s.is_doctest for s in blocks) >= 4  # the samples that show output are compared
    assert "README.md" in WITH_SAMPLES and os.path.join("docs", "user-guide.md") in WITH_SAMPLES


def test_extras_named_in_the_docs_exist():
    """An install command in the docs may only name extras pyproject.toml defines (issue 13: how to open the
    notebooks in JupyterLab from a fresh environment)."""
    import re

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        extras = set(tomllib.load(f)["project"]["optional-dependencies"])
    named = set()
    for d in DOCS:
        with open(os.path.join(ROOT, d)) as f:
            named |= {
                x for group in re.findall(r"pip install [^\n]*?'\.\[([\w,-]+)\]'", f.read()) for x in group.split(",")
            }
    assert "jupyter" in named and named <= extras, (named, extras)
    with open(os.path.join(ROOT, "docs", "notebooks.md")) as f:
        assert "jupyter lab notebooks/" in f.read()
