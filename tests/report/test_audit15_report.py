"""Report fixes from user audit 15 (what users read): --steps naming none of a run's steps (finding 12)
and the note of a report made with --no-findings (13). Each test fails on the code the audit ran
(bd929ea)."""

from __future__ import annotations

from pathlib import Path

from fabricpace.report.html import render_report


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
