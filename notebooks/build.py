"""Builds each notebook from its source: notebooks/NN_name.py becomes
notebooks/NN_name.ipynb, executed in place (outputs and widget state stored), so
the committed notebooks are exactly what a run of their source gives. A cell that
raises stops the build with the error, and that notebook is not written. nbval
(`pytest notebooks`) re-runs the built notebooks and compares their outputs.

    python notebooks/build.py            # all
    python notebooks/build.py 04 07      # the ones whose name starts with 04 or 07

A source is a Python file in the percent format (jupytext's convention), so ruff
lints it like any other Python file:

    # %% [markdown]
    # # A title
    #
    # Markdown, each line commented.

    # %%
    x = 1
    # %fl_backend rocm          <- a magic, commented so the file stays Python

    # %% tags=["raises-exception"]
    # %fl_backend nope          <- a cell that is meant to fail (nbclient and nbval accept it)

A line `# %name` or `# %%name` in a code cell is the magic `%name` / `%%name`;
`# %%` alone (or followed by a space) starts a cell; lines before the first cell
marker are not allowed. Conventions: every cell's printed output is deterministic
(seeded, no timings), except cells marked `# NBVAL_IGNORE_OUTPUT` (the built cell
carries nbval's `nbval-ignore-output` tag instead of the line: timings, widgets,
figures built from timings); the cell after such a cell asserts a deterministic fact
about its result."""

from __future__ import annotations

import glob
import json
import os
import re
import sys

import nbformat

HERE = os.path.dirname(os.path.abspath(__file__))
CELL = re.compile(r"^# %%(?P<markdown> \[markdown\])?(?P<meta>(?: .*)?)$")
META = re.compile(r'\s*(?P<key>\w+)=(?P<value>\[[^\]]*\]|"[^"]*"|\S+)')
MAGIC = re.compile(r"^# (?P<magic>%%?[A-Za-z].*)$")
IGNORE_OUTPUT = "# NBVAL_IGNORE_OUTPUT"  # in a source; the built notebook carries nbval's tag instead
# Plotly's figures as their JSON (the mime bundle), not HTML with random element ids: what nbval can compare.
# The build's kernels and nbval's (tests/conftest.py, scripts/test.sh) get it from the environment, so no
# notebook cell has to say it.
RENDERER = ("PLOTLY_RENDERER", "plotly_mimetype")


class SourceError(ValueError):
    """A notebook source that does not follow the percent format."""


def sources(prefixes: list[str] | tuple[str, ...] = ()) -> list[str]:
    """The notebook sources (NN_name.py), sorted, those starting with one of `prefixes` if given."""
    found = sorted(glob.glob(os.path.join(HERE, "[0-9][0-9]_*.py")))
    return [p for p in found if not prefixes or os.path.basename(p).startswith(tuple(prefixes))]


def _metadata(text: str, where: str) -> dict:
    meta, pos = {}, 0
    text = text.rstrip()
    while pos < len(text):
        m = META.match(text, pos)
        if m is None:
            raise SourceError(f"{where}: cannot read the cell metadata {text[pos:].strip()!r} (key=value, JSON)")
        try:
            meta[m["key"]] = json.loads(m["value"])
        except json.JSONDecodeError as e:
            raise SourceError(f"{where}: {m['key']}={m['value']} is not JSON: {e}") from None
        pos = m.end()
    return meta


def _trim(lines: list[str]) -> list[str]:
    while lines and not lines[0].strip():
        lines = lines[1:]
    while lines and not lines[-1].strip():
        lines = lines[:-1]
    return lines


def read_source(path: str) -> nbformat.NotebookNode:
    """The notebook a percent-format source describes (cells only, no outputs)."""
    with open(path) as f:
        text = f.read()
    cells: list[tuple[bool, dict, list[str], int]] = []  # (markdown?, metadata, lines, first line number)
    for number, line in enumerate(text.splitlines(), 1):
        m = CELL.match(line)
        if m:
            cells.append((bool(m["markdown"]), _metadata(m["meta"], f"{path}:{number}"), [], number))
        elif not cells:
            if line.strip():
                raise SourceError(f"{path}:{number}: text before the first cell marker (# %% or # %% [markdown])")
        else:
            cells[-1][2].append(line)
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    for index, (markdown, meta, lines, start) in enumerate(cells):
        lines = _trim(lines)
        if markdown:
            for line in lines:
                if line != "#" and not line.startswith("# "):
                    raise SourceError(f"{path}: markdown cell at line {start}: a line without '# ': {line!r}")
            cell = nbformat.v4.new_markdown_cell("\n".join(line[2:] for line in lines))
        else:
            # test plumbing stays out of what the reader sees: the marker becomes nbval's cell tag
            ignore = any(line.strip() == IGNORE_OUTPUT for line in lines)
            code = [MAGIC.sub(r"\g<magic>", line) for line in lines if line.strip() != IGNORE_OUTPUT]
            cell = nbformat.v4.new_code_cell("\n".join(code))
            if ignore:
                meta = {**meta, "tags": [*meta.get("tags", []), "nbval-ignore-output"]}
        cell.metadata.update(meta)
        cell.id = f"cell-{index}"  # stable ids: a rebuild changes only what ran differently
        nb.cells.append(cell)
    if not nb.cells:
        raise SourceError(f"{path}: no cells")
    return nb


def build(path: str) -> str:
    """Executes the notebook of a source in the source's folder and writes it beside
    the source; a cell error (other than in a cell tagged raises-exception) raises
    nbclient's CellExecutionError and nothing is written."""
    from nbconvert.preprocessors import ExecutePreprocessor

    nb = read_source(path)
    os.environ.setdefault(*RENDERER)
    ExecutePreprocessor(timeout=600, kernel_name="python3", store_widget_state=True, allow_errors=False).preprocess(
        nb, {"metadata": {"path": os.path.dirname(path)}}
    )
    out = os.path.splitext(path)[0] + ".ipynb"
    nbformat.write(nb, out)
    return out


def main(argv: list[str]) -> int:
    from nbclient.exceptions import CellExecutionError

    paths = sources(argv)
    if not paths:
        print(f"no notebook source starts with {' or '.join(argv)}", file=sys.stderr)
        return 2
    failed = []
    for path in paths:
        try:
            print("wrote", build(path))
        except (CellExecutionError, SourceError) as e:
            print(f"FAILED {os.path.basename(path)} (notebook not written):\n{e}", file=sys.stderr)
            failed.append(path)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
