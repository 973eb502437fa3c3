"""Figures of a scaling study: throughput against nodes with the ideal line (the paper's Figures 1/5),
CV of iteration time against nodes, and a per-rank timeline of a few steps of one run (Figure 2).

Written as one self-contained HTML file (plotly.js embedded, works offline); PNGs too when kaleido is
installed (it is optional).
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import plotly.graph_objects as go

from fabricpace.run.reader import load_run

_MODE_COLORS = {"baseline": "#4C78A8", "paced": "#E8700A"}
# Paced drawn over baseline in the same style hid baseline whenever they were equal (the whole paper
# study): baseline is a thick solid line with large open circles, paced a thinner dotted line with
# small filled diamonds in a contrasting colour, so both show where they coincide.
_MODE_STYLES: dict[str, dict[str, Any]] = {
    "baseline": {
        "line": {"dash": "solid", "width": 6},
        "marker": {"symbol": "circle-open", "size": 15},
        "error": {"thickness": 5, "width": 10},
    },
    "paced": {
        "line": {"dash": "dot", "width": 2.5},
        "marker": {"symbol": "diamond", "size": 8},
        "error": {"thickness": 1.5, "width": 5},
    },
}
_OTHER_STYLE: dict[str, Any] = {
    "line": {"dash": "dashdot", "width": 2},
    "marker": {"symbol": "square", "size": 8},
    "error": {"thickness": 1.5, "width": 5},
}


def _style(mode: str) -> dict[str, Any]:
    st = _MODE_STYLES.get(mode, _OTHER_STYLE)
    c = {"color": _MODE_COLORS[mode]} if mode in _MODE_COLORS else {}
    return {
        "line": {**st["line"], **c},
        "marker": {**st["marker"], **c, "line": {**c, "width": 2}},
        "error": {**st["error"], **c},
    }


def _repeats(rows: Sequence[dict[str, Any]]) -> int:
    return max((int(r.get("repeats") or 1) for r in rows), default=1)


def _ci_title(rows: Sequence[dict[str, Any]]) -> str:
    """A title never promises a CI that is not drawn: one repeat has none."""
    n = _repeats(rows)
    return "(1 repeat: no CI)" if n < 2 else f"(95% CI over {n} repeats)"


def _nodes_axis(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Log-scaled node axis with a tick at each of the study's node counts (and nowhere else).

    A linear axis put ticks at 4.5, 5.5, ... nodes; node counts usually double, so log spacing keeps
    them evenly apart."""
    nodes = sorted({int(r["nodes"]) for r in rows})
    return {
        "title": {"text": "nodes (log scale)"},
        "type": "log",
        "tickmode": "array",
        "tickvals": nodes,
        "ticktext": [str(n) for n in nodes],
        "minor": {"showgrid": False},
    }


def _error_bars(rs: Sequence[dict[str, Any]], value: str, ci: str) -> dict[str, Any] | None:
    if not any(r.get(ci) for r in rs):
        return None  # no CI anywhere: no zero-length bars that look like a measured one
    hi = [(r[ci][1] - r[value]) if r.get(ci) else 0 for r in rs]
    lo = [(r[value] - r[ci][0]) if r.get(ci) else 0 for r in rs]
    return {"type": "data", "array": hi, "arrayminus": lo, "visible": True}


def _mode_trace(rs: Sequence[dict[str, Any]], mode: str, value: str, ci: str) -> go.Scatter:
    style = _style(mode)
    err = _error_bars(rs, value, ci)
    return go.Scatter(
        x=[r["nodes"] for r in rs],
        y=[r[value] for r in rs],
        mode="lines+markers",
        name=mode,
        line=style["line"],
        marker=style["marker"],
        **({"error_y": {**err, **style["error"]}} if err else {}),
    )


def _by_mode(rows: Sequence[dict[str, Any]]) -> list[tuple[str, list[dict[str, Any]]]]:
    return [
        (mode, sorted((r for r in rows if r["mode"] == mode), key=lambda r: r["nodes"]))
        for mode in dict.fromkeys(r["mode"] for r in rows)
    ]


def scaling_figure(rows: Sequence[dict[str, Any]]) -> go.Figure:
    fig = go.Figure()
    for mode, rs in _by_mode(rows):
        fig.add_trace(_mode_trace(rs, mode, "throughput", "throughput_ci"))
    base = sorted((r for r in rows if r["mode"] == rows[0]["mode"]), key=lambda r: r["nodes"]) if rows else []
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
        title={"text": f"Throughput against nodes {_ci_title(rows)}", "x": 0},
        xaxis=_nodes_axis(rows),
        yaxis_title="samples/s",
        template="plotly_white",
        height=420,
    )
    return fig


def cv_figure(rows: Sequence[dict[str, Any]]) -> go.Figure:
    """CV against nodes with the CV's CI as error bars; the y axis starts at 0 (from 0.009 it made a
    step from 0.0093 to 0.0122 look steep, inside a CI three times wider than the difference)."""
    fig = go.Figure()
    for mode, rs in _by_mode(rows):
        fig.add_trace(_mode_trace(rs, mode, "cv", "cv_ci"))
    fig.update_layout(
        title={"text": f"Coefficient of variation of iteration time {_ci_title(rows)}", "x": 0},
        xaxis=_nodes_axis(rows),
        yaxis={"title": {"text": "CV"}, "rangemode": "tozero"},
        template="plotly_white",
        height=380,
    )
    return fig


def timeline_point(points: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The run the timeline shows: repeat 0 at the largest node count, baseline when there is one."""
    if not points:
        return None
    top = max(p["nodes"] for p in points)
    cands = [p for p in points if p["nodes"] == top and p["repeat"] == 0] or [
        p for p in points if p["nodes"] == top
    ]
    return min(cands, key=lambda p: (p["mode"] != "baseline", p["repeat"]))


def _point_name(p: dict[str, Any]) -> str:
    return f"{p['nodes']}-node {p['mode']} run, repeat {int(p['repeat']) + 1} (seed {p['seed']})"


def _plan_items(plan: dict[str, Any], rows: Sequence[dict[str, Any]]) -> list[tuple[str, str]]:
    steps, warm = plan.get("steps"), plan.get("warmup")
    repeats, seed = int(plan.get("repeats") or 1), plan.get("seed")
    seeds = f"seed {seed}"
    if repeats > 1 and isinstance(seed, int):
        seeds = f"seeds {seed}–{seed + repeats - 1}"
    no_ci = "; one repeat: no CI" if repeats < 2 else ""
    items = [
        ("scenario", str(plan.get("scenario") or "—")),
        ("backend", str(plan.get("backend"))),
        ("node counts", ", ".join(str(n) for n in plan.get("nodes") or [])),
        ("modes", ", ".join(plan.get("modes") or [])),
        ("steps per run", f"{steps}, of which the first {warm} (warm-up) are left out of every row"),
        ("repeats", f"{repeats} ({seeds}, the same in every mode){no_ci}"),
    ]
    for key in ("cluster", "workload", "noise"):
        if plan.get(key):
            items.append((key, str(plan[key])))
    if plan.get("backend") == "sim":
        items.append(("node order", str(plan.get("node_order"))))
    return items


def _header_html(result: dict[str, Any], timeline: str | None) -> str:
    from fabricpace.study.table import table_cells, table_columns, table_notes

    plan, rows = result.get("plan") or {}, result["rows"]
    esc = html.escape
    dl = "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in _plan_items(plan, rows))
    cols = table_columns(rows, decisions=True)
    head = "".join(f"<th>{esc(c)}</th>" for c in cols)
    body = "".join(
        "<tr>"
        + "".join(
            f"<td class='{'l' if c == 'mode' else 'r'}'>{esc(v)}</td>"
            for c, v in zip(cols, cells, strict=True)
        )
        + "</tr>"
        for cells in table_cells(rows, decisions=True)
    )
    notes = "".join(f"<li>{esc(n)}</li>" for n in table_notes(rows))
    shown = f"<p>The timeline below shows the {esc(timeline)}.</p>" if timeline else ""
    return (
        "<style>body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse;margin:.5em 0}"
        "th,td{padding:2px 10px;border-bottom:1px solid #ddd}th{text-align:left}td.r{text-align:right}"
        ".plan th{font-weight:normal;color:#555}</style>"
        "<h1>fabricpace study</h1>"
        f"<table class='plan'>{dl}</table>"
        f"<h2>Table 1</h2><table><tr>{head}</tr>{body}</table>"
        + (f"<ul>{notes}</ul>" if notes else "")
        + shown
    )


def write_study_figures(
    result: dict[str, Any], out_dir: Path, *, timeline_run: str | None = None
) -> list[Path]:
    """Write ``figures.html`` (and PNGs when kaleido is available); returns the files written.

    The page starts with the plan and the study table; ``timeline_run`` (a run directory of the study,
    see ``timeline_point``) gets a per-rank timeline whose title names the run."""
    from fabricpace.report.timeline import timeline_figure

    rows = result["rows"]
    figs: list[tuple[str, go.Figure]] = [("scaling", scaling_figure(rows)), ("cv", cv_figure(rows))]
    name = None
    if timeline_run is not None:
        point = next((p for p in result.get("points") or [] if p.get("run_dir") == str(timeline_run)), None)
        name = _point_name(point) if point else f"run {timeline_run}"
        # Three steps mid-run: the run's collectives table can be far larger than memory (one row per
        # rank, bucket and step), so only those steps' rows are read.
        run = load_run(timeline_run, tables=("steps", "ranks"))
        all_steps = sorted(run.steps["step"].unique().to_list())
        mid = all_steps[len(all_steps) // 2] if all_steps else 0
        coll = load_run(timeline_run, tables=("collectives",), step_range=(mid, mid + 2)).collectives
        fig = timeline_figure(replace(run, collectives=coll), (mid, mid + 2))
        shown = len(fig.layout.yaxis.categoryarray or ())
        of = f" ({shown} of {run.world_size} ranks)" if 0 < shown < run.world_size else ""
        fig.update_layout(
            title={"text": f"Per-rank timeline of the {name}, steps {mid}–{mid + 2}{of}", "x": 0}
        )
        figs.append(("timeline", fig))
    parts = []
    for i, (_, fig) in enumerate(figs):
        parts.append(fig.to_html(full_html=False, include_plotlyjs=(i == 0)))
    page = (
        "<!doctype html><html><head><meta charset='utf-8'><title>fabricpace study</title></head><body>"
        + _header_html(result, name)
        + "".join(f"<div>{p}</div>" for p in parts)
        + "</body></html>"
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "figures.html"
    tmp = out_dir / ".figures.html.tmp"
    tmp.write_text(page, encoding="utf-8")
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
