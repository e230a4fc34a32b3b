"""The live view of `fl.watch`: a widget that redraws as each training step ends.

It renders what the Watch records (torch_fl/tools/stepwatch.py) and nothing else: a
head line with the last step's figures, the loss as an inline SVG line (no
plotting round trip per step), a per-step table of the last steps, and the
ops that took each path in the last step, CPU fallbacks first. Widget updates
reach the browser while the cell is still running, so the view moves with the
loop."""

from __future__ import annotations

import html
from collections.abc import Sequence

import ipywidgets as widgets

from ..tools.stepwatch import StepRecord, Watch, human_bytes

ROWS = 8  # steps in the table


def loss_svg(losses: Sequence[float | None], width: int = 360, height: int = 60) -> str:
    """The loss curve as an SVG polyline scaled to its own range (empty without two finite points)."""
    points = [(i, v) for i, v in enumerate(losses) if v is not None and v == v and abs(v) != float("inf")]
    if len(points) < 2:
        return ""
    lo, hi = min(v for _, v in points), max(v for _, v in points)
    span = (hi - lo) or 1.0
    n = max(i for i, _ in points) or 1
    xy = " ".join(f"{i / n * (width - 4) + 2:.1f},{(hi - v) / span * (height - 4) + 2:.1f}" for i, v in points)
    return (
        f'<svg width="{width}" height="{height}" style="border:1px solid #ddd">'
        f'<polyline fill="none" stroke="#1f77b4" stroke-width="1.5" points="{xy}"/></svg>'
        f'<div style="font-size:smaller">loss {lo:.4g} .. {hi:.4g}</div>'
    )


class WatchView:
    """`display(WatchView(watch))`: redraws after every step of the watch."""

    def __init__(self, watch: Watch) -> None:
        self.watch = watch
        self.head = widgets.HTML()
        self.curve = widgets.HTML()
        self.table = widgets.HTML()
        self.paths = widgets.HTML()
        self.box = widgets.VBox([self.head, self.curve, self.table, self.paths])
        watch.listeners.append(self.update)
        self.update(None)

    def update(self, _step: StepRecord | None) -> None:
        w = self.watch
        if not w.steps:
            self.head.value = f"<b>fl.watch on {html.escape(w.backend)}</b>: waiting for the first step"
            return
        last = w.steps[-1]
        loss = f"{last.loss:.5g}" if last.loss is not None else "-"
        fallbacks = sum(last.fallback_ops.values())
        copied, held = human_bytes(last.copied_bytes), human_bytes(last.allocated)
        self.head.value = (
            f"<b>fl.watch on {html.escape(w.backend)}</b>: step {last.step}, loss {loss}, "
            f"{last.kernels} kernels, {fallbacks} CPU fallbacks, {copied} copied, "
            f"{held} on the device, {last.seconds * 1e3:.1f} ms"
        )
        self.curve.value = loss_svg([s.loss for s in w.steps])
        rows = "".join(
            f"<tr><td>{s.step}</td><td>{s.loss if s.loss is None else f'{s.loss:.5g}'}</td>"
            f"<td>{s.seconds * 1e3:.1f}</td><td>{s.kernels}</td><td>{sum(s.fallback_ops.values())}</td>"
            f"<td>{human_bytes(s.copied_bytes)}</td><td>{human_bytes(s.allocated)}</td></tr>"
            for s in w.steps[-ROWS:]
        )
        self.table.value = (
            "<table><tr><th>step</th><th>loss</th><th>ms</th><th>kernels</th><th>fallbacks</th>"
            f"<th>copied</th><th>allocated</th></tr>{rows}</table>"
        )
        by_path = ", ".join(f"{html.escape(p)} {k}" for p, k in sorted(last.paths.items()))
        fell = ", ".join(f"{html.escape(op)} x{k}" for op, k in sorted(last.fallback_ops.items()))
        self.paths.value = f"op calls by path: {by_path}" + (f"<br>on the CPU fallback: {fell}" if fell else "")

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.box)
