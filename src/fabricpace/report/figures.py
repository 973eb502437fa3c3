"""Plotly figures of the HTML report: heatmap, skew distribution, last arrivers, breakdown, scaling, timeline.

Every figure is built from pre-aggregated numpy arrays (histograms are binned here, heatmap steps binned
in ``data`` to ≤ 300 columns and, above 300 ranks, ranks binned here to ≤ 300 rows), so the heatmap is
at most ~1.4 MB whatever the run's size. Measured (synthetic runs, ``report --no-findings``): 5.9 / 6.0 /
6.3 MB at 1,024 / 2,048 / 4,096 ranks × 200 steps and 6.3 MB at 1,024 × 2,000 steps, of which 4.8 MB
is the inlined plotly.js; with one float64 row per rank and three views they were 12.0 / 19.0 / 33.1
and 15.0 MB (the heatmap alone 27.7 MB at 4,096 ranks). The per-rank bars (last arrivers, breakdown)
still grow with the ranks: 0.5 MB at 4,096.
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
import polars as pl

from fabricpace.report import data as rd
from fabricpace.report.timeline import MAX_TIMELINE_RANKS, pick_ranks
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
    "skew_wait": "lost to late peers (blocked before the last arrival)",
    "transfer": "exposed transfer (blocked after it)",
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


MANY_RANKS = 200  # above this, per-rank bars touch and lose their outline (else they alias into stripes)


def color_range(z: np.ndarray) -> tuple[float, float] | None:
    """(zmin, zmax) of a heatmap in ms: its values' range, but at least 2% of their median (and
    0.1 ms) wide, centred on them. A healthy simulated run's step times differ by 1 ns: autoscaled, the
    1-ns shorter steps read as dark stripes across every rank. None when there are no values."""
    finite = z[np.isfinite(z)]
    if finite.size == 0:
        return None
    lo, hi = float(finite.min()), float(finite.max())
    span = max(0.02 * abs(float(np.median(finite))), 0.1)
    if hi - lo >= span:
        return lo, hi
    mid = (lo + hi) / 2
    lo, hi = mid - span / 2, mid + span / 2
    if float(finite.min()) >= 0 > lo:  # a range of times stays at or above 0
        lo, hi = 0.0, hi - lo
    return lo, hi


def _tick_format(lo: float, hi: float) -> str:
    """Colour-bar ticks with as many decimals as the range needs (2 of them significant), at most 3."""
    span = hi - lo
    decimals = 0 if span <= 0 else int(min(3, max(0, 1 - np.floor(np.log10(span)))))
    return f".{decimals}f"


HEATMAP_MAX_ROWS = 300
"""Most rank rows the heatmap draws. The figure is at most 900 px high, about 750 px of plot: up to 300
rows a rank's row is at least 2.5 px, one row can be seen and hovered. Above it ranks are binned."""

# Per value, how a bin of ranks is reduced so that one slow rank stays visible: its own compute is the
# bin's largest; a late rank is the one that waits least (its peers wait for it), so the bin's smallest
# time lost to late peers. A mean over 8 or 16 ranks would dilute a 30% slow rank to 2-4%. Step time
# (equal on every rank under synchronous training) is drawn only when neither of the two was recorded.
_BIN_REDUCE = {"compute_ns": "max", "skew_wait_ns": "min", "dur_ns": "max"}


def _binned_keys(mats: dict[str, np.ndarray]) -> list[str]:
    keys: list[str] = [k for k in ("compute_ns", "skew_wait_ns") if k in mats]
    return keys or [k for k in ("dur_ns",) if k in mats]


def ranks_per_row(n_ranks: int, max_rows: int = HEATMAP_MAX_ROWS) -> int:
    """Ranks in one heatmap row: 1 up to ``max_rows`` ranks, else the smallest power of two that brings
    the rows under it (2, 4, 8, 16: bins fall on the node boundaries of 2-, 4- or 8-GPU nodes)."""
    per = 1
    while -(-n_ranks // per) > max_rows:
        per *= 2
    return per


def bin_rank_rows(z: np.ndarray, per_row: int, how: str) -> tuple[np.ndarray, np.ndarray]:
    """(rows of ``z`` reduced ``per_row`` at a time by ``how`` ('max' or 'min') ignoring NaN, the row
    index in ``z`` of the rank each cell took its value from; -1 where the bin has no value)."""
    n, cols = z.shape
    nbin = -(-n // per_row)
    padded = np.full((nbin * per_row, cols), np.nan)
    padded[:n] = z
    blocks = padded.reshape(nbin, per_row, cols)
    fill = -np.inf if how == "max" else np.inf
    filled = np.where(np.isnan(blocks), fill, blocks)
    pick = filled.argmax(axis=1) if how == "max" else filled.argmin(axis=1)
    vals = np.take_along_axis(filled, pick[:, None, :], axis=1)[:, 0, :]
    empty = ~np.isfinite(vals)
    src = np.arange(nbin)[:, None] * per_row + pick
    return np.where(empty, np.nan, vals), np.where(empty, -1, src)


def _binned_heatmap(fig: go.Figure, ranks: np.ndarray, cols: np.ndarray, mats: dict[str, np.ndarray],
                    per_row: int, binned: str) -> tuple[list[str], str]:
    """Adds one trace per value of ``mats`` with ranks in bins of ``per_row`` (``_BIN_REDUCE``); returns
    the titles and the note that says how. Step time is left out: under synchronous training it is equal
    on every rank, and drawn per rank bin it was a third of the report's bytes for no information."""
    nbin = -(-len(ranks) // per_row)
    lo = ranks[np.arange(nbin) * per_row]
    hi = ranks[np.minimum(np.arange(nbin) * per_row + per_row, len(ranks)) - 1]
    rows = [f"{a}–{b}" for a, b in zip(lo.tolist(), hi.tolist(), strict=True)]
    # Rank ids fit 16 bits below 32,768 ranks: half the bytes of the per-cell "which rank" array.
    rank_dtype = np.int16 if int(ranks.max()) < np.iinfo(np.int16).max else np.int32
    keys = _binned_keys(mats)
    titles: list[str] = []
    for i, key in enumerate(keys):
        how = _BIN_REDUCE[key]
        label = rd.HEATMAP_VALUES[key]
        z, src = bin_rank_rows(mats[key], per_row, how)
        who = np.where(src >= 0, ranks[np.maximum(src, 0)], -1).astype(rank_dtype)
        rng = color_range(z)
        extra: dict[str, object] = {} if rng is None else {"zmin": rng[0], "zmax": rng[1]}
        word = "largest" if how == "max" else "smallest"
        fig.add_trace(go.Heatmap(
            z=z.astype(np.float32), x=cols, y=rows, customdata=who, colorscale="Viridis", visible=i == 0,
            name=label, colorbar={"title": {"text": "ms"},
                                  "tickformat": _tick_format(*rng) if rng else ".2f"},
            hovertemplate=(f"ranks %{{y}}<br>step %{{x}}<br>{label}, {word} in the bin: %{{z:.2f}} ms "
                           "(rank %{customdata})<extra></extra>"), **extra,
        ))
        titles.append(f"{label.capitalize()}, {word} in each bin of {per_row} ranks (rank bin × step)"
                      f"{binned}")
    note = (f"{len(ranks):,} ranks in {nbin} bins of {per_row}. Each cell shows the bin's slowest rank: "
            "own compute is the largest in the bin, lost to late peers the smallest (a late rank waits "
            "least);<br>hover names the rank. Step time, equal on every rank under synchronous training, "
            "is not drawn per rank at this scale.")
    return titles, note


def _per_rank_heatmap(fig: go.Figure, ranks: np.ndarray, cols: np.ndarray, mats: dict[str, np.ndarray],
                      keys: list[str], binned: str) -> list[str]:
    """Adds one trace per value in ``keys``, a row per rank; returns the titles."""
    for i, key in enumerate(keys):
        label = rd.HEATMAP_VALUES[key]
        z = mats[key]
        rng = color_range(z)
        extra: dict[str, object] = {}
        if rng is not None:
            extra = {"zmin": rng[0], "zmax": rng[1]}
        fig.add_trace(go.Heatmap(
            z=z, x=cols, y=ranks, colorscale="Viridis", visible=i == 0, name=label,
            colorbar={"title": {"text": "ms"}, "tickformat": _tick_format(*rng) if rng else ".2f"},
            hovertemplate=f"rank %{{y}}<br>step %{{x}}<br>{label} %{{z:.2f}} ms<extra></extra>", **extra,
        ))
    return [f"Per-rank {rd.HEATMAP_VALUES[k]} (rank × step){binned}" for k in keys]


def heatmap(
    run: RunData, waits: pl.DataFrame | None = None, *, max_rows: int = HEATMAP_MAX_ROWS
) -> go.Figure:
    """Rank × step heatmap of own compute (who is slow), with buttons for the time lost to late peers
    (who waits) and step time (equal on every rank under synchronous training, so not the default).
    Above ``max_rows`` ranks, ranks are binned (``ranks_per_row``) so that one slow rank stays visible."""
    ranks, cols, mats, per_col = rd.heatmap_matrices(run, waits=waits)
    binned = f" (mean of {per_col} steps per column)" if per_col > 1 else ""
    fig = go.Figure()
    per_row = ranks_per_row(len(ranks), max_rows)
    if per_row > 1:
        keys = _binned_keys(mats)
        title, note = _binned_heatmap(fig, ranks, cols, mats, per_row, binned)
    else:
        keys = [k for k in ("compute_ns", "skew_wait_ns", "dur_ns") if k in mats]
        title, note = _per_rank_heatmap(fig, ranks, cols, mats, keys, binned), ""
    if len(keys) > 1:
        buttons = [{"label": rd.HEATMAP_VALUES[k], "method": "update",
                    "args": [{"visible": [j == i for j in range(len(keys))]}, {"title.text": title[i]}]}
                   for i, k in enumerate(keys)]
        fig.update_layout(updatemenus=[{"buttons": buttons, "direction": "right", "type": "buttons",
                                        "x": 1.0, "xanchor": "right", "y": 1.01, "yanchor": "bottom"}])
    fig.update_xaxes(title_text="step")
    if len(cols) <= 30:
        fig.update_xaxes(tickmode="array", tickvals=list(cols))
    if per_row > 1:  # category rows "1232–1239", top to bottom; plotly thins their labels to fit
        fig.update_yaxes(title_text=f"ranks (bins of {per_row})", type="category", autorange="reversed",
                         automargin=True)
    else:
        fig.update_yaxes(title_text="rank", autorange="reversed")
    if len(ranks) <= 32:  # whole ranks only (2 ranks read -0.5, 0, 0.5, 1, 1.5)
        fig.update_yaxes(tickmode="array", tickvals=list(ranks))
    rows = -(-len(ranks) // per_row)
    height = int(min(900, max(320, 14 * rows + 140)))
    fig = _layout(fig, title[0] if title else "Per-rank step time (rank × step)", height=height)
    if note:  # below the step axis title, in the bottom margin
        fig.add_annotation(text=note, xref="paper", yref="paper", x=0.0, y=0.0, xanchor="left",
                           yanchor="top", yshift=-42, showarrow=False, align="left", font={"size": 11})
        fig.update_layout(margin={"b": 95})
    # The buttons sit in the top margin, between the title and the plot, not on the plot.
    return fig.update_layout(margin={"t": 95}) if len(keys) > 1 else fig


def warmup_words(warmup: int) -> str:
    """'after 20 warm-up steps' ('' without a warm-up)."""
    return "" if warmup <= 0 else f"after {warmup} warm-up step{'s' if warmup != 1 else ''}"


def skew_distribution(inst: pl.DataFrame, warmup: int = 0) -> go.Figure:
    skew = inst["skew_ns"].to_numpy().astype(np.float64) / rd.MS
    fig = go.Figure()
    if len(skew):
        counts, edges = np.histogram(skew, bins=min(60, max(10, int(np.sqrt(len(skew))))))
        mids = (edges[:-1] + edges[1:]) / 2
        fig.add_bar(x=mids, y=counts, width=np.diff(edges), marker_color=COLORS["skew_wait"],
                    hovertemplate="%{x:.3f} ms: %{y} instances<extra></extra>", name="instances")
        p50, p95 = (float(np.percentile(skew, q)) for q in (50, 95))
        # The labels sit on either side of their lines, so close quantiles do not print over each other.
        for q, v, dash, side in ((50, p50, "dot", "top left"), (95, p95, "dash", "top right")):
            fig.add_vline(x=v, line_dash=dash, line_color="#333",
                          annotation_text=f"p{q} {v:.2f} ms", annotation_position=side)
    fig.update_xaxes(title_text="arrival spread per collective instance (last − first arrival), ms",
                     rangemode="nonnegative")
    fig.update_yaxes(title_text="instances")
    after = f", {warmup_words(warmup)}" if warmup > 0 else ""
    return _layout(fig, f"Arrival spread distribution ({len(skew):,} collective instances{after})")


def last_arrivers(share: pl.DataFrame, warmup: int = 0) -> go.Figure:
    n = max(share.height, 1)
    fig = go.Figure(
        go.Bar(x=share["rank"].to_numpy(), y=share["share"].to_numpy(), marker_color=COLORS["skew_wait"],
               customdata=share["count"].to_numpy(),
               hovertemplate="rank %{x}: last in %{customdata} instances (%{y:.1%})<extra></extra>")
    )
    # The line is the share each rank would have if none were persistently late, not a verdict: the
    # label said "(no persistent straggler)" above a rank last in 100% of the instances.
    fig.add_hline(y=1.0 / n, line_dash="dash", line_color="#333",
                  annotation_text=f"1/N = {1.0 / n:.1%} (expected if no rank were persistently late)",
                  annotation_position="top left")
    fig.update_xaxes(title_text="rank", type="category" if n <= 64 else "linear")
    top = float(share["share"].to_numpy().max()) if share.height else 0.0
    fig.update_yaxes(title_text="share of instances where the rank arrived last",
                     tickformat=".0%" if top >= 0.1 else ".1%")
    if n > MANY_RANKS:
        fig.update_layout(bargap=0)
        fig.update_traces(marker_line_width=0)
    after = f" ({warmup_words(warmup)})" if warmup > 0 else ""
    return _layout(fig, f"Last-arriver share by rank{after}")


def breakdown_bars(b: pl.DataFrame, warmup: int = 0) -> go.Figure:
    fig = go.Figure()
    many = b.height > MANY_RANKS
    if b.height:
        for part in COLORS:
            if part in b.columns and float(b[part].sum()) > 0:
                fig.add_bar(x=b["rank"].to_numpy(), y=b[part].to_numpy(), name=LABELS[part],
                            marker_color=COLORS[part], marker_line_width=0 if many else None,
                            hovertemplate=f"rank %{{x}}: {LABELS[part]} %{{y:.2f}} ms<extra></extra>")
    # The legend always shows, also for one part: it is where the colours are named.
    fig.update_layout(barmode="stack", showlegend=True, bargap=0 if many else None)
    fig.update_xaxes(title_text="rank", type="category" if b.height <= 64 else "linear")
    fig.update_yaxes(title_text="mean per step, ms")
    after = f" ({warmup_words(warmup)})" if warmup > 0 else ""
    return _layout(fig, f"Where each rank's step goes: compute, lost to late peers, exposed transfer{after}")


def scaling(rows: pl.DataFrame) -> go.Figure:
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=("Step time and efficiency", "Where the step goes"),
                        specs=[[{"secondary_y": True}, {}]])
    x = rows["world_size"].to_numpy()
    fig.add_scatter(x=x, y=rows["step_ms"].to_numpy(), mode="lines+markers", name="mean step (ms)",
                    row=1, col=1, secondary_y=False, line_color=COLORS["compute"])
    fig.add_scatter(x=x, y=rows["efficiency"].to_numpy(), mode="lines+markers", name="efficiency",
                    row=1, col=1, secondary_y=True, line_color=COLORS["paced"], line_dash="dash")
    for part in ("compute", "skew_wait", "transfer"):
        col = f"{part}_ms"
        if col in rows.columns:
            fig.add_bar(x=[str(v) for v in x], y=rows[col].to_numpy(), name=LABELS[part],
                        marker_color=COLORS[part], row=1, col=2)
    fig.update_layout(barmode="stack")
    # N doubles from run to run: a log axis with a tick at each run's N (a linear one crowded the
    # small runs and put ticks between them).
    ticks = sorted({int(v) for v in x})
    fig.update_xaxes(title_text="ranks (N)", row=1, col=1, type="log" if min(ticks) > 0 else "linear",
                     tickmode="array", tickvals=ticks, ticktext=[str(t) for t in ticks])
    fig.update_xaxes(title_text="ranks (N)", type="category", row=1, col=2)
    fig.update_yaxes(title_text="mean step, ms", rangemode="tozero", row=1, col=1, secondary_y=False)
    top = max(1.05, float(np.nanmax(rows["efficiency"].to_numpy())) * 1.05)
    fig.update_yaxes(title_text="efficiency vs smallest run", tickformat=".0%", range=[0, top], dtick=0.2,
                     row=1, col=1, secondary_y=True)
    fig.update_yaxes(title_text="mean per rank-step, ms", row=1, col=2)
    fig = _layout(fig, "Scaling across runs (after each run's warm-up)", height=480)
    return fig.update_layout(margin={"t": 90})


def size_sweep(rows: pl.DataFrame) -> go.Figure:
    """nccl-tests size sweeps: bandwidth against message size, one line per run (and op): the bus
    bandwidth nccl-tests reports (comparable across rank counts) when every row has it, else algbw."""
    bus = rows["busbw_gbytes_s"].null_count() == 0
    col, label = ("busbw_gbytes_s", "bus bandwidth, GB/s") if bus else ("algbw_gbytes_s", "algbw, GB/s")
    fig = go.Figure()
    for (run, op), part in rows.sort("world_size", "bytes").group_by(["run", "op"], maintain_order=True):
        n = int(part["world_size"][0])
        fig.add_scatter(x=part["bytes"].to_numpy(), y=part[col].to_numpy(), mode="lines+markers",
                        name=f"{run} ({n} ranks) {op}", customdata=part["time_ms"].to_numpy(),
                        hovertemplate="%{x} B: %{y:.2f} GB/s, %{customdata:.3f} ms<extra></extra>")
    fig.update_xaxes(title_text="message size, bytes", type="log")
    fig.update_yaxes(title_text=label, rangemode="tozero")
    return _layout(fig, "nccl-tests size sweeps: bandwidth against message size, per rank count")


def timeline(
    run: RunData,
    steps: tuple[int, int],
    *,
    max_ranks: int = MAX_TIMELINE_RANKS,
    ranks: list[int] | None = None,
) -> go.Figure:
    """Per-rank timeline of the chosen steps (the paper's Figure 2): step, waiting for peers, transfer.
    ``ranks``: the ranks drawn (default ``pick_ranks``, as the phase timeline draws them)."""
    lo, hi = steps
    if ranks is None:
        ranks = pick_ranks(run, max_ranks)
    s = run.steps.filter(pl.col("step").is_between(lo, hi) & pl.col("rank").is_in(ranks))
    c = run.collectives.filter(pl.col("step").is_between(lo, hi) & pl.col("rank").is_in(ranks))
    ranks = sorted(set(ranks) & set(s["rank"].to_list()))
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
                    name="before the last rank arrived", marker_color=COLORS["skew_wait"],
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
