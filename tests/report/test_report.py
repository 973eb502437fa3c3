"""HTML report and Perfetto export: golden run table, offline self-contained HTML, bad input via the CLI."""

from __future__ import annotations

import json
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
                "evidence": {"last_arriver_share": 0.97, "shared_locality": {"attribute": "gpu"}},
                "what_if_saving_pct": 12.0,
                "recommendation": "drain <node 1>",
            },
        ],
        "abstained": [{"run": "/x/run8", "mode": "topology_contention", "reason": "no cluster file"}],
    }
    html = findings_html(diag, None)
    assert html.index("persistent_straggler") < html.index("sync_amplification")  # most severe first
    assert "12.5% [CI 11.0–14.0]" in html and "ranks 5; nodes 1" in html
    assert "drain &lt;node 1&gt;" in html  # escaped
    assert "shared_locality = {attribute: gpu}" in html
    assert "no cluster file" in html
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
    assert html.index("<h2>Findings</h2>") < html.index("<h2>Runs</h2>") < html.index('id="heatmap-0"')
    for div in ("scaling", "heatmap-0", "skew-0", "last-0", "breakdown-0", "timeline-0", "heatmap-1"):
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
    assert "<h2>Findings</h2>" in html and "tiny" in html
