"""simulate on a scenario folder without a ``study:`` block (audit 17 A1 finding 6).

Such a folder's warm-up is study's default, 50 (so simulate and study still measure a run over the same
steps); the help and docs/simulator.md used to read "the scenario's study.warmup, else 20", which a user
whose file has no ``study:`` block read as 20. And a 30-step run printed "2 steps after warm-up ... CV
0.000" without a word that two steps are no measurement: now one stderr line says so.
"""

from __future__ import annotations

import json


def _bare_scenario(tmp_path):
    folder = tmp_path / "sc"
    folder.mkdir()
    (folder / "scenario.yaml").write_text("name: x\ncluster: single-switch\nworkload: resnet-50\n")
    return folder


def test_a_scenario_without_study_block_warms_up_as_study_does(cli, tmp_path):
    sc = _bare_scenario(tmp_path)
    r = cli("simulate", "--scenario", str(sc), "--nodes", "1", "--steps", "100", "--format", "json",
            "--out", str(tmp_path / "sim"))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["warmup"] == 50
    assert "steps measured" not in r.stderr  # 50 steps measured: no note
    r = cli("simulate", "--help")
    assert "50 when" in " ".join(r.stdout.split()), r.stdout


def test_a_run_with_few_steps_after_warmup_says_so(cli, tmp_path):
    sc = _bare_scenario(tmp_path)
    r = cli("simulate", "--scenario", str(sc), "--nodes", "1", "--steps", "30", "--out", str(tmp_path / "a"))
    assert r.returncode == 0, r.stderr
    assert "2 steps after warm-up" in r.stdout
    notes = [ln for ln in r.stderr.splitlines() if "steps measured" in ln]
    assert len(notes) == 1, r.stderr
    note = notes[0]
    # what was left out and why, that a CV of 2 steps is not a CV, and the fix
    assert "only 2 steps measured of 30 after warm-up 28" in note, note
    assert "study's default 50, as scenario.yaml sets no study.warmup, lowered to fit" in note, note
    assert "--steps 60" in note and "--warmup" in note, note
    # an explicit --warmup that leaves few steps gets the same line; JSON output too (on stderr)
    r = cli("simulate", "--cluster", "single-switch", "--workload", "resnet-50", "--nodes", "1", "--steps",
            "12", "--warmup", "5", "--format", "json", "--out", str(tmp_path / "b"))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["steps"] == 7
    assert "only 7 steps measured of 12 after --warmup 5;" in r.stderr and "--steps 15" in r.stderr, r.stderr
    # 10 or more measured steps: no note
    r = cli("simulate", "--cluster", "single-switch", "--workload", "resnet-50", "--nodes", "1", "--steps",
            "30", "--out", str(tmp_path / "c"))
    assert r.returncode == 0, r.stderr
    assert "steps measured" not in r.stderr
