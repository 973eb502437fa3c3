"""Plotly figures of the HTML report: heatmap, skew distribution, last arrivers, breakdown, scaling, timeline.

Every figure is built from pre-aggregated numpy arrays (histograms are binned here, heatmaps binned in
``data``), so a report of 1,024 ranks × 2,000 steps stays a few MB and opens fast.
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
import polars as pl

from fabricpace.report import data as rd
from fabricpace.run.reader import RunData

COLORS = {
    "compute": "#4C78A8",
    "skew_wait": "#E45756",
    "transfer": "#F58518",
    "data": "#72B7B2",
    "gc": "#B279A2",
    "paced": "#54A24B",
    "other": "#BAB0AC",
}
LABELS = {
    "compute": "compute",
    "skew_wait": "wait for peers (skew)",
    "transfer": "transfer (exposed comm)",
    "data": "data",
    "gc": "gc",
    "paced": "paced",
    "other": "other",
}


def _layout(fig: go.Figure, title: str, *, height: int = 420) -> go.Figure:
    fig.update_layout(
        title={"text": title, "x": 0.0, "xanchor": "left"},
        height=height,
        margin={"l": 70, "r": 30, "t": 60, "b": 50},
        template="plotly_white",
        legend={"orientation": "h", "y": -0.18},
    )
    return fig


def heatmap(run: RunData, waits: pl.DataFrame | None = None) -> go.Figure:
    """Rank × step heatmap of step time, with buttons for own compute and wait for peers."""
    ranks, cols, mats, per_col = rd.heatmap_matrices(run, waits=waits)
    binned = f" (mean of {per_col} steps per column)" if per_col > 1 else ""
    fig = go.Figure()
    keys = list(mats)
    for i, key in enumerate(keys):
        label = rd.HEATMAP_VALUES[key]
        fig.add_trace(go.Heatmap(
            z=mats[key], x=cols, y=ranks, colorscale="Viridis", visible=i == 0, name=label,
            colorbar={"title": {"text": "ms"}},
            hovertemplate=f"rank %{{y}}<br>step %{{x}}<br>{label} %{{z:.2f}} ms<extra></extra>",
        ))
    if len(keys) > 1:
        buttons = [{"label": rd.HEATMAP_VALUES[k], "method": "update",
                    "args": [{"visible": [j == i for j in range(len(keys))]}]} for i, k in enumerate(keys)]
        fig.update_layout(updatemenus=[{"buttons": buttons, "direction": "right", "type": "buttons",
                                        "x": 1.0, "xanchor": "right", "y": 1.13, "yanchor": "top"}])
    fig.update_xaxes(title_text="step")
    fig.update_yaxes(title_text="rank", autorange="reversed")
    height = int(min(900, max(320, 14 * len(ranks) + 140)))
    hint = " — buttons: own compute, wait for peers" if len(keys) > 1 else ""
    return _layout(fig, f"Per-rank step time (rank × step){binned}{hint}", height=height)


def skew_distribution(inst: pl.DataFrame) -> go.Figure:
    skew = inst["skew_ns"].to_numpy().astype(np.float64) / rd.MS
    fig = go.Figure()
    if len(skew):
        counts, edges = np.histogram(skew, bins=min(60, max(10, int(np.sqrt(len(skew))))))
        mids = (edges[:-1] + edges[1:]) / 2
        fig.add_bar(x=mids, y=counts, width=np.diff(edges), marker_color=COLORS["skew_wait"],
                    hovertemplate="%{x:.3f} ms: %{y} instances<extra></extra>", name="instances")
        for q, dash in ((50, "dot"), (95, "dash")):
            v = float(np.percentile(skew, q))
            fig.add_vline(x=v, line_dash=dash, line_color="#333",
                          annotation_text=f"p{q} {v:.2f} ms", annotation_position="top right")
    fig.update_xaxes(title_text="arrival skew per collective instance (last − first arrival), ms")
    fig.update_yaxes(title_text="instances")
    return _layout(fig, f"Arrival skew distribution ({len(skew)} collective instances)")


def last_arrivers(share: pl.DataFrame) -> go.Figure:
    n = max(share.height, 1)
    fig = go.Figure(
        go.Bar(x=share["rank"].to_numpy(), y=share["share"].to_numpy(), marker_color=COLORS["skew_wait"],
               customdata=share["count"].to_numpy(),
               hovertemplate="rank %{x}: last in %{customdata} instances (%{y:.1%})<extra></extra>")
    )
    fig.add_hline(y=1.0 / n, line_dash="dash", line_color="#333",
                  annotation_text=f"1/N = {1.0 / n:.1%} (no persistent straggler)")
    fig.update_xaxes(title_text="rank", type="category" if n <= 64 else "linear")
    top = float(share["share"].to_numpy().max()) if share.height else 0.0
    fig.update_yaxes(title_text="share of instances where the rank arrived last",
                     tickformat=".0%" if top >= 0.1 else ".1%")
    return _layout(fig, "Last-arriver share by rank")


def breakdown_bars(b: pl.DataFrame) -> go.Figure:
    fig = go.Figure()
    if b.height:
        for part in COLORS:
            if part in b.columns and float(b[part].sum()) > 0:
                fig.add_bar(x=b["rank"].to_numpy(), y=b[part].to_numpy(), name=LABELS[part],
                            marker_color=COLORS[part],
                            hovertemplate=f"rank %{{x}}: {LABELS[part]} %{{y:.2f}} ms<extra></extra>")
    fig.update_layout(barmode="stack")
    fig.update_xaxes(title_text="rank", type="category" if b.height <= 64 else "linear")
    fig.update_yaxes(title_text="mean per step, ms")
    return _layout(fig, "Where each rank's step goes: compute, waiting for peers, transfer")


def scaling(rows: pl.DataFrame) -> go.Figure:
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=("Step time and efficiency", "Where the step goes"),
                        specs=[[{"secondary_y": True}, {}]])
    x = rows["world_size"].to_numpy()
    fig.add_scatter(x=x, y=rows["step_ms"].to_numpy(), mode="lines+markers", name="median step (ms)",
                    row=1, col=1, secondary_y=False, line_color=COLORS["compute"])
    fig.add_scatter(x=x, y=rows["efficiency"].to_numpy(), mode="lines+markers", name="efficiency",
                    row=1, col=1, secondary_y=True, line_color=COLORS["paced"], line_dash="dash")
    for part in ("compute", "skew_wait", "transfer"):
        col = f"{part}_ms"
        if col in rows.columns:
            fig.add_bar(x=[str(v) for v in x], y=rows[col].to_numpy(), name=LABELS[part],
                        marker_color=COLORS[part], row=1, col=2)
    fig.update_layout(barmode="stack")
    fig.update_xaxes(title_text="ranks (N)", row=1, col=1)
    fig.update_xaxes(title_text="ranks (N)", row=1, col=2)
    fig.update_yaxes(title_text="median step, ms", rangemode="tozero", row=1, col=1, secondary_y=False)
    top = max(1.05, float(np.nanmax(rows["efficiency"].to_numpy())) * 1.05)
    fig.update_yaxes(title_text="efficiency vs smallest run", tickformat=".0%", range=[0, top], row=1, col=1,
                     secondary_y=True)
    fig.update_yaxes(title_text="mean per rank-step, ms", row=1, col=2)
    return _layout(fig, "Scaling across runs", height=460)


def timeline(run: RunData, steps: tuple[int, int], *, max_ranks: int = 48) -> go.Figure:
    """Per-rank timeline of the chosen steps (the paper's Figure 2): step, waiting for peers, transfer."""
    lo, hi = steps
    s = run.steps.filter(pl.col("step").is_between(lo, hi))
    c = run.collectives.filter(pl.col("step").is_between(lo, hi))
    ranks = sorted(s["rank"].unique().to_list())
    if len(ranks) > max_ranks:  # keep the slowest ranks of the window and an even sample of the rest
        slow = (s.with_columns((pl.col("t_end_ns") - pl.col("t_start_ns")).alias("d"))
                .group_by("rank").agg(pl.col("compute_ns").sum()).sort("compute_ns", descending=True))
        keep = set(slow["rank"].head(max_ranks // 2).to_list())
        keep |= set(ranks[:: max(1, len(ranks) // (max_ranks - len(keep)))])
        ranks = sorted(keep)[:max_ranks]
        s = s.filter(pl.col("rank").is_in(ranks))
        c = c.filter(pl.col("rank").is_in(ranks))
    t0 = float(s["t_start_ns"].to_numpy().min()) if s.height else 0.0
    fig = go.Figure()
    y = [f"rank {r}" for r in s["rank"].to_list()]
    fig.add_bar(y=y, x=((s["t_end_ns"] - s["t_start_ns"]).to_numpy() / rd.MS),
                base=(s["t_start_ns"].to_numpy() - t0) / rd.MS, orientation="h", name="step",
                marker_color=COLORS["compute"], opacity=0.35,
                customdata=s["step"].to_numpy(), hovertemplate="step %{customdata}<extra>%{y}</extra>")
    if c.height:
        last = c.with_columns(pl.col("t_enter_ns").max().over(["group", "seq"]).alias("last"),
                              pl.col("t_exit_ns").min().over(["group", "seq"]).alias("first_exit"))
        yc = [f"rank {r}" for r in last["rank"].to_list()]
        enter = last["t_enter_ns"].to_numpy().astype(np.float64)
        lst = last["last"].to_numpy().astype(np.float64)
        ext = last["t_exit_ns"].to_numpy().astype(np.float64)
        fig.add_bar(y=yc, x=(lst - enter) / rd.MS, base=(enter - t0) / rd.MS, orientation="h",
                    name=LABELS["skew_wait"], marker_color=COLORS["skew_wait"],
                    hovertemplate="waited %{x:.2f} ms<extra>%{y}</extra>")
        fig.add_bar(y=yc, x=(np.maximum(ext, lst) - lst) / rd.MS, base=(lst - t0) / rd.MS, orientation="h",
                    name="in collective after last arrival", marker_color=COLORS["transfer"],
                    hovertemplate="transfer %{x:.2f} ms<extra>%{y}</extra>")
    fig.update_layout(barmode="overlay")
    fig.update_xaxes(title_text=f"ms since step {lo} started")
    fig.update_yaxes(autorange="reversed", type="category",
                     categoryorder="array", categoryarray=[f"rank {r}" for r in ranks])
    span = f"steps {lo}–{hi}" if hi > lo else f"step {lo}"
    title = f"Arrivals at the collectives of {span}: waiting for the last rank, then transfer"
    fig = _layout(fig, title, height=int(min(1000, max(300, 22 * len(ranks) + 160)) + 40))
    # The legend in its own strip below the axis title (a share of the plot height put it on the title).
    return fig.update_layout(margin={"b": 90},
                             legend={"yref": "container", "y": 0.0, "yanchor": "bottom", "x": 0.0})
