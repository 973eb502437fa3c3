"""`lab run` through the real CLI: bad input is one line and exit 2; --backend local runs on loopback."""

from __future__ import annotations

import json

import pytest


def test_unknown_scenario_is_exit_2(cli, tmp_path):
    r = cli("lab", "run", "--scenario", "no-such-scenario", "--out", str(tmp_path / "r"))
    assert r.returncode == 2
    assert "no-such-scenario" in r.stderr and "healthy" in r.stderr and r.stderr.count("\n") == 1


def test_bad_scenario_field_names_file_and_field(cli, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nworld: 4\nfaults:\n  throttle: {ranks: [1], cpus: -1}\n")
    r = cli("lab", "run", "--scenario", str(bad), "--out", str(tmp_path / "r"))
    assert r.returncode == 2
    assert str(bad) in r.stderr and "faults.throttle.cpus" in r.stderr


def test_existing_run_directory_is_never_overwritten(cli, tmp_path):
    out = tmp_path / "r"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    r = cli("lab", "run", "--scenario", "healthy", "--backend", "local", "--out", str(out))
    assert r.returncode == 2 and "not empty" in r.stderr
    assert (out / "keep.txt").read_text() == "mine"


@pytest.mark.slow
def test_local_backend_runs_the_worker_on_loopback(cli, tmp_path):
    import fabricpace

    out = tmp_path / "local"
    r = cli("lab", "run", "--scenario", "healthy", "--backend", "local", "--nodes", "2", "--steps", "30",
            "--out", str(out), "--format", "json")
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout)["world"] == 2
    run = fabricpace.load_run(out)
    assert run.manifest.source == "local" and run.manifest.complete
    assert run.steps.height == 2 * 30
    assert set(run.steps["samples"].to_list()) == {64}  # batch_per_rank, pacing off
    assert (out / "lab" / "lab.json").is_file()
