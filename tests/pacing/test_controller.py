"""The controller on synthetic window summaries: triggers, guard verdicts, reasons, determinism."""

from __future__ import annotations

import pytest

from fabricpace import ConfigError
from fabricpace.pacing import Controller, PacingConfig, PacingState, parse_policies
from fabricpace.pacing.rebalance import counts_from_shares

# A first move tried at once, without a confirmation window (``rebalance_confirm_steps`` = 0): these
# tests are about what follows the move.
_AT_ONCE = PacingConfig(rebalance_confirm_steps=0)


def test_healthy_run_takes_no_action(summaries):
    ctl = Controller(4)
    for w in range(10):
        state, dec = ctl.update((w + 1) * 50, summaries(w))
        assert dec == []
        assert not state.active
    assert ctl.describe() == "pacing: watching"


def test_gc_churn_enables_lockstep_and_keeps_it_when_faster(summaries):
    ctl = Controller(4)
    # GC on one rank only (the median rank saw none) may be a one-off: not yet persistent
    few = {"gc_ms": [32.0, 0.0, 0.0, 0.0], "gc_count": [4.0, 0.0, 0.0, 0.0]}
    state, dec = ctl.update(50, summaries(0, step_ms=100, **few))
    assert dec == [] and state.gc_interval is None
    state, dec = ctl.update(100, summaries(1, step_ms=100, **few))
    assert [d.policy for d in dec] == ["gc"] and dec[0].action == "enable"
    assert "GC pauses" in dec[0].reason and state.gc_interval == ctl.config.gc_interval
    # window 2 runs with lockstep (ON) and is clearly faster: kept after one pair
    state, dec = ctl.update(150, summaries(2, step_ms=70, gc_ms=0.5, gc_count=5))
    assert [(d.policy, d.action) for d in dec] == [("guard", "keep")]
    assert "gc kept" in dec[0].reason and "CI" in dec[0].reason
    assert state.gc_interval is not None and ctl.kept.gc_interval is not None


def test_gc_churn_measured_within_one_window_is_tried_at_once(summaries):
    # 2 collections per rank and step: the cost is a rate measured over ~100 collections per rank,
    # not a one-off, so no second window is needed (a one-off needs two: test_one_off_...).
    ctl = Controller(4)
    state, dec = ctl.update(50, summaries(0, step_ms=100, gc_ms=8, gc_count=100))
    assert [d.policy for d in dec] == ["gc"] and state.gc_interval == ctl.config.gc_interval_churn


def test_gc_on_every_rank_within_one_window_is_tried_at_once(summaries):
    # One collection on every rank in one window: GC measured on the whole fleet, so acting one
    # window later would only leave one more window at the slower level.
    ctl = Controller(4)
    state, dec = ctl.update(50, summaries(0, step_ms=100, gc_ms=8, gc_count=1))
    assert [d.policy for d in dec] == ["gc"] and state.gc_interval == ctl.config.gc_interval
    # near the trigger (one 50 ms pause per rank: 3.8% amplified, under twice the trigger) one window
    # is not enough
    ctl = Controller(4)
    state, dec = ctl.update(50, summaries(0, step_ms=100, gc_ms=1, gc_count=1))
    assert dec == [] and state.gc_interval is None
    state, dec = ctl.update(100, summaries(1, step_ms=100, gc_ms=1, gc_count=1))
    assert [d.policy for d in dec] == ["gc"]


def _gc_trial_after(summaries, history: list[float]) -> list:
    """Untreated windows with the given step times (no GC), then GC churn at 100 ms, then a 6% faster
    ON window: the decisions taken on that ON window."""
    ctl = Controller(4, policies=("gc",))
    for w, t in enumerate(history):
        ctl.update(50 * (w + 1), summaries(w, step_ms=t, std_ms=1.0))
    w = len(history)
    _s, dec = ctl.update(50 * (w + 1), summaries(w, step_ms=100, std_ms=1.0, gc_ms=8, gc_count=100))
    assert [d.action for d in dec] == ["enable"]
    _s, dec = ctl.update(50 * (w + 2), summaries(w + 1, step_ms=94, std_ms=1.0, gc_ms=1, gc_count=50))
    return dec


def test_window_to_window_drift_before_a_trial_widens_the_guard(summaries):
    # A quiet host: consecutive windows agree within 0.5%, so one pair at -6% is a clear gain.
    quiet = _gc_trial_after(summaries, [100.0, 100.4, 99.8, 100.3, 100.1])
    assert [d.action for d in quiet] == ["keep"]
    # A busy host: windows swing by +-10% with no change at all; one pair at -6% proves nothing.
    busy = _gc_trial_after(summaries, [100.0, 110.0, 99.0, 111.0, 98.0])
    assert busy == []  # the trial goes on


def test_guard_reverts_a_policy_that_hurts(summaries):
    ctl = Controller(4, PacingConfig(guard_cooldown=3, trigger_windows=1))
    ctl.update(50, summaries(0, step_ms=100, gc_ms=8, gc_count=3))
    times = {1: 110.0, 2: 112.0, 3: 100.0, 4: 100.0}  # (off, on), (on, off), ...: ON is slower
    state = None
    reverted = None
    for w in range(1, 5):
        state, dec = ctl.update((w + 1) * 50, summaries(w, step_ms=times[w], gc_ms=8, gc_count=3))
        for d in dec:
            if d.action == "revert":
                reverted = d
    assert reverted is not None and "gc reverted" in reverted.reason
    assert "it hurts" in reverted.reason or "no gain" in reverted.reason
    assert state is not None and state.gc_interval is None and ctl.kept.gc_interval is None


def test_guard_reverts_when_no_gain_beyond_noise(summaries):
    ctl = Controller(4, PacingConfig(trigger_windows=1))
    ctl.update(50, summaries(0, step_ms=100, std_ms=30, gc_ms=8, gc_count=3))
    seq = [99.0, 101.0, 100.5, 99.5, 100.2, 99.9]
    decs = []
    for w, t in enumerate(seq, start=1):
        _state, dec = ctl.update((w + 1) * 50, summaries(w, step_ms=t, std_ms=30, gc_ms=8, gc_count=3))
        decs += dec
    assert any(d.action == "revert" and "no gain beyond noise" in d.reason for d in decs)
    assert ctl.kept == PacingState()


def test_status_counts_a_trial_in_pairs_up_to_the_most_it_can_take(summaries):
    """A trial that runs on (an estimate favouring the policy, within noise) showed "trial gc 5/4": windows
    over the minimum pairs. It counts measured pairs over the most a trial can take."""
    import re

    ctl = Controller(4, PacingConfig(trigger_windows=1))
    ctl.update(50, summaries(0, step_ms=100, std_ms=30, gc_ms=8, gc_count=3))
    # ON windows 1% faster, far inside the 30 ms spread: the trial runs on to its most pairs
    seen = []
    for w in range(1, 12):
        trial = ctl.guard.trial
        t = 99.0 if trial is not None and trial.arm_for(w) == "on" else 100.0
        ctl.update((w + 1) * 50, summaries(w, step_ms=t, std_ms=30, gc_ms=8, gc_count=3))
        seen += re.findall(r"trial gc pair (\d+)/(\d+)", ctl.describe())
    assert max(int(k) for k, _ in seen) == 5
    assert all(int(k) <= int(m) for k, m in seen), seen


def test_straggler_gets_fewer_samples_with_a_reason(summaries):
    ctl = Controller(4, _AT_ONCE, policies=("rebalance",))
    comp = [60.0, 90.0, 60.0, 60.0]
    last = [1.0, 45.0, 2.0, 2.0]
    state, dec = ctl.update(50, summaries(0, compute_ms=comp, last=last))  # clear: tried at once
    assert dec[0].policy == "rebalance" and dec[0].rank == 1
    assert "rank 1 last in 90% of collectives, compute 50% above median" in dec[0].reason
    assert state.shares is not None and state.shares[1] < 0.25 < state.shares[0]
    assert sum(state.shares) == pytest.approx(1.0, abs=1e-5)


def test_one_off_triggers_start_no_trial(summaries):
    """A GC spike in one window, or a different "slow" rank in each window (another process took the
    CPU for a while), is not persistent: no trial, so a healthy run pays for no control windows."""
    ctl = Controller(4)
    quiet = summaries(1)
    for w in range(8):
        if w % 2 == 0:
            # every other window, on one rank: not two in a row
            s = summaries(w, gc_ms=[32.0, 0.0, 0.0, 0.0], gc_count=[1.0, 0.0, 0.0, 0.0])
        else:
            # stalled for part of the window: its median compute 10% up, last in 62% of collectives
            r = w % 4
            comp = [60.0] * 4
            comp[r] = 66.0
            last = [6.0] * 4
            last[r] = 30.0
            s = summaries(w, compute_ms=comp, last=last)
        state, dec = ctl.update((w + 1) * 50, s)
        assert dec == [] and not state.active
    assert quiet  # the fixture built windows of the same shape


def test_a_clear_straggler_is_tried_at_once_and_its_recovery_undone_at_once(summaries):
    """A rank last in nearly every collective of a window and far slower is tried in the next window;
    when it recovers, the ranks that took its samples arrive last and the shares go back at once."""
    ctl = Controller(4, _AT_ONCE, policies=("rebalance",))
    comp, last = [60.0, 90.0, 60.0, 60.0], [1.0, 45.0, 2.0, 2.0]
    state, dec = ctl.update(50, summaries(0, compute_ms=comp, last=last))
    assert [d.policy for d in dec] == ["rebalance"] and state.shares is not None
    samples = [float(n) for n in counts_from_shares(state.shares, 64, 4)]
    fast = [60.0 / 16 * n for n in samples]  # the ON window: rank 1 still slow per sample
    fast[1] = 90.0 / 16 * samples[1]
    state, dec = ctl.update(
        100, summaries(1, step_ms=80, compute_ms=fast, samples=samples, last=[15.0, 5.0, 15.0, 15.0])
    )
    assert [d.action for d in dec] == ["keep"] and ctl.kept.shares is not None
    # rank 1 recovers: per-sample compute equal again, the ranks with extra samples arrive last
    rec = [60.0 / 16 * n for n in samples]
    state, dec = ctl.update(
        150, summaries(2, step_ms=80, compute_ms=rec, samples=samples, last=[16.0, 0.0, 16.0, 16.0])
    )
    assert [(d.policy, d.action) for d in dec] == [("rebalance", "enable")]
    assert state.shares is not None and state.shares[1] > ctl.kept.shares[1]


def test_rebalance_trial_needs_a_real_move(summaries):
    """Shares whose rounding moves no sample (or makes another rank the slowest) are not tried."""
    ctl = Controller(8, policies=("rebalance",))
    comp = [60.0] * 8
    comp[3] = 66.0  # 10% slower per sample at 12 samples per rank: a rank given a 13th sample (65)
    # would be almost as slow as rank 3 is now (66); the fractional shares predicted a 4% saving
    last = [1.0] * 8
    last[3] = 45.0
    for w in range(4):
        state, dec = ctl.update((w + 1) * 50, summaries(w, world=8, compute_ms=comp, samples=12.0, last=last))
        assert dec == [] and state.shares is None


def test_straggler_without_last_arrivals_is_not_moved(summaries):
    ctl = Controller(4, policies=("rebalance",))
    # slower compute but never last (its slowness is hidden): nothing to gain by moving samples
    state, dec = ctl.update(50, summaries(0, compute_ms=[60.0, 90.0, 60.0, 60.0], last=[15, 0, 15, 15]))
    assert dec == [] and state.shares is None


def test_comm_needs_persistent_inflation_and_exposure(summaries):
    ctl = Controller(4, policies=("comm",))
    for w, t in enumerate((10.0, 10.5, 9.5)):  # the quiet level: median of earlier windows
        ctl.update(50 * (w + 1), summaries(w, transfer_ms=t, wait_ms=30))
    _s, dec = ctl.update(200, summaries(3, transfer_ms=25, wait_ms=30))
    assert dec == []  # one inflated window is not enough
    state, dec = ctl.update(250, summaries(4, transfer_ms=25, wait_ms=30))
    assert [d.policy for d in dec] == ["comm"] and state.comm_window == ctl.config.comm_window_init


def test_comm_inflation_within_the_noise_of_transfer_starts_no_trial(summaries):
    """On a busy host transfer time swings from window to window: 2x its median is not contention
    when windows routinely differ that much (the old running-minimum baseline tried comm here)."""
    ctl = Controller(4, policies=("comm",))
    seq = [10.0, 30.0, 12.0, 28.0, 9.0, 25.0, 26.0, 27.0, 11.0, 29.0]
    for w, t in enumerate(seq):
        state, dec = ctl.update(50 * (w + 1), summaries(w, transfer_ms=t, wait_ms=30))
        assert dec == [] and state.comm_window is None


def test_a_host_slowing_down_as_a_whole_is_not_network_contention(summaries):
    """Other processes take the CPU: compute and transfer stretch together (2.5x). Not contention in
    the network, so comm is not tried; transfer stretching alone is."""
    ctl = Controller(4, policies=("comm",))
    for w, t in enumerate((10.0, 10.5, 9.5)):
        ctl.update(50 * (w + 1), summaries(w, transfer_ms=t, compute_ms=60.0, wait_ms=30))
    for w in (3, 4, 5):
        state, dec = ctl.update(50 * (w + 1), summaries(w, transfer_ms=25, compute_ms=150.0, wait_ms=30))
        assert dec == [] and state.comm_window is None


def test_identical_inputs_give_identical_decisions(summaries):
    a, b = Controller(4), Controller(4)
    for w in range(6):
        s = summaries(w, step_ms=100 - 5 * (w % 2), gc_ms=6, gc_count=2, std_ms=3)
        assert a.update(w * 50, s) == b.update(w * 50, list(reversed(s)))


def test_placement_proposed_once_with_leaves(summaries):
    ctl = Controller(4, policies="auto", leaves=[0, 1, 0, 1])
    state, dec = ctl.update(50, summaries(0))
    assert state.placement == (0, 2, 1, 3)
    assert [d.policy for d in dec] == ["placement"] and "next restart" in dec[0].reason
    _state, dec = ctl.update(100, summaries(1))
    assert dec == []


def test_placement_learns_leaves_from_the_window_summaries(summaries):
    from dataclasses import replace

    from fabricpace.observe.windows import leaf_id

    ids = [leaf_id(n) for n in ("sw-17", "sw-3", "sw-17", "sw-3")]
    ctl = Controller(4, policies="placement")
    state, dec = ctl.update(50, [replace(s, leaf=ids[s.rank]) for s in summaries(0)])
    assert ctl.leaves == (0, 1, 0, 1) and state.placement == (0, 2, 1, 3)
    assert [d.policy for d in dec] == ["placement"]
    # one rank without a leaf name: nothing is learnt, nothing proposed
    ctl = Controller(4, policies="placement")
    s = [replace(s, leaf=ids[s.rank] if s.rank else -1.0) for s in summaries(0)]
    assert ctl.update(50, s)[1] == [] and ctl.leaves is None


def test_bad_summaries_raise(summaries):
    ctl = Controller(4)
    with pytest.raises(ValueError, match="expected 4"):
        ctl.update(50, summaries(0, world=3))
    s = summaries(0)
    s[1] = summaries(1)[1]
    with pytest.raises(ValueError, match="mix windows"):
        ctl.update(50, s)


def test_policies_and_config_validation():
    assert parse_policies("auto") == ("gc", "rebalance", "comm", "placement")
    assert parse_policies("off") == ()
    assert parse_policies(["comm", "gc"]) == ("gc", "comm")
    with pytest.raises(ConfigError, match="unknown policy 'fast'"):
        parse_policies("gc,fast")
    with pytest.raises(ConfigError, match="gc_interval"):
        PacingConfig(gc_interval=0)
    with pytest.raises(ConfigError, match="unknown field 'nope'"):
        PacingConfig().with_overrides(nope=1)


def test_memory_growth_adds_full_collections_no_more_often_than_the_floor(summaries):
    """Lockstep young collections every step; when memory keeps growing, full lockstep collections are
    added and made more frequent, but never more often than `gc_full_interval_min` steps."""
    ctl = Controller(4, policies=("gc",))
    ctl.update(50, summaries(0, step_ms=100, gc_ms=8, gc_count=100))
    ctl.update(100, summaries(1, step_ms=70, gc_ms=1, gc_count=50))
    assert ctl.kept.gc_interval == 1
    rss = 1e9
    for w in range(2, 12):
        rss *= 1.2
        ctl.update(50 * (w + 1), summaries(w, step_ms=70, gc_ms=1, gc_count=50, rss=rss))
    assert ctl.kept.gc_full_interval == ctl.config.gc_full_interval_min


def test_heavy_gc_on_a_part_of_the_fleet_is_tried_at_once(summaries):
    """GC costing several times the trigger on a fifth of the ranks is clear within one window: waiting
    for a second window leaves a whole window at the slow level (and a level change in the run)."""
    ctl = Controller(10, policies=("gc",))
    heavy = {"gc_ms": [80.0, 80.0] + [0.0] * 8, "gc_count": [1.0, 1.0] + [0.0] * 8}
    state, dec = ctl.update(50, summaries(0, world=10, step_ms=100, **heavy))
    assert [d.policy for d in dec] == ["gc"] and state.gc_interval is not None
    # the same on a single rank of ten (a one-off) still waits for a second window
    ctl = Controller(10, policies=("gc",))
    one = {"gc_ms": [80.0] + [0.0] * 9, "gc_count": [1.0] + [0.0] * 9}
    state, dec = ctl.update(50, summaries(0, world=10, step_ms=100, **one))
    assert dec == [] and state.gc_interval is None


def test_a_move_whose_straggler_is_gone_in_its_on_window_is_reverted_at_once(summaries):
    """Slowness that wanders (rank 1 slow in window 0, rank 2 in window 1, ...): the move tried for
    rank 1 runs while rank 2 is slow, so the ON window is slower and rank 1 no longer slow per sample.
    The move is reverted after that one pair (before: a second pair, one more ON window), and from then
    on a straggler must persist for two windows before a move is tried."""
    ctl = Controller(4, _AT_ONCE, policies=("rebalance",))

    def slow_window(w: int, r: int, samples: list[float], step_ms: float) -> tuple:
        comp = [60.0 / 16 * n for n in samples]
        comp[r] = 90.0 / 16 * samples[r]
        last = [2.0] * 4
        last[r] = 45.0
        return ctl.update(
            (w + 1) * 50, summaries(w, step_ms=step_ms, compute_ms=comp, samples=samples, last=last)
        )

    state, dec = slow_window(0, 1, [16.0] * 4, 100.0)
    assert [d.action for d in dec] == ["enable"] and state.shares is not None
    moved = [float(n) for n in counts_from_shares(state.shares, 64, 4)]
    # ON window: rank 1 is fine now (fewer samples), rank 2 slow with extra samples: 8% slower steps
    state, dec = slow_window(1, 2, moved, 108.0)
    assert [(d.policy, d.action) for d in dec] == [("rebalance", "note"), ("guard", "revert")]
    assert "no longer slower per sample" in dec[0].reason and "it hurts" in dec[1].reason
    assert state.shares is None and ctl.kept.shares is None
    # After the cooldown, a new straggler clear within one window is no longer tried at once...
    w = ctl.config.guard_cooldown + 2
    state, dec = slow_window(w, 3, [16.0] * 4, 100.0)
    assert dec == [] and state.shares is None
    # ...but one that persists for a second window is.
    state, dec = slow_window(w + 1, 3, [16.0] * 4, 100.0)
    assert [d.action for d in dec] == ["enable"] and state.shares is not None


def test_a_move_whose_straggler_persists_is_judged_by_the_guard_alone(summaries):
    """The early revert needs both: the ranks relieved are no longer slow AND the ON window is slower.
    A straggler that is still slow per sample in a slower ON window (e.g. a noisy window) is left to the
    guard's pairs, as before."""
    ctl = Controller(4, _AT_ONCE, policies=("rebalance",))
    comp, last = [60.0, 90.0, 60.0, 60.0], [1.0, 45.0, 2.0, 2.0]
    state, _ = ctl.update(50, summaries(0, compute_ms=comp, last=last))
    samples = [float(n) for n in counts_from_shares(state.shares, 64, 4)]
    on = [60.0 / 16 * n for n in samples]
    on[1] = 90.0 / 16 * samples[1]
    state, dec = ctl.update(
        100, summaries(1, step_ms=108, compute_ms=on, samples=samples, last=[15.0, 5.0, 15.0, 15.0])
    )
    assert dec == [] and ctl.guard.trial is not None


def test_controller_memory_does_not_grow_with_healthy_windows(summaries):
    # The drift estimate reads the latest guard_drift_windows + 1 untreated windows; the controller
    # kept every window it ever saw (~72 B each: 20,000 windows of a 1M-step run, for nothing).
    ctl = Controller(4)
    for w in range(300):
        ctl.update((w + 1) * 50, summaries(w, step_ms=100 + (w % 3)))
    assert len(ctl._untreated) <= ctl.config.guard_drift_windows + 1
    assert ctl._drift_sd() > 0  # (the windows it needs are still there)


def test_a_straggler_that_appeared_before_the_trial_is_not_drift(summaries):
    """Audit 17 (node 2 3x slow from step 200): the jump into the fault, among the changes between
    untreated windows, was taken as host drift and kept a -50% gain from ever being kept. Here the job
    steps up from 100 to 130 ms and stays; a 6% faster ON window is then a clear gain after one pair,
    as on a quiet host. A host whose level comes and goes still widens the guard."""
    def trial(history: list[float], level: float) -> list:
        ctl = Controller(4, policies=("gc",))
        for w, t in enumerate(history):
            ctl.update(50 * (w + 1), summaries(w, step_ms=t, std_ms=1.0))
        w = len(history)
        _s, dec = ctl.update(50 * (w + 1), summaries(w, step_ms=level, std_ms=1.0, gc_ms=8, gc_count=100))
        assert [d.action for d in dec] == ["enable"]
        _s, dec = ctl.update(50 * (w + 2), summaries(w + 1, step_ms=0.94 * level, std_ms=1.0, gc_ms=1,
                                                     gc_count=50))
        return dec

    assert [d.action for d in trial([100.0, 100.4, 99.8, 130.0, 130.3], 130.0)] == ["keep"]
    assert trial([100.0, 100.4, 130.0, 130.2, 100.1, 100.3], 100.0) == []  # up and back: drift


def test_the_gc_reason_gives_a_true_collection_rate(summaries):
    """Audit 17: "GC pauses cost 9.6% of step time (0 collections per rank and step)": the 0 was the
    median over ranks, most of which did not collect in a 10-step window."""
    ctl = Controller(4, PacingConfig(trigger_windows=1), policies=("gc",))
    _s, dec = ctl.update(10, summaries(0, steps=10, gc_ms=[30.0, 15.0, 0.0, 0.0], gc_count=[2, 1, 0, 0]))
    assert [d.action for d in dec] == ["enable"], dec
    assert "(0.075 collections per rank and step, on 50% of ranks)" in dec[0].reason, dec[0].reason
