"""The plugin conformance checker: `torch-fl plugin check PATH_OR_NAME`.

Loads a plugin and checks every entry point against fl_plugin.h's contract
(allocation and copy round trips, error reporting, RNG, the kernel table),
then each declared kernel against PyTorch on CPU, on recorded real calls in
every declared dtype, with non-contiguous and zero-size tensors among them.

The checks run in a child process: a plugin that crashes it (a segfault in a
kernel, say) is reported as a failure of the check that was running, and a
fresh child carries on with the rest."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from ...progress import Reporter
from ...progress import start as start_progress
from ...rendering import Report
from ...runtime import spawn
from .contract import FAIL, PASS, SKIP, WARN


@dataclass
class CheckRow:
    check: str
    status: str
    detail: str


@dataclass
class CheckReport(Report):
    target: str
    rows: list[CheckRow] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not any(r.status == FAIL for r in self.rows) and any(r.status == PASS for r in self.rows)

    def counts(self) -> dict[str, int]:
        out = {PASS: 0, FAIL: 0, WARN: 0, SKIP: 0}
        for r in self.rows:
            out[r.status] = out.get(r.status, 0) + 1
        return out

    def failures(self) -> list[CheckRow]:
        return [r for r in self.rows if r.status == FAIL]

    def to_dict(self) -> dict:
        return {
            "target": self.target,
            "passed": self.passed,
            "counts": self.counts(),
            "rows": [asdict(r) for r in self.rows],
        }

    def to_json(self, **kw: Any) -> str:
        return json.dumps(self.to_dict(), **kw)

    def render(self, width: int = 120) -> str:
        name_w = min(max((len(r.check) for r in self.rows), default=10), 60)
        lines = [f"torch_fl plugin check: {self.target}", f"{'check':<{name_w}}  status  detail"]
        room = max(width - name_w - 10, 40)
        for r in self.rows:
            if r.status == FAIL:  # a failure is read in full: wrapped, never cut
                first, *rest = textwrap.wrap(r.detail, room) or [""]
            else:
                first, rest = (r.detail if len(r.detail) <= room else r.detail[: room - 3] + "..."), []
            lines.append(f"{r.check[:name_w]:<{name_w}}  {r.status:<6}  {first}")
            lines += [f"{'':<{name_w + 10}}{more}" for more in rest]
        c = self.counts()
        lines.append(
            f"{'PASSED' if self.passed else 'FAILED'}: {c[PASS]} passed, {c[FAIL]} failed, "
            f"{c[WARN]} warnings, {c[SKIP]} skipped"
        )
        return "\n".join(lines)

    def html(self) -> str:
        """The verdict and one table row per check."""
        import html

        rows = "".join(
            f"<tr><td>{html.escape(r.check)}</td><td>{r.status}</td><td>{html.escape(r.detail)}</td></tr>"
            for r in self.rows
        )
        verdict = "PASSED" if self.passed else "FAILED"
        return (
            f"<b>plugin check {html.escape(self.target)}: {verdict}</b>"
            f"<table><tr><th>check</th><th>status</th><th>detail</th></tr>{rows}</table>"
        )


# Phases that are not the plugin's work (importing torch and the OpInfo database, recording
# PyTorch's own calls) get at least this long, whatever the per-check timeout.
SETUP_S = 600.0
_SETUP_PHASES = (None, "load", "recording samples")


def check_plugin(
    target: str, *, ops: str = "*", samples: int = 4, timeout: float = 300.0, progress: bool | Reporter = True
) -> CheckReport:
    """Check the plugin at a path (a lib*.so file) or a discovered backend by name.

    progress: each row is shown as it is decided, since the checks take minutes (torch_fl.progress: lines
    in a terminal, a bar in a notebook); False for silence, or a Reporter of your own.

    timeout: seconds one check (one contract group, or one kernel's calls) may take; a check
    that takes longer (a kernel that never returns) is reported as FAIL, its worker is
    stopped, and a fresh worker goes on with the remaining checks."""
    report = CheckReport(target)
    env = dict(os.environ)
    env["FL_MEMORY_POOL"] = "0"  # every buffer a fresh guarded block (see guarded.py)
    # a plugin file, else a backend name: a folder that happens to share a backend's name (./opencl) is not a
    # plugin and must not hide the backend
    if os.path.isfile(target):
        target = os.path.abspath(target)
        env["FL_PLUGIN_PATH"] = target
    elif os.sep in target or target.endswith(".so"):
        report.rows.append(CheckRow("load", FAIL, f"{target}: no such file (a plugin is a lib*.so file)"))
        return report
    done: set[str] = set()
    shown = start_progress(f"plugin check {os.path.basename(target)}", None, progress)
    try:
        _check_rows(report, target, env, ops, samples, timeout, shown, done)
    finally:
        shown.close()
    return report


def _check_rows(
    report: CheckReport, target: str, env: dict, ops: str, samples: int, timeout: float, shown: Reporter, done: set[str]
) -> None:
    def decided(row: CheckRow) -> None:
        report.rows.append(row)
        shown.update(len(report.rows), f"{row.status:<4} {row.check}", failed=row.status == FAIL)

    for _attempt in range(64):  # each crash or hang costs one attempt
        cmd = spawn.python_command(
            "torch_fl.tools.checker.worker",
            target,
            "--ops",
            ops,
            "--samples",
            str(samples),
            "--skip",
            ",".join(sorted(done)),
        )
        run = _WorkerRun(cmd, env, timeout)
        for kind, payload in run.events():
            if kind == "ROW":
                decided(CheckRow(**payload))
            elif kind == "BEGIN" and run.previous:
                done.add(run.previous)
        if run.finished:
            break
        current = run.current
        if current is None:
            why = f"the checking process failed to start: {run.stderr_tail(500)}"
            decided(CheckRow("checker", FAIL, why))
            break
        decided(CheckRow(current, FAIL, run.failure()))
        done.add(current)
        if current in ("load", "recording samples"):
            break


_MISSING_MODULE = re.compile(r"^(?:ModuleNotFoundError|ImportError): No module named '([^']+)'", re.M)


def _why_the_process_ended(rc: int | None, stderr: str) -> str:
    """What killed a checking process. A missing Python module is the
    environment's fault, not the plugin's: name the module and say so, rather
    than blame the plugin for a crash."""
    missing = _MISSING_MODULE.findall(stderr)
    if missing:
        module = missing[-1].split(".")[0]
        return (
            f"the environment, not the plugin: Python module '{module}' is not installed, so the checker "
            f"could not run this check (install the package that provides '{module}', e.g. "
            f"pip install {module}, and check again)"
        )
    why = f"killed by signal {signal.Signals(-rc).name}" if rc is not None and rc < 0 else f"exit status {rc}"
    tail = stderr.strip().splitlines()[-1] if stderr.strip() else ""
    return f"the plugin crashed the process ({why}) during this check" + (f": {tail}" if tail else "")


class _WorkerRun:
    """One checking process, read line by line against a deadline per check.

    Why a reader thread: reading the worker's stdout blocks until a line comes,
    so a kernel that never returns would block the checker too; lines go through
    a queue that the parent waits on with a timeout instead. stderr goes to a
    file, so a chatty worker can never fill a pipe and stall."""

    def __init__(self, cmd: list[str], env: dict, timeout: float) -> None:
        self.timeout = timeout
        self.current: str | None = None
        self.previous: str | None = None
        self.finished = False
        self.timed_out = False
        self._stderr = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=self._stderr, stdin=subprocess.DEVNULL, text=True, env=env
        )
        self._lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def _limit(self) -> float:
        return max(self.timeout, SETUP_S) if self.current in _SETUP_PHASES else self.timeout

    def events(self) -> Iterator[tuple[str, Any]]:
        """(kind, payload) for each @@ line, until the worker ends or a check overruns."""
        deadline = time.monotonic() + self._limit()
        while True:
            try:
                line = self._lines.get(timeout=max(deadline - time.monotonic(), 0.0))
            except queue.Empty:
                self.timed_out = True
                self.proc.kill()
                break
            if line is None:
                break
            if line.startswith("@@BEGIN "):
                self.previous, self.current = self.current, line[8:].strip()
                deadline = time.monotonic() + self._limit()
                yield "BEGIN", self.current
            elif line.startswith("@@ROW "):
                yield "ROW", json.loads(line[6:])
            elif line.startswith("@@DONE"):
                self.finished = True
        self.proc.wait()

    def stderr_tail(self, n: int) -> str:
        self._stderr.seek(0)
        return self._stderr.read()[-n:]

    def failure(self) -> str:
        """Why the check that was running did not finish."""
        if self.timed_out:
            return (
                f"did not finish within {self._limit():g} s (a kernel or entry point that never returns?); "
                f"the checking process was stopped. Raise --timeout if the check is only slow"
            )
        return _why_the_process_ended(self.proc.returncode, self.stderr_tail(1 << 20))


__all__ = ["CheckReport", "CheckRow", "check_plugin", "PASS", "FAIL", "WARN", "SKIP"]
