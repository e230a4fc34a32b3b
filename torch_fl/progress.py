"""Progress of long work: a plugin check, the doctor, the model zoo and coverage runs take minutes.

Silence for minutes reads as a hang, so each of them reports every step as it ends: one line per step in a
terminal (stderr, where it does not mix with a report printed on stdout), and, inside a Jupyter kernel, a bar
that updates in place, once the notebook layer has registered one (`torch_fl.notebook` does on import,
and `%load_ext fl_magics` imports it). Without it a kernel gets the lines, on stdout, since a kernel's stderr
renders as a red error box.

The work itself only calls `update`; who shows it is decided here, so the tools stay free of widgets and the
notebook layer free of logic."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Protocol, TextIO


class Reporter(Protocol):
    def update(self, done: int, text: str, failed: bool = False) -> None:
        """`done` steps of the total have ended; `text` says what the last one was."""

    def close(self) -> None:
        """The work is over (also after an error): the view shows its final state."""


class Lines:
    """One line per step: `[3/40] title: text`."""

    def __init__(self, title: str, total: int | None, stream: TextIO | None = None):
        self.title, self.total = title, total
        self.stream = stream or (sys.stdout if in_kernel() else sys.stderr)

    def update(self, done: int, text: str, failed: bool = False) -> None:
        count = f"{done}/{self.total}" if self.total else str(done)
        self.stream.write(f"[{count}] {self.title}: {text}\n")
        self.stream.flush()

    def close(self) -> None:
        pass


class Silent:
    def update(self, done: int, text: str, failed: bool = False) -> None:
        pass

    def close(self) -> None:
        pass


class _Bars:
    """The notebook layer's bar, when it registered one (see `register_bar`)."""

    factory: Callable[[str, int | None], Reporter] | None = None


def register_bar(factory: Callable[[str, int | None], Reporter] | None) -> None:
    """The notebook layer's progress bar: called as factory(title, total) inside a Jupyter kernel."""
    _Bars.factory = factory


def in_kernel() -> bool:
    """Running inside a Jupyter kernel (not a terminal IPython, where lines are what one wants)."""
    app = sys.modules.get("ipykernel.kernelapp")
    return app is not None and app.IPKernelApp.initialized()


def start(title: str, total: int | None = None, show: bool | Reporter = True) -> Reporter:
    """The reporter a long run uses: `show` False for none, a Reporter of the caller's own, or True for
    the default (a bar in a Jupyter kernel where the notebook layer registered one, lines otherwise)."""
    if show is False or show is None:
        return Silent()
    if show is not True:
        return show
    if _Bars.factory is not None and in_kernel():
        return _Bars.factory(title, total)
    return Lines(title, total)
