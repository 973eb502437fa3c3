"""Two lab runs started together, and a second Ctrl-C while a run cleans up.

Before: the busy check read the rank PIDs recorded in the lab's state, and a run records them only
once its ranks start (seconds after the check, while the lab comes up and torch imports). A second
``lab run`` (or ``lab up`` with another shape) in that window passed the check and shared or rebuilt
the first run's lab. And a second Ctrl-C during the clean-up raised KeyboardInterrupt inside it, so
the ranks, the throttle cgroup or the half-written run directory could stay.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from fabricpace.lab import fabric
from fabricpace.lab._sh import lab_unavailable_reason

REASON = lab_unavailable_reason()

# A `lab run` caught between its busy check and its first rank: the lab is up, no PID is recorded yet.
_STARTING_RUN = """
import sys, time
from pathlib import Path
from fabricpace.lab import launcher
from fabricpace.lab.scenario import load_scenario

def spawn(sc, run, *, world, out, args, cfg, rank_node):
    print("lab up, ranks not started yet", flush=True)
    time.sleep(60)

launcher._spawn_workers = spawn
try:
    launcher.run_scenario(load_scenario("healthy"), out=Path(sys.argv[1]), backend="lab", prefix=sys.argv[2],
                          nodes=2, steps=5)
except KeyboardInterrupt:
    sys.exit(130)
"""


@pytest.mark.lab
@pytest.mark.skipif(REASON is not None, reason=REASON or "")
def test_a_run_that_is_starting_keeps_others_out(cli, refused, tmp_path, lab_down_after):
    prefix = "fpz-"
    lab_down_after.append(prefix)
    first = subprocess.Popen([sys.executable, "-c", _STARTING_RUN, str(tmp_path / "first"), prefix],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert first.stdout is not None
        assert "ranks not started yet" in first.stdout.readline(), first.stderr.read() if first.stderr else ""
        assert fabric.live_processes(prefix) == []  # what the old check saw: nobody
        second = tmp_path / "second"
        r = cli("lab", "run", "--prefix", prefix, "--scenario", "healthy", "--nodes", "2", "--steps", "5",
                "--out", str(second), timeout=120)
        refused(r, f"lab {prefix} is in use by another lab run", "lab down")
        assert not second.exists()
        r = cli("lab", "up", "--prefix", prefix, "--nodes", "3", "--leaves", "1")
        refused(r, f"lab {prefix} is in use by a lab run that is starting")
        assert first.poll() is None  # the first run was not disturbed
    finally:
        first.send_signal(signal.SIGTERM)
        first.wait(timeout=60)
    # The claim ends with the run (the kernel drops the lock with its process): the lab is free again.
    r = cli("lab", "up", "--prefix", prefix, "--nodes", "3", "--leaves", "1")
    assert r.returncode == 0, r.stderr


# Ctrl-C during training, then a second one while the launcher cleans up.
_TWICE = """
import os, signal, sys, time
from pathlib import Path
from fabricpace.lab import launcher
from fabricpace.lab.scenario import load_scenario

def spawn(sc, run, *, world, out, args, cfg, rank_node):
    out.mkdir(parents=True, exist_ok=True)
    (out / "manifest.json").write_text("{}")
    run.procs.append(object())

def wait(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(30)

def cleanup(run, cfg, prefix):
    os.kill(os.getpid(), getattr(signal, sys.argv[2]))  # the impatient second signal
    time.sleep(0.3)  # ending the ranks takes a moment
    print("cleanup finished", flush=True)

launcher._spawn_workers, launcher._wait, launcher._cleanup = spawn, wait, cleanup
try:
    launcher.run_scenario(load_scenario("healthy"), out=Path(sys.argv[1]), backend="local", steps=10)
except KeyboardInterrupt:
    print("interrupted", flush=True)
    sys.exit(130)
"""


@pytest.mark.parametrize("second", ["SIGINT", "SIGTERM"])
def test_a_second_interrupt_waits_for_the_cleanup(tmp_path, second):
    out = tmp_path / "run"
    env = dict(os.environ, FABRICPACE_LAB_STATE_DIR=str(tmp_path / "state"))
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-c", _TWICE, str(out), second], capture_output=True, text=True,
                       env=env, timeout=60)
    assert r.returncode == 130, (r.returncode, r.stdout, r.stderr)
    assert "cleanup finished" in r.stdout and "interrupted" in r.stdout
    assert "cleaning up the lab run" in r.stderr and "Traceback" not in r.stderr
    assert not out.exists() and not (tmp_path / ".run.lab").exists()
    assert time.monotonic() - t0 < 30  # the run still ends: the first interrupt stopped it


def test_too_many_ranks_per_cpu_are_warned_about():
    from fabricpace.lab import launcher

    cpus = len(os.sched_getaffinity(0))
    assert launcher.cpu_warning(2) is None
    most = launcher.RANKS_PER_CPU * cpus
    warning = launcher.cpu_warning(most + 1)
    assert warning is not None and "ranks per CPU" in warning and f"--nodes {most} or fewer" in warning
