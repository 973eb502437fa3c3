"""A lab that a run is using is not rebuilt (or shared) under it.

Measured before the fix: with ``lab run --scenario healthy --prefix fpa-`` training, a second terminal's
``lab up --prefix fpa- --nodes 2`` printed "created" with exit 0 — it had torn the lab down, ending the
run's four ranks (the run failed with "rank 0 exited with -15"). A second ``lab run`` in the same lab
would have rebuilt it the same way, or (same shape) started a second job on the same rendezvous port.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from fabricpace.lab import fabric, state
from fabricpace.lab._sh import lab_unavailable_reason
from fabricpace.lab.config import LabConfig

REASON = lab_unavailable_reason()
pytestmark = [pytest.mark.lab, pytest.mark.skipif(REASON is not None, reason=REASON or "")]


def test_up_and_run_refuse_a_lab_a_run_is_using(cli, refused, tmp_path, lab_down_after):
    prefix = "fpy-"
    lab_down_after.append(prefix)
    cfg = LabConfig(nodes=2, leaves=1, prefix=prefix, foreign_hosts=False)
    fabric.up(cfg)
    rank = subprocess.Popen(["ip", "netns", "exec", cfg.node_ns(0), sys.executable, "-c",
                             "import time; time.sleep(120)"])
    try:
        state.record_pid(prefix, rank.pid, "rank 0")  # what the launcher records for each rank
        r = cli("lab", "up", "--prefix", prefix, "--nodes", "3", "--leaves", "1")
        refused(r, f"lab {prefix} is in use", f"rank 0 PID {rank.pid}", "lab down")
        out = tmp_path / "run"
        r = cli("lab", "run", "--prefix", prefix, "--scenario", "healthy", "--out", str(out))
        refused(r, f"lab {prefix} is in use")
        assert rank.poll() is None  # the run's rank still runs
        assert not out.exists() and not (tmp_path / ".run.lab").exists()
        assert fabric.status(prefix)["up"]  # and its lab is as it was
        # The same shape again is no rebuild: still "already up", the rank untouched.
        assert fabric.up(cfg)["action"] == "already up"
        assert rank.poll() is None
    finally:
        rank.kill()
        rank.wait()
    # Once the run is over, a rebuild is fine.
    r = cli("lab", "up", "--prefix", prefix, "--nodes", "3", "--leaves", "1")
    assert r.returncode == 0, r.stderr
