"""The one rendering hook every torch_fl report shares: text for a terminal, HTML
for a notebook, and `_repr_mimebundle_` for Jupyter (which asks for the formats it
wants with include/exclude).

A report class defines `render()` (its text) and, if it has a richer view than the
text in a <pre> block, `html()`. This module imports nothing from torch_fl, so every
layer can use it (pyproject.toml's layers contract keeps it at the bottom). Not to be
confused with compile/graph_report.py, which is one such report (fl.fusion_report)."""

from __future__ import annotations

import html as _html
from collections.abc import Collection


class Report:
    """Mixin: `str(report)` is `report.render()`; Jupyter shows `report.html()`."""

    def render(self) -> str:
        raise NotImplementedError(f"{type(self).__name__} must define render()")

    def html(self) -> str:
        """The text in a <pre> block; a report with a table of its own overrides this."""
        return "<pre>" + _html.escape(self.render()) + "</pre>"

    def __str__(self) -> str:
        return self.render()

    def _repr_mimebundle_(
        self, include: Collection[str] | None = None, exclude: Collection[str] | None = None
    ) -> dict[str, str]:
        """Only the formats asked for are rendered: every one unless `include`
        names some, less those in `exclude`."""
        formats = {"text/plain": self.render, "text/html": self.html}
        return {
            mime: make()
            for mime, make in formats.items()
            if (include is None or mime in include) and (exclude is None or mime not in exclude)
        }
