"""simulate and study describe the same run over the same steps: simulate's default warm-up is the
scenario's ``study.warmup`` (docs/simulator.md says so), and its JSON says which warm-up it used."""

from __future__ import annotations

import json


def _scenario(tmp_path, write_yaml, *, warmup=6, steps=16):
    folder = tmp_path / "sc"
    folder.mkdir()
    write_yaml(folder / "noise.yaml", {"jitter": {"cv": 0.05}})
    write_yaml(
        folder / "scenario.yaml",
        {"name": "t", "cluster": "single-switch", "workload": "resnet-50", "noise": "noise.yaml",
         "study": {"nodes": [2], "steps": steps, "warmup": warmup, "repeats": 1}},
    )
    return folder


def test_simulate_measures_a_scenario_run_as_study_does(cli, tmp_path, write_yaml):
    # Before: simulate left out 14 of these 16 steps (its own default 20, fewer on short runs), study 6,
    # so one run (paper scenario, 16 nodes, 300 steps, seed 1) read 3368.6 samples/s, CV 0.026 over 280
    # steps in simulate and 3364.0, CV 0.028 over 250 steps in study.
    sc = _scenario(tmp_path, write_yaml)
    r = cli("simulate", "--scenario", str(sc), "--nodes", "2", "--steps", "16", "--seed", "1", "--format",
            "json", "--out", str(tmp_path / "sim"))
    assert r.returncode == 0, r.stderr
    sim = json.loads(r.stdout)
    r = cli("study", "--scenario", str(sc), "--no-figures", "--out", str(tmp_path / "study"))
    assert r.returncode == 0, r.stderr
    (point,) = json.loads((tmp_path / "study" / "study.json").read_text())["points"]
    assert sim["steps"] == point["steps"] == 10
    assert sim["throughput"] == point["throughput"] and sim["cv"] == point["cv"]
    assert sim["warmup"] == 6


def test_scenario_warmup_is_lowered_on_short_runs(cli, tmp_path, write_yaml):
    # "fewer on short runs", as without a scenario: two steps stay measured
    sc = _scenario(tmp_path, write_yaml, warmup=50, steps=60)
    r = cli("simulate", "--scenario", str(sc), "--nodes", "1", "--steps", "8", "--format", "json",
            "--out", str(tmp_path / "sim"))
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["warmup"] == 6 and doc["steps"] == 2


def test_explicit_warmup_wins_and_default_without_scenario_is_20(cli, tmp_path, write_yaml):
    sc = _scenario(tmp_path, write_yaml)
    r = cli("simulate", "--scenario", str(sc), "--nodes", "1", "--steps", "16", "--warmup", "3",
            "--format", "json", "--out", str(tmp_path / "a"))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["warmup"] == 3 and json.loads(r.stdout)["steps"] == 13
    r = cli("simulate", "--cluster", "single-switch", "--workload", "resnet-50", "--nodes", "1", "--steps",
            "30", "--format", "json", "--out", str(tmp_path / "b"))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["warmup"] == 20 and json.loads(r.stdout)["steps"] == 10
