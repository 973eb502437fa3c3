"""The picture of ``fabricpace collective --plot``: bus bandwidth against message size, one line per node
count, as nccl-tests users read their results — with the measured rows of the calibration logs drawn
over the model's lines, so where the fit holds and where it does not is visible at a glance.

One self-contained HTML file (plotly.js embedded, works offline), published without overwriting.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import plotly.graph_objects as go

from fabricpace.report.output import publish

# Colour-blind-safe qualitative palette (Okabe & Ito), one colour per node count.
_PALETTE = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000")


def _size_label(n: float) -> str:
    for unit, div in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= div:
            return f"{n / div:g}{unit}"
    return f"{n:g}"


def busbw_figure(
    predicted: Sequence[dict[str, Any]], measured: Sequence[dict[str, Any]], *, title: str
) -> go.Figure:
    """``predicted``: rows of ``collective`` (nodes, bytes, busbw_gbps, algorithm, protocol);
    ``measured``: rows with nodes, bytes, busbw_gbps, the log's file name (``source``) and whether the
    model was fitted to it (``fitted``: circles) or not (``--compare`` logs: diamonds)."""
    fig = go.Figure()
    node_counts = sorted({int(r["nodes"]) for r in [*predicted, *measured]})
    colour = {n: _PALETTE[i % len(_PALETTE)] for i, n in enumerate(node_counts)}
    for n in node_counts:
        rows = sorted((r for r in predicted if int(r["nodes"]) == n), key=lambda r: r["bytes"])
        if rows:
            fig.add_trace(
                go.Scatter(
                    x=[r["bytes"] for r in rows],
                    y=[r["busbw_gbps"] for r in rows],
                    mode="lines",
                    name=f"{n} nodes, model",
                    line={"color": colour[n]},
                    customdata=[[_size_label(r["bytes"]), r["algorithm"], r["protocol"]] for r in rows],
                    hovertemplate="%{customdata[0]}: %{y:.1f} GB/s (%{customdata[1]}/%{customdata[2]})"
                    "<extra>" + f"{n} nodes, model" + "</extra>",
                )
            )
        for fitted, label, symbol in ((True, "measured, fitted", "circle-open"),
                                      (False, "measured, not fitted", "diamond-open")):
            got = sorted(
                (r for r in measured if int(r["nodes"]) == n and bool(r.get("fitted", True)) == fitted),
                key=lambda r: r["bytes"],
            )
            if not got:
                continue
            fig.add_trace(
                go.Scatter(
                    x=[r["bytes"] for r in got],
                    y=[r["busbw_gbps"] for r in got],
                    mode="markers",
                    name=f"{n} nodes, {label}",
                    marker={"color": colour[n], "symbol": symbol, "size": 9, "line": {"width": 2}},
                    customdata=[[_size_label(r["bytes"]), r["source"]] for r in got],
                    hovertemplate="%{customdata[0]}: %{y:.1f} GB/s<extra>%{customdata[1]}</extra>",
                )
            )
    sizes = sorted({float(r["bytes"]) for r in [*predicted, *measured]})
    fig.update_layout(
        title={"text": title, "x": 0},
        xaxis={
            "title": "message size (nccl-tests 'size')",
            "type": "log",
            "tickvals": sizes,
            "ticktext": [_size_label(s) for s in sizes],
        },
        yaxis={"title": "busbw (GB/s, nccl-tests definition)", "rangemode": "tozero"},
        legend={"orientation": "h", "y": -0.22},
        template="plotly_white",
        height=520,
    )
    return fig


def write_figure(fig: go.Figure, path: Path, *, title: str) -> Path:
    """Write ``fig`` as one offline HTML page at ``path`` (which the caller checked is new)."""
    html = (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title></head><body>"
        + fig.to_html(full_html=False, include_plotlyjs=True)
        + "</body></html>"
    )
    tmp = path.parent / f".{path.name}.tmp"
    tmp.write_text(html, encoding="utf-8")
    publish(tmp, path)
    return path
