"""Plotly figures of torch_fl results. Deterministic: the same data gives the
same figure JSON (no random ids, fixed colours, sorted inputs), so nbval can
compare notebook outputs rendered with the `plotly_mimetype` renderer."""

from __future__ import annotations

import plotly.graph_objects as go

PATH_COLORS = {
    "native": "#2ca02c",
    "decomposition": "#1f77b4",
    "jit": "#9467bd",
    "fallback": "#d62728",
    "view": "#7f7f7f",
    "copy": "#ff7f0e",
    "copy-async": "#ffbb78",
    "copy-wait": "#e377c2",
    "foreach": "#17becf",
    "alloc": "#bcbd22",
    "meta": "#c7c7c7",
    "other": "#8c564b",
}
VERDICT_COLORS = {"ok": "#2ca02c", "check": "#ff7f0e", "suspect": "#d62728"}


def _layout(fig: go.Figure, title: str) -> go.Figure:
    fig.update_layout(title=title, template="plotly_white", height=420, margin={"l": 40, "r": 20, "t": 50, "b": 40})
    return fig


def fallback_paths(profile, top: int = 30) -> go.Figure:
    """Sunburst: path -> op, sized by calls, for the ops a profile saw (depth-0 and nested)."""
    ops = sorted(profile.ops(), key=lambda s: (-sum(s.paths.values()), s.op))[:top]
    ids, labels, parents, values, colors = [], [], [], [], []
    totals: dict[str, int] = {}
    for s in ops:
        for path, n in s.paths.items():
            totals[path] = totals.get(path, 0) + n
    for path in sorted(totals):
        ids.append(path)
        labels.append(path)
        parents.append("")
        values.append(totals[path])
        colors.append(PATH_COLORS.get(path, "#8c564b"))
    for s in ops:
        for path, n in sorted(s.paths.items()):
            ids.append(f"{path}/{s.op}")
            labels.append(f"{s.op} ({s.kernels} kernels)" if path in ("native", "decomposition") else s.op)
            parents.append(path)
            values.append(n)
            colors.append(PATH_COLORS.get(path, "#8c564b"))
    fig = go.Figure(
        go.Sunburst(
            ids=ids, labels=labels, parents=parents, values=values, branchvalues="total", marker={"colors": colors}
        )
    )
    return _layout(fig, "op calls by path")


def time_by_path(profile) -> go.Figure:
    data = profile.time_by_path()
    paths = sorted(data)
    fig = go.Figure(
        go.Bar(x=paths, y=[data[p] * 1e3 for p in paths], marker_color=[PATH_COLORS.get(p, "#8c564b") for p in paths])
    )
    fig.update_yaxes(title="self time (ms)")
    return _layout(fig, "time by path")


def comparison_kernels(comparison, top: int = 20) -> go.Figure:
    """Kernel launches per op on the two backends of a Comparison."""
    rows = sorted(comparison.rows(), key=lambda r: (-max(r["kernels"]), r["op"]))[:top]
    a, b = comparison.names
    ops = [r["op"] for r in rows]
    fig = go.Figure(
        [
            go.Bar(name=a, x=ops, y=[r["kernels"][0] for r in rows], marker_color="#1f77b4"),
            go.Bar(name=b, x=ops, y=[r["kernels"][1] for r in rows], marker_color="#ff7f0e"),
        ]
    )
    fig.update_layout(barmode="group")
    fig.update_yaxes(title="kernel launches")
    return _layout(fig, f"kernels per op: {a} vs {b}")


def alignment_layers(report, mode: int = 0) -> go.Figure:
    """Max relative error of every module's output, in execution order, coloured by verdict."""
    m = report.modes[mode]
    fig = go.Figure(
        go.Bar(
            x=[f"{d.module} ({d.kind})" for d in m.forward],
            y=[max(d.max_rel, 1e-12) for d in m.forward],
            marker_color=[VERDICT_COLORS[d.verdict] for d in m.forward],
        )
    )
    fine, suspect = report.tolerances
    fig.add_hline(y=fine, line_dash="dot", line_color="#ff7f0e")
    fig.add_hline(y=suspect, line_dash="dash", line_color="#d62728")
    fig.update_yaxes(type="log", title="max rel error")
    return _layout(fig, f"{report.backend} vs {report.reference} [{m.mode}] per module")


ERROR_FLOOR = 1e-9  # an error below this (an exact match) is drawn at it: a log axis has no 0


def alignment_losses(report) -> go.Figure:
    """Both loss curves, and on a log axis each one's error against the float64 run, relative to the float64
    loss's scale over the run (the alignment's own yardstick; the step-by-step relative difference spiked
    wherever a loss crossed 0, and its zeros broke the log line apart)."""
    t = report.training
    steps = list(range(1, t.steps + 1))
    traces = [
        go.Scatter(x=steps, y=t.losses, name=report.backend, mode="lines+markers"),
        go.Scatter(x=steps, y=t.reference_losses, name=report.reference, mode="lines+markers", line={"dash": "dash"}),
    ]
    if t.float64_losses:
        scale = max(max(abs(v) for v in t.float64_losses), 1e-30)

        def err(curve):
            return [max(abs(a - b) / scale, ERROR_FLOOR) for a, b in zip(curve, t.float64_losses, strict=True)]

        traces += [
            go.Scatter(
                x=steps,
                y=err(t.losses),
                name=f"{report.backend} error vs float64",
                yaxis="y2",
                mode="lines",
                line={"color": "#d62728"},
            ),
            go.Scatter(
                x=steps,
                y=err(t.reference_losses),
                name=f"{report.reference} error vs float64",
                yaxis="y2",
                mode="lines",
                line={"color": "#d62728", "dash": "dot"},
            ),
        ]
    fig = go.Figure(traces)
    fig.update_layout(
        yaxis={"title": "loss"},
        yaxis2={
            "title": "error vs float64",
            "overlaying": "y",
            "side": "right",
            "type": "log",
            "exponentformat": "power",
            "rangemode": "tozero",
        },
    )
    return _layout(fig, f"training: {report.backend} vs {report.reference}")


FUSION_COLORS = {"unfused": "#7f7f7f", "fused": "#9467bd"}


def fusion_figure(report, metric: str = "kernels") -> go.Figure:
    """Eager vs compiled bars per backend from a FusionReport's measurements
    (`fl.measure_compiled`): kernel launches, or time with metric="ms"."""
    ms = report.measurements
    x = [f"{m.backend} ({m.workload})" for m in ms]
    if metric == "kernels":
        before, after = [m.kernels_before for m in ms], [m.kernels_after for m in ms]
    else:
        before = [round(m.seconds_before * 1e3, 3) for m in ms]
        after = [round(m.seconds_after * 1e3, 3) for m in ms]
    fig = go.Figure(
        [
            go.Bar(name="eager", x=x, y=before, marker_color=FUSION_COLORS["unfused"]),
            go.Bar(name="compiled", x=x, y=after, marker_color=FUSION_COLORS["fused"]),
        ]
    )
    fig.update_layout(barmode="group", yaxis_title="kernel launches" if metric == "kernels" else "ms per call")
    return _layout(
        fig, "backend='fl': " + ("kernel launches" if metric == "kernels" else "time") + " eager vs compiled"
    )


def fusion_patterns(report) -> go.Figure:
    """Patterns fused, by kind, split by the graph they were fused in (captured,
    forward, backward, inference), from a FusionReport."""
    kinds = ("captured", "forward", "backward", "inference")
    counts: dict[str, dict[str, int]] = {}
    for row in report.rows():
        if row["applied"]:
            per = counts.setdefault(row["pattern"], dict.fromkeys(kinds, 0))
            per[row["graph"]] = per.get(row["graph"], 0) + 1
    labels = sorted(counts)
    fig = go.Figure(
        [
            go.Bar(name=k, y=labels, x=[counts[p].get(k, 0) for p in labels], orientation="h")
            for k in kinds
            if any(counts[p].get(k, 0) for p in labels)
        ]
    )
    fig.update_layout(
        barmode="stack",
        xaxis_title="patterns fused",
        height=max(300, 28 * len(labels) + 120),
        title="fused patterns by graph" if labels else "no pattern fused",
        template="plotly_white",
    )
    return fig
