"""The guard's block bootstrap and ABBA plan."""

from __future__ import annotations

import numpy as np

from fabricpace.pacing import PacingConfig, PacingState
from fabricpace.pacing.guard import Guard, block_bootstrap_ci


def test_bootstrap_ci_covers_the_mean_and_is_deterministic():
    d = np.array([-0.1, -0.12, -0.09, -0.11])
    est, lo, hi = block_bootstrap_ci(d, confidence=0.9, resamples=2000, seed=5)
    assert lo <= est <= hi < 0
    assert (est, lo, hi) == block_bootstrap_ci(d, confidence=0.9, resamples=2000, seed=5)


def test_abba_plan_starts_with_the_proposing_window_as_control():
    g = Guard(PacingConfig())
    g.start(policy="gc", on=PacingState(gc_interval=10), off=PacingState(), window=3, reason="x")
    assert [g.trial.arm_for(w) for w in range(3, 9)] == ["off", "on", "on", "off", "off", "on"]


def test_within_window_noise_blocks_an_early_keep():
    g = Guard(PacingConfig())
    t = g.start(policy="gc", on=PacingState(gc_interval=10), off=PacingState(), window=0, reason="x")
    t.arms[0] = "off"
    t.record(0, 100.0, 10.0)
    g.state_for(1)
    t.record(1, 95.0, 10.0)  # 5% faster, but each window's mean is uncertain by 10%
    assert g.verdict(1).decide == "continue"
    t2 = Guard(PacingConfig())
    tt = t2.start(policy="gc", on=PacingState(gc_interval=10), off=PacingState(), window=0, reason="x")
    tt.arms[0] = "off"
    tt.record(0, 100.0, 0.5)
    t2.state_for(1)
    tt.record(1, 95.0, 0.5)
    assert t2.verdict(1).decide == "keep"
