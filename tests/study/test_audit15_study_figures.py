"""The study's figures.html (audit 15, findings 2 and 10): the CV's CI drawn from 0, a page that says
what was run, baseline and paced told apart where they coincide, ticks at the study's node counts, no
CI promised for one repeat, and the timeline's run named."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fabricpace.report.study_figures import cv_figure, scaling_figure

SMALL = ["--backend", "sim", "--cluster", "single-switch", "--workload", "resnet-50", "--steps", "12",
         "--warmup", "2", "--format", "json"]




def _figures(html: str) -> list[dict[str, Any]]:
    """The plotly figures embedded in figures.html (data and layout), in page order."""
    dec = json.JSONDecoder()
    out = []
    for m in re.finditer(r'Plotly\.newPlot\(\s*"[^"]+",\s*', html):
        data, j = dec.raw_decode(html, m.end())
        j = html.index(",", j) + 1
        while html[j].isspace():
            j += 1
        layout, _ = dec.raw_decode(html, j)
        out.append({"data": data, "layout": layout})
    return out


# --- finding 2: the CV's CI in the figure --------------------------------------------------------


def test_the_cv_figure_draws_the_cv_ci_and_starts_at_zero(table_row):
    rows = [table_row(4, "baseline", repeats=3, cv=0.0093, cv_ci=[0.0045, 0.0141]),
            table_row(8, "baseline", repeats=3)]
    fig = cv_figure(rows).to_plotly_json()
    (trace,) = fig["data"]
    err = trace["error_y"]
    assert err["visible"] and list(err["array"]) == pytest.approx([0.0048, 0.0329 - 0.0122])
    # the lower bound stops at 0: the bar reaches down to 0, not below
    assert list(err["arrayminus"]) == pytest.approx([0.0048, 0.0122])
    # from 0.009 the axis made a step from 0.0093 to 0.0122 look steep
    assert fig["layout"]["yaxis"]["rangemode"] == "tozero"


# --- finding 10: figures.html ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def one_repeat_study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("study") / "s"
    # paced first: the timeline used to show whichever mode came first (here the paced run)
    r = subprocess.run(
        [sys.executable, "-m", "fabricpace.cli.app", "study", *SMALL, "--nodes", "1,2,4", "--repeats", "1",
         "--compare", "paced,baseline", "--out", str(out)],
        capture_output=True, text=True, timeout=600,
    )
    assert r.returncode == 0, r.stderr
    return out


def test_figures_html_starts_with_the_plan_and_the_table(one_repeat_study):
    html = (one_repeat_study / "figures.html").read_text()
    head = html[: html.index("Plotly.newPlot")]
    study = json.loads((one_repeat_study / "study.json").read_text())
    for needle in ("fabricpace study", "backend", "sim", "node counts", "1, 2, 4", "steps per run", "12",
                   "warm-up", "repeats", "single-switch", "resnet-50"):
        assert needle in head, needle
    # the Table-1 rows, as the terminal prints them
    for row in study["rows"]:
        assert f"<td class='l'>{row['mode']}</td>" in head
        assert f"{row['efficiency']:.3f}" in head
    assert "paced at 1, 2 and 4 nodes: the controller made no pacing decision" in head


def test_baseline_and_paced_look_different_where_they_coincide(one_repeat_study):
    scaling = _figures((one_repeat_study / "figures.html").read_text())[0]
    traces = {t["name"]: t for t in scaling["data"] if t["name"] in ("baseline", "paced")}
    b, p = traces["baseline"], traces["paced"]
    assert b["y"] == p["y"]  # nothing to pace here: the two lines are the same numbers
    assert b["line"]["dash"] != p["line"]["dash"]
    assert b["marker"]["symbol"] != p["marker"]["symbol"]
    assert b["line"]["width"] > p["line"]["width"] and b["marker"]["size"] > p["marker"]["size"]


def test_the_node_axis_ticks_at_the_study_node_counts(one_repeat_study):
    for fig in _figures((one_repeat_study / "figures.html").read_text())[:2]:
        x = fig["layout"]["xaxis"]
        # a linear axis ticked at 1.5, 2.5, 3.5 ... nodes
        assert x["type"] == "log" and x["tickvals"] == [1, 2, 4] and x["ticktext"] == ["1", "2", "4"]


def test_one_repeat_promises_no_ci(one_repeat_study):
    figs = _figures((one_repeat_study / "figures.html").read_text())
    titles = [f["layout"]["title"]["text"] for f in figs[:2]]
    assert all(t.endswith("(1 repeat: no CI)") for t in titles), titles
    assert not any("95% CI" in t for t in titles)
    assert not any("error_y" in t for f in figs[:2] for t in f["data"])


def test_the_timeline_title_names_its_run(one_repeat_study):
    title = _figures((one_repeat_study / "figures.html").read_text())[2]["layout"]["title"]["text"]
    # the largest baseline run, although paced was listed first
    assert title.startswith("Per-rank timeline of the 4-node baseline run, repeat 1 (seed 1), steps "), title


def test_with_repeats_the_titles_name_the_ci(tmp_path, table_row):
    rows = [table_row(4, "baseline", repeats=3), table_row(8, "baseline", repeats=3)]
    for fig in (scaling_figure(rows), cv_figure(rows)):
        assert fig.layout.title.text.endswith("(95% CI over 3 repeats)")
