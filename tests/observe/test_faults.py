"""Faults a real job meets, on real gloo ranks: the observer must never hang or kill the training.

Each test launches a few ranks of ``_fault_worker.py`` (a small observed DDP job) and injects one
fault. Timeouts in the observer's config are set high where the old behaviour was "wait for a
timeout" (so a regression shows as a slow exit), and the assertions compare exit times with those
timeouts, never with absolute speeds. docs/observer.md ("When things go wrong") has the numbers.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import fabricpace

WORKER = Path(__file__).parent / "_fault_worker.py"


def _launch(launcher, out: Path, fault: str, *args: str, world: int = 2, env: dict[str, str] | None = None,
            port: int | None = None, timeout: float = 120) -> list[dict]:
    """Run ``world`` ranks; per rank its last JSON record plus its return code and exit wall time."""
    _launch_ranks, free_port = launcher
    port = port or free_port()
    out.mkdir(parents=True, exist_ok=True)
    procs = []
    for rank in range(world):
        e = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                 LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                 GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1", **(env or {}))
        procs.append(subprocess.Popen([sys.executable, str(WORKER), str(out), fault, *args], env=e,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    ended: dict[int, float] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(ended) < world and time.monotonic() < deadline:
            for r, p in enumerate(procs):
                if r not in ended and p.poll() is not None:
                    ended[r] = time.time()
            time.sleep(0.05)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()  # only the processes started here
    errs = [p.communicate()[1] for p in procs]
    hung = sorted(set(range(world)) - set(ended))
    assert not hung, f"ranks {hung} hung; stderr:\n{errs[0][-2000:]}"
    recs = []
    for r, p in enumerate(procs):
        path = out / f"rank-{r}.json"
        rec = json.loads(path.read_text().splitlines()[-1]) if path.exists() else {}
        recs.append({**rec, "rc": p.returncode, "exited": ended[r], "stderr": errs[r]})
    return recs


def _fault_time(out: Path) -> float:
    return float(json.loads((out / "fault.json").read_text())["wall"])


# Config of the timed tests: timeouts long enough that waiting for one of them shows.
SLOW_TIMEOUTS = ["--gather-timeout", "30", "--close-timeout", "20", "--store-timeout", "20"]


def test_user_error_at_a_window_boundary_ends_every_rank_promptly(launcher, tmp_path):
    # Rank 1 raises inside the step that closes a window (window 4, step 7). The old observer started
    # that window's gather on the way out and waited gather_timeout_s (30 s) in close for peers that
    # were blocked in the user's all-reduce for rank 1; rank 0 then waited close_timeout_s (20 s)
    # for closed keys: the job's failure took ~40-50 s instead of ~1 s.
    recs = _launch(launcher, tmp_path, "raise", "--rank", "1", "--step", "7", *SLOW_TIMEOUTS, world=3)
    t_fault = _fault_time(tmp_path)
    after = [r["exited"] - t_fault for r in recs]
    assert max(after) < 15, f"ranks took {after} s after the fault (gather timeout 30 s, close 20 s)"
    assert recs[1]["end"] == "UserBoom: user error on rank 1"  # the user's own error, unchanged
    for r in (0, 2):  # the others end in the user's own collective (torch's error, not fabricpace's)
        assert recs[r]["end"].startswith("RuntimeError") and "fabricpace" not in recs[r]["end"]
    assert all(r["rc"] == 3 for r in recs)
    data = fabricpace.load_run(tmp_path / "run")
    assert data.manifest.complete is False
    assert data.manifest.extra["error"].startswith("RuntimeError")  # rank 0's own ending error
    steps = data.steps
    assert set(steps["rank"].unique().to_list()) == {0, 1, 2}
    assert steps.height >= 3 * 6  # the steps before the fault were written on every rank
    # The survivors' step 7 (their all-reduce failed: blocked until the transport gave up) is no
    # step: not written, counted on rank 0 (before, it was written as one long all-"compute" step
    # that skewed every step statistic). Rank 1's UserBoom is a RuntimeError: not written either.
    last = dict(steps.group_by("rank").agg(steps["step"].max()).iter_rows())
    assert last == {0: 6, 1: 6, 2: 6} and data.manifest.extra["failed_steps"] == [7]


def test_killed_rank_survivors_exit_with_their_own_error_promptly(launcher, tmp_path):
    # Rank 1 is SIGKILLed at step 7. The survivors' all-reduce fails at once (gloo sees the closed
    # connection); the old observer's close then held rank 0 for close_timeout_s (20 s) waiting for
    # rank 1's "closed" key, and the other survivor, whose collective only failed when rank 0's
    # connection closed, with it.
    recs = _launch(launcher, tmp_path, "kill", "--rank", "1", "--step", "7", *SLOW_TIMEOUTS, world=3)
    t_fault = _fault_time(tmp_path)
    assert recs[1]["rc"] == -signal.SIGKILL
    after = [recs[r]["exited"] - t_fault for r in (0, 2)]
    assert max(after) < 15, f"survivors took {after} s after the kill (close timeout 20 s)"
    for r in (0, 2):
        assert recs[r]["rc"] == 3 and recs[r]["end"].startswith("RuntimeError")
    data = fabricpace.load_run(tmp_path / "run")
    assert data.manifest.complete is False and "error" in data.manifest.extra
    assert {0, 2} <= set(data.steps["rank"].unique().to_list())


def _store_server(port: int) -> subprocess.Popen[bytes]:
    """A TCPStore server in a process of its own (like torchrun's agent), so the test can freeze it."""
    code = ("import time, torch.distributed as d; "
            f"s = d.TCPStore('127.0.0.1', {port}, is_master=True, wait_for_workers=False); "
            "print('up', flush=True); time.sleep(600)")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline().strip() == b"up"
    return proc


def test_frozen_store_does_not_hold_training_or_exit(launcher, tmp_path):
    # The Store's host process freezes (SIGSTOP: alive, not answering) while the ranks train and
    # re-align clocks in the background. Training must finish; close must not wait a Store timeout
    # per call. The old observer's close blocked in a plain Store set for the job's Store timeout
    # (here 60 s; torchrun's default is 15 min), then in more calls after it.
    _launch_ranks, free_port = launcher
    port = free_port()
    store = _store_server(port)
    out = tmp_path
    try:
        import threading

        def freeze() -> None:  # as soon as rank 0 reaches step 4
            deadline = time.monotonic() + 90
            while not (out / "fault.json").exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            store.send_signal(signal.SIGSTOP)

        t = threading.Thread(target=freeze, daemon=True)
        t.start()
        recs = _launch(launcher, out, "mark", "--rank", "0", "--step", "4", "--steps", "24",
                       "--sleep-ms", "50",
                       "--clock-every", "4", "--store-timeout", "3", "--close-timeout", "3",
                       "--gather-timeout", "10", "--user-timeout", "60",
                       env={"TORCHELASTIC_USE_AGENT_STORE": "True"}, port=port, timeout=100)
        t.join(5)
    finally:
        store.send_signal(signal.SIGCONT)
        store.kill()
        store.wait(10)
    t_fault = _fault_time(out)
    assert all(r["end"] == "ok" and r["rc"] == 0 for r in recs), [r["end"] for r in recs]
    after = [r["exited"] - t_fault for r in recs]
    # 20 steps of training (>= 1 s) + the clock thread's join and the close handshake (3 s each).
    assert max(after) < 40, f"ranks took {after} s after the Store froze (Store timeout 60 s)"
    assert all("close" in r["failures"] for r in recs)  # said once, in the failures
    data = fabricpace.load_run(out / "run")
    assert data.manifest.complete is False  # rank 0 could not confirm the others closed
    assert data.ranks["host"].null_count() == 0  # ranks.parquet keeps the rows read at start


def test_restarted_attempt_on_the_same_store_gets_a_fresh_run_dir_on_every_rank(launcher, tmp_path):
    # A job that keeps its Store server across attempts (torchrun's agent store does; here a server
    # of its own and one PrefixStore per attempt) restarts with the same run_dir. The old observer
    # stripped the job's prefixes, so attempt 1's ranks 1.. read attempt 0's run start and run
    # directory from the Store while rank 0 picked run-1: they wrote into attempt 0's directory,
    # replacing its parts. (Rank 0 of attempt 1 takes 1 s to pick run-1, as on a slow shared file
    # system, so the others ask the Store before it answers: without it that is a race.)
    _launch_ranks, free_port = launcher
    port = free_port()
    store = _store_server(port)
    run = tmp_path / "run"
    try:
        first = _launch(launcher, tmp_path / "a0", "none", "--store-prefix", "attempt0", "--steps", "12",
                        "--run-dir", str(run), port=port)
        second = _launch(launcher, tmp_path / "a1", "none", "--store-prefix", "attempt1", "--steps", "6",
                         "--run-dir", str(run), "--slow-rank0-dir", port=port,
                         env={"TORCHELASTIC_RESTART_COUNT": "1"})
    finally:
        store.kill()
        store.wait(10)
    assert {r.get("run_dir") for r in first} == {str(run)}, [r["stderr"][-800:] for r in first]
    assert {r["run_dir"] for r in second} == {str(run) + "-1"}  # every rank agrees on one directory
    a0, a1 = fabricpace.load_run(run), fabricpace.load_run(tmp_path / "run-1")
    assert a0.manifest.complete and a1.manifest.complete
    # Nothing of attempt 0 was lost or replaced: 12 steps per rank there, 6 in the new directory.
    assert sorted(a0.steps.group_by("rank").len()["len"].to_list()) == [12, 12]
    assert sorted(a1.steps.group_by("rank").len()["len"].to_list()) == [6, 6]
    assert a0.manifest.run_id != a1.manifest.run_id


MNT = Path("/tmp/fpt-c8-mnt")


@pytest.fixture
def small_tmpfs():
    """A 2 MB tmpfs (root only): a disk that fills up mid-run. Unmounted by its path afterwards."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    MNT.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2M", "fpt-c8-tmpfs", str(MNT)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield MNT
    finally:
        subprocess.run(["umount", str(MNT)], check=False)


def test_disk_full_mid_run_training_goes_on_and_says_so_once(launcher, tmp_path, small_tmpfs):
    run = small_tmpfs / "run"
    recs = _launch(launcher, tmp_path, "ro", "--rank", "0", "--step", "6", "--steps", "30", "--window", "3",
                   "--pacing", "auto", "--run-dir", str(run))
    assert all(r["end"] == "ok" and r["rc"] == 0 for r in recs)
    assert "writing" in recs[0]["failures"]
    for r in recs:  # the observer says it once per rank; the pacer's writer once at most
        assert r["stderr"].count("writing disabled after a failure") <= 1
        assert r["stderr"].count("could not write pacing.parquet") <= 1
    (run / "fill.bin").unlink()  # room for the reader's own output
    data = fabricpace.load_run(run)  # what was written before the disk filled stays readable
    assert data.manifest.complete is False
    assert data.steps.height > 0 and data.ranks.height == 2


LOCAL = dict(status_line=False, flush_mode="main", flush_every=2, flush_interval_s=0)


def test_interrupt_in_the_loop_propagates_unchanged_and_marks_the_run_incomplete(tmp_path):
    from fabricpace.observe import ObserverConfig

    stop = KeyboardInterrupt()
    cfg = ObserverConfig(**LOCAL)
    run = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt) as info, fabricpace.observe(None, run, config=cfg) as obs:
        for i in range(10):
            with obs.step(samples=1):
                if i == 5:
                    raise stop
    assert info.value is stop
    data = fabricpace.load_run(tmp_path / "run")
    assert data.manifest.complete is False and data.manifest.extra["error"] == "KeyboardInterrupt"
    # The interrupted step is not a step: counted, not written (its time would read as compute)
    assert data.steps["step"].to_list() == list(range(5)) and data.manifest.extra["failed_steps"] == [5]


def test_close_in_an_except_block_finds_the_error_and_sys_exit_0_is_clean(tmp_path):
    from fabricpace.observe import ObserverConfig

    obs = fabricpace.observe(None, tmp_path / "a", config=ObserverConfig(**LOCAL))
    try:
        with obs.step(samples=1):
            raise ValueError("bad batch")
    except ValueError:
        obs.close()
    assert fabricpace.load_run(obs.run_dir).manifest.extra["error"] == "ValueError: bad batch"
    with pytest.raises(SystemExit), fabricpace.observe(None, tmp_path / "b", config=obs.config) as ok:
        with ok.step(samples=1):
            pass
        sys.exit(0)
    assert fabricpace.load_run(ok.run_dir).manifest.complete is True


def test_misuse_is_harmless(tmp_path, monkeypatch):
    # No process group although WORLD_SIZE says 2; used after close; observe() twice on one directory.
    from fabricpace.observe import ObserverConfig

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    cfg = ObserverConfig(**LOCAL)
    obs = fabricpace.observe(None, tmp_path / "run", config=cfg)
    assert (obs.rank, obs.world, obs.distributed) == (1, 2, False)
    with obs.step(samples=1):
        pass
    obs.close()
    obs.close()
    with obs.step(samples=1):  # after close: a no-op, no error
        pass
    assert obs.batch_share(9) == 4 and obs.failures == {}
    monkeypatch.setenv("RANK", "0")
    first = fabricpace.observe(None, tmp_path / "again", config=cfg)
    with first.step(samples=1):
        pass
    first.close()
    second = fabricpace.observe(None, tmp_path / "again", config=cfg)
    second.close()
    assert second.run_dir == tmp_path / "again-1"  # the first run is kept, not overwritten
    assert fabricpace.load_run(first.run_dir).steps.height == 1


def test_a_rank_local_pacing_failure_turns_pacing_off_on_every_rank(launcher, tmp_path):
    # Rank 1's controller exceeds its time limit (a rank-local event: 0 s limit there), so rank 1
    # turns pacing off. The old observer left the other ranks pacing with the old decisions (batch
    # shares no longer agreed across ranks, for the rest of the run); now the flag rides on the next
    # window gather and every rank drops pacing at the same window.
    recs = _launch(launcher, tmp_path, "none", "--pacing", "auto", "--pacer-timeout-rank", "1",
                   "--steps", "24", "--window", "4")
    assert all(r["end"] == "ok" for r in recs)
    off = [r.get("pacer_off_step") for r in recs]
    assert None not in off, f"pacing still on at the end on some rank: {off}"
    assert max(off) - min(off) <= 4  # within one window
    assert "pacing went off on rank 1" in recs[0]["failures"]["pacing"]


def test_a_controller_timeout_with_rebalance_on_ends_the_window_summaries_without_a_stall(launcher, tmp_path):
    # With rebalance among the policies, the other ranks may close the open window early (a rebalance
    # trial's short probe window); rank 1, whose controller did not return, cannot know. It leaves
    # the window gathers as a rank under DDP's Join does: the peers' next gather ends at once (before,
    # a peer closing its window early would wait for rank 1's contribution while rank 1 waits for it
    # in DDP's all-reduce, until gather_timeout_s). A 60 s gather timeout makes such a stall fail this
    # test's 45 s limit.
    recs = _launch(launcher, tmp_path, "none", "--pacing", "auto", "--pacer-timeout-rank", "1",
                   "--batch-share", "--steps", "24", "--window", "4", "--gather-timeout", "60",
                   timeout=45)
    assert all(r["end"] == "ok" for r in recs)
    off = [r.get("pacer_off_step") for r in recs]
    assert None not in off, f"pacing still on at the end on some rank: {off}"
    assert "pacing failed on this rank" in recs[1]["failures"]["gather"]
    assert "stopped observing before window gather" in recs[0]["failures"]["gather"]


def test_pacing_states_that_differ_between_ranks_turn_pacing_off_on_every_rank(launcher, tmp_path):
    # Every rank decides from the same gathered windows, so their pacing states agree — unless
    # something rank-local intervenes (here: rank 1 pinned to another GC interval; in a real job,
    # float results that differ between hosts). Each rank's window row carries a digest of its
    # state; a mismatch turns pacing off on every rank at the same window.
    recs = _launch(launcher, tmp_path, "none", "--pin-gc-rank", "1", "--steps", "16", "--window", "4")
    assert all(r["end"] == "ok" for r in recs)
    off = [r.get("pacer_off_step") for r in recs]
    assert None not in off, f"pacing still on at the end on some rank: {off}"
    assert max(off) - min(off) <= 4  # within one window
    assert all("pacing states differ between ranks (rank 1's is not rank 0's)" in r["failures"]["pacing"]
               for r in recs)
