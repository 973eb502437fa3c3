"""fabricpace lab: option values that cannot mean anything are one line and exit 2, before any work.

These checks run before the lab is touched (no root, no namespaces, no ranks), so they need no lab.
Before session 8, ``lab run --steps -3`` started four ranks, trained nothing and printed "healthy: 4
ranks, -3 steps" with exit 0, leaving an empty run directory behind; ``lab measure --seconds -1``
quietly measured for 0.5 s.
"""

from __future__ import annotations

import pytest


def _one_line(r, *needles: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("fabricpace: error: ")
    for needle in needles:
        assert needle in lines[0], lines[0]
    assert r.stdout == ""


def _down_if_built(prefix: str) -> None:
    """Code that ignored the option built a lab; take it down so a failing test leaves nothing behind."""
    from fabricpace.lab._sh import lab_unavailable_reason

    if lab_unavailable_reason() is None:
        from fabricpace.lab import fabric

        if fabric.leftovers(prefix):
            fabric.down(prefix)


@pytest.mark.parametrize("backend", ["lab", "local"])
def test_lab_run_negative_steps_is_refused_before_anything_runs(cli, tmp_path, backend):
    out = tmp_path / "run"
    try:
        r = cli("lab", "run", "--steps", "-3", "--out", str(out), "--backend", backend, "--prefix", "fpw-")
    finally:
        _down_if_built("fpw-")
    _one_line(r, "--steps -3")
    assert not out.exists()  # nothing started, nothing written
    assert not (tmp_path / ".run.lab").exists()


@pytest.mark.parametrize("seconds", ["-1", "0"])
def test_lab_measure_non_positive_seconds_is_refused(cli, seconds):
    r = cli("lab", "measure", "--seconds", seconds, "--prefix", "fpw-")
    _one_line(r, f"--seconds {seconds}")


def test_lab_run_fault_on_a_rank_the_run_lacks_is_refused(cli, tmp_path):
    scenario = tmp_path / "th7.yaml"
    scenario.write_text("name: th7\nworld: 4\nsteps: 10\nfaults:\n  throttle: {ranks: [7], cpus: 0.5}\n")
    out = tmp_path / "run"
    try:  # before: the 4 ranks trained with no fault at all, exit 0
        r = cli("lab", "run", "--scenario", str(scenario), "--backend", "local", "--steps", "3",
                "--out", str(out), "--prefix", "fpw-")
    finally:
        _down_if_built("fpw-")
    _one_line(r, "faults.throttle.ranks [7]", "0-3")
    assert not out.exists()
    # beyond what a scenario file's `world` may ask for (before: 65 local ranks started on this machine)
    r = cli("lab", "run", "--nodes", "65", "--backend", "local", "--out", str(out), "--prefix", "fpw-")
    _one_line(r, "--nodes 65")
    assert not out.exists()
