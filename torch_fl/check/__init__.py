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
import re
import signal
import subprocess
import sys
import textwrap
from dataclasses import asdict, dataclass, field

from ._contract import FAIL, PASS, SKIP, WARN


@dataclass
class CheckRow:
    check: str
    status: str
    detail: str


@dataclass
class CheckReport:
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
        return {"target": self.target, "passed": self.passed, "counts": self.counts(),
                "rows": [asdict(r) for r in self.rows]}

    def to_json(self, **kw) -> str:
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
        lines.append(f"{'PASSED' if self.passed else 'FAILED'}: {c[PASS]} passed, {c[FAIL]} failed, "
                     f"{c[WARN]} warnings, {c[SKIP]} skipped")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.render()

    def _repr_mimebundle_(self, include=None, exclude=None):
        import html

        rows = "".join(f"<tr><td>{html.escape(r.check)}</td><td>{r.status}</td><td>{html.escape(r.detail)}</td></tr>"
                       for r in self.rows)
        verdict = "PASSED" if self.passed else "FAILED"
        return {"text/plain": self.render(),
                "text/html": f"<b>plugin check {html.escape(self.target)}: {verdict}</b>"
                             f"<table><tr><th>check</th><th>status</th><th>detail</th></tr>{rows}</table>"}


def check_plugin(target: str, *, ops: str = "*", samples: int = 4, timeout: float = 1800.0) -> CheckReport:
    """Check the plugin at a path (a lib*.so file) or a discovered backend by name."""
    report = CheckReport(target)
    env = dict(os.environ)
    if os.path.exists(target):
        env["FL_PLUGIN_PATH"] = os.path.abspath(target)
    elif os.sep in target or target.endswith(".so"):
        report.rows.append(CheckRow("load", FAIL, f"{target}: no such file"))
        return report
    done: set[str] = set()
    for _attempt in range(64):  # each crash costs one attempt
        cmd = [sys.executable, "-m", "torch_fl.check._worker", target, "--ops", ops, "--samples", str(samples),
               "--skip", ",".join(sorted(done))]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        current, finished = None, False
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                if line.startswith("@@BEGIN "):
                    if current:
                        done.add(current)
                    current = line[8:].strip()
                elif line.startswith("@@ROW "):
                    report.rows.append(CheckRow(**json.loads(line[6:])))
                elif line.startswith("@@DONE"):
                    finished = True
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        stderr = proc.stderr.read() if proc.stderr else ""
        if finished:
            break
        if current is None:
            report.rows.append(CheckRow("checker", FAIL, f"the checking process failed to start: {stderr[-500:]}"))
            break
        report.rows.append(CheckRow(current, FAIL, _why_the_process_ended(proc.returncode, stderr)))
        done.add(current)
        if current in ("load", "recording samples"):
            break
    return report


_MISSING_MODULE = re.compile(r"^(?:ModuleNotFoundError|ImportError): No module named '([^']+)'", re.M)


def _why_the_process_ended(rc: int | None, stderr: str) -> str:
    """What killed a checking process. A missing Python module is the
    environment's fault, not the plugin's: name the module and say so, rather
    than blame the plugin for a crash."""
    missing = _MISSING_MODULE.findall(stderr)
    if missing:
        module = missing[-1].split(".")[0]
        return (f"the environment, not the plugin: Python module '{module}' is not installed, so the checker "
                f"could not run this check (install the package that provides '{module}', e.g. "
                f"pip install {module}, and check again)")
    why = f"killed by signal {signal.Signals(-rc).name}" if rc is not None and rc < 0 else f"exit status {rc}"
    tail = stderr.strip().splitlines()[-1] if stderr.strip() else ""
    return f"the plugin crashed the process ({why}) during this check" + (f": {tail}" if tail else "")


__all__ = ["CheckReport", "CheckRow", "check_plugin", "PASS", "FAIL", "WARN", "SKIP"]
