"""Audit 17 A3 finding 3: the heatmap drew one row per rank in at most 900 px, so at 2,048 ranks the one
slow rank was a 0.4-px line that the browser resampled away, and report.html grew with the ranks
(12.0 / 19.1 / 33.2 MB at 1,024 / 2,048 / 4,096 ranks, 84% of it the heatmap, a third of that the step
time, equal on every rank). Above 300 ranks the rows are now bins of ranks that keep the slowest rank of
each bin, labelled with their rank range, and step time is not drawn per rank. Each test fails on the
code the audit ran (b5a0049)."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fabricpace.diagnose.synthetic import SynthSpec, write_synthetic
from fabricpace.report import data as rd
from fabricpace.report import figures
from fabricpace.report.html import render_report
from fabricpace.run.reader import RunData, load_run

SLOW = 413  # bins of 4 at 640 ranks: rank 413 is in bin 103, ranks 412-415


@pytest.fixture(scope="module")
def wide_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """640 ranks × 12 steps; rank 413 computes 30% longer every step, its peers wait for it."""
    out = tmp_path_factory.mktemp("wide") / "wide"
    return write_synthetic(out, SynthSpec(ranks=640, gpus_per_node=8, nodes_per_leaf=16, steps=12,
                                          slow_ranks=(SLOW,), slow_factor=1.3, seed=3))


def _array(v: Any) -> np.ndarray:
    """A plotly array: a list, or its binary form {dtype, bdata, shape}."""
    if isinstance(v, dict) and "bdata" in v:
        a = np.frombuffer(base64.b64decode(v["bdata"]), dtype=np.dtype(v["dtype"]))
        shape = [int(x) for x in str(v.get("shape", a.size)).split(",")]
        return a.reshape(shape)
    return np.asarray(v)


def test_ranks_per_row_bins_only_above_300_ranks() -> None:
    assert [figures.ranks_per_row(n) for n in (1, 32, 300, 301, 640, 1024, 2048, 4096)] == [
        1, 1, 1, 2, 4, 4, 8, 16]


def test_bin_keeps_the_extreme_rank_and_says_which() -> None:
    """A ragged last bin and a bin with no values (NaN) stay themselves: NaN, from rank -1."""
    z = np.array([[1.0, np.nan], [5.0, np.nan], [2.0, 7.0], [3.0, 9.0], [np.nan, 4.0]])
    hi, src_hi = figures.bin_rank_rows(z, 2, "max")
    assert np.array_equal(hi, np.array([[5.0, np.nan], [3.0, 9.0], [np.nan, 4.0]]), equal_nan=True)
    assert src_hi.tolist() == [[1, -1], [3, 3], [-1, 4]]
    lo, src_lo = figures.bin_rank_rows(z, 2, "min")
    assert np.array_equal(lo, np.array([[1.0, np.nan], [2.0, 7.0], [np.nan, 4.0]]), equal_nan=True)
    assert src_lo.tolist() == [[0, -1], [2, 2], [-1, 4]]


def test_one_slow_rank_of_640_has_its_own_visible_bin(wide_run: Path) -> None:
    """Before, 640 rows of ~1.2 px and a third trace (step time) equal on every rank."""
    run: RunData = load_run(wide_run)
    fig = figures.heatmap(run)
    names = [t.name for t in fig.data]
    assert names == ["own compute", rd.HEATMAP_VALUES["skew_wait_ns"]]  # no step time per rank
    compute, waits = fig.data
    y = list(compute.y)
    assert len(y) == 160 and y[0] == "0–3" and y[-1] == "636–639"
    z = np.asarray(compute.z, dtype=np.float64)
    row = int(np.nanargmax(np.nanmean(z, axis=1)))  # the slowest bin of ranks...
    assert y[row] == f"{SLOW - 1}–{SLOW + 2}"  # ...is rank 413's, and its label names its ranks
    assert (np.asarray(compute.customdata)[row] == SLOW).all()  # the hover names the rank
    assert "ranks %{y}" in compute.hovertemplate and "(rank %{customdata})" in compute.hovertemplate
    # Its bin stands out by the slow rank's 30%, not diluted by a mean over the bin's 4 ranks.
    others = np.delete(np.nanmean(z, axis=1), row)
    assert np.nanmean(z, axis=1)[row] > 1.2 * float(np.max(others))
    # Lost to late peers: the late rank is the one that waits least; the bin's minimum keeps it.
    w = np.asarray(waits.z, dtype=np.float64)
    assert int(np.nanargmin(np.nanmean(w, axis=1))) == row
    assert (np.asarray(waits.customdata)[row] == SLOW).all()
    # The figure says that ranks are binned, and how.
    assert fig.layout.title.text.startswith("Own compute, largest in each bin of 4 ranks")
    assert fig.layout.yaxis.title.text == "ranks (bins of 4)"
    note = fig.layout.annotations[0].text
    assert note.startswith("640 ranks in 160 bins of 4. Each cell shows the bin's slowest rank")
    assert "Step time" in note


def test_report_embeds_binned_float32_heatmap(wide_run: Path, figure_in) -> None:  # type: ignore[no-untyped-def]
    """The report's heatmap payload is bins × columns in float32, not ranks × columns × 3 in float64."""
    html = render_report([wide_run], findings=False)
    data, layout = figure_in(html, "heatmap-0")
    assert [t["name"] for t in data] == ["own compute", rd.HEATMAP_VALUES["skew_wait_ns"]]
    for t in data:
        assert t["z"]["dtype"] == "f4"
        z = _array(t["z"])
        assert z.shape == (160, 12)
        assert t["y"][SLOW // 4] == "412–415"
        assert (_array(t["customdata"])[SLOW // 4] == SLOW).all()
    assert [b["label"] for b in layout["updatemenus"][0]["buttons"]] == ["own compute",
                                                                         rd.HEATMAP_VALUES["skew_wait_ns"]]
    assert layout["yaxis"]["type"] == "category"


def test_300_ranks_keep_one_row_per_rank(tmp_path: Path) -> None:
    """Small runs draw as before: a row per rank, the three views."""
    run = load_run(write_synthetic(tmp_path / "r300", SynthSpec(ranks=300, gpus_per_node=4, steps=3)))
    fig = figures.heatmap(run)
    assert [t.name for t in fig.data] == ["own compute", rd.HEATMAP_VALUES["skew_wait_ns"], "step time"]
    assert np.asarray(fig.data[0].z).shape == (300, 3)
    assert list(fig.data[0].y) == list(range(300))
    assert fig.data[0].customdata is None and not fig.layout.annotations
