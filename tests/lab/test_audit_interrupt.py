"""An interrupted or failed ``lab run`` leaves no half-written run directory behind.

Measured before the fix: Ctrl-C 20 s into ``lab run --scenario throttled-rank --out /tmp/fpa/int20``
exited 130 but left ``int20/`` (manifest.json and ranks.parquet, written by the observer at start-up)
and the hidden ``.int20.lab/`` beside it; the same command again was refused ("--out ...: already
exists and is not empty"). Ctrl-C 6 s in (ranks still importing torch) left ``.int6.lab/``.

The ranks are replaced by a stand-in that writes what the observer writes at start-up, so these tests
need neither root nor torch; the cleanup they check is the launcher's.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fabricpace._errors import LabError
from fabricpace.lab import launcher
from fabricpace.lab.scenario import load_scenario


@pytest.fixture
def half_started(monkeypatch, tmp_path):
    """Ranks that got as far as the observer's first files; ``_wait`` then raises what the test sets."""
    monkeypatch.setenv("FABRICPACE_LAB_STATE_DIR", str(tmp_path / "state"))
    raised: list[BaseException] = []

    def spawn(sc, run, *, world, out, args, cfg, rank_node):
        out.mkdir(parents=True, exist_ok=True)
        (out / "manifest.json").write_text("{}")
        (out / "ranks.parquet").write_bytes(b"PAR1")
        (launcher.scratch_dir(out) / "logs" / "rank-00000.log").write_text("rank 0 started\n")
        run.procs.append(object())  # the launcher's record that ranks were started

    def wait(*args, **kwargs):
        raise raised[0]

    monkeypatch.setattr(launcher, "_spawn_workers", spawn)
    monkeypatch.setattr(launcher, "_wait", wait)
    monkeypatch.setattr(launcher, "_cleanup", lambda run, cfg, prefix: None)
    return raised


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.name != "state"
                  and "state" not in p.relative_to(root).parts)


def test_ctrl_c_leaves_nothing_and_the_same_out_works_again(half_started, tmp_path):
    half_started.append(KeyboardInterrupt())
    out = tmp_path / "runs" / "deep" / "lab-run"  # parents made by the run go too
    with pytest.raises(KeyboardInterrupt):
        launcher.run_scenario(load_scenario("healthy"), out=out, backend="local", steps=10)
    assert _files(tmp_path) == []
    launcher.check_new_dir(out)  # the same --out is accepted again


def test_ctrl_c_keeps_the_users_empty_folder(half_started, tmp_path):
    half_started.append(KeyboardInterrupt())
    out = tmp_path / "mine"
    out.mkdir()
    with pytest.raises(KeyboardInterrupt):
        launcher.run_scenario(load_scenario("healthy"), out=out, backend="local", steps=10)
    assert _files(tmp_path) == ["mine"]


def test_a_failed_run_keeps_only_the_logs_it_names(half_started, tmp_path):
    half_started.append(LabError("rank 1 exited with 1"))
    out = tmp_path / "run"
    with pytest.raises(LabError):
        launcher.run_scenario(load_scenario("healthy"), out=out, backend="local", steps=10)
    assert not out.exists()  # the same --out works again
    assert _files(tmp_path) == [".run.lab", ".run.lab/logs", ".run.lab/logs/rank-00000.log"]


_KILLED_RUN = """
import os, signal, sys, time
from pathlib import Path
from fabricpace.lab import launcher
from fabricpace.lab.scenario import load_scenario

def spawn(sc, run, *, world, out, args, cfg, rank_node):
    out.mkdir(parents=True, exist_ok=True)
    (out / "manifest.json").write_text("{}")
    run.procs.append(object())

def wait(*args, **kwargs):
    os.kill(os.getpid(), getattr(signal, sys.argv[2]))
    time.sleep(30)

# A terminal's process starts with SIGHUP at its default; under `nohup` (a CI runner, a detached test
# run) it is inherited as ignored, and the launcher rightly leaves ignored signals alone.
signal.signal(signal.SIGHUP, signal.SIG_DFL)
launcher._spawn_workers, launcher._wait = spawn, wait
launcher._cleanup = lambda run, cfg, prefix: print("cleanup ran", flush=True)
try:
    launcher.run_scenario(load_scenario("healthy"), out=Path(sys.argv[1]), backend="local", steps=10)
except KeyboardInterrupt as exc:
    print("interrupted by", exc, flush=True)
    sys.exit(130)
"""


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP"])
def test_kill_or_hangup_cleans_up_like_ctrl_c(tmp_path, sig):
    """Measured before: ``kill`` (SIGTERM) 20 s into a throttled-rank run killed the launcher at once;
    its 4 ranks trained on as orphans, the cgroup fpa-lab/rank1 and the run directory stayed."""
    import os
    import subprocess
    import sys

    out = tmp_path / "run"
    env = dict(os.environ, FABRICPACE_LAB_STATE_DIR=str(tmp_path / "state"))
    r = subprocess.run([sys.executable, "-c", _KILLED_RUN, str(out), sig], capture_output=True, text=True,
                       env=env, timeout=60)
    assert r.returncode == 130, (r.returncode, r.stdout, r.stderr)
    assert "cleanup ran" in r.stdout and f"interrupted by {sig}" in r.stdout
    assert _files(tmp_path) == []
