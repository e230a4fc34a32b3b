"""Plotly figures of torch_fl results. Deterministic: the same data gives the
same figure JSON (no random ids, fixed colours, sorted inputs), so nbval can
compare notebook outputs rendered with the `plotly_mimetype` renderer."""

from __future__ import annotations

import plotly.graph_objects as go

PATH_COLORS = {"native": "#2ca02c", "decomposition": "#1f77b4", "jit": "#9467bd", "fallback": "#d62728",
               "view": "#7f7f7f", "copy": "#ff7f0e", "copy-async": "#ffbb78", "copy-wait": "#e377c2",
               "foreach": "#17becf", "alloc": "#bcbd22", "meta": "#c7c7c7", "other": "#8c564b"}
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
    fig = go.Figure(go.Sunburst(ids=ids, labels=labels, parents=parents, values=values, branchvalues="total",
                                marker={"colors": colors}))
    return _layout(fig, "op calls by path")


def time_by_path(profile) -> go.Figure:
    data = profile.time_by_path()
    paths = sorted(data)
    fig = go.Figure(go.Bar(x=paths, y=[data[p] * 1e3 for p in paths],
                           marker_color=[PATH_COLORS.get(p, "#8c564b") for p in paths]))
    fig.update_yaxes(title="self time (ms)")
    return _layout(fig, "time by path")


def comparison_kernels(comparison, top: int = 20) -> go.Figure:
    """Kernel launches per op on the two backends of a Comparison."""
    rows = sorted(comparison.rows(), key=lambda r: (-max(r["kernels"]), r["op"]))[:top]
    a, b = comparison.names
    ops = [r["op"] for r in rows]
    fig = go.Figure([go.Bar(name=a, x=ops, y=[r["kernels"][0] for r in rows], marker_color="#1f77b4"),
                     go.Bar(name=b, x=ops, y=[r["kernels"][1] for r in rows], marker_color="#ff7f0e")])
    fig.update_layout(barmode="group")
    fig.update_yaxes(title="kernel launches")
    return _layout(fig, f"kernels per op: {a} vs {b}")


def alignment_layers(report, mode: int = 0) -> go.Figure:
    """Max relative error of every module's output, in execution order, coloured by verdict."""
    m = report.modes[mode]
    fig = go.Figure(go.Bar(x=[f"{d.module} ({d.kind})" for d in m.forward],
                           y=[max(d.max_rel, 1e-12) for d in m.forward],
                           marker_color=[VERDICT_COLORS[d.verdict] for d in m.forward]))
    fine, suspect = report.tolerances
    fig.add_hline(y=fine, line_dash="dot", line_color="#ff7f0e")
    fig.add_hline(y=suspect, line_dash="dash", line_color="#d62728")
    fig.update_yaxes(type="log", title="max rel error")
    return _layout(fig, f"{report.backend} vs {report.reference} [{m.mode}] per module")


def alignment_losses(report) -> go.Figure:
    t = report.training
    steps = list(range(1, t.steps + 1))
    fig = go.Figure([go.Scatter(x=steps, y=t.losses, name=report.backend, mode="lines+markers"),
                     go.Scatter(x=steps, y=t.reference_losses, name=report.reference, mode="lines+markers",
                                line={"dash": "dash"}),
                     go.Scatter(x=steps, y=t.rel_diff, name="rel diff", yaxis="y2", mode="lines",
                                line={"color": "#d62728"})])
    fig.update_layout(yaxis={"title": "loss"}, yaxis2={"title": "rel diff", "overlaying": "y", "side": "right",
                                                       "type": "log"})
    return _layout(fig, f"training: {report.backend} vs {report.reference}")


FUSION_COLORS = {"unfused": "#7f7f7f", "fused": "#9467bd"}


def fusion_figure(report, metric: str = "kernels") -> go.Figure:
    """Before/after bars per backend and mode from a FusionReport (after
    `compiled.measure`): kernel launches, or time with metric="ms"."""
    graphs = [g for g in report.graphs if g.measurement is not None]
    x = [f"{g.backend} ({g.mode})" for g in graphs]
    if metric == "kernels":
        before = [g.measurement.kernels_before for g in graphs]
        after = [g.measurement.kernels_after for g in graphs]
    else:
        before = [round(g.measurement.seconds_before * 1e3, 3) for g in graphs]
        after = [round(g.measurement.seconds_after * 1e3, 3) for g in graphs]
    fig = go.Figure([go.Bar(name="unfused", x=x, y=before, marker_color=FUSION_COLORS["unfused"]),
                     go.Bar(name="fused", x=x, y=after, marker_color=FUSION_COLORS["fused"])])
    fig.update_layout(barmode="group", yaxis_title="kernel launches" if metric == "kernels" else "ms per call")
    return _layout(fig, "fusion: " + ("kernel launches" if metric == "kernels" else "time") + " before vs after")


def fusion_patterns(report) -> go.Figure:
    """Kernel launches per pattern before vs after (the latest measured graph)."""
    graph = next((g for g in reversed(report.graphs) if g.measurement is not None), None)
    labels, before, after = [], [], []
    if graph is not None:
        for i, r in enumerate(graph.records):
            cost = graph.measurement.per_pattern.get(i)
            if cost is not None:
                labels.append(f"{r.path} [{r.pattern}]")
                before.append(cost.kernels_before)
                after.append(cost.kernels_after)
    fig = go.Figure([go.Bar(name="unfused", y=labels, x=before, orientation="h",
                            marker_color=FUSION_COLORS["unfused"]),
                     go.Bar(name="fused", y=labels, x=after, orientation="h", marker_color=FUSION_COLORS["fused"])])
    fig.update_layout(barmode="group", xaxis_title="kernel launches", height=max(300, 22 * len(labels) + 120))
    title = f"kernels per fused pattern ({graph.backend}, {graph.mode})" if graph else "no measured graph"
    fig.update_layout(title=title, template="plotly_white")
    return fig
