"""The study table (audit 15, findings 2 and 11): the CV with its CI, footnotes only for what is
printed, and paced rows whose controller decided nothing saying so (study.json counts the decisions)."""

from __future__ import annotations

import io
import json
from typing import Any

from rich.console import Console

from fabricpace.cli.simulate import study_table

SMALL = ["--backend", "sim", "--cluster", "single-switch", "--workload", "resnet-50", "--steps", "12",
         "--warmup", "2", "--format", "json"]


def _render(rows: list[dict[str, Any]], width: int | None = None) -> str:
    """The table as the CLI prints it on a terminal ``width`` columns wide (default: wide enough)."""
    console = Console(width=width or 200, record=True, file=io.StringIO())
    console.print(study_table(rows, "t") if width is None else study_table(rows, "t", width=width))
    return console.export_text()




# --- finding 2: the CV's CI ----------------------------------------------------------------------


def test_the_table_prints_the_cv_with_its_half_width_when_there_are_repeats(table_row):
    # 3 repeats: "CV 0.012" used to stand alone, although its CI [0, 0.033] is three times wider.
    text = _render([table_row(8, "baseline", repeats=3)])
    assert "0.012 ± 0.021" in text, text
    assert "0.012 ±" not in _render([table_row(8, "baseline", repeats=1)])


# --- finding 11: footnotes and paced rows that decided nothing ------------------------------------


def test_the_plus_minus_footnote_stands_only_under_a_plus_minus(table_row):
    one = _render([table_row(4, "baseline", repeats=1), table_row(4, "paced", repeats=1)])
    assert "±" not in one and "half-width" not in one, one
    assert "1 repeat: no CI" in one
    three = _render([table_row(4, "baseline", repeats=3), table_row(4, "paced", repeats=3)])
    assert "± = half-width of the 95% CI" in three


def test_a_3_repeat_table_fits_80_columns_without_cutting_numbers(table_row):
    rows = [table_row(8, "baseline", repeats=3), table_row(8, "paced", repeats=3)]
    text = _render(rows, width=80)
    assert "…" not in text and max(len(line) for line in text.splitlines()) <= 80, text
    assert "1897 ± 58" in text and "0.012 ± 0.021" in text and "(no change)" in text


def test_paced_rows_whose_controller_decided_nothing_say_so(cli, tmp_path):
    # One node on a single switch: nothing for the controller to act on. The paced row equalled the
    # baseline's to every digit, and nothing told "pacing found nothing to do" from "did not run".
    out = tmp_path / "s"
    r = cli("study", *SMALL, "--nodes", "1", "--repeats", "2", "--compare", "baseline,paced",
            "--out", str(out))
    assert r.returncode == 0, r.stderr
    rows = {row["mode"]: row for row in json.loads(r.stdout)["rows"]}
    assert rows["paced"]["pacing_decisions"] == 0 and rows["baseline"]["pacing_decisions"] is None
    points = json.loads((out / "study.json").read_text())["points"]
    assert [p["pacing_decisions"] for p in points if p["mode"] == "paced"] == [0, 0]
    text = _render(list(rows.values()))
    assert "paced at 1 node: the controller made no pacing decision" in text, text


def test_paced_rows_count_the_decisions_the_controller_made(tmp_path):
    # The paper cluster in rendezvous order at 8 nodes: the placement policy acts at the first window.
    from fabricpace.study import StudyPlan, load_scenario, run_study

    sc = load_scenario("paper")
    plan = StudyPlan(backend="sim", nodes=(8,), modes=("baseline", "paced"), repeats=1, steps=60, warmup=10,
                     seed=1, out_dir=tmp_path / "s", cluster=sc.cluster, workload=sc.workload, noise=sc.noise,
                     node_order="shuffled")
    rows = {r["mode"]: r for r in run_study(plan).rows}
    assert rows["paced"]["pacing_decisions"] >= 1
    assert "no pacing decision" not in _render(list(rows.values()))
