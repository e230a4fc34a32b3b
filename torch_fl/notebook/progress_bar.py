"""The progress bar a long run (plugin check, doctor, zoo, coverage) shows in a notebook.

torch_fl.progress decides who shows a run's steps; inside a Jupyter kernel it asks for this bar, which
`torch_fl.notebook` registers on import. The bar moves while the cell runs (widget updates reach the
browser at once), turns red from the first failed step on, and keeps the last step's text, so the cell
still says what happened once the run is over."""

from __future__ import annotations

import html
import time

import ipywidgets as widgets
from IPython.display import display


class ProgressBar:
    """`[=====     ] 12/40 title: last step`; `total` None grows the bar with the steps."""

    def __init__(self, title: str, total: int | None) -> None:
        self.title, self.total = title, total
        self.failures = 0
        self.t0 = time.perf_counter()
        self.bar = widgets.IntProgress(value=0, min=0, max=max(total or 1, 1), bar_style="info")
        self.label = widgets.HTML(f"<b>{html.escape(title)}</b>: starting")
        self.box = widgets.HBox([self.bar, self.label])
        display(self.box)

    def update(self, done: int, text: str, failed: bool = False) -> None:
        self.failures += failed
        if self.total is None and done >= self.bar.max:
            self.bar.max = done + 1
        self.bar.value = min(done, self.bar.max)
        if self.failures:
            self.bar.bar_style = "danger"
        count = f"{done}/{self.total}" if self.total else str(done)
        failed_note = f", {self.failures} failed" if self.failures else ""
        self.label.value = f"<b>{html.escape(self.title)}</b> [{count}{failed_note}]: {html.escape(text)}"

    def close(self) -> None:
        if self.total is None:
            self.bar.max = max(self.bar.value, 1)
            self.bar.value = self.bar.max
        if not self.failures:
            self.bar.bar_style = "success"
        self.label.value += f" &mdash; {time.perf_counter() - self.t0:.0f} s"
