"""The capability explorer: one widget over `fl.capabilities()` and
`fl.path_table()`. Pick a backend; tabs for devices, op paths (searchable,
filterable by path), fused kernels, collectives; a second dropdown compares
two backends op by op. Observers do the work, so tests drive it by setting
widget values (no browser)."""

from __future__ import annotations

import html

import ipywidgets as w

from ..runtime import REGISTRY
from ..tools.coverage import MARKS, path_table

_STYLE = "<style>.flx td,.flx th{padding:2px 8px;text-align:left;font-family:monospace}</style>"


def _table(head: list[str], rows: list[list[str]]) -> str:
    th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f"{_STYLE}<table class='flx'><tr>{th}</tr>{body}</table>"


class CapabilityExplorer:
    def __init__(self, backend: str | None = None, limit: int = 60):
        REGISTRY.discover()
        names = sorted(REGISTRY.backends)
        start = backend or (REGISTRY.current.name if REGISTRY.current else names[0])
        self.limit = limit
        self.backend = w.Dropdown(options=names, value=start, description="backend")
        self.compare_with = w.Dropdown(options=["(none)"] + names, value="(none)", description="compare")
        self.search = w.Text(value="", placeholder="op name contains...", description="search")
        self.path = w.Dropdown(
            options=["any", "native", "decomposition", "jit", "fallback", "none"], value="any", description="path"
        )
        self.summary = w.HTML()
        self.devices = w.HTML()
        self.ops = w.HTML()
        self.fused = w.HTML()
        self.collectives = w.HTML()
        self.comparison = w.HTML()
        self.tabs = w.Tab(
            children=[
                self.devices,
                w.VBox([w.HBox([self.search, self.path]), self.ops]),
                self.fused,
                self.collectives,
                self.comparison,
            ]
        )
        for i, title in enumerate(["devices", "op paths", "fused kernels", "collectives", "compare"]):
            self.tabs.set_title(i, title)
        self.widget = w.VBox([w.HBox([self.backend, self.compare_with]), self.summary, self.tabs])
        self._coverage: dict[str, object] = {}
        self.backend.observe(lambda _: self.refresh(), names="value")
        self.compare_with.observe(lambda _: self._render_compare(), names="value")
        self.search.observe(lambda _: self._render_ops(), names="value")
        self.path.observe(lambda _: self._render_ops(), names="value")
        self.refresh()

    def _cov(self, name: str):
        if name not in self._coverage:
            self._coverage[name] = path_table(name)
        return self._coverage[name]

    def refresh(self) -> None:
        import torch_fl as fl

        caps = fl.capabilities(self.backend.value)
        kind = "EMULATED" if caps.emulated else "real"
        self.summary.value = (
            f"<b>{html.escape(caps.backend)}</b> ({kind}) {html.escape(caps.vendor)} "
            f"{html.escape(caps.version)}: {html.escape(caps.description)}<br>"
            f"{len(caps.kernels)} native kernels; autocast {caps.amp_dtype}; collectives "
            f"{caps.collectives_path}; plugin {html.escape(caps.plugin_path)} "
            f"(ABI v{caps.abi_version})"
        )
        self.devices.value = _table(
            [
                "device",
                "name",
                "memory",
                "dtypes",
                "host-accessible",
                "async copy",
                "async kernels",
                "fp16 stable",
                "units",
            ],
            [
                [
                    f"fl:{d.index}",
                    html.escape(d.name),
                    f"{d.total_memory / 2**30:.1f} GiB",
                    ", ".join(d.dtypes),
                    "yes" if d.host_accessible else "no",
                    "yes" if d.async_copy else "no",
                    "yes" if d.async_kernels else "no",
                    "yes" if d.fp16_stable else "no",
                    str(d.compute_units),
                ]
                for d in caps.devices
            ],
        )
        self.fused.value = (
            _table(
                ["fused kernel", "dtypes"],
                [[html.escape(k), ", ".join(caps.kernels.get(k, []))] for k in caps.fused_kernels],
            )
            if caps.fused_kernels
            else "no fused kernels"
        )
        self.collectives.value = _table(
            ["collective", "in the plugin"],
            [[k, "yes" if v else "no (CPU relay)"] for k, v in sorted(caps.collectives.items())],
        )
        self._render_ops()
        self._render_compare()

    def _render_ops(self) -> None:
        cov = self._cov(self.backend.value)
        path = None if self.path.value == "any" else self.path.value
        rows = cov.filter(self.search.value, path)
        shown = list(rows.items())[: self.limit]
        counts = cov.counts()
        lacking = (
            f"; the device has no {html.escape(', '.join(cov.host_dtypes))}: those run on the CPU (F)"
            if cov.host_dtypes
            else ""
        )
        head = (
            f"{len(rows)} of {len(cov.rows)} ops; N native {counts.get('native', 0)}, D decomposition "
            f"{counts.get('decomposition', 0)}, J jit {counts.get('jit', 0)}, F fallback "
            f"{counts.get('fallback', 0)}, . not defined by PyTorch for the dtype {counts.get('undefined', 0)} "
            f"(op x dtype){lacking}<br>"
        )
        self.ops.value = head + _table(
            ["op"] + list(cov.dtypes),
            [[html.escape(op)] + [MARKS.get(r[d], "?") for d in cov.dtypes] for op, r in shown],
        )

    def _render_compare(self) -> None:
        other = self.compare_with.value
        if other == "(none)":
            self.comparison.value = "pick a backend to compare with"
            return
        a, b = self._cov(self.backend.value), self._cov(other)
        diff = [
            [
                html.escape(op),
                MARKS.get(a.rows[op].get("float32", "none"), "?"),
                MARKS.get(b.rows.get(op, {}).get("float32", "none"), "?"),
            ]
            for op in a.rows
            if a.rows[op].get("float32") != b.rows.get(op, {}).get("float32")
        ]
        self.comparison.value = (
            f"{len(diff)} ops take a different float32 path on {html.escape(a.backend)} and "
            f"{html.escape(b.backend)}<br>" + _table(["op", a.backend, b.backend], diff[: self.limit])
        )

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget)
