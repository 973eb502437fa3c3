"""HTML report and Perfetto export: golden run table, offline self-contained HTML, bad input via the CLI."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from fabricpace._errors import InputError
from fabricpace.importers.synthetic import SyntheticJob, write_job
from fabricpace.report import data as rd
from fabricpace.report.html import findings_html, render_report, summary_table, write_report
from fabricpace.report.perfetto import export_perfetto
from fabricpace.run import load_run

GOLDEN = Path(__file__).parent / "data" / "summary_table.golden.html"


def test_run_table_matches_golden(tiny_run: Path) -> None:
    """Values in the golden file were computed by hand (see write_tiny_run's docstring)."""
    html = summary_table([rd.summarize(load_run(tiny_run), "tiny")])
    assert html + "\n" == GOLDEN.read_text()


def test_breakdown_and_last_arrivers_by_hand(tiny_run: Path) -> None:
    run = load_run(tiny_run)
    b = rd.breakdown(run)
    assert b["skew_wait"].to_list() == [10.0, 8.0, 0.0]
    assert b["transfer"].to_list() == [10.0, 10.0, 10.0]
    inst = rd.instances(run)
    assert inst["skew_ns"].to_list() == [10_000_000] * 4
    assert inst["transfer_ns"].to_list() == [10_000_000] * 4
    share = rd.last_arriver_share(inst, [0, 1, 2])
    assert share["share"].to_list() == [0.0, 0.0, 1.0]
    _ranks, cols, mats, per_col = rd.heatmap_matrices(run, max_cols=2)
    assert per_col == 2 and list(cols) == [0, 2]
    assert np.allclose(mats["dur_ns"], [[105.0, 125.0]] * 3)
    assert np.allclose(mats["skew_wait_ns"][:, 0], [10.0, 8.0, 0.0])


def test_findings_section_orders_and_labels() -> None:
    diag = {
        "healthy": False,
        "findings": [
            {
                "mode": "sync_amplification",
                "run": "/x/run8",
                "severity_pct": 3.0,
                "confidence": 0.7,
                "culprits": {"ranks": [], "nodes": []},
                "evidence": {"skew_share": 0.031},
                "what_if_saving_pct": 2.0,
                "recommendation": "lockstep gc",
            },
            {
                "mode": "persistent_straggler",
                "run": "/x/run8",
                "severity_pct": 12.5,
                "severity_ci_pct": [11.0, 14.0],
                "confidence": 0.99,
                "culprits": {"ranks": [5], "nodes": [1]},
                # As the diagnosis wrote it for the README's ex1 run (U7's report: a raw dict dump).
                "evidence": {
                    "last_arriver_share": 0.97,
                    "median_lateness_ms": 21.506565,
                    "component_excess_ms": {"compute": 22.91, "data": -0.004997, "gc": 0.05412, "paced": 0},
                    "transfer_inflation_median": 1.769863,
                    "cause": "slower own compute",
                    "steps": 180,
                    "shared_locality": None,
                },
                "what_if_saving_pct": 12.0,
                "recommendation": "drain <node 1>",
            },
        ],
        "abstained": [{"run": "/x/run8", "mode": "topology_contention", "reason": "no cluster file"}],
    }
    html = findings_html(diag, None)
    assert html.index("persistent_straggler") < html.index("sync_amplification")  # most severe first
    assert "12.5% [CI 11.0–14.0]" in html and "rank 5; node 1" in html
    assert "drain &lt;node 1&gt;" in html  # escaped
    evidence = html[html.index('<ul class="evidence">') + 21 : html.index("</ul>")]
    shown_items = re.findall(r"<li(?: title=\"[^\"]*\")?>([^<]*)</li>", evidence)
    for shown in ("last arriver share: 97.0%", "median lateness: 21.51 ms",
                  "component excess: compute +22.91 ms; gc +0.05 ms", "transfer inflation median: ×1.77",
                  "cause: slower own compute", "steps: 180"):
        assert shown in shown_items, (shown, evidence)
    text = " ".join(shown_items)
    for raw in ("None", "{", "=", "_", "-0.00", "data", "paced", "shared locality"):
        assert raw not in text, (raw, evidence)
    assert "topology_contention (run8): no cluster file" in html
    assert "Healthy" in findings_html({"healthy": True, "findings": []}, None)
    assert "Undecided" in findings_html(
        {"healthy": False, "findings": [], "abstained": ["too few steps"]}, None
    )


def test_report_is_offline_and_self_contained(tiny_run: Path, tmp_path: Path) -> None:
    job = SyntheticJob(world_size=4, steps=5, kernels_per_step=4, slow_rank=1)
    from fabricpace.importers.kineto import import_kineto

    other = import_kineto(write_job(tmp_path / "k", job, gz=True)[0].parent, tmp_path / "k_run")
    html = render_report([tiny_run, other], findings=False)
    assert html.count("<script") == html.count("</script>")
    assert 'src="http' not in html and "src='http" not in html  # nothing fetched: works offline
    assert html.count("Plotly JavaScript") <= 1 or html.count("plotly.js v") == 1  # the library once
    assert html.index('<h2 id="findings">') < html.index('<h2 id="runs">') < html.index('id="heatmap-0"')
    for div in ("scaling-fig", "heatmap-0", "skew-0", "last-0", "breakdown-0", "timeline-0", "heatmap-1"):
        assert f'id="{div}"' in html, div


def test_perfetto_export(tiny_run: Path, tmp_path: Path) -> None:
    out = export_perfetto(tiny_run, tmp_path / "trace.json")
    doc = json.loads(out.read_text())
    ev = doc["traceEvents"]
    names = [e for e in ev if e["ph"] == "M" and e["name"] == "process_name"]
    assert sorted(e["pid"] for e in names) == [0, 1, 2]
    steps = [e for e in ev if e.get("cat") == "step"]
    coll = [e for e in ev if e.get("cat") == "collective"]
    assert len(steps) == 12 and len(coll) == 12
    first = next(e for e in coll if e["pid"] == 0 and e["args"]["seq"] == 0)
    assert first["ts"] == 50_000.0 and first["dur"] == 20_000.0  # µs
    assert first["args"]["skew_wait_ns"] == 10_000_000 and first["args"]["transfer_ns"] == 10_000_000
    part = json.loads(export_perfetto(tiny_run, tmp_path / "part.json", steps=(1, 2)).read_text())
    assert len([e for e in part["traceEvents"] if e.get("cat") == "step"]) == 6


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("report", "{missing}", "-o", "{tmp}/r.html"), "not a directory"),
        (("export", "perfetto", "{tiny}", "-o", "{tmp}/t.json", "--steps", "40:50"), "no such steps"),
    ],
)
def test_cli_bad_input_one_line_exit_2(cli, tiny_run: Path, tmp_path: Path, args, needle) -> None:  # type: ignore[no-untyped-def]
    argv = [a.format(missing=tmp_path / "nope", tmp=tmp_path, tiny=tiny_run) for a in args]
    r = cli(*argv)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], r.stderr
    assert not (tmp_path / "r.html").exists() and not (tmp_path / "t.json").exists()


def test_output_that_is_a_folder_is_refused(tiny_run: Path, tmp_path: Path) -> None:
    with pytest.raises(InputError, match="is a directory"):
        write_report([tiny_run], tmp_path)
    with pytest.raises(InputError, match="is a directory"):
        export_perfetto(tiny_run, tmp_path)


def test_cli_report_with_findings(cli, tiny_run: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "report.html"
    r = cli("report", str(tiny_run), "-o", str(out))
    assert r.returncode == 0, r.stderr
    html = out.read_text()
    assert '<h2 id="findings">Findings</h2>' in html and "tiny" in html


def _bucketed_run(out: Path) -> Path:
    """2 ranks × 3 steps of 100 ms; 4 DDP-style buckets per step launched 1 ms apart without waiting:
    rank 0 enters them at +10..+13 ms, rank 1 (slow) at +50..+53 ms, all finish at +60..+63 ms.

    By hand: rank 0 waits in [10, 50], [11, 51], [12, 52], [13, 53] — overlapping, 43 ms in all (their
    sum, 160 ms, is longer than the step); rank 1 waits 0. Skew wait per rank-step (43 + 0) / 2 =
    21.5 ms = 21.5% of the 100 ms step.
    """
    from fabricpace.run import Manifest, RunWriter

    ms = 1_000_000
    w = RunWriter(out, Manifest(source="test", world_size=2, nodes=1, gpus_per_node=2))
    for r in range(2):
        starts = [0, 100, 200]
        enter = 10 if r == 0 else 50
        blocked = [(63 - enter) * ms] * 3  # from the first bucket's launch to the last one's end
        w.write("steps", {"rank": [r] * 3, "step": [0, 1, 2], "t_start_ns": [s * ms for s in starts],
                          "t_end_ns": [(s + 100) * ms for s in starts], "compute_ns": [enter * ms] * 3,
                          "wait_ns": blocked, "comm_ns": blocked, "data_ns": [0] * 3, "gc_ns": [0] * 3,
                          "paced_ns": [0] * 3, "samples": [8] * 3}, rank=r)
        rows = [(step, s + enter + b, s + 60 + b, 4 * step + b)
                for step, s in enumerate(starts) for b in range(4)]
        w.write("collectives", {
            "rank": [r] * 12, "step": [x[0] for x in rows], "seq": [x[3] for x in rows], "group": ["dp"] * 12,
            "op": ["all_reduce"] * 12, "bytes": [1 << 20] * 12,
            "t_enter_ns": [x[1] * ms for x in rows], "t_exit_ns": [x[2] * ms for x in rows],
        }, rank=r)
    w.close()
    return out


def test_skew_wait_counts_overlapping_bucket_waits_once(tmp_path: Path) -> None:
    """U7: the README's ex1 run showed "skew wait / step 161.6%" — per-bucket waits summed."""
    run = load_run(_bucketed_run(tmp_path / "b"))
    s = rd.summarize(run, "b")
    assert s.skew_share == pytest.approx(0.215)
    assert rd.breakdown(run)["skew_wait"].to_list() == pytest.approx([43.0, 0.0])
    # Streamed in chunks of about one step (instances never split): the same answer.
    from fabricpace.run.reader import StepChunks

    streamed = rd.collective_stats(StepChunks(tmp_path / "b"), rows_per_chunk=8)
    assert sorted(streamed.waits.rows()) == sorted(rd.collective_stats(run).waits.rows())
    assert "<td class=\"num\">21.5%</td>" in summary_table([s])


@pytest.mark.parametrize("verb", ["report", "export"])
def test_existing_output_file_is_never_overwritten(cli, tiny_run: Path, tmp_path: Path, verb: str) -> None:  # type: ignore[no-untyped-def]
    """U7: report (default -o report.html) and export perfetto replaced files silently."""
    out = tmp_path / ("report.html" if verb == "report" else "t.json")
    out.write_text("the user's file\n")
    argv = ("report", str(tiny_run), "--no-findings") if verb == "report" else (
        "export", "perfetto", str(tiny_run))
    r = cli(*argv, "-o", str(out))
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "exists; choose a new file name" in lines[0], r.stderr
    assert out.read_text() == "the user's file\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == [out.name]  # no temp file left behind
    # The default name too: run where report.html already exists.
    if verb == "report":
        r = cli("report", str(tiny_run), "--no-findings", cwd=tmp_path)
        assert r.returncode == 2 and "report.html: exists" in r.stderr, r.stderr
        assert out.read_text() == "the user's file\n"


def test_per_rank_timeline_gives_every_rank_a_row(tiny_run: Path) -> None:
    """U7: with 4 ranks the report's "Per-rank timeline" collapsed to one ~20 px row (a fixed height for
    margins + legend left no room for the bars). Checked on the figure as the report embeds it."""
    html = render_report([tiny_run], findings=False)
    start = html.index('id="phases-0"')
    from dataclasses import replace

    from fabricpace.report.html import default_steps
    from fabricpace.report.timeline import timeline_figure
    from fabricpace.run.reader import StepChunks

    run = load_run(tiny_run, tables=("ranks", "steps"))
    window = default_steps(run)
    assert window is not None
    fig = timeline_figure(replace(run, collectives=StepChunks(tiny_run).read(*window)), window)
    lay = fig.layout
    plot_px = lay.height - (lay.margin.t if lay.margin.t is not None else 100) - (
        lay.margin.b if lay.margin.b is not None else 80)
    assert plot_px >= 24 * 3, (lay.height, lay.margin)  # at least 24 px per rank
    assert list(lay.yaxis.categoryarray) == ["rank 0", "rank 1", "rank 2"]
    assert lay.legend.yref == "container"  # the legend has its own strip, not a share of the plot
    # The report embeds this figure as it is (no layout override shrinking it again).
    div = html[start : html.index("</script>", start)]
    assert f'"height":{lay.height}' in div and '"categoryarray":["rank 0","rank 1","rank 2"]' in div


def test_evidence_of_every_shape_reads_as_words() -> None:
    from fabricpace.report.evidence import items

    got = dict(items({
        "stage_work_ms": {"2": 104.02, "0": 79.98},
        "stage_max_over_median": 1.3,
        "slow_stage_excess_over_median_stage": 0.301,
        "shared_locality": {"attribute": "gpu", "values": ["1:GPU1"], "precision": 1.0,
                            "ranks_with_values": 1},
        "hot_groups": [{"group": f"pair{i}", "excess_ms": 10.0 + i, "inflation": 4.0} for i in range(6)],
        "skew_share_by_world_size": [[4, 0.031], [16, 0.052]],
        "data_ms_per_step_median_rank": 20.52,
        "period_runs_z": -10.87,
        "notes": [],
        "severity_ci_pct": None,
    }))
    assert got == {
        "stage work": "stage 2: 104.02 ms; stage 0: 79.98 ms",
        "stage max over median": "×1.30",
        "slow stage excess over median stage": "30.1%",
        "shared locality": "GPU1 on node 1 (precision 100%, 1 rank has it)",
        "hot groups": "group pair0, excess 10.00 ms, inflation ×4.00; group pair1, excess 11.00 ms, "
                      "inflation ×4.00; group pair2, excess 12.00 ms, inflation ×4.00; group pair3, excess "
                      "13.00 ms, inflation ×4.00; … and 2 more",
        "slowest − median rank's own work, share of step, by rank count": "4: 3.1%; 16: 5.2%",
        "data per step median rank": "20.52 ms",
        "clustering of inflated steps (runs-test z)": "-10.87",
    }
