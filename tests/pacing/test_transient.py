"""Transient stragglers: the window's tail, and the fixed per-step cost when counts barely differ."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from fabricpace.pacing import Controller, PacingConfig
from fabricpace.pacing.rebalance import fixed_step_cost
from fabricpace.run.window import WINDOW_FIELDS, WindowSummary, tail_steps

# A first move tried at once, without a confirmation window (``rebalance_confirm_steps`` = 0): these
# tests are about what follows the move.
_AT_ONCE = PacingConfig(rebalance_confirm_steps=0)


def _with_tail(summaries: list[WindowSummary], tail_ms: list[float]) -> list[WindowSummary]:
    return [
        replace(s, tail_compute_median_ns=t * 1e6, tail_samples_mean=s.samples_mean)
        for s, t in zip(summaries, tail_ms, strict=True)
    ]


def test_a_straggler_that_recovered_inside_the_window_is_not_moved_at_once(summaries):
    """Rank 3 is 2x slow in the window's median and last in every collective (clear within one window)
    but no longer slow in the window's last steps: it recovered inside the window, so a move tried now
    would run after it is gone. The trigger must persist; a straggler still slow at the end is moved at
    once as before."""
    comp = [60.0, 60.0, 60.0, 120.0]
    last = [0.0, 0.0, 0.0, 40.0]
    gone = Controller(4, _AT_ONCE, policies=["rebalance"])
    _, out = gone.update(50, _with_tail(summaries(0, compute_ms=comp, last=last), [60.0, 61.0, 59.0, 60.5]))
    assert not [d for d in out if d.action == "enable"], out
    assert gone.guard.trial is None
    still = Controller(4, _AT_ONCE, policies=["rebalance"])
    _, out = still.update(50, _with_tail(summaries(0, compute_ms=comp, last=last), [60.0, 61.0, 59.0, 119.0]))
    assert [d.policy for d in out if d.action == "enable"] == ["rebalance"]
    # Without tail fields (an older sender) the window's median decides, as before.
    old = Controller(4, _AT_ONCE, policies=["rebalance"])
    _, out = old.update(50, summaries(0, compute_ms=comp, last=last))
    assert [d.policy for d in out if d.action == "enable"] == ["rebalance"]


def test_a_tail_that_was_quiet_still_counts_toward_persistence(summaries):
    """The window whose tail looked recovered is still a window in which the trigger fired: when the
    straggler is slow again in the next window (a dip, not a recovery), that window's move is tried."""
    comp = [60.0, 60.0, 60.0, 120.0]
    last = [0.0, 0.0, 0.0, 40.0]
    weak = [60.0, 60.0, 60.0, 65.4]  # 9% slow: below the clear excess, so it must fire in two windows
    fresh = Controller(4, _AT_ONCE, policies=["rebalance"])
    _, out = fresh.update(100, _with_tail(summaries(1, compute_ms=weak, last=last, samples=160.0), weak))
    assert not [d for d in out if d.action == "enable"]  # one window of a weak straggler: waits
    ctl = Controller(4, _AT_ONCE, policies=["rebalance"])
    quiet_tail = [60.0, 60.0, 60.0, 60.0]
    ctl.update(50, _with_tail(summaries(0, compute_ms=comp, last=last, samples=160.0), quiet_tail))
    assert ctl.guard.trial is None
    _, out = ctl.update(100, _with_tail(summaries(1, compute_ms=weak, last=last, samples=160.0), weak))
    assert [d.policy for d in out if d.action == "enable"] == ["rebalance"]


def test_tail_length():
    assert [tail_steps(n) for n in (0, 1, 3, 5, 10, 25, 50, 100)] == [0, 1, 3, 5, 5, 5, 10, 20]
    i = WINDOW_FIELDS.index("tail_compute_median_ns")
    assert WINDOW_FIELDS[i : i + 2] == ("tail_compute_median_ns", "tail_samples_mean")


def test_fixed_step_cost_is_not_read_from_counts_that_barely_differ():
    """ResNet-50 at 256 samples per GPU after a move: the ranks that took samples hold 259, 260 and 261.
    A slope between counts one sample apart is jitter; extrapolated to 0 samples it made a 'fixed part'
    of a quarter of the step, and the rank that gave samples away looked 2x faster per sample than it
    is (the controller then handed it 6x an equal share). No fixed part can be told from such counts."""
    n = np.array([155.0] + [259.0] * 10 + [260.0] * 11 + [261.0] * 10)
    for seed in range(10):  # before: 15, 59 and 67 ms of a 98 ms compute for seeds 0, 8 and 9
        rng = np.random.default_rng(seed)
        c = 0.38 * n * (1.0 + rng.normal(0.0, 0.005, n.size))  # no fixed part; 0.5% rank-to-rank spread
        assert fixed_step_cost(c, n) == 0.0, seed
    rng = np.random.default_rng(1)
    # counts far enough apart still give the intercept (the session-5 case: 12 and 13 samples)
    n2 = np.array([8.0] + [12.0] * 27 + [13.0] * 4)
    c2 = 6.0 + 29.0 * n2 * (1.0 + rng.normal(0.0, 0.0035, n2.size))
    assert fixed_step_cost(c2, n2) == pytest.approx(6.0, abs=12.0)
    assert fixed_step_cost(c2, n2) > 0.0


def _window(summaries, w, per_sample_ms, counts, tail_per_sample_ms, *, step_ms, last):
    comp = [p * n for p, n in zip(per_sample_ms, counts, strict=True)]
    tail = [p * n for p, n in zip(tail_per_sample_ms, counts, strict=True)]
    return _with_tail(summaries(w, compute_ms=comp, samples=list(counts), step_ms=step_ms, last=last), tail)


@pytest.mark.parametrize("gone_excess", [0.025, 0.0])
def test_a_kept_move_is_undone_when_the_straggler_recovered(summaries, gone_excess):
    """Rank 3 (2x slow) gave samples away and the move was kept. In a later window it recovered part-way:
    the window's median still calls it slow and it is still last in half the collectives, but its last
    steps run at the fleet's speed. The move has nothing left to relieve: equal shares again at once
    (before, and with the check off, the move stayed — here the move back predicts less than the 3%
    a further move needs, so nothing would ever undo it)."""
    from fabricpace.pacing.config import PacingConfig
    from fabricpace.pacing.rebalance import counts_from_shares

    config = PacingConfig(straggler_tail_gone_excess=gone_excess, rebalance_confirm_steps=0)
    ctl = Controller(4, config, policies=["rebalance"])
    slow = [0.375, 0.375, 0.375, 0.75]
    even = [160, 160, 160, 160]
    ctl.update(50, _window(summaries, 0, slow, even, slow, step_ms=100.0, last=[0.0, 0.0, 0.0, 40.0]))
    trial = ctl.guard.trial
    assert trial is not None and trial.on.shares is not None
    counts = counts_from_shares(trial.on.shares, 640, 4)
    assert counts[3] < 160
    _, out = ctl.update(100, _window(summaries, 1, slow, counts, slow, step_ms=75.0,
                                     last=[10.0, 10.0, 10.0, 10.0]))
    assert [d.action for d in out if d.policy == "guard"] == ["keep"]
    assert ctl.kept.shares == trial.on.shares
    mixed = [0.375, 0.375, 0.375, 0.6]  # the window's median: still slow
    state, out = ctl.update(150, _window(summaries, 2, mixed, counts, [0.375] * 4, step_ms=75.0,
                                         last=[13.0, 13.0, 13.0, 21.0]))
    undo = [d for d in out if d.policy == "rebalance" and d.action == "adjust"]
    if gone_excess > 0:
        assert len(undo) == 1 and "no longer slower per sample in the window's last steps" in undo[0].reason
        assert ctl.kept.shares is None and state.shares is None and ctl.guard.trial is None
    else:
        assert undo == [] and state.shares == trial.on.shares, out


def test_a_move_whose_straggler_left_is_not_reported_as_kept(summaries):
    """Rank 3 was 2x slow in the window that proposed the move and gone from the first step of the ON
    window: the ON window is faster than the slow OFF one only because the straggler left. Session 9
    kept the move ("step time -30% with it", a claim the move did not earn) and undid it in the same
    window; now it is reverted as "its straggler is gone", with no cooldown and the same result:
    equal shares from the next window on, and a straggler that comes back is moved at once."""
    ctl = Controller(4, _AT_ONCE, policies=["rebalance"])
    slow = [0.375, 0.375, 0.375, 0.75]
    even = [160, 160, 160, 160]
    ctl.update(50, _window(summaries, 0, slow, even, slow, step_ms=100.0, last=[0.0, 0.0, 0.0, 40.0]))
    trial = ctl.guard.trial
    assert trial is not None and trial.on.shares is not None
    from fabricpace.pacing.rebalance import counts_from_shares

    counts = counts_from_shares(trial.on.shares, 640, 4)
    fast = [0.375] * 4
    state, out = ctl.update(100, _window(summaries, 1, fast, counts, fast, step_ms=70.0,
                                         last=[13.0, 13.0, 14.0, 0.0]))
    assert [(d.policy, d.action) for d in out] == [("rebalance", "note"), ("guard", "revert")], out
    assert "its straggler is gone" in out[1].reason and not [d for d in out if d.action == "keep"]
    assert state.shares is None and ctl.kept.shares is None
    # no cooldown, no "wandering" flag: the straggler's return is moved at once
    back = _window(summaries, 2, slow, even, slow, step_ms=100.0, last=[0.0, 0.0, 0.0, 40.0])
    _, out = ctl.update(150, back)
    assert [d.policy for d in out if d.action == "enable"] == ["rebalance"], out


def test_ranks_a_hair_below_equal_do_not_speak_for_the_straggler(summaries):
    """Kept shares after two moves: rank 3 gave 40% of its samples, ranks 0 and 1 are 1% below equal
    from a later adjustment. Ranks 0 and 1 run at the fleet's speed, rank 3 is still slow: the move
    still has a straggler to relieve and stays."""
    from fabricpace.pacing.state import PacingState

    ctl = Controller(4, policies=["rebalance"])
    shares = (0.2475, 0.2475, 0.355, 0.15)
    ctl.kept = ctl.state = PacingState(shares=shares)
    counts = [99, 99, 142, 60]
    per = [0.375, 0.375, 0.375, 0.75]
    _, out = ctl.update(50, _window(summaries, 0, per, counts, per, step_ms=60.0,
                                   last=[10.0, 10.0, 10.0, 10.0]))
    assert not [d for d in out if d.action == "adjust" and d.policy == "rebalance"], out
    assert ctl.kept.shares == shares


def test_a_group_just_above_the_trigger_is_not_lost_to_one_noisy_tail(summaries):
    """A group of 3 ranks 5.4% slow for two windows: in the second window's tail one of them reads 4.9%
    (below the 5% trigger) — the group as a whole kept its excess, so the move is tried (before, the
    tail check was per rank, and unseen-56 lost its move in 3 of 5 seeds)."""
    comp = [60.0] * 5 + [63.24] * 3
    tail = [60.0] * 5 + [63.3, 62.94, 63.2]
    last = [0.0] * 5 + [10.0] * 3
    ctl = Controller(8, _AT_ONCE, policies=["rebalance"])
    for w in (0, 1):
        window = summaries(w, 8, compute_ms=comp, last=last, samples=256.0, step_ms=45.0)
        _, out = ctl.update(50 * (w + 1), _with_tail(window, tail))
    assert [d.policy for d in out if d.action == "enable"] == ["rebalance"], out


def test_a_rebalance_trial_opens_with_a_short_probe_window(summaries):
    """The first ON window of a rebalance trial lasts ``rebalance_probe_steps`` (5) steps, whatever the
    window length (or, with that 0, a fifth of the proposing window, at least 5 steps): a straggler gone
    right after the proposing window costs those steps, not a whole window."""
    comp, last = [60.0, 60.0, 60.0, 120.0], [0.0, 0.0, 0.0, 40.0]
    ctl = Controller(4, _AT_ONCE, policies=["rebalance"])
    state, out = ctl.update(50, summaries(0, compute_ms=comp, last=last))
    assert [d.policy for d in out if d.action == "enable"] == ["rebalance"] and state.shares is not None
    assert ctl.next_window_steps == 5
    long = Controller(4, _AT_ONCE, policies=["rebalance"])
    long.update(100, summaries(0, compute_ms=comp, last=last, steps=100))
    assert long.next_window_steps == 5
    share = Controller(4, replace(_AT_ONCE, rebalance_probe_steps=0), policies=["rebalance"])
    share.update(50, summaries(0, compute_ms=comp, last=last))
    assert share.next_window_steps == 10
    off = Controller(4, replace(_AT_ONCE, rebalance_probe_share=0.0), policies=["rebalance"])
    off.update(50, summaries(0, compute_ms=comp, last=last))
    assert off.guard.trial is not None and off.next_window_steps is None
    # a 20-step window gives 5 (the floor); no trial, no probe
    short = Controller(4, _AT_ONCE, policies=["rebalance"])
    short.update(20, summaries(0, compute_ms=comp, last=last, steps=20))
    assert short.next_window_steps == 5
    quiet = Controller(4, _AT_ONCE, policies=["rebalance"])
    quiet.update(50, summaries(0))
    assert quiet.next_window_steps is None


def test_a_first_move_waits_for_a_short_confirmation_window(summaries):
    """A straggler clear in one window is moved only if it is still slow in the next 5 steps, run on the
    old shares: one that ended exactly where the proposing window ended (a fault from step 0 to 50)
    then costs nothing. Confirmed, the trial starts with its probe; the proposing and the confirmation
    window together are its first control window."""
    comp, last = [60.0, 60.0, 60.0, 120.0], [0.0, 0.0, 0.0, 40.0]
    for still in (True, False):
        ctl = Controller(4, policies=["rebalance"])
        state, out = ctl.update(50, summaries(0, compute_ms=comp, last=last))
        assert out == [] and state.shares is None and ctl.guard.trial is None
        assert ctl.next_window_steps == 5 and "confirming a move for rank 3" in ctl.describe()
        now = comp if still else [60.0, 61.0, 59.0, 60.5]
        confirm = [replace(x, first_step=50) for x in summaries(1, steps=5, compute_ms=now, last=last)]
        state, out = ctl.update(55, confirm)
        if still:
            assert [(d.policy, d.action) for d in out] == [("rebalance", "enable")], out
            assert state.shares is not None and state.shares[3] < 0.25
            trial = ctl.guard.trial
            assert trial is not None and trial.start_window == 1 and trial.arms[1] == "off"
            assert ctl.next_window_steps == 5 and trial.probe == 2  # the probe follows
        else:
            assert [(d.policy, d.action) for d in out] == [("rebalance", "note")], out
            assert "not tried" in out[0].reason and "rank 3" in out[0].reason
            assert state.shares is None and ctl.guard.trial is None and ctl.next_window_steps is None
    three = Controller(4, PacingConfig(rebalance_confirm_steps=3), policies=["rebalance"])
    three.update(50, summaries(0, compute_ms=comp, last=last))
    assert three.next_window_steps == 3 and three.guard.trial is None
    # with rebalance_confirm_steps = 0 the trial starts at once (before session 12)
    at_once = Controller(4, _AT_ONCE, policies=["rebalance"])
    state, out = at_once.update(50, summaries(0, compute_ms=comp, last=last))
    assert [d.action for d in out] == ["enable"] and state.shares is not None


def test_a_straggler_that_ends_inside_the_confirmation_window_is_not_moved(summaries):
    """Slow in 3 of the confirmation window's 5 steps, rank 3 is still slow in their median, but it no
    longer arrives last in the last ones (62% of the collectives instead of 100%): not tried. A second
    straggler that takes the last place (rank 2, now 20% slow per sample) does not count against rank 3."""
    comp, last = [60.0, 60.0, 60.0, 120.0], [0.0, 0.0, 0.0, 40.0]
    cases = {  # confirmation window: (compute, last arrivals) -> move tried
        "ended": ([60.0, 60.0, 60.0, 120.0], [1.0, 1.0, 1.0, 5.0], False),
        "still": ([60.0, 60.0, 60.0, 120.0], [0.0, 0.0, 0.0, 8.0], True),
        "second": ([60.0, 60.0, 90.0, 120.0], [0.0, 0.0, 7.0, 1.0], True),
    }
    for name, (c_comp, c_last, tried) in cases.items():
        ctl = Controller(4, policies=["rebalance"])
        ctl.update(50, summaries(0, compute_ms=comp, last=last))
        confirm = [replace(x, first_step=50) for x in summaries(1, steps=5, compute_ms=c_comp, last=c_last)]
        _, out = ctl.update(55, confirm)
        assert (ctl.guard.trial is not None) == tried, (name, out)
        if not tried:
            assert "last in 62% of the collectives (100% before)" in out[0].reason, out


def test_arrival_order_confirms_only_a_group_that_was_nearly_always_last(summaries):
    """A straggler last in 70% of the collectives (GC pauses and jitter put others last too) is judged in
    the confirmation window by its compute per sample alone: last in 20% of a few steps' collectives is
    noise for it, not its end."""
    comp, last = [60.0, 60.0, 60.0, 69.0], [5.0, 5.0, 5.0, 35.0]  # 15% slow, last in 70%
    ctl = Controller(4, policies=["rebalance"])
    ctl.update(50, summaries(0, compute_ms=comp, last=last))
    ctl.update(100, summaries(1, compute_ms=comp, last=last))  # persistent: waits for confirmation
    noisy = summaries(2, steps=5, compute_ms=comp, last=[3.0, 3.0, 2.0, 2.0])
    confirm = [replace(x, first_step=100) for x in noisy]
    _, out = ctl.update(105, confirm)
    assert ctl.guard.trial is not None and [d.action for d in out] == ["enable"], out


def test_a_gc_candidate_is_not_held_back_by_an_unconfirmed_move(summaries):
    """GC and a straggler clear in the same window make one trial; when the straggler is gone in the
    confirmation window the GC candidate starts alone (its trial has whole windows, no probe)."""
    comp, last = [60.0, 60.0, 60.0, 120.0], [0.0, 0.0, 0.0, 40.0]
    ctl = Controller(4, policies=["gc", "rebalance"])
    kw = {"gc_ms": 10.0, "gc_count": 2.0}
    _, out = ctl.update(50, summaries(0, compute_ms=comp, last=last, **kw))
    assert out == [] and ctl.next_window_steps == 5
    confirm = [replace(x, first_step=50) for x in summaries(1, steps=5, last=last, **kw)]
    state, out = ctl.update(55, confirm)
    assert [(d.policy, d.action) for d in out] == [("rebalance", "note"), ("gc", "enable")], out
    assert ctl.guard.trial is not None and ctl.guard.trial.policy == "gc"
    assert state.gc_interval is not None and state.shares is None and ctl.next_window_steps is None


def test_the_confirmation_window_counts_with_the_window_before_it(summaries):
    """A weaker straggler (it must fire in two consecutive windows) whose first move waits for a
    confirmation that fails: the next whole window still follows the proposing one for the trigger's
    streak, so a straggler that is back is proposed again at once instead of starting a new streak."""
    comp, last = [60.0, 60.0, 60.0, 69.0], [5.0, 5.0, 5.0, 35.0]  # 15% slow, last in 70%: not clear
    ctl = Controller(4, PacingConfig(trigger_windows=2), policies=["rebalance"])
    assert ctl.update(50, summaries(0, compute_ms=comp, last=last))[1] == []
    assert ctl.next_window_steps is None  # not persistent yet: no confirmation window
    ctl.update(100, summaries(1, compute_ms=comp, last=last))  # persistent: waits for confirmation
    assert ctl.next_window_steps == 5 and ctl.guard.trial is None
    gone = [replace(x, first_step=100) for x in summaries(2, steps=5, last=last)]
    _, out = ctl.update(105, gone)
    assert [d.action for d in out] == ["note"]
    ctl.update(155, summaries(3, compute_ms=comp, last=last))  # slow again: consecutive with window 1
    # (confirmed over 10 steps now: the straggler before ended within its confirmation window)
    assert ctl.next_window_steps == 10 and ctl.guard.trial is None


def test_a_gc_trial_keeps_whole_windows(summaries):
    ctl = Controller(4, policies=["gc"])
    heavy = {"gc_ms": [30.0] * 4, "gc_count": [2.0] * 4}
    state, _ = ctl.update(50, summaries(0, **heavy))
    assert state.gc_interval is not None and ctl.guard.trial is not None
    assert ctl.next_window_steps is None


def test_a_move_whose_straggler_left_is_reverted_even_when_its_on_window_looks_faster(summaries):
    """A node fault that ends exactly where the proposing window ends, after three quiet windows: the
    ON window is faster than the slow proposing window, but the fault's own jump (100 -> 150 ms) is the
    only change between untreated windows, so the drift it adds to the CI kept the guard from keeping
    (or reverting) after one pair, and the move ran through a second ON window (-2.4% on the paper
    workload at 4 nodes). Rank 3 is no longer slow per sample in the ON window: reverted at once."""
    ctl = Controller(4, _AT_ONCE, policies=["rebalance"])
    for w in range(3):
        ctl.update(50 * (w + 1), summaries(w, step_ms=100.0 + (w % 2), compute_ms=60.0))
    comp, last = [60.0, 60.0, 60.0, 90.0], [0.0, 0.0, 0.0, 40.0]
    state, out = ctl.update(200, summaries(3, step_ms=150.0, compute_ms=comp, last=last))
    assert [d.policy for d in out if d.action == "enable"] == ["rebalance"]
    from fabricpace.pacing.rebalance import counts_from_shares

    counts = [float(n) for n in counts_from_shares(state.shares, 64, 4)]
    even = [60.0 / 16 * n for n in counts]  # rank 3 at the fleet's speed per sample again
    state, out = ctl.update(210, summaries(4, step_ms=110.0, compute_ms=even, samples=counts, steps=10))
    assert [(d.policy, d.action) for d in out] == [("rebalance", "note"), ("guard", "revert")], out
    assert "its straggler is gone" in out[1].reason
    assert state.shares is None and ctl.kept.shares is None and ctl.guard.trial is None


def test_a_move_that_loads_a_new_straggler_is_replaced_at_once(summaries):
    """Rank 3 is slow and a move gives its samples to the others; during the move's probe window rank 1
    becomes 1.6x slow (a second fault). The move now loads the new straggler: it is reverted after that
    window with no cooldown, and a move for rank 1 is proposed from the same window (before: the trial
    ran two more windows and was reverted as "it hurts", -5% on a user's two-fault scenario)."""
    from fabricpace.pacing.rebalance import counts_from_shares

    ctl = Controller(4, _AT_ONCE, policies=["rebalance"])
    comp, last = [60.0, 60.0, 60.0, 90.0], [0.0, 0.0, 0.0, 40.0]
    state, _ = ctl.update(50, summaries(0, compute_ms=comp, last=last))
    assert state.shares is not None and ctl.next_window_steps == 5
    counts = [float(n) for n in counts_from_shares(state.shares, 64, 4)]
    per = [60.0 / 16, 96.0 / 16, 60.0 / 16, 90.0 / 16]  # per sample: rank 1 1.6x, rank 3 still 1.5x
    comp2 = [p * n for p, n in zip(per, counts, strict=True)]
    state, out = ctl.update(60, summaries(1, step_ms=130.0, compute_ms=comp2, samples=counts, steps=10,
                                          last=[0.0, 9.0, 0.0, 1.0]))
    acts = [(d.policy, d.action) for d in out]
    assert acts[:2] == [("rebalance", "note"), ("guard", "revert")], out
    assert "rank 1, given samples by the move" in out[0].reason and "a new straggler" in out[1].reason
    assert ("rebalance", "enable") in acts[2:] and state.shares is not None
    assert state.shares[1] < 0.25, state.shares  # the new move relieves rank 1
    # A move that works (its receivers no slower per sample) is not touched by this rule.
    ok = Controller(4, _AT_ONCE, policies=["rebalance"])
    state, _ = ok.update(50, summaries(0, compute_ms=comp, last=last))
    counts = [float(n) for n in counts_from_shares(state.shares, 64, 4)]
    comp3 = [60.0 / 16 * n for n in counts[:3]] + [90.0 / 16 * counts[3]]
    _, out = ok.update(60, summaries(1, step_ms=80.0, compute_ms=comp3, samples=counts, steps=10,
                                     last=[3.0, 3.0, 3.0, 1.0]))
    assert not [d for d in out if "new straggler" in d.reason], out


def test_a_further_move_on_trial_ends_when_the_kept_moves_straggler_is_gone(summaries):
    """A kept move relieves rank 3 and a further move is on trial. In one of the trial's control
    windows rank 3 runs at the fleet's speed again (its fault ended): both moves have nothing left to
    relieve. The trial ends there and the kept move is undone in the same window (before: the trial
    ran on through its windows with the kept shares, and the undo waited for the trial's end —
    ResNet-50, node 1.5x slow until step 131, one seed +6.3% instead of +9.9%)."""
    from fabricpace.pacing.state import PacingState

    ctl = Controller(4, policies=["rebalance"])
    kept = PacingState(shares=(0.3, 0.3, 0.3, 0.1))
    ctl.kept = ctl.state = kept
    trial = ctl.guard.start(policy="rebalance", on=PacingState(shares=(0.31, 0.31, 0.31, 0.07)),
                            off=kept, window=0, reason="test")
    trial.arms[0] = "off"
    trial.record(0, 100e6, 1e6)
    assert [ctl.guard.state_for(w) for w in (1, 2, 3)] == [trial.on, trial.on, kept]
    for w in (1, 2):
        trial.record(w, 101e6, 1e6)
    counts = [120.0, 120.0, 120.0, 40.0]
    even = [0.375 * n for n in counts]
    state, out = ctl.update(200, _with_tail(summaries(3, compute_ms=even, samples=counts), even))
    assert [(d.policy, d.action) for d in out] == [("guard", "revert"), ("rebalance", "adjust")], out
    assert "its straggler is gone" in out[0].reason
    assert ctl.guard.trial is None and state.shares is None and ctl.kept.shares is None


def test_a_slightly_slow_node_trimmed_by_the_move_does_not_speak_for_the_straggler(summaries):
    """A rank 43% slow and a node 4% slow: the speed-proportional move takes 23% from the rank and a
    hair from the node's ranks. In the probe window the node is still 4% slow (below the 5% trigger)
    and the rank still 43%: the move's straggler is not gone (before: the median over all ranks that
    gave anything — mostly the node — read 4% and reverted a move worth +9%; a user's unseen scenario)."""
    from fabricpace.pacing.rebalance import counts_from_shares

    world = 16
    per = [0.375 * 1.043] * 8 + [0.375] * 7 + [0.375 * 1.43]
    samples = 160.0
    comp = [p * samples for p in per]  # the straggler's compute: 86 of a 100 ms step
    last = [0.0] * 15 + [40.0]
    ctl = Controller(world, _AT_ONCE, policies=["rebalance"])
    state, out = ctl.update(50, summaries(0, world, compute_ms=comp, samples=samples, last=last))
    assert [d.policy for d in out if d.action == "enable"] == ["rebalance"] and state.shares is not None
    assert state.shares[15] < state.shares[0] < 1 / world < state.shares[8]
    counts = [float(n) for n in counts_from_shares(state.shares, 2560, world)]
    comp2 = [p * n for p, n in zip(per, counts, strict=True)]
    state, out = ctl.update(60, summaries(1, world, compute_ms=comp2, samples=counts, steps=10, step_ms=101.0,
                                          last=[1.0] * 16))
    assert not [d for d in out if d.action == "revert"], out
    assert ctl.guard.trial is not None and state.shares is not None


def test_the_drift_between_windows_pairs_only_windows_that_follow_each_other():
    """The guard's between-window noise is measured on untreated windows that follow each other. Two
    untreated windows with a trial between them differ by whatever changed over the trial (a straggler
    that came back: `ts2.0-periodic`, whose +9.6% fell to +3.5% when that jump widened the next
    trial's CI so much that a clear gain could not be kept)."""
    from fabricpace.pacing.state import PacingState

    ctl = Controller(4, policies=["rebalance"])
    off = PacingState()
    ctl._untreated = [(off, 100.0, 0), (off, 150.0, 3), (off, 151.0, 4), (off, 150.0, 5), (off, 151.5, 6)]
    assert 0 < ctl._drift_sd() < 0.01
    ctl._untreated = [(off, 100.0, 0), (off, 150.0, 3), (off, 151.0, 4), (off, 150.0, 5)]
    assert ctl._drift_sd() == 0.0  # two changes between neighbours: too few to measure drift


def test_a_move_kept_on_its_probe_is_rechecked_in_short_windows(summaries):
    """After a move is kept on its 5-step probe, the next whole window is run as 5-step re-checks that
    only ask whether its straggler is gone: rank 3's fault ends in the third re-check, and the move is
    undone there (before: a whole window of moved samples first, -0.4% instead of +2.5% when a 1.5x
    node recovers 20 steps after the move)."""
    from fabricpace.pacing.rebalance import counts_from_shares

    ctl = Controller(4, _AT_ONCE, policies=["rebalance"])
    comp, last = [60.0, 60.0, 60.0, 120.0], [0.0, 0.0, 0.0, 40.0]
    state, _ = ctl.update(50, summaries(0, compute_ms=comp, last=last))
    counts = [float(n) for n in counts_from_shares(state.shares, 64, 4)]
    slow = [60.0 / 16 * n for n in counts[:3]] + [120.0 / 16 * counts[3]]
    state, out = ctl.update(55, summaries(1, step_ms=90.0, compute_ms=slow, samples=counts, steps=5,
                                          last=[1.0, 1.0, 1.0, 2.0]))
    assert [(d.policy, d.action) for d in out] == [("guard", "keep")] and ctl.kept.shares is not None
    assert ctl.next_window_steps == 5  # the first re-check
    for w, at in ((2, 60), (3, 65)):  # still slow: nothing changes
        state, out = ctl.update(at, summaries(w, step_ms=90.0, compute_ms=slow, samples=counts, steps=5,
                                              last=[1.0, 1.0, 1.0, 2.0]))
        assert out == [] and state.shares == ctl.kept.shares and ctl.next_window_steps == 5
    even = [60.0 / 16 * n for n in counts]  # rank 3 at the fleet's speed per sample again
    state, out = ctl.update(70, summaries(4, step_ms=80.0, compute_ms=even, samples=counts, steps=5,
                                          last=[2.0, 2.0, 1.0, 0.0]))
    assert [(d.policy, d.action) for d in out] == [("rebalance", "adjust")], out
    assert "nothing left to relieve" in out[0].reason
    assert state.shares is None and ctl.kept.shares is None and ctl.next_window_steps is None


def test_rechecks_that_see_the_straggler_stay_make_up_one_whole_window(summaries):
    """Re-checks that keep seeing the straggler end after one whole window of steps; the controller then
    judges their union as that window (a further move can be proposed from it) and the windows are
    whole again."""
    from fabricpace.pacing.rebalance import counts_from_shares

    ctl = Controller(4, _AT_ONCE, policies=["rebalance"])
    comp, last = [60.0, 60.0, 60.0, 120.0], [0.0, 0.0, 0.0, 40.0]
    state, _ = ctl.update(50, summaries(0, compute_ms=comp, last=last))
    counts = [float(n) for n in counts_from_shares(state.shares, 64, 4)]
    slow = [60.0 / 16 * n for n in counts[:3]] + [120.0 / 16 * counts[3]]
    probe = {"step_ms": 90.0, "compute_ms": slow, "samples": counts, "last": [1.0, 1.0, 1.0, 2.0]}
    ctl.update(55, summaries(1, steps=5, **probe))
    lengths, out = [], []
    step, w = 55, 2
    while ctl._rechecking and w < 30:
        n = ctl.next_window_steps
        lengths.append(n)
        step += n
        _, out = ctl.update(step, summaries(w, steps=n, **probe))
        w += 1
    assert sum(lengths) == 50 and set(lengths) == {5}, lengths
    assert ctl.kept.shares is not None and ctl._rechecks == []
    # rank 3 is still slow after the damped move: the whole window proposes the next move (its
    # trigger fired in the probe window too: the re-checks count as one window between them)
    assert [(d.policy, d.action) for d in out] == [("rebalance", "enable")], out
    off = Controller(4, PacingConfig(rebalance_recheck=0, rebalance_confirm_steps=0), policies=["rebalance"])
    off.update(50, summaries(0, compute_ms=comp, last=last))
    off.update(55, summaries(1, steps=5, **probe))
    assert off.kept.shares is not None and off.next_window_steps is None


def test_merge_windows_weights_by_steps_and_keeps_the_latest_tail(summaries):
    from fabricpace.pacing.fleet import merge_windows

    a = summaries(3, step_ms=100.0, compute_ms=[60.0, 60.0, 60.0, 90.0], steps=5, last=[1.0, 0.0, 0.0, 4.0])
    b = summaries(4, step_ms=80.0, compute_ms=[60.0, 60.0, 60.0, 60.0], steps=15, last=[5.0, 5.0, 5.0, 0.0])
    m = merge_windows([a, b])
    r3 = m[3]
    assert (r3.window, r3.first_step, r3.steps) == (4, a[3].first_step, 20)
    assert r3.step_mean_ns == pytest.approx((5 * 100e6 + 15 * 80e6) / 20)
    assert r3.compute_median_ns == pytest.approx((5 * 90e6 + 15 * 60e6) / 20)
    assert (r3.last_arrivals, r3.collectives) == (4.0, a[3].collectives + b[3].collectives)
    # the tail (5 steps of 20) lies in the second window: rank 3 is at the fleet's speed there
    assert r3.tail_compute_median_ns == pytest.approx(60e6)
    # the spread pools the between-window difference of the means
    assert r3.step_std_ns > 1e6
    assert merge_windows([a]) == a


def test_a_fault_that_ends_inside_an_on_window_ends_the_trial_there(summaries):
    """Rank 3's fault ends 40 steps into a full ON window of a rebalance trial: slow in the window's
    median, at the fleet's speed in its last steps. The trial is reverted there as "its straggler is
    gone" (before: it ran its next pair with the move; ResNet-50, node 1.5x slow until step 96, +4.1%
    instead of +5.5%)."""
    from dataclasses import replace as _replace

    from fabricpace.pacing.rebalance import counts_from_shares

    ctl = Controller(4, _AT_ONCE, policies=["rebalance"])
    comp, last = [60.0, 60.0, 60.0, 120.0], [0.0, 0.0, 0.0, 40.0]
    state, _ = ctl.update(50, summaries(0, compute_ms=comp, last=last))
    counts = [float(n) for n in counts_from_shares(state.shares, 64, 4)]
    slow = [60.0 / 16 * n for n in counts[:3]] + [120.0 / 16 * counts[3]]
    # the probe shows no clear gain: the trial goes on with whole windows
    ctl.update(55, summaries(1, step_ms=100.0, std_ms=20.0, compute_ms=slow, samples=counts, steps=5,
                             last=[1.0, 1.0, 1.0, 2.0]))
    assert ctl.guard.trial is not None and ctl.next_window_steps is None
    step, w = 55, 2
    while ctl.state.shares is None:  # control windows first (ABBA)
        step += 50
        ctl.update(step, summaries(w, compute_ms=comp, last=last))
        w += 1
    even = [60.0 / 16 * n for n in counts]
    on = [
        _replace(s, tail_compute_median_ns=even[s.rank] * 1e6, tail_samples_mean=counts[s.rank])
        for s in summaries(w, step_ms=95.0, compute_ms=slow, samples=counts, last=[1.0, 1.0, 1.0, 30.0])
    ]
    _, out = ctl.update(step + 50, on)
    assert [(d.policy, d.action) for d in out][:2] == [("rebalance", "note"), ("guard", "revert")], out
    assert "ON window's last steps" in out[0].reason and "its straggler is gone" in out[1].reason
    assert ctl.guard.trial is None and ctl.kept.shares is None


def test_a_straggler_gone_in_the_last_recheck_is_undone_there(summaries):
    """Node fault 100..200, move kept on its probe at 155: the re-checks run to 205 and only the last
    one (200..205) is clean. The whole window they make up is judged with the last re-check as its
    tail, so the move is undone at 205 (before: the tail was the last 10 steps, half of them slow, and
    the move ran a whole window more: user scenario x29, +3.5% -> -0.1%)."""
    from fabricpace.pacing.rebalance import counts_from_shares

    ctl = Controller(4, _AT_ONCE, policies=["rebalance"])
    comp, last = [60.0, 60.0, 60.0, 120.0], [0.0, 0.0, 0.0, 40.0]
    state, _ = ctl.update(50, summaries(0, compute_ms=comp, last=last))
    counts = [float(n) for n in counts_from_shares(state.shares, 64, 4)]
    slow = [60.0 / 16 * n for n in counts[:3]] + [120.0 / 16 * counts[3]]
    even = [60.0 / 16 * n for n in counts]
    kw = {"step_ms": 90.0, "samples": counts, "last": [1.0, 1.0, 1.0, 2.0], "steps": 5}
    ctl.update(55, summaries(1, compute_ms=slow, **kw))
    assert ctl._rechecking
    step, w, out = 55, 2, []
    while ctl._rechecking:
        step += 5
        _, out = ctl.update(step, summaries(w, compute_ms=slow if step < 105 else even, **kw))
        w += 1
    assert step == 105 and [(d.policy, d.action) for d in out] == [("rebalance", "adjust")], out
    assert ctl.kept.shares is None


def test_windows_that_wait_on_a_straggler_do_not_set_the_quiet_transfer_level(summaries):
    """While rank 3 is slow, every bucket crosses the network alone as rank 3 sends it: transfer per unit
    of compute is low (the simulator's paper workload: 0.70 against 2.5-2.7 when healthy). Learnt as the
    quiet level, it made the healthy windows after the straggler read 3.7x inflated and start a comm
    trial that then held the guard while the straggler came back (`ts2.0-periodic`, 4 nodes: +4.6%
    instead of +11.3%). Such windows are left out of the quiet level."""
    ctl = Controller(4, policies=["comm"])
    slow = {"compute_ms": [60.0, 60.0, 60.0, 90.0], "last": [0.0, 0.0, 0.0, 40.0]}
    for w in range(3):
        ctl.update(50 * (w + 1), summaries(w, transfer_ms=3.0, wait_ms=30.0, **slow))
    for w in range(3, 8):
        _, out = ctl.update(50 * (w + 1), summaries(w, transfer_ms=10.0, wait_ms=30.0))
        assert not ctl._inflated_now and out == [], (w, out)
    assert ctl._quiet_transfer == pytest.approx(10.0 / 60.0)


def test_only_a_straggler_that_ended_lengthens_the_next_confirmation(summaries):
    """A confirmation that fails because the group is weaker (still above the trigger: outweighed, not
    ended) leaves the next confirmation at 5 steps; one whose group ended doubles it (audit 18: t10 of
    scenarios_unseen2 lost 0.6 points at 4 nodes when every failed confirmation counted)."""
    comp, last = [60.0, 60.0, 60.0, 69.0], [5.0, 5.0, 5.0, 35.0]  # 15% slow, last in 70%
    for confirm_ms, expect in ((64.0, 5), (60.0, 10)):  # 6.7% slow: weaker; 0%: ended
        ctl = Controller(4, PacingConfig(trigger_windows=2), policies=["rebalance"])
        ctl.update(50, summaries(0, compute_ms=comp, last=last))
        ctl.update(100, summaries(1, compute_ms=comp, last=last))
        seen = [replace(x, first_step=100) for x in summaries(2, steps=5, last=last,
                                                            compute_ms=[60.0, 60.0, 60.0, confirm_ms])]
        _, out = ctl.update(105, seen)
        assert [d.action for d in out] == ["note"], out
        ctl.update(155, summaries(3, compute_ms=comp, last=last))
        assert ctl.next_window_steps == expect, (confirm_ms, ctl.next_window_steps)


def test_a_longer_confirmation_is_for_the_group_that_ended_only(summaries):
    """Rank 3 ended within its confirmation: its next move is confirmed over 10 steps, but a straggler
    on another rank (slowness that moves between ranks, audit 18's e04: +6.25% at 4 nodes, +2.85% while
    every group waited longer) is confirmed over the usual 5."""
    last3, last2 = [5.0, 5.0, 5.0, 35.0], [5.0, 5.0, 35.0, 5.0]
    slow3, slow2 = [60.0, 60.0, 60.0, 69.0], [60.0, 60.0, 69.0, 60.0]
    for comp, last, windows, expect in ((slow3, last3, 1, 10), (slow2, last2, 2, 5)):
        ctl = Controller(4, PacingConfig(trigger_windows=2), policies=["rebalance"])
        ctl.update(50, summaries(0, compute_ms=slow3, last=last3))
        ctl.update(100, summaries(1, compute_ms=slow3, last=last3))
        ctl.update(105, [replace(x, first_step=100) for x in summaries(2, steps=5, last=last3)])  # ended
        for k in range(windows):  # (rank 3's streak goes on; rank 2 needs its own two windows)
            ctl.update(155 + 50 * k, summaries(3 + k, compute_ms=comp, last=last))
        assert ctl._pending is not None and ctl.next_window_steps == expect, (comp, ctl.next_window_steps)
