"""Figures of a scaling study: throughput against nodes with the ideal line (the paper's Figures 1/5),
CV of iteration time against nodes, and a per-rank timeline of a few steps of one run (Figure 2).

Written as one self-contained HTML file (plotly.js embedded, works offline); PNGs too when kaleido is
installed (it is optional).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import plotly.graph_objects as go

from fabricpace.run.reader import load_run

_MODE_COLORS = {"baseline": "#4C78A8", "paced": "#54A24B"}


def scaling_figure(rows: Sequence[dict[str, Any]]) -> go.Figure:
    fig = go.Figure()
    for mode in dict.fromkeys(r["mode"] for r in rows):
        rs = sorted((r for r in rows if r["mode"] == mode), key=lambda r: r["nodes"])
        err_hi = [(r["throughput_ci"][1] - r["throughput"]) if r["throughput_ci"] else 0 for r in rs]
        err_lo = [(r["throughput"] - r["throughput_ci"][0]) if r["throughput_ci"] else 0 for r in rs]
        fig.add_trace(
            go.Scatter(
                x=[r["nodes"] for r in rs],
                y=[r["throughput"] for r in rs],
                mode="lines+markers",
                name=mode,
                marker_color=_MODE_COLORS.get(mode),
                error_y={"type": "data", "array": err_hi, "arrayminus": err_lo, "visible": True},
            )
        )
    base = sorted((r for r in rows if r["mode"] == rows[0]["mode"]), key=lambda r: r["nodes"])
    if base:
        n0, t0 = base[0]["nodes"], base[0]["throughput"]
        xs = [r["nodes"] for r in base]
        fig.add_trace(
            go.Scatter(
                x=xs,
                y=[t0 * n / n0 for n in xs],
                mode="lines",
                name=f"ideal (linear from {n0} nodes)",
                line={"dash": "dash", "color": "#999"},
            )
        )
    fig.update_layout(
        title={"text": "Throughput against nodes (95% CI over repeats)", "x": 0},
        xaxis_title="nodes",
        yaxis_title="samples/s",
        template="plotly_white",
        height=420,
    )
    return fig


def cv_figure(rows: Sequence[dict[str, Any]]) -> go.Figure:
    fig = go.Figure()
    for mode in dict.fromkeys(r["mode"] for r in rows):
        rs = sorted((r for r in rows if r["mode"] == mode), key=lambda r: r["nodes"])
        fig.add_trace(
            go.Scatter(
                x=[r["nodes"] for r in rs],
                y=[r["cv"] for r in rs],
                mode="lines+markers",
                name=mode,
                marker_color=_MODE_COLORS.get(mode),
            )
        )
    fig.update_layout(
        title={"text": "Coefficient of variation of iteration time", "x": 0},
        xaxis_title="nodes",
        yaxis_title="CV",
        template="plotly_white",
        height=380,
    )
    return fig


def write_study_figures(
    result: dict[str, Any], out_dir: Path, *, timeline_run: str | None = None
) -> list[Path]:
    """Write ``figures.html`` (and PNGs when kaleido is available); returns the files written."""
    from fabricpace.report.timeline import timeline_figure

    rows = result["rows"]
    figs: list[tuple[str, go.Figure]] = [("scaling", scaling_figure(rows)), ("cv", cv_figure(rows))]
    if timeline_run is not None:
        # Three steps mid-run: the run's collectives table can be far larger than memory (one row per
        # rank, bucket and step), so only those steps' rows are read.
        run = load_run(timeline_run, tables=("steps", "ranks"))
        all_steps = sorted(run.steps["step"].unique().to_list())
        mid = all_steps[len(all_steps) // 2] if all_steps else 0
        coll = load_run(timeline_run, tables=("collectives",), step_range=(mid, mid + 2)).collectives
        figs.append(("timeline", timeline_figure(replace(run, collectives=coll), (mid, mid + 2))))
    parts = []
    for i, (_, fig) in enumerate(figs):
        parts.append(fig.to_html(full_html=False, include_plotlyjs=(i == 0)))
    html = (
        "<!doctype html><html><head><meta charset='utf-8'><title>fabricpace study</title></head><body>"
        + "".join(f"<div>{p}</div>" for p in parts)
        + "</body></html>"
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "figures.html"
    tmp = out_dir / ".figures.html.tmp"
    tmp.write_text(html, encoding="utf-8")
    tmp.replace(path)
    written = [path]
    try:
        import kaleido  # noqa: F401
    except ImportError:
        return written
    for name, fig in figs:
        png = out_dir / f"{name}.png"
        try:
            fig.write_image(str(png))
            written.append(png)
        except Exception:  # kaleido present but unusable (no browser): HTML is the deliverable
            break
    return written
