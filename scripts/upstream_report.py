"""A pytest plugin for scripts/upstream_tests.py: one JSON line per test, written as each test starts and ends.

Why not --junitxml: that file is written when the session ends, so a test that kills the interpreter (a
segfault, the kernel's OOM killer) would lose every result of the file. With a line per event the runner
knows which test was running when the process died, records it as crashed and runs the rest again without it.
The log's path comes from FL_UPSTREAM_LOG."""

from __future__ import annotations

import json
import os
import time

_LOG = None
_OUTCOME: dict[str, tuple[str, str]] = {}
_IDS: dict[str, str] = {}  # pytest's nodeid -> "test_file.py::Class::test"


def _id(nodeid: str) -> str:
    """A test's id with its file's name: the files lie outside pytest's rootdir, so its nodeids start with an
    empty path ("::TestFooCPU::test_bar_cpu")."""
    return _IDS.get(nodeid, nodeid)


def _write(record: dict) -> None:
    global _LOG
    if _LOG is None:
        _LOG = open(os.environ["FL_UPSTREAM_LOG"], "a", buffering=1)  # noqa: SIM115 - one line per event
    _LOG.write(json.dumps(record) + "\n")


def pytest_collection_modifyitems(config, items) -> None:
    """Leave out the tests the runner names in FL_UPSTREAM_SKIP (those already run before a crash, and the
    crashed ones), those upstream_tests.DESELECT names (more memory than the machine has), and, with
    FL_UPSTREAM_SAMPLE=N, those outside the runner's 1-in-N selection."""
    from upstream_tests import DESELECT, key_of, matching, sampled

    sample = int(os.environ.get("FL_UPSTREAM_SAMPLE", "1") or 1)
    path = os.environ.get("FL_UPSTREAM_SKIP")
    done = set()
    if path and os.path.exists(path):
        with open(path) as fh:
            done = {line.strip() for line in fh if line.strip()}
    keep, drop = [], []
    for item in items:
        _IDS[item.nodeid] = f"{item.path.name}::{item.nodeid.split('::', 1)[1]}" if "::" in item.nodeid else item.nodeid
        key = key_of(_id(item.nodeid))
        if _id(item.nodeid) in done or matching(DESELECT, key) is not None or not sampled(key, sample):
            drop.append(item)
        else:
            keep.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_collection_finish(session) -> None:
    _write({"collected": [_id(item.nodeid) for item in session.items]})


def pytest_runtest_logstart(nodeid, location) -> None:
    _write({"start": _id(nodeid), "t": time.monotonic()})


def pytest_runtest_logreport(report) -> None:
    """The outcome of a test is its worst phase: a failed setup or teardown fails it, a skip in setup skips
    it; xfail and xpass come from PyTorch's expectedFailure decorators (unittest's) or pytest's marks."""
    prev = _OUTCOME.get(report.nodeid)
    if hasattr(report, "wasxfail"):
        outcome = "xfailed" if report.skipped else "xpassed"
        why = str(report.wasxfail)
    elif report.failed:
        outcome = "failed" if report.when == "call" else "error"
        why = _first_line(report)
    elif report.skipped:
        outcome = "skipped"
        longrepr = report.longrepr
        why = str(longrepr[2]) if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    elif report.when == "call":
        outcome, why = "passed", ""
    else:
        return
    if prev is not None and prev[0] in ("failed", "error"):
        return  # a teardown after a failed call keeps the call's failure
    _OUTCOME[report.nodeid] = (outcome, why)


def pytest_runtest_logfinish(nodeid, location) -> None:
    outcome, why = _OUTCOME.pop(nodeid, ("error", "no outcome reported"))
    _write({"end": _id(nodeid), "outcome": outcome, "why": why[:400], "t": time.monotonic()})


def _first_line(report) -> str:
    """The exception line of a failure (its type and message), which is what the summary shows."""
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        return crash.message.splitlines()[0] if crash.message else ""
    text = str(report.longrepr).strip().splitlines()
    return text[-1] if text else ""
