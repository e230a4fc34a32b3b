"""Docs and comments name no file that does not exist.

A file renamed or removed leaves its name behind in prose (a design document
that was never committed, kernel files regrouped by topic): a newcomer then
looks for something that is not there. This scans every text file of the
repository for paths into the repository's own folders, and for the names of
its own C sources and headers, and checks each exists."""

from __future__ import annotations

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOP = ("torch_fl/", "plugins_cffi/", "docs/", "notebooks/", "tests/", "bench/", "scripts/", "fl_magics/", ".ci/")
SKIP_DIRS = {".git", "build", "dist", ".venv", "__pycache__", ".ipynb_checkpoints", ".ruff_cache", ".pytest_cache"}
BUILT = ("torch_fl/runtime/include/", "torch_fl/runtime/plugins/")
TEXT = (".py", ".md", ".c", ".h", ".cpp", ".toml", ".sh", ".cfg", ".in", "Makefile", "run")
# a repository path, or a bare name of the repository's own C files (k_*.c, fl_*.h, ...), or a Markdown document
PATH = re.compile(
    r"(?<![\w/.-])((?:\.ci|[a-z_]+)/[\w./-]*[\w-](?:\.\w+)?"
    r"|(?:k|fl|comm|fused)_[\w-]*\.(?:c|h|cpp)|emu\.h|[\w-]+\.md)(?![\w/-])"
)
PLACEHOLDER = re.compile(r"NN_|<|\*|\{|FILE\.md")


def _files() -> list[str]:
    out = []
    for base, dirs, names in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.endswith(".egg-info")]
        out += [os.path.relpath(os.path.join(base, n), ROOT) for n in names]
    return out


def _exists(ref: str, where: str, files: set[str], dirs: set[str], names: set[str]) -> bool:
    ref = ref.rstrip(".")
    if "/" not in ref:
        return ref in names
    if not ref.startswith(TOP):
        return True  # torch's own files (torch/..., test/...), URLs' tails, module paths in prose
    if ref.startswith(BUILT):  # where the build puts plugins_cffi's headers and the compiled plugins
        return True
    if "." not in os.path.basename(ref) and not ref.endswith("/"):
        return True  # not a file name (a store key, a module path in prose)
    cand = {ref, ref.rstrip("/"), os.path.normpath(os.path.join(os.path.dirname(where), ref))}
    return bool(cand & files) or bool(cand & dirs)


def test_docs_and_comments_name_only_files_that_exist():
    all_files = _files()
    files = set(all_files)
    names = {os.path.basename(f) for f in all_files}
    dirs = {os.path.dirname(f) for f in all_files}
    dirs |= {d.rsplit("/", k)[0] for d in list(dirs) for k in range(1, d.count("/") + 1)}
    missing = []
    for f in all_files:
        if not f.endswith(TEXT) or f.startswith(("tests/plugins/", *BUILT)) or f == "tests/test_references.py":
            continue
        with open(os.path.join(ROOT, f), errors="replace") as fh:
            text = fh.read()
        for m in PATH.finditer(text):
            ref = m.group(1)
            around = text[max(0, m.start() - 60) : m.end() + 5]
            if PLACEHOLDER.search(ref) or "://" in around or "/tmp" in around or "site-packages" in around:
                continue
            if not _exists(ref, f, files, dirs, names):
                missing.append(f"{f}:{text.count(chr(10), 0, m.start()) + 1}: {ref}")
    assert not missing, "names of files that do not exist:\n" + "\n".join(missing)
