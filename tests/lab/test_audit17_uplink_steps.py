"""An uplink change is placed on the run's steps (audit 17 A4, finding 4).

The launcher recorded only the wall-clock time of a scenario's ``uplink_change``; one that landed after
the run's last step (every transfer at the old rate) read "applied" in the report. The change now
carries its clock reading, and ``lab.annotate`` turns it into the first step that ran under it. Runs on
the real steps of an audit lab run (``tests/report/data/lab-uplink-drop``); needs no root.
"""

from __future__ import annotations

import json
from pathlib import Path

from fabricpace.lab.annotate import place_changes
from fabricpace.run import load_run

RUN = Path(__file__).parents[1] / "report" / "data" / "lab-uplink-drop"


def test_an_uplink_change_is_placed_on_the_run_steps(tmp_path: Path) -> None:
    """The launcher turns the change's clock reading into the steps that ran under it."""
    run = RUN
    t0 = json.loads((run / "lab" / "t0.json").read_text())["t0_monotonic_ns"]
    steps = load_run(run, all_steps=True).steps
    last_end = int(steps["t_end_ns"].max())  # 4.27 s: the last step's end on any rank
    step15 = int(steps.filter(steps["step"] == 15)["t_start_ns"].max())
    change = {"event": "uplink_change", "rate": "20mbit", "applied": True}
    late = change | {"monotonic_ns": t0 + last_end + 490_000_000}  # as in the audit: 0.49 s after
    mid = change | {"monotonic_ns": t0 + step15 + 1_000_000}
    place_changes(run, events := [late, mid], t0)
    assert events[0]["first_step"] is None and events[0]["last_step"] == 39
    assert events[0]["t_ns"] == last_end + 490_000_000
    assert events[1]["first_step"] == 15 and events[1]["last_step"] == 39
