"""`fabricpace demo` says what it injects and holds the diagnosis against it (audit 16, finding 6).

It used to say only "host noise + a slow rank": nothing named the 0.08-CPU cgroup quota on rank 2 or
the GC churn on every rank, so a new user could not tell whether "persistent_straggler rank 2, cause:
longer GC pauses" was right. The lines come from the scenario file, not from text in the demo.
The whole demo, end to end, is tests/cli/test_demo.py.
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

from fabricpace.cli import demo
from fabricpace.diagnose import diagnose
from fabricpace.lab import cgroup

SHIPPED = Path(str(resources.files("fabricpace") / "data" / "demo" / "local-noisy.yaml"))
REAL = Path(__file__).parents[1] / "diagnose" / "data" / "real" / "demo-throttled-rank2-load"
AS_QUOTA = os.geteuid() == 0 and cgroup.available()


def _injection_text(scenario: Path, capsys) -> str:
    inj, world = demo._injection(scenario)
    demo._print_injection(inj, scenario, world)
    return capsys.readouterr().out


def test_demo_prints_what_its_shipped_scenario_injects(capsys) -> None:
    text = _injection_text(SHIPPED, capsys)
    head = f"what the demo injects into both local runs (4 ranks; scenario demo-local-noisy, {SHIPPED})"
    assert head in text
    if AS_QUOTA:
        assert "\n  rank 2: CPU quota 0.08 CPUs (a cgroup CPU quota on the rank's process)\n" in text, text
    else:  # the launcher's stand-in without root
        assert "\n  rank 2: extra compute each step (the stand-in for a CPU quota of 0.08 CPUs)" in text, text
    assert "\n  every rank: GC churn: 10,000–30,000 cyclic objects allocated per step (mean 20,000), each " \
           "living 3 steps, over a live heap of 300,000 objects" in text


def test_the_lines_follow_the_scenario_file(tmp_path: Path, capsys) -> None:
    """Another scenario file, other lines: nothing is hard-coded."""
    sc = tmp_path / "mine.yaml"
    sc.write_text("name: mine\nworld: 3\nfaults:\n  throttle: {ranks: [0, 1], cpus: 0.2}\n"
                  "  gc_noise: {ranks: [2], heap: 1000, churn: 500, lifetime: 2}\n")
    text = _injection_text(sc, capsys)
    assert "(3 ranks; scenario mine," in text
    assert "\n  ranks 0 and 1: " in text and "0.2 CPUs" in text
    assert "\n  rank 2: GC churn: 250–750 cyclic objects allocated per step (mean 500), each living 2 " \
           "steps, over a live heap of 1,000 objects" in text
    healthy = tmp_path / "none.yaml"
    healthy.write_text("name: none\nworld: 2\n")
    assert "\n  nothing (the scenario has no faults)\n" in _injection_text(healthy, capsys)


def test_demo_holds_a_real_diagnosis_against_the_injection(capsys) -> None:
    """The diagnosis of a real recorded demo run (rank 2 under the quota), whatever it names."""
    inj, _ = demo._injection(SHIPPED)
    demo._print_verdict(inj, diagnose(REAL).to_dict())
    line = capsys.readouterr().out.strip().splitlines()[0]
    assert line.startswith("diagnosis against the injection: the diagnosis named "), line
    assert "rank 2, the rank the demo slowed (" in line or "named rank 2 — the rank the demo slowed (" in line


def test_a_gc_cause_is_set_next_to_the_injected_quota(capsys) -> None:
    """The audit's diagnosis: persistent_straggler rank 2, cause "longer GC pauses" (the quota makes
    rank 2's walks of its 300k-object heap slow: a symptom). The demo says both."""
    inj, _ = demo._injection(SHIPPED)
    diag = {"findings": [{"mode": "persistent_straggler", "culprits": {"ranks": [2], "nodes": [2]},
                          "evidence": {"cause": "longer GC pauses"}},
                         {"mode": "sync_amplification", "culprits": {"ranks": [], "nodes": []},
                          "evidence": {}}]}
    demo._print_verdict(inj, diag)
    lines = capsys.readouterr().out.strip().splitlines()
    how = "CPU quota 0.08 CPUs" if AS_QUOTA else "extra compute each step"
    assert lines[0] == f"diagnosis against the injection: the diagnosis named rank 2 — the rank the demo " \
                       f"slowed ({how})"
    assert lines[1] == (f"  persistent_straggler on rank 2: the cause \"longer GC pauses\" is the part of "
                        f"the rank's step that grew, as measured; what the demo injected there is the {how}, "
                        "which slows all of the rank's CPU work (its garbage collections included)")
