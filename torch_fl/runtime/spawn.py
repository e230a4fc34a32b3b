"""Starting torch_fl's own Python worker processes without trusting the working directory.

Why: `python -m pkg.module` and `python script.py` put the working directory
(or the script's folder) first on sys.path, so a file named like a standard
module (`tempfile.py`, `json.py`) in the folder where a user runs
`torch-fl plugin check` would be imported, and run, by the worker. Python 3.11
has `-P` for this; torch_fl supports 3.10, so the worker starts through a
three-line bootstrap that drops that first entry before importing anything.
PYTHONPATH, user site-packages and editable installs keep working (unlike
`-I`, which drops them)."""

from __future__ import annotations

import sys

_BOOTSTRAP = (
    "import sys, runpy\n"
    "if sys.path and sys.path[0] == '':\n"  # the working directory that `-c` put first (not with -P/PYTHONSAFEPATH)
    "    del sys.path[0]\n"
    "sys.argv = sys.argv[1:]\n"
    "target = sys.argv[0]\n"
    "if target.endswith('.py'):\n"
    "    runpy.run_path(target, run_name='__main__')\n"
    "else:\n"
    "    runpy.run_module(target, run_name='__main__', alter_sys=True)\n"
)


def python_command(target: str, *args: str) -> list[str]:
    """argv running a module (`torch_fl.tools.checker.worker`) or a script path (ending in .py) in a
    fresh interpreter whose sys.path does not contain the working directory."""
    return [sys.executable, "-c", _BOOTSTRAP, target, *args]
