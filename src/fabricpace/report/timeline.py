"""Per-rank timeline of a few steps (the paper's Figure 2, "coordination bottleneck timeline").

Each rank is a row; each step is drawn as consecutive segments — gc, data, compute, paced, and wait
(blocked until the collectives finished) — plus a thin bar spanning the time that rank's collectives
were in flight (first issue to last completion). Ranks that arrive last push everyone's wait; the
figure shows that directly. Built from the run directory only, so it works for any source.
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
import polars as pl

from fabricpace.run.reader import RunData

SEGMENTS = (
    ("gc_ns", "gc pause", "#B279A2"),
    ("data_ns", "data", "#72B7B2"),
    ("compute_ns", "compute", "#4C78A8"),
    ("paced_ns", "paced", "#54A24B"),
    ("wait_ns", "wait (peers + exposed comm)", "#E45756"),
)

ROW_PX = 28  # height of one rank's row
MIN_PLOT_PX = 160  # smallest plot area (a 1-rank timeline still reads as a chart)
MAX_HEIGHT_PX = 1100  # 32 ranks (the most drawn) fit
MAX_TIMELINE_RANKS = 32  # the report's two timelines draw the same ranks, at most this many


def pick_ranks(run: RunData, max_ranks: int) -> list[int]:
    """Up to ``max_ranks`` ranks: every rank for small jobs, else evenly spaced plus the slowest."""
    ranks = sorted(run.steps["rank"].unique().to_list())
    if len(ranks) <= max_ranks:
        return ranks
    compute = run.steps.group_by("rank").agg(pl.col("compute_ns").median()).sort("compute_ns")
    slowest = compute["rank"].to_list()[-max(1, max_ranks // 8) :]
    spaced = [ranks[int(i)] for i in np.linspace(0, len(ranks) - 1, max_ranks - len(slowest))]
    return sorted(set(spaced) | set(slowest))


def timeline_figure(
    run: RunData,
    steps: tuple[int, int] | None = None,
    *,
    max_ranks: int = MAX_TIMELINE_RANKS,
    ranks: list[int] | None = None,
) -> go.Figure:
    """Gantt-style figure of steps ``steps[0]..steps[1]`` (inclusive; default: 3 steps mid-run), of
    ``ranks`` (default: ``pick_ranks(run, max_ranks)``)."""
    all_steps = sorted(run.steps["step"].unique().to_list())
    if steps is None:
        mid = all_steps[len(all_steps) // 2] if all_steps else 0
        steps = (mid, mid + 2)
    if ranks is None:
        ranks = pick_ranks(run, max_ranks)
    sel = run.steps.filter(pl.col("step").is_between(steps[0], steps[1]) & pl.col("rank").is_in(ranks)).sort(
        ["rank", "step"]
    )
    fig = go.Figure()
    if sel.height == 0:
        fig.update_layout(title=f"No steps {steps[0]}..{steps[1]} in {run.path}")
        return fig
    t0 = int(sel["t_start_ns"].to_numpy().min())
    label = [f"rank {r}" for r in sel["rank"].to_list()]
    cursor = (sel["t_start_ns"].to_numpy() - t0) / 1e6
    for col, name, color in SEGMENTS:
        dur = sel[col].fill_null(0).to_numpy() / 1e6
        fig.add_trace(
            go.Bar(
                y=label,
                x=dur,
                base=cursor,
                orientation="h",
                name=name,
                marker_color=color,
                hovertemplate=f"{name}: %{{x:.2f}} ms<extra>%{{y}}</extra>",
                width=0.7,
            )
        )
        cursor = cursor + dur
    coll = run.collectives
    if coll.height:
        span = (
            coll.filter(pl.col("step").is_between(steps[0], steps[1]) & pl.col("rank").is_in(ranks))
            .group_by(["rank", "step"])
            .agg(pl.col("t_enter_ns").min(), pl.col("t_exit_ns").max())
            .sort(["rank", "step"])
        )
        if span.height:
            fig.add_trace(
                go.Bar(
                    y=[f"rank {r}" for r in span["rank"].to_list()],
                    x=(span["t_exit_ns"] - span["t_enter_ns"]).to_numpy() / 1e6,
                    base=(span["t_enter_ns"].to_numpy() - t0) / 1e6,
                    orientation="h",
                    name="collectives in flight",
                    marker_color="#F58518",
                    width=0.2,
                    hovertemplate="comm %{x:.2f} ms<extra>%{y}</extra>",
                )
            )
    # Sized in pixels, not as a share of the figure: a fixed share for margins and legend left ~20 px
    # for the bars of 4 ranks (one visible row, bars on top of each other). Every rank gets a row of
    # ROW_PX, the plot area at least MIN_PLOT_PX, and the legend sits in its own strip at the bottom.
    shown = [f"rank {r}" for r in ranks if r in set(sel["rank"].to_list())]
    top, bottom = 60, 110
    plot = max(MIN_PLOT_PX, ROW_PX * len(shown))
    fig.update_layout(
        barmode="overlay",
        title={"text": f"Per-rank timeline, steps {steps[0]}–{steps[1]} ({run.manifest.source})", "x": 0},
        xaxis_title="time (ms)",
        yaxis={"autorange": "reversed", "type": "category", "categoryorder": "array", "categoryarray": shown},
        height=int(min(MAX_HEIGHT_PX, top + bottom + plot)),
        margin={"l": 70, "r": 30, "t": top, "b": bottom},
        template="plotly_white",
        legend={"orientation": "h", "yref": "container", "y": 0.0, "yanchor": "bottom", "x": 0.0},
    )
    return fig
