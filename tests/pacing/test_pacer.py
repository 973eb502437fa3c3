"""The pacer's safety: controller errors and timeouts turn pacing off, decisions are written, shares
change on the same step on every rank."""

from __future__ import annotations

import gc
from dataclasses import replace

import pyarrow.parquet as pq

from fabricpace.pacing import PacingConfig, PacingState, make_pacer


def test_controller_error_turns_pacing_off_and_is_recorded(tmp_path, summaries):
    p = make_pacer("auto", rank=0, world_size=4, run_dir=tmp_path, window=50)
    p.on_window(49, summaries(0, world=3))  # wrong number of ranks: the controller raises
    assert not p.enabled and "controller error" in p.status()
    assert p.batch_share(64) == 16  # equal split from now on
    p.on_window(99, summaries(1))  # ignored, no exception
    p.close()  # (decisions are written by a thread: all of them are on disk once closed)
    t = pq.read_table(tmp_path / "pacing.parquet").to_pylist()
    assert t[-1]["action"] == "off" and t[-1]["policy"] == "guard"


def test_slow_controller_turns_pacing_off(tmp_path, summaries):
    was = gc.isenabled()
    p = make_pacer(
        "gc", rank=0, world_size=4, run_dir=tmp_path, window=50, config=PacingConfig(controller_timeout_s=0.0)
    )
    p.on_window(49, summaries(0, gc_ms=10, gc_count=4))
    assert not p.enabled and "limit" in (p.off_reason or "")
    assert gc.isenabled() == was  # nothing was left applied
    p.close()


def test_a_controller_that_never_returns_turns_pacing_off_in_bounded_time(tmp_path, summaries):
    # A hang in the controller (a bug) must not hold the training thread: the update runs on the
    # pacer's own thread and is waited for at most controller_timeout_s. The hang is made by making
    # the real controller's update block until the test releases it.
    import threading
    import time

    p = make_pacer("auto", rank=0, world_size=4, run_dir=tmp_path, window=50,
                   config=PacingConfig(controller_timeout_s=0.3))
    release = threading.Event()
    real = p.controller.update

    def hangs(step, window):  # type: ignore[no-untyped-def]
        release.wait()
        return real(step, window)

    p.controller.update = hangs  # type: ignore[method-assign]
    t0 = time.perf_counter()
    p.on_window(49, summaries(0))
    took = time.perf_counter() - t0
    assert 0.25 <= took < 5.0  # the limit, not the hang
    assert not p.enabled and "did not return within 0.3s" in (p.off_reason or "")
    assert p.batch_share(64) == 16
    release.set()  # the abandoned update finishes; its result is dropped
    time.sleep(0.05)
    p.on_window(99, summaries(1))
    assert not p.enabled and p.state == PacingState()
    p.close()
    t = pq.read_table(tmp_path / "pacing.parquet").to_pylist()
    assert t[-1]["action"] == "off" and "did not return" in t[-1]["reason"]


def test_only_rank_zero_writes(tmp_path, summaries):
    p = make_pacer("gc", rank=1, world_size=4, run_dir=tmp_path, window=50)
    p.on_window(49, summaries(0, gc_ms=10, gc_count=4))
    p.on_window(99, summaries(1, gc_ms=10, gc_count=4))
    assert p.decisions and not (tmp_path / "pacing.parquet").exists()
    p.close()


def test_gc_lockstep_is_restored_on_close(tmp_path, summaries):
    assert gc.isenabled()
    p = make_pacer("gc", rank=0, world_size=4, run_dir=tmp_path, window=50)
    p.on_window(49, summaries(0, gc_ms=10, gc_count=4))
    p.on_window(99, summaries(1, gc_ms=10, gc_count=4))
    assert p.state.gc_interval is not None and not gc.isenabled()
    p.on_step_start(100)  # a lockstep collection at a multiple of the interval
    assert p.gc.collections == 1
    p.close()
    assert gc.isenabled()
    assert "gc" in p.status()


def test_shares_take_effect_after_the_lag_on_every_rank(tmp_path, summaries):
    pacers = [make_pacer("rebalance", rank=r, world_size=4, run_dir=None, window=50) for r in range(4)]
    # rank 1 is 50% slower in most steps of the window: a clear straggler, tried at once
    s = summaries(0, compute_ms=[60.0, 90.0, 60.0, 60.0], last=[1.0, 45.0, 2.0, 2.0])
    for p in pacers:
        p.on_step_end(49)
        p.on_window(49, s)
    # first a 5-step window on the old shares confirms that rank 1 is still slow
    assert all(p.next_window_end == 55 and p.batch_counts(64, 54) == [16] * 4 for p in pacers)
    c = summaries(1, steps=5, compute_ms=[60.0, 90.0, 60.0, 60.0], last=[0.0, 5.0, 0.0, 0.0])
    for p in pacers:
        p.on_step_end(54)
        p.on_window(54, [replace(x, first_step=50) for x in c])
    lag = pacers[0].share_lag_steps
    for step in (55, 55 + lag - 1):
        assert pacers[0].batch_counts(64, step) == [16, 16, 16, 16]
    after = [p.batch_counts(64, 55 + lag) for p in pacers]
    assert all(a == after[0] for a in after) and sum(after[0]) == 64 and after[0][1] < 16


def test_pin_applies_a_fixed_state(tmp_path):
    p = make_pacer("off", rank=0, world_size=2, run_dir=tmp_path, window=50)
    p.pin(PacingState(comm_window=1), step_time_ns=1e8)
    assert p.comm.window == 1 and p.comm.budget_ns == 1_000_000
    assert "pinned" in p.status()
    p.close()


def test_wants_comm_hook_only_when_gating_is_near(tmp_path, summaries):
    p = make_pacer("auto", rank=1, world_size=4, run_dir=None, window=50)
    assert not p.wants_comm_hook()  # a fresh run pays for no comm hook
    for w, t in enumerate((10.0, 10.5, 9.5)):  # quiet level learnt
        p.on_window(50 * w + 49, summaries(w, transfer_ms=t, wait_ms=20.0))
        assert not p.wants_comm_hook()
    # inflated once: a single noisy window on a busy host must not make a healthy run pay a comm hook
    p.on_window(199, summaries(3, transfer_ms=20.0, wait_ms=20.0))
    assert not p.wants_comm_hook() and p.state.comm_window is None
    p.on_window(249, summaries(4, transfer_ms=20.0, wait_ms=20.0))  # inflated twice: comm on trial
    assert p.wants_comm_hook()
    p.on_window(299, summaries(5, transfer_ms=20.0, wait_ms=20.0))
    assert p.wants_comm_hook() and p.state.comm_window is not None
    p.close()
    off = make_pacer("gc,rebalance", rank=0, world_size=4, run_dir=None, window=50)
    for w, t in enumerate((10.0, 10.5, 9.5, 20.0, 20.0)):
        off.on_window(49 + 50 * w, summaries(w, transfer_ms=t, wait_ms=20.0))
    assert not off.wants_comm_hook()  # comm not among the policies
    pinned = make_pacer("off", rank=0, world_size=2, run_dir=None, window=50)
    pinned.pin(PacingState(comm_window=1), step_time_ns=1e8)
    assert pinned.wants_comm_hook()


def test_a_lazily_installed_comm_hook_restarts_the_transfer_level(summaries):
    """Without a comm hook the observer measures only exposed transfer; once the hook is installed
    (the first before_bucket) the level steps up with no change in the network: that step-up starts
    no further comm trial."""
    p = make_pacer("comm", rank=0, world_size=4, run_dir=None, window=50)
    for w, t in enumerate((10.0, 10.5, 9.5)):
        p.on_window(50 * w + 49, summaries(w, transfer_ms=t, wait_ms=20.0))
    p.on_window(199, summaries(3, transfer_ms=20.0, wait_ms=20.0))  # inflated once: not yet armed
    assert not p.wants_comm_hook()
    p.on_window(249, summaries(4, transfer_ms=20.0, wait_ms=20.0))  # inflated twice: armed
    assert p.wants_comm_hook()
    for b in range(4):  # the observer installed its hook: buckets now go through the pacer
        p.before_bucket(b)
        p.after_bucket(b)
    p.on_step_end(200)
    started = [d for d in p.decisions if d.policy == "comm"]
    for w in range(5, 16):  # every later window measures all transfer: 25 ms, steady
        p.on_window(50 * w + 49, summaries(w, transfer_ms=25.0, wait_ms=20.0))
    comm = [d for d in p.decisions if d.policy == "comm"]
    guard = [d for d in p.decisions if d.policy == "guard"]
    assert len(started) == 1 and started[0].action == "enable"  # the trial the two windows started
    assert [d.action for d in guard] == ["revert"]  # equal step times: not kept
    assert comm == started  # and the step-up in measured transfer starts no other trial


def test_a_probe_window_runs_the_new_shares_longer_than_the_old_ones(summaries):
    """The window open when a rebalance trial starts began where the summarized one ended; its first
    steps still run the old shares (the lag). The pacer closes it once the new shares ran the probe's
    5 steps *and* at least one step more than the old ones did, so its medians measure the move (with
    5 steps after a 4-step lag the old shares were the window's median, and a real straggler's probe
    never showed a gain). A re-check of a kept move changes nothing and counts from the decision."""
    p = make_pacer("rebalance", rank=0, world_size=4, run_dir=None, window=50)
    s = summaries(0, compute_ms=[60.0, 90.0, 60.0, 60.0], last=[1.0, 45.0, 2.0, 2.0])  # steps 0-49
    p.on_step_end(51)
    p.on_window(51, s)  # decided two steps into the next window: first a confirmation window
    assert p.controller.next_window_steps == 5 and p.next_window_end == 51 + 1 + 5
    c = summaries(1, steps=7, compute_ms=[60.0, 90.0, 60.0, 60.0], last=[0.0, 7.0, 0.0, 0.0])  # 50-56
    p.on_step_end(58)
    p.on_window(58, [replace(x, first_step=50) for x in c])  # rank 1 still slow: the trial starts
    assert p.controller.next_window_steps == 5
    apply = 58 + 1 + p.share_lag_steps  # the new shares run from here; steps 57..apply-1 ran the old
    assert p.next_window_end == apply + max(5, apply - 57 + 1)
    # the probe shows a clear gain (rank 1 still slow per sample, the step faster): kept, and the kept
    # move is re-checked in windows that count from the decision (the shares do not change)
    from fabricpace.pacing.rebalance import counts_from_shares

    counts = [float(n) for n in counts_from_shares(p.controller.kept.shares or p.state.shares, 64, 4)]
    comp = [60.0 / 16 * n for n in counts]
    comp[1] = 90.0 / 16 * counts[1]
    end = p.next_window_end
    probe = summaries(2, step_ms=80.0, compute_ms=comp, samples=counts, steps=end - 57,
                      last=[5.0, 5.0, 5.0, 5.0])  # fmt: skip
    probe = [replace(x, first_step=57) for x in probe]
    p.on_step_end(end)
    p.on_window(end, probe)
    assert [d.action for d in p.decisions][-1] == "keep", p.decisions
    assert p.controller.next_window_steps == 5 and p.next_window_end == end + 1 + 5
    p.close()


def test_hosts_from_the_launcher():
    from fabricpace.pacing.pacer import hosts_from_env

    assert hosts_from_env(4, {"LOCAL_WORLD_SIZE": "4", "WORLD_SIZE": "4"}) == 1  # torchrun, one node
    assert hosts_from_env(8, {"LOCAL_WORLD_SIZE": "4"}) == 2
    assert hosts_from_env(4, {"LOCAL_WORLD_SIZE": "1"}) == 4  # the fabric lab: a namespace per rank
    assert hosts_from_env(4, {"OMPI_COMM_WORLD_LOCAL_SIZE": "4"}) == 1
    assert hosts_from_env(16, {"SLURM_STEP_NUM_NODES": "2"}) == 2
    assert hosts_from_env(4, {}) is None and hosts_from_env(4, {"LOCAL_WORLD_SIZE": "x"}) is None


def test_auto_on_one_host_leaves_comm_out_but_an_explicit_comm_stays(summaries):
    auto = make_pacer("auto", rank=0, world_size=4, run_dir=None, window=50, hosts=1)
    assert "comm" not in auto.policies and "comm" not in auto.controller.policies
    assert auto.notes and "one host" in auto.notes[0]
    for w, t in enumerate((10.0, 10.5, 9.5, 30.0, 30.0)):  # transfer inflated twice: no comm trial
        auto.on_window(50 * w + 49, summaries(w, transfer_ms=t, wait_ms=20.0))
    assert not auto.wants_comm_hook() and not [d for d in auto.decisions if d.policy == "comm"]
    assert "comm" in make_pacer("gc,comm", rank=0, world_size=4, run_dir=None, window=50, hosts=1).policies
    assert "comm" in make_pacer("auto", rank=0, world_size=4, run_dir=None, window=50, hosts=2).policies


def test_comm_is_not_tried_when_the_gate_cannot_hold_a_bucket(summaries):
    """With no more DDP buckets than the in-flight window a trial would set (2), the gate never holds a
    launch: the trigger fires, no trial starts, and no comm hook is asked for."""
    for buckets, tried in ((1, False), (2, False), (3, True), (None, True)):
        p = make_pacer("comm", rank=0, world_size=4, run_dir=None, window=50, hosts=2)
        p.set_comm_buckets(buckets)
        for w, t in enumerate((10.0, 10.5, 9.5, 30.0, 30.0)):
            p.on_window(50 * w + 49, summaries(w, transfer_ms=t, wait_ms=20.0))
        assert p.wants_comm_hook() is tried, buckets
        assert bool([d for d in p.decisions if d.policy == "comm"]) is tried, buckets
