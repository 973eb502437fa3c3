"""Figure fixes from user audit 15 (what users read): the 1/N line labelled as a verdict (finding 3),
a healthy run's 1-ns colour range (7), fractional rank ticks (14), degenerate figures (15), 512 ranks'
bars aliasing into stripes and an uninformative default heatmap view (20), and the two timelines of
the same steps drawing different ranks (21). Each test fails on the code the audit ran (bd929ea)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from fabricpace.report import data as rd
from fabricpace.report import figures
from fabricpace.report.html import render_report


def test_last_arriver_line_is_labelled_as_an_expectation() -> None:
    """Finding 3: "1/N = 25.0% (no persistent straggler)" sat above rank 3 last in 100% of instances
    (gloo-slow), whose finding above it was persistent_straggler."""
    share = pl.DataFrame({"rank": pl.Series([0, 1, 2, 3], dtype=pl.Int32), "count": [0, 0, 0, 9],
                          "share": [0.0, 0.0, 0.0, 1.0]})
    text = figures.last_arrivers(share).layout.annotations[0].text
    assert "no persistent straggler" not in text
    assert text == "1/N = 25.0% (expected if no rank were persistently late)"


def test_healthy_heatmap_colour_range_is_not_one_nanosecond(flat_run: Path, overlapped_run: Path,
                                                            figure_in) -> None:  # type: ignore[no-untyped-def]
    """Finding 7: a healthy run's colour bar ran from 188.014524 to 188.014525 ms with 7-decimal ticks,
    and the 1-ns shorter steps read as dark stripes across every rank. Finding 20: the heatmap opened on
    step time, equal on every rank by design. Finding 14: 2 ranks read -0.5, 0, 0.5, 1, 1.5."""
    html = render_report([flat_run], findings=False)
    data, layout = figure_in(html, "heatmap-0")
    names = [t["name"] for t in data]
    assert names == ["own compute", rd.HEATMAP_VALUES["skew_wait_ns"], "step time"]
    assert data[0].get("visible", True) is True and data[2]["visible"] is False
    assert layout["title"]["text"].startswith("Per-rank own compute")
    for t in data:
        assert t["zmax"] - t["zmin"] >= 0.1, t["name"]
        assert t["colorbar"]["tickformat"] in (".0f", ".1f", ".2f", ".3f"), t["colorbar"]["tickformat"]
    step = data[2]
    assert step["zmax"] - step["zmin"] >= 0.02 * 188.0
    assert step["zmin"] < 188.014524 < step["zmax"]
    assert layout["yaxis"]["tickvals"] == [0, 1, 2, 3]
    two = render_report([overlapped_run], findings=False)
    assert figure_in(two, "heatmap-0")[1]["yaxis"]["tickvals"] == [0, 1]


def test_colour_range_keeps_real_differences() -> None:
    z = np.array([[100.0, 140.0], [101.0, np.nan]])
    assert figures.color_range(z) == (100.0, 140.0)  # a real spread is drawn as it is
    lo, hi = figures.color_range(np.array([[0.0, 0.0]])) or (None, None)
    assert lo == 0.0 and hi is not None and hi >= 0.1  # all-zero waits: no negative milliseconds
    assert figures.color_range(np.full((2, 2), np.nan)) is None


def test_degenerate_figures_read_clearly() -> None:
    """Finding 15: an all-zero spread histogram ran from -0.4 ms with the p50 and p95 labels printed on
    each other; a breakdown of one part (an nccl-tests import: transfer only) had no legend, so orange =
    transfer was never said."""
    fig = figures.skew_distribution(pl.DataFrame({"skew_ns": [0, 0, 0, 0]}))
    assert fig.layout.xaxis.rangemode == "nonnegative"
    p50, p95 = fig.layout.annotations
    assert p50.text.startswith("p50") and p95.text.startswith("p95")
    assert (p50.xanchor, p95.xanchor) == ("right", "left")  # on either side of their lines
    one = figures.breakdown_bars(pl.DataFrame({"rank": [0, 1], "transfer": [0.1, 0.1]}))
    assert len(one.data) == 1 and one.layout.showlegend is True


def test_many_ranks_bars_touch() -> None:
    """Finding 20: at 512 ranks the breakdown's bars, with gaps and white outlines, aliased into pale
    bars with dark stripes."""
    b = pl.DataFrame({"rank": np.arange(512), "compute": np.full(512, 300.0), "transfer": np.full(512, 30.0)})
    fig = figures.breakdown_bars(b)
    assert fig.layout.bargap == 0 and all(t.marker.line.width == 0 for t in fig.data)
    small = figures.breakdown_bars(b.head(8))
    assert small.layout.bargap is None and all(t.marker.line.width is None for t in small.data)


def test_both_timelines_draw_the_same_ranks(tmp_path: Path, figure_in) -> None:  # type: ignore[no-untyped-def]
    """Finding 21: of the same steps, the phase timeline drew 32 ranks and the arrivals timeline 40
    others (each picked its own sample)."""
    from fabricpace.diagnose.synthetic import SynthSpec, write_synthetic

    run = write_synthetic(tmp_path / "s", SynthSpec(ranks=64, gpus_per_node=8, steps=30, slow_ranks=(41,),
                                                    slow_factor=1.2))
    html = render_report([run], findings=False)
    _d, phases = figure_in(html, "phases-0")
    _d, arrivals = figure_in(html, "timeline-0")
    shown = phases["yaxis"]["categoryarray"]
    assert shown == arrivals["yaxis"]["categoryarray"]
    assert 0 < len(shown) <= 32 and "rank 41" in shown
