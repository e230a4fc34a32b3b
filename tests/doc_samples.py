"""The code samples of README.md and docs/*.md, extracted and run, so they
cannot go stale (tests/test_docs.py runs each file in a fresh interpreter).

A ```python block that holds `>>>` prompts is a doctest: its printed output is
compared (ELLIPSIS: `...` stands for any text; whitespace normalised). Any
other ```python block must run without an error; comments in it are not
checked, so a sample that claims an output is written as a doctest. An
```ipython block (`%load_ext ...`) runs in an IPython shell. A file's blocks run
top to bottom in one namespace, as a reader would paste them.

A block that cannot run here (it needs torchrun, say) is marked on the line
right before its fence with

    <!-- doc-sample: skip (the reason) -->

and test_docs.py keeps such markers rare.

    python tests/doc_samples.py FILE.md    # run one file's samples; exit 1 on a failure"""

from __future__ import annotations

import doctest
import re
import sys
import traceback
from dataclasses import dataclass

FENCE = re.compile(r"^```(\w*)\s*$")
SKIP = re.compile(r"^<!-- doc-sample: skip \((?P<reason>[^)]+)\) -->$")
LANGS = ("python", "ipython")


@dataclass
class Sample:
    path: str
    line: int  # the 1-based line of the block's first code line
    lang: str
    code: str
    skip: str | None = None  # why it does not run, from its marker

    @property
    def is_doctest(self) -> bool:
        return self.lang == "python" and any(ln.lstrip().startswith(">>>") for ln in self.code.splitlines())


def samples(path: str) -> list[Sample]:
    """Every ```python / ```ipython block of a Markdown file, in order."""
    with open(path) as f:
        lines = f.read().splitlines()
    out: list[Sample] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m or not m.group(1):
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("```")), len(lines))
        if m.group(1) in LANGS:
            marker = SKIP.match(lines[i - 1]) if i else None
            out.append(
                Sample(
                    path,
                    i + 2,
                    m.group(1),
                    "\n".join(lines[i + 1 : end]) + "\n",
                    marker.group("reason") if marker else None,
                )
            )
        i = end + 1
    return out


def skip_markers(path: str) -> list[str]:
    """The reasons of every skip marker in a file (a marker not before a block counts too)."""
    with open(path) as f:
        return [m.group("reason") for m in map(SKIP.match, f.read().splitlines()) if m]


def _run_doctest(sample: Sample, ns: dict) -> str | None:
    parser = doctest.DocTestParser()
    test = parser.get_doctest(sample.code, ns, f"{sample.path}:{sample.line}", sample.path, sample.line - 1)
    report: list[str] = []
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    runner.run(test, out=report.append, clear_globs=False)
    ns.update(test.globs)
    return "".join(report) if runner.failures else None


def _run_code(sample: Sample, ns: dict) -> str | None:
    # blank lines in front keep the file's own line numbers in a traceback
    code = compile("\n" * (sample.line - 1) + sample.code, sample.path, "exec")
    try:
        exec(code, ns)
    except BaseException:  # noqa: BLE001 - reported as the sample's failure
        return traceback.format_exc()
    return None


def _run_ipython(sample: Sample, shell) -> str | None:
    result = shell.run_cell(sample.code)
    if result.success:
        return None
    return f"{sample.path}:{sample.line}: {result.error_before_exec or result.error_in_exec!r}"


def run_file(path: str) -> list[str]:
    """Runs a file's samples; the failures, each with where and why."""
    todo = [s for s in samples(path) if s.skip is None]
    shell = None
    if any(s.lang == "ipython" for s in todo):
        from IPython.core.interactiveshell import InteractiveShell

        shell = InteractiveShell.instance()
    ns = shell.user_ns if shell is not None else {"__name__": "__main__"}
    failures = []
    for s in todo:
        if s.lang == "ipython":
            problem = _run_ipython(s, shell)
        elif s.is_doctest:
            problem = _run_doctest(s, ns)
        else:
            problem = _run_code(s, ns)
        if problem:
            failures.append(f"--- {s.path}, the block at line {s.line}:\n{problem}")
    return failures


if __name__ == "__main__":
    problems = run_file(sys.argv[1])
    print("\n".join(problems) or f"{sys.argv[1]}: every sample ran as written")
    sys.exit(1 if problems else 0)
