"""Loading plugins that torch_fl has not seen before in a throwaway process first.

Why: a plugin is native code running in the user's process; one whose library
constructor or fl_plugin_init crashes would kill `import torch_fl` (and every
`torch-fl` command) with no message. Each plugin that is not bundled with
torch_fl is therefore loaded once in a child process (probe.py) with the
loader's own calls; only a plugin that survives there is loaded here. The
verdict is cached in the private cache folder by the file's identity (path,
size, modification time, inode), so the child runs once per plugin build,
not once per import."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess

from ..errors import CacheDirError
from . import private, spawn

PROBE_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "probe.py")
PROBE_TIMEOUT_S = 120.0  # loading a plugin takes milliseconds; this only bounds a hang
_VERDICT_VERSION = 1


def crash_verdict(path: str) -> str | None:
    """Why loading `path` would crash or hang this process, or None when it loaded cleanly in a
    child process (now or in an earlier run with the same file)."""
    key = _file_key(path)
    cached = _read_verdict(key)
    if cached is not None:
        return cached or None
    verdict = _probe(path)
    _write_verdict(key, path, verdict)
    return verdict


def _probe(path: str) -> str | None:
    try:
        r = subprocess.run(
            spawn.python_command(PROBE_SCRIPT, path),
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return (
            f"loading it did not finish within {PROBE_TIMEOUT_S:.0f} s in a test process (its library "
            f"constructor or fl_plugin_init hangs), so torch_fl does not load it"
        )
    if r.returncode == 0 and "@@PROBE " in r.stdout:
        return None  # loaded, or refused in an orderly way the loader will explain
    if r.returncode < 0:
        why = f"was killed by {signal.Signals(-r.returncode).name}"
    else:
        why = f"exited with status {r.returncode}"
    tail = r.stderr.strip().splitlines()[-1][:300] if r.stderr.strip() else ""
    return (
        f"loading it crashed a test process (it {why}{': ' + tail if tail else ''}), so torch_fl does not load "
        f"it into yours; run `torch-fl plugin check {path}` for details"
    )


def _file_key(path: str) -> str:
    st = os.stat(path)
    ident = f"{_VERDICT_VERSION}\0{os.path.realpath(path)}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ino}\0{st.st_dev}"
    return hashlib.sha256(ident.encode()).hexdigest()[:32]


def _verdict_dir() -> str | None:
    try:
        return private.private_dir(os.path.join(private.cache_root(), "probe"))
    except CacheDirError:
        return None  # no private cache: probe every time rather than trust a shared folder


def _read_verdict(key: str) -> str | None:
    """The cached verdict: "" for a clean load, the reason for a crash, None when unknown."""
    folder = _verdict_dir()
    if folder is None:
        return None
    path = os.path.join(folder, key + ".json")
    if private.file_problem(path) is not None:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            return str(json.load(f)["problem"] or "")
    except (OSError, ValueError, KeyError):
        return None


def _write_verdict(key: str, plugin: str, problem: str | None) -> None:
    folder = _verdict_dir()
    if folder is None:
        return
    data = json.dumps({"plugin": plugin, "problem": problem or ""}).encode()
    try:
        private.write_file(os.path.join(folder, key + ".json"), data)
    except OSError:
        pass  # a cache that cannot be written only costs a probe next time
