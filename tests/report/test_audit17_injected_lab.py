"""What a lab run injected, held against its steps and its placement (audit 17 A4, findings 4 and 7).

Two real lab runs of the audit (4 gloo ranks in namespaces, 2 leaves; ``lab/logs`` and the optional
tables left out): ``lab-uplink-drop`` (uplink 200 -> 20 Mbit/s "after 4 s": it landed 0.49 s before the
ranks were done, after the last of its 40 steps, and the report said "applied") and ``lab-slow-inter``
(interleaved placement on 20 Mbit/s uplinks, no other fault: the report said "Nothing injected ... (a
healthy baseline)" next to its own topology_contention finding).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from fabricpace.report import injected as inj
from fabricpace.report.html import render_report
from fabricpace.run import read_manifest

DATA = Path(__file__).parent / "data"


def _section(html: str) -> str:
    from tests.report.test_injected import text_of

    return text_of(html[html.index('id="injected"') - 4:html.index('id="runs"') - 4])


def _with_events(tmp_path: Path, events: list[dict]) -> Path:
    run = tmp_path / "uplink-drop"
    shutil.copytree(DATA / "lab-uplink-drop", run)
    lab = json.loads((run / "lab" / "lab.json").read_text())
    lab["events"] = events
    (run / "lab" / "lab.json").write_text(json.dumps(lab))
    return run


def _uplink_line(run: Path) -> str:
    m = read_manifest(run)
    got = inj.from_manifest(m.source, m.extra, run)
    assert got is not None
    return next(line for line in inj.fault_lines(got.faults) if line.startswith("every uplink"))


def test_report_says_a_change_after_the_last_step_ran_under_no_step(tmp_path: Path) -> None:
    late = {"event": "uplink_change", "rate": "20mbit", "progress_step": 30, "steps": 40, "applied": True,
            "t_ns": 4_758_000_000, "first_step": None, "last_step": 39}
    line = _uplink_line(_with_events(tmp_path / "a", [late]))
    assert "applied" not in line.split("—")[1]
    assert "after the run's last step 39 had ended: no step ran under it" in line
    skipped = {"event": "uplink_change", "rate": "20mbit", "progress_step": 40, "steps": 40, "applied": False}
    line = _uplink_line(_with_events(tmp_path / "b", [skipped]))
    assert line.endswith("scheduled at step 40, after the run's last step 39: not applied")
    mid = late | {"first_step": 15, "t_ns": 1_800_000_000}
    run = _with_events(tmp_path / "c", [mid])
    assert _uplink_line(run).endswith("applied during step 15: steps 15–39 ran under it")
    assert "steps 15–39 ran under it" in _section(render_report([run]))


def test_report_lists_an_interleaved_placement_as_injected(tmp_path: Path) -> None:
    run = tmp_path / "slow-inter"
    shutil.copytree(DATA / "lab-slow-inter", run)
    section = _section(render_report([run]))
    assert "Nothing injected" not in section and "healthy baseline" not in section
    assert "rank order placement interleaved, rank -> node 0,2,1,3" in section
    assert "the ring crosses leaves 4× per all-reduce (at least 2 with these nodes)" in section
    assert "uplinks 20mbit, node links 1gbit" in section
    # a contiguous run stays a baseline, with its placement and fabric said as notes
    m = read_manifest(DATA / "lab-uplink-drop")
    got = inj.from_manifest(m.source, m.extra, DATA / "lab-uplink-drop")
    assert got is not None and all(f.where != "rank order" for f in got.faults)
    assert any("placement contiguous" in n and "2×" in n for n in got.notes)
