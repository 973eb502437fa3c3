"""pacing.stragglers: whether the straggler a rebalance move relieves is still there."""

from __future__ import annotations

import numpy as np

from fabricpace.pacing.config import PacingConfig
from fabricpace.pacing.fleet import Fleet
from fabricpace.pacing.guard import Trial
from fabricpace.pacing.state import PacingState

CONFIG = PacingConfig()


def fleet(cps: list[float], samples: list[float]) -> Fleet:
    """Window 3: compute = compute per sample x samples, step = the slowest rank's compute + 10%."""
    c, n = np.asarray(cps, dtype=np.float64), np.asarray(samples, dtype=np.float64)
    comp = c * n
    return Fleet(
        window=3, step_time=float(comp.max()) * 1.1, step_stderr=0.0, gc_share=0.0, wait_share=0.1,
        transfer=0.0, compute=comp, cps=c, samples=n, last_share=np.zeros(c.size), has_arrivals=False,
        rss=0.0, steps=50.0, gc_per_step=0.0, gc_ranks=0.0,
    )  # fmt: skip


def _on_window(off: list[float] | None, on: list[float], cps: list[float]) -> str | None:
    from fabricpace.pacing.stragglers import straggler_gone

    t = Trial(policy="rebalance", on=PacingState(shares=tuple(on)),
              off=PacingState(shares=None if off is None else tuple(off)), start_window=2, reason="x")
    t.arms[3] = "on"  # the fleet below is window 3
    return straggler_gone(t, fleet(cps, [12.0] * len(cps)), CONFIG)


def test_a_correction_on_a_kept_move_is_judged_by_the_straggler_the_shares_relieve():
    """Audit 17: on top of a kept move for rank 5 (0.79x), a noise-driven correction trimmed other
    ranks by ~1 sample; their median (+0%) then spoke for the straggler ("ranks 5,8,18 no longer
    slower per sample"), while rank 5 was still +25% slower per sample."""
    n = 8
    # a speed-proportional move: rank 0 at 0.79x, ranks 1 and 2 (a hair slow on noise) a hair below
    # equal, the others above it
    kept = [0.79 / n, 0.124, 0.124] + [(1 - 0.79 / n - 0.248) / (n - 3)] * (n - 3)
    on = list(kept)
    on[0] -= 0.002  # rank 0 gives a hair more...
    on[1] -= 0.004  # ...and ranks 1, 2 a hair each (noise)
    on[2] -= 0.004
    on[3] += 0.010
    cps = [1.25] + [1.0] * (n - 1)
    assert _on_window(kept, on, cps) is None  # rank 0 (the straggler) is still 25% slower per sample
    # ...and when rank 0 did recover, the move is for nothing
    why = _on_window(kept, on, [1.0] * n)
    assert why is not None and why.startswith("rank 0 no longer slower per sample")


def test_a_first_move_still_names_its_straggler():
    on = [0.25, 0.25, 0.25 + 0.05, 0.25 - 0.05]
    assert _on_window(None, on, [1.0, 1.0, 1.0, 1.6]) is None
    why = _on_window(None, on, [1.0, 1.0, 1.0, 1.01])
    assert why is not None and why.startswith("rank 3 no longer slower per sample")
    # a move back toward equal shares takes from ranks above equal: never judged this way
    assert _on_window([0.26, 0.26, 0.26, 0.22], [0.255, 0.255, 0.255, 0.235], [1.0] * 4) is None
