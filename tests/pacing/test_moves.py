"""pacing.moves: a move's predicted saving, and the confirmation window's verdict on a first move."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from fabricpace.pacing.config import PacingConfig
from fabricpace.pacing.fleet import Fleet
from fabricpace.pacing.moves import Pending, fmt_shares, rebalance_target, unconfirmed
from fabricpace.pacing.rebalance import counts_from_shares

CONFIG = PacingConfig()


def fleet(cps: list[float], samples: list[float], *, last: list[float] | None = None) -> Fleet:
    """One window: compute = compute per sample x samples, step = the slowest rank's compute + 10%."""
    c, n = np.asarray(cps, dtype=np.float64), np.asarray(samples, dtype=np.float64)
    comp = c * n
    return Fleet(
        window=3, step_time=float(comp.max()) * 1.1, step_stderr=0.0, gc_share=0.0, wait_share=0.1,
        transfer=0.0, compute=comp, cps=c, samples=n,
        last_share=np.asarray(last if last is not None else [0.0] * c.size, dtype=np.float64),
        has_arrivals=last is not None, rss=0.0, steps=50.0, gc_per_step=0.0, gc_ranks=0.0,
    )  # fmt: skip


def pending(slow: list[int], excess: float, last: float) -> Pending:
    return Pending(candidates=[], summaries=[], window=2, slow=np.asarray(slow), excess=excess, last=last)


def test_a_move_is_predicted_for_the_sample_counts_it_rounds_to():
    f = fleet([1.0, 1.0, 1.0, 2.0], [12, 12, 12, 12])
    new, gain = rebalance_target(f, np.full(4, 0.25), CONFIG)
    counts = counts_from_shares(tuple(new), 48, 4)
    assert counts[3] < 12 and sum(counts) == 48
    # the saving of exactly those integer counts, as a share of the window's step time
    expect = (24.0 - max(c * n for c, n in zip(f.cps, counts, strict=True))) / f.step_time
    assert gain == pytest.approx(expect) and gain > CONFIG.rebalance_min_gain


def test_a_move_that_rounds_to_no_move_predicts_no_saving():
    # one sample per rank: the slow rank cannot give any away, whatever its shares say
    new, gain = rebalance_target(fleet([1.0, 1.0, 1.0, 2.0], [1, 1, 1, 1]), np.full(4, 0.25), CONFIG)
    assert new[3] < 0.25 and counts_from_shares(tuple(new), 4, 4) == [1, 1, 1, 1]
    assert gain == 0.0


def test_a_straggler_that_ended_with_the_proposing_window_is_not_confirmed():
    why = unconfirmed(fleet([1.0, 1.0, 1.0, 1.02], [12] * 4), pending([3], 1.0, math.nan), CONFIG)
    assert why is not None and "less than half as slow per sample as when the move was proposed" in why


def test_a_straggler_still_slow_per_sample_is_confirmed():
    assert unconfirmed(fleet([1.0, 1.0, 1.0, 1.6], [12] * 4), pending([3], 1.0, math.nan), CONFIG) is None


def test_a_straggler_that_stopped_holding_the_others_up_is_not_confirmed():
    # still slow in the median of the 5 steps (it ended 3 steps in), but no longer last
    f = fleet([1.0, 1.0, 1.0, 1.6], [12] * 4, last=[0.3, 0.3, 0.2, 0.2])
    why = unconfirmed(f, pending([3], 1.0, 0.95), CONFIG)
    assert why is not None and "no longer holding the others up" in why


def test_a_second_straggler_taking_the_last_place_does_not_count_against_the_first():
    # rank 0 is now also slow and arrives last more often than rank 3: the two count together
    f = fleet([1.3, 1.0, 1.0, 1.0, 1.0, 1.6], [12] * 6, last=[0.5, 0.0, 0.0, 0.0, 0.0, 0.5])
    assert unconfirmed(f, pending([5], 0.6, 0.95), CONFIG) is None
    # (alone, rank 5's 50% would be under 80% of the 95% it had)
    assert unconfirmed(replace(f, cps=np.asarray([1.0] * 5 + [1.6])), pending([5], 0.6, 0.95), CONFIG)


def test_arrival_order_is_judged_only_for_a_group_that_was_last_nearly_always():
    f = fleet([1.0, 1.0, 1.0, 1.6], [12] * 4, last=[0.3, 0.3, 0.2, 0.2])
    assert unconfirmed(f, pending([3], 1.0, 0.6), CONFIG) is None  # last in 60% before: noise-prone
    assert unconfirmed(fleet([1.0, 1.0, 1.0, 1.6], [12] * 4), pending([3], 1.0, 0.95), CONFIG) is None


def test_shares_in_a_reason_list_every_rank_of_a_small_job_and_the_changed_ones_of_a_large_one():
    assert fmt_shares(np.array([0.1875, 0.270833, 0.270833, 0.270833]), 4) == "[0.75 1.08 1.08 1.08]x equal"
    world = 2048
    shares = np.full(world, 1.0)
    shares[5], shares[9] = 0.75, 0.8
    text = fmt_shares(shares / shares.sum(), world)
    assert text == "rank 5 0.75x, rank 9 0.80x; others 1.00x equal"
    assert len(fmt_shares(np.linspace(0.5, 1.5, world) / world, world)) < 200  # never thousands of numbers
