"""Audit 20 (benchmarks/scenarios_unseen4): a first move for a straggler that comes and goes is weighed
over the steps it is not slow; the slowest of many receivers is not a new straggler by chance alone."""

from __future__ import annotations

import numpy as np

from fabricpace.pacing.config import PacingConfig
from fabricpace.pacing.fleet import Fleet
from fabricpace.pacing.guard import Trial
from fabricpace.pacing.moves import rebalance_target
from fabricpace.pacing.state import PacingState
from fabricpace.pacing.stragglers import loads_a_straggler
from fabricpace.pacing.triggers import Declined, duty_weighted, first_move_candidate

CONFIG = PacingConfig()


def _fleet(cps, samples, last_share, window=3):  # type: ignore[no-untyped-def]
    c, n = np.asarray(cps, dtype=np.float64), np.asarray(samples, dtype=np.float64)
    comp = c * n
    return Fleet(
        window=window, step_time=float(comp.max()) * 1.05, step_stderr=0.0, gc_share=0.0, wait_share=0.1,
        transfer=0.0, compute=comp, cps=c, samples=n, last_share=np.asarray(last_share, dtype=np.float64),
        has_arrivals=True, rss=0.0, steps=20.0, gc_per_step=0.0, gc_ranks=0.0,
    )  # fmt: skip


def _intermittent_fleet():  # type: ignore[no-untyped-def]
    # 16 ranks, 4 samples each; rank 0 1.5x slower per sample on average over the window (slow about
    # half its steps), last in 50% of collectives (1/16 by chance)
    cps = [1.5] + [1.0] * 15
    last = [0.5] + [0.5 / 15] * 15
    return _fleet(cps, [4.0] * 16, last)


def test_duty_weighted_is_the_saving_while_slow_minus_the_cost_while_not():  # type: ignore[no-untyped-def]
    fleet = _intermittent_fleet()
    slow = np.arange(1)
    new, gain = rebalance_target(fleet, np.full(16, 1 / 16), CONFIG)
    expected, duty, cost = duty_weighted(fleet, slow, new, gain, 0.5, 16)
    assert duty == (0.5 - 1 / 16) / (1 - 1 / 16)
    # rank 0 gives one of 4 samples: 4.5 instead of 6 while slow; healthy, the rank given a fifth sample
    # computes 5 where the step took 4: one sample's compute, 1 / 6.3 of the step, either way
    assert gain == cost == 1.0 / 6.3
    assert expected == duty * gain - (1 - duty) * cost
    assert expected < CONFIG.rebalance_min_gain


def test_a_group_that_came_and_went_gets_no_move_that_loses_over_its_cycle():  # type: ignore[no-untyped-def]
    fleet = _intermittent_fleet()
    args = (fleet, PacingState(), CONFIG, 16, lambda key: True)
    assert not isinstance(first_move_candidate(*args, wander=False), Declined)  # first time: tried
    d = first_move_candidate(*args, wander=False, intermittent=lambda g: True)
    assert isinstance(d, Declined) and list(d.slow) == [0]
    assert "rank 0 slow in about 47% of steps" in d.reason and d.reason.endswith("not tried")


def test_a_persistent_straggler_is_never_declined():  # type: ignore[no-untyped-def]
    # last in every collective: the duty is 1, the expected saving the saving
    fleet = _fleet([1.5] + [1.0] * 15, [4.0] * 16, [1.0] + [0.0] * 15)
    found = first_move_candidate(fleet, PacingState(), CONFIG, 16, lambda key: True, wander=False,
                                 intermittent=lambda g: True)
    assert found is not None and not isinstance(found, Declined)


def _receivers(excess_of_slowest: float, n: int = 1400, seed: int = 0) -> str | None:
    rng = np.random.default_rng(seed)
    on = np.full(n + 1, 1.0 / (n + 1))
    on[0] *= 0.77
    on[1:] += (1.0 / (n + 1) - on[0]) / n
    cps = 1.0 + rng.normal(0.0, 0.03 / np.sqrt(3), n + 1)  # 3% per-step jitter, 3 steps of the window
    cps[0] = 1.0  # the relieved rank, no slower per sample any more (b01: "the ranks it relieves: +0%")
    cps[1 + int(np.argmax(cps[1:]))] = 1.0 + excess_of_slowest
    t = Trial(policy="rebalance", on=PacingState(shares=tuple(on)), off=PacingState(), start_window=2,
              reason="x")
    t.arms[3] = "on"
    fleet = _fleet(cps, on * 4 * (n + 1), np.zeros(n + 1))
    return loads_a_straggler(t, fleet, CONFIG)


def test_the_slowest_of_many_receivers_by_chance_is_no_new_straggler():  # type: ignore[no-untyped-def]
    # ~1,400 receivers, 1.7% per-sample noise: their slowest is ~6% slower by chance (3.8 sigma); the
    # plain rule (>= 5% and slower than the relieved rank) named one 5.5% slower
    assert _receivers(0.055) is None
    why = _receivers(0.12)
    assert why is not None and why.endswith("a new straggler")


def test_few_receivers_keep_the_plain_rule():  # type: ignore[no-untyped-def]
    on = [0.25 - 0.05, 0.25 + 0.05 / 3, 0.25 + 0.05 / 3, 0.25 + 0.05 / 3]
    t = Trial(policy="rebalance", on=PacingState(shares=tuple(on)), off=PacingState(), start_window=2,
              reason="x")
    t.arms[3] = "on"
    why = loads_a_straggler(t, _fleet([1.3, 1.0, 1.0, 1.6], [16 * s for s in on], np.zeros(4)), CONFIG)
    assert why is not None and why.startswith("rank 3, given samples")
