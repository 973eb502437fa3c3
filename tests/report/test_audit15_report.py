"""Report fixes from user audit 15 (what users read): exposed transfer counted as waiting for peers
(finding 1, High), four numbers under one name with no definitions (5), warm-up rules that differ
from the diagnosis's (6), empty timelines for steps a run does not have (12), the wrong flag named
(13), no word on a run without arrival spread (15) and a raw scaling table (17). Each test fails on
the code the audit ran (bd929ea)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from fabricpace.report import data as rd
from fabricpace.report.html import findings_html, render_report, summary_table
from fabricpace.run import Manifest, RunWriter, load_run

MS = 1_000_000


def test_exposed_transfer_is_not_counted_as_waiting_for_peers(overlapped_run: Path) -> None:
    """Finding 1 (High): buckets in flight during the backward made the union of a rank's
    [arrival, last arrival] intervals span it; capped at the blocked time, all of that time read as
    "wait for peers" and the transfer as 0 (see write_overlapped_run for the numbers by hand)."""
    run = load_run(overlapped_run)
    b = rd.breakdown(run)
    assert b["skew_wait"].to_list() == pytest.approx([20.0, 0.0])  # was [25, 0]
    assert b["transfer"].to_list() == pytest.approx([5.0, 5.0])  # was [0, 5]
    rows = rd.scaling_rows([("o", run)])
    assert rows["skew_wait_ms"][0] == pytest.approx(10.0) and rows["transfer_ms"][0] == pytest.approx(5.0)
    s = rd.summarize(run, "o")
    assert s.skew_share == pytest.approx(0.10)  # 10 ms of a 100 ms step (was 12.5%)
    # Read a step at a time (a rank-step's rows never split from its cut): the same.
    from fabricpace.run.reader import StepChunks

    streamed = rd.collective_stats(StepChunks(overlapped_run), steps=run.steps, rows_per_chunk=8)
    assert sorted(streamed.waits.rows()) == sorted(rd.collective_stats(run).waits.rows())
    assert sorted(streamed.waits["skew_wait_ns"].to_list()) == [0] * 3 + [20 * MS] * 3


def test_report_splits_the_step_as_diagnose_does(tmp_path: Path) -> None:
    """Finding 1 (High), on the simulator's paper scenario: at 8 nodes diagnose read ~25 ms skew and
    ~23 ms exposed comm per step; the report read 47.7 ms "wait for peers" and 0.23 ms transfer (at 16
    nodes 99.8 / 0.4 ms against diagnose's 34.5 / 66.5 ms)."""
    from fabricpace.diagnose import diagnose
    from fabricpace.sim import simulate

    scen = Path(rd.__file__).parents[1] / "data" / "scenarios" / "paper"
    runs = [
        simulate(scen / "cluster.yaml", scen / "workload.yaml", scen / "noise.yaml", nodes=n, steps=60,
                 seed=1, out_dir=tmp_path / f"n{n}")
        for n in (2, 8)
    ]
    diag = diagnose([str(p) for p in runs]).to_dict()
    want = {r["world_size"]: r for r in diag["scaling"]["rows"]}
    warm = [r["metrics"]["warmup_steps"] for r in diag["runs"]]
    got = rd.scaling_rows([(p.name, load_run(p)) for p in runs], warmups=warm)
    for row in got.iter_rows(named=True):
        d = want[row["world_size"]]
        assert row["skew_wait_ms"] == pytest.approx(d["skew_ms"], rel=0.1, abs=1.0), (row, d)
        assert row["transfer_ms"] == pytest.approx(d["exposed_comm_ms"], rel=0.1, abs=1.0), (row, d)
        assert row["step_ms"] == pytest.approx(d["step_ms"], rel=1e-6)
    assert got["transfer_ms"][1] > 10.0  # the fabric's loss shows as transfer, as diagnose says


def _warm_run(out: Path) -> Path:
    """2 ranks × 40 steps: steps 0–3 take 500 ms (warm-up), the rest 100 ± 10 ms."""
    rng = np.random.default_rng(0)
    durs = [500] * 4 + [int(x) for x in 100 + rng.integers(-10, 11, 36)]
    starts = [sum(durs[:s]) for s in range(40)]
    w = RunWriter(out, Manifest(source="test", world_size=2, nodes=1, gpus_per_node=2))
    for r in range(2):
        w.write("steps", {
            "rank": [r] * 40, "step": list(range(40)), "t_start_ns": [s * MS for s in starts],
            "t_end_ns": [(s + d) * MS for s, d in zip(starts, durs, strict=True)],
            "compute_ns": [(d - 5) * MS for d in durs], "wait_ns": [5 * MS] * 40, "comm_ns": [5 * MS] * 40,
            "data_ns": [0] * 40, "gc_ns": [0] * 40, "paced_ns": [0] * 40, "samples": [8] * 40,
        }, rank=r)
    w.close()
    return out


def test_runs_table_uses_the_diagnosis_warmup(tmp_path: Path) -> None:
    """Finding 6: one run had three CVs (demo 0.362, diagnose 1.812, report 2.178): the report counted
    the warm-up steps. The table now uses the diagnosis's warm-up and says so."""
    from fabricpace.diagnose import diagnose

    run_dir = _warm_run(tmp_path / "w")
    metrics = diagnose([str(run_dir)]).to_dict()["runs"][0]["metrics"]
    assert metrics["warmup_steps"] == 4
    s = rd.summarize(load_run(run_dir), "w", warmup=4)
    assert s.steps == 36 and s.warmup == 4
    assert f"{s.cv:.3f}" == f"{metrics['step_cv']:.3f}"
    assert s.median_step_ms == pytest.approx(metrics["step_ms_median"])
    html = render_report([run_dir])
    assert '<td class="num">36 (after 4 warm-up)</td>' in html
    assert f'<td class="num">{metrics["step_cv"]:.3f}</td>' in html


def test_skew_numbers_have_distinct_names_and_definitions() -> None:
    """Finding 5: "median skew (ms)" 41.4, "skew wait / step" 21.9%, "mean skew" 26.2 ms, "skew share
    of step" 5.7% and "skew share by world size" 7.6% were different numbers of one run, none defined
    (nor "iid model skew", "score fleet over own", "period runs z-score", the bare "confidence")."""
    s = rd.RunSummary(name="r", source="sim", world_size=8, nodes=1, steps=10, median_step_ms=100.0,
                      p95_step_ms=110.0, cv=0.05, instances=20, median_skew_ms=4.0, skew_share=0.07,
                      top_last_arriver=3, top_last_share=0.5, warmup=2)
    table = summary_table([s])
    assert "median skew" not in table and "skew wait / step" not in table
    for head in ("arrival spread p50 (ms)", "lost to late peers / step", "steps used", "step CV"):
        assert re.search(r'<th title="[^"]+">' + re.escape(head) + "</th>", table), head
    assert 'class="meta defs"' in table and "<b>lost to late peers / step</b>:" in table
    diag = {"healthy": False, "findings": [{
        "mode": "sync_amplification", "run": "/x/r", "severity_pct": 5.7, "confidence": 0.97,
        "culprits": {}, "what_if_saving_pct": 5.7, "recommendation": "gc",
        "evidence": {"skew_share_of_step": 0.057, "mean_skew_ms": 26.2, "iid_model_skew_ms": 18.4,
                     "skew_share_by_world_size": [[32, 0.05], [128, 0.076]], "period_runs_z": -14.0,
                     "score_fleet_over_own": 0.08, "cause_explains_share": 0.95,
                     "arrival_basis": "aligned clocks"},
    }]}
    html = findings_html(diag, None)
    items = re.findall(r'<li title="([^"]+)">([^<:]+):', html)
    labels = [lab for _d, lab in items]
    assert len(items) == 8 and len(set(labels)) == 8, items  # every term defined, no two alike
    assert not any("skew" in lab for lab in labels), labels
    assert '<span title="share of block-bootstrap' in html and "confidence 0.97" in html
    assert '<details class="glossary">' in html and "<dt>confidence</dt>" in html


def test_steps_outside_the_run_exit_2(cli, tiny_run: Path, tmp_path: Path, refused) -> None:  # type: ignore[no-untyped-def]
    """Finding 12: --steps 500:503 on a run of steps 0–199 exited 0 with empty timelines."""
    out = tmp_path / "s.html"
    refused(cli("report", str(tiny_run), "-o", str(out), "--steps", "500:503", "--no-findings"),
            "--steps 500:503", "it has steps 0–3")
    assert not out.exists()
    r = cli("report", str(tiny_run), "-o", str(out), "--steps", "2:9", "--no-findings")
    assert r.returncode == 0, r.stderr  # a window that overlaps the run is drawn


def test_no_findings_note_names_the_flag_used(tiny_run: Path) -> None:
    """Finding 13: "No diagnosis in this report: run without --findings." (the flag is --no-findings)."""
    html = render_report([tiny_run], findings=False)
    assert "No diagnosis in this report: made with --no-findings." in html
    assert "run without --findings" not in html


def test_no_arrival_spread_is_said_not_drawn_empty(flat_run: Path) -> None:
    """Finding 15: with all ranks arriving together, "Last-arriver share by rank" was an empty plot and
    the spread histogram a bar at 0 on an axis from -0.4 ms, with no word why."""
    html = render_report([flat_run], findings=False)
    assert 'id="last-0"' not in html and 'id="skew-0"' not in html
    assert ("All ranks arrived at the same time at every one of the 27 collective instances after 3 "
            "warm-up steps (arrival spread 0)") in html


def test_scaling_section_reads_as_words(tiny_run: Path, overlapped_run: Path, figure_in) -> None:  # type: ignore[no-untyped-def]
    """Finding 17: raw column names (world_size, step_ms, skew_wait_ms), no heading, the median step
    beside diagnose's mean, efficiency ticks at 22/44/65/87%, a linear N axis, no table of contents."""
    html = render_report([tiny_run, overlapped_run], findings=False)
    start = html.index('<h2 id="scaling">Scaling</h2>')
    table = html[start : html.index("</table>", start)]
    heads = re.findall(r"<th>([^<]+)</th>", table)
    assert heads == ["run", "ranks", "nodes", "mean step (ms)", "compute (ms)", "lost to late peers (ms)",
                     "exposed transfer (ms)", "efficiency"]
    _data, layout = figure_in(html, "scaling-fig")
    assert layout["yaxis2"]["dtick"] == 0.2 and layout["yaxis2"]["tickformat"] == ".0%"
    assert layout["xaxis"]["type"] == "log" and layout["xaxis"]["tickvals"] == [2, 3]
    assert _data[0]["name"] == "mean step (ms)"
    nav = html[html.index('<nav class="toc">') : html.index("</nav>")]
    for anchor in ("findings", "runs", "scaling", "run-0", "run-1"):
        assert f'href="#{anchor}"' in nav and f'<h2 id="{anchor}">' in html
