"""A JupyterLab server for one test, and a notebook in it driven by headless Chromium.

`JupyterLab(home, root)` starts `python -m jupyterlab` from this interpreter on a free port of 127.0.0.1
with token auth, no browser, `root` as its root folder and everything else of Jupyter's and IPython's
(config, settings, workspaces, kernel specs, runtime files) under `home`, so nothing on the machine is
read or written; its kernel spec `fl-test` runs this interpreter's ipykernel (the one that imports
torch_fl). `NotebookPage` opens a notebook in it through Playwright and runs its cells one at a time the
way a user does (click into the cell, Shift+Enter), waiting on the cell's prompt and the kernel's status,
never on sleeps. Playwright drives the system's Chromium (`executable_path`); it never downloads a
browser."""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request

KERNEL = "fl-test"

# JupyterLab user settings: no news or update prompts over the notebook, every cell kept in the page
SETTINGS = {
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false", "checkForUpdates": False},
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
}


def find_chromium() -> str | None:
    """The Chromium binary to drive: $FL_TEST_CHROMIUM, else `chromium` (Debian) or `chromium-browser`."""
    explicit = os.environ.get("FL_TEST_CHROMIUM")
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    return next((p for p in map(shutil.which, ("chromium", "chromium-browser")) if p), None)


def missing() -> str | None:
    """Why the browser test cannot run here, naming what to install; None when it can."""
    why = []
    if find_chromium() is None:
        why.append("no Chromium on PATH (apt-get install chromium; or set FL_TEST_CHROMIUM to a Chromium binary)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        why.append(
            "no Playwright for Python (pip install playwright; never `playwright install`: the test drives "
            "the system chromium)"
        )
    try:
        import jupyterlab  # noqa: F401
    except ImportError:
        why.append("no JupyterLab in this environment (pip install 'jupyterlab>=4')")
    return "; ".join(why) or None


def write_notebook(path: str, cells: list[str]) -> None:
    """An nbformat 4.5 notebook of code cells, no outputs, on the `fl-test` kernel."""
    nb = {
        "cells": [
            {
                "cell_type": "code",
                "execution_count": None,
                "id": f"cell-{i}",
                "metadata": {},
                "outputs": [],
                "source": src,
            }
            for i, src in enumerate(cells)
        ],
        "metadata": {
            "kernelspec": {"name": KERNEL, "display_name": "torch_fl (test)", "language": "python"},
            "language_info": {"name": "python"},
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    with open(path, "w") as f:
        json.dump(nb, f, indent=1)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class JupyterLab:
    """`with JupyterLab(home, root, log) as lab:` a running server; lab.url(path) opens a page of it."""

    def __init__(self, home: str, root: str, log: str, start_timeout: float = 120.0) -> None:
        self.home, self.root, self.log = home, root, log
        self.start_timeout = start_timeout
        self.token = secrets.token_hex(16)
        self.port = _free_port()
        self.proc: subprocess.Popen | None = None

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}/{path.lstrip('/')}?token={self.token}"

    def _env(self) -> dict[str, str]:
        dirs = {
            k: os.path.join(self.home, k.lower())
            for k in ("JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR", "IPYTHONDIR")
        }
        for d in dirs.values():
            os.makedirs(d, exist_ok=True)
        spec = os.path.join(dirs["JUPYTER_DATA_DIR"], "kernels", KERNEL)
        os.makedirs(spec, exist_ok=True)
        with open(os.path.join(spec, "kernel.json"), "w") as f:
            json.dump(
                {
                    "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                    "display_name": "torch_fl (test)",
                    "language": "python",
                },
                f,
            )
        for name, values in SETTINGS.items():
            path = os.path.join(dirs["JUPYTER_CONFIG_DIR"], "lab", "user-settings", name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                json.dump(values, f)
        # the kernel inherits this: no FL_* setting of the caller's picks its backends (as tests/test_docs.py)
        env = {k: v for k, v in os.environ.items() if not k.startswith("FL_") or k in ("FL_CACHE_DIR", "FL_JIT_CACHE")}
        env.update(dirs)
        env.pop("JUPYTER_PATH", None)
        return env

    def __enter__(self) -> JupyterLab:
        cmd = [
            sys.executable,
            "-m",
            "jupyterlab",
            "--no-browser",
            "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={self.port}",
            "--ServerApp.port_retries=0",
            f"--ServerApp.root_dir={self.root}",
            f"--IdentityProvider.token={self.token}",
            "--ServerApp.allow_root=True",
            "--LabApp.news_url=None",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
            "--LabApp.expose_app_in_browser=True",
        ]  # window.jupyterapp: the notebook's kernel connection
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self._env(),
                cwd=self.root,
                start_new_session=True,
            )
        deadline = time.monotonic() + self.start_timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"jupyter lab exited with status {self.proc.returncode}:\n{self.log_tail()}")
            try:
                self.api("status")
                return self
            except OSError:
                if time.monotonic() > deadline:
                    self.__exit__()
                    raise RuntimeError(
                        f"jupyter lab did not answer within {self.start_timeout:.0f} s:\n{self.log_tail()}"
                    ) from None
                time.sleep(0.25)

    def api(self, path: str, method: str = "GET"):
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/api/{path}", method=method, headers={"Authorization": f"token {self.token}"}
        )
        with urllib.request.urlopen(req, timeout=10) as r:
            body = r.read()
        return json.loads(body) if body else None

    def log_tail(self, n: int = 4000) -> str:
        try:
            with open(self.log, errors="replace") as f:
                return f.read()[-n:]
        except OSError:
            return "(no log)"

    def __exit__(self, *exc) -> None:
        """Shut the kernels down through the API, then the server (SIGTERM; SIGKILL to its process group
        after 20 s). ipykernel also exits by itself once its parent is gone."""
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            for k in self.api("kernels"):
                self.api(f"kernels/{k['id']}", method="DELETE")
        except OSError:
            pass
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the group start_new_session made: this server's own
            self.proc.wait(10)


KERNEL_IDLE = """() => {
    const panel = window.jupyterapp && window.jupyterapp.shell.currentWidget;
    const kernel = panel && panel.sessionContext && panel.sessionContext.session
        && panel.sessionContext.session.kernel;
    return !!kernel && kernel.connectionStatus === "connected" && kernel.status === "idle";
}"""
PROMPT_DONE = re.compile(r"^\s*\[\d+\]:\s*$")


class NotebookPage:
    """One notebook open in JupyterLab in a Playwright page; cells are numbered from 0."""

    def __init__(self, page, timeout_s: float) -> None:
        self.page = page
        self.timeout_ms = timeout_s * 1000

    def open(self, url: str) -> None:
        from playwright.sync_api import expect

        self.page.goto(url, timeout=self.timeout_ms)
        expect(self.cells.first).to_be_visible(timeout=self.timeout_ms)
        self.wait_idle()

    @property
    def panel(self):
        return self.page.locator(".jp-NotebookPanel:visible")

    @property
    def cells(self):
        return self.panel.locator(".jp-Notebook .jp-Cell")

    def cell(self, i: int):
        return self.cells.nth(i)

    def output(self, i: int):
        return self.cell(i).locator(".jp-OutputArea")

    def wait_idle(self, timeout_s: float | None = None) -> None:
        """The notebook's session has its kernel, connected and idle. (The toolbar's indicator says idle
        before the session has a kernel, and a cell run then is dropped: JupyterLab clears its prompt.)"""
        self.page.wait_for_function(KERNEL_IDLE, timeout=self.timeout_ms if timeout_s is None else timeout_s * 1000)

    def run(self, i: int, timeout_s: float | None = None) -> str:
        """Run cell i as a user would and wait until it has finished; its output's text (a traceback fails)."""
        from playwright.sync_api import expect

        cell = self.cell(i)
        cell.locator(".jp-InputArea-editor").click()
        self.page.keyboard.press("Shift+Enter")
        timeout = self.timeout_ms if timeout_s is None else timeout_s * 1000
        expect(cell.locator(".jp-InputPrompt")).to_have_text(PROMPT_DONE, timeout=timeout)
        self.wait_idle(timeout_s)
        text = self.output(i).inner_text()
        assert "Traceback" not in text and "UsageError" not in text, f"cell {i} failed:\n{text}"
        return text

    def poll(self, what: str, check, detail=None, timeout_s: float | None = None, interval_s: float = 0.2):
        """check() until it returns something true (its value is returned), else an AssertionError naming
        `what`, with detail() (what the page shows) appended."""
        deadline = time.monotonic() + (self.timeout_ms / 1000 if timeout_s is None else timeout_s)
        while True:
            value = check()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"timed out waiting for {what}" + (f"; the page shows:\n{detail()}" if detail else "")
                )
            self.page.wait_for_timeout(interval_s * 1000)
