"""Audit 20 (benchmarks/scenarios_unseen4): the slowest of many receivers is not a new straggler by chance
alone."""

from __future__ import annotations

import numpy as np

from fabricpace.pacing.config import PacingConfig
from fabricpace.pacing.fleet import Fleet
from fabricpace.pacing.guard import Trial
from fabricpace.pacing.state import PacingState
from fabricpace.pacing.stragglers import loads_a_straggler

CONFIG = PacingConfig()


def _fleet(cps, samples, last_share, window=3):  # type: ignore[no-untyped-def]
    c, n = np.asarray(cps, dtype=np.float64), np.asarray(samples, dtype=np.float64)
    comp = c * n
    return Fleet(
        window=window, step_time=float(comp.max()) * 1.05, step_stderr=0.0, gc_share=0.0, wait_share=0.1,
        transfer=0.0, compute=comp, cps=c, samples=n, last_share=np.asarray(last_share, dtype=np.float64),
        has_arrivals=True, rss=0.0, steps=20.0, gc_per_step=0.0, gc_ranks=0.0,
    )  # fmt: skip


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
