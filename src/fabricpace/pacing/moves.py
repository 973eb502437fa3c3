"""Rebalance moves: the shares a move proposes, and whether a first move survives its confirmation window.

Pure functions of one window's ``Fleet`` view, used by the controller. ``rebalance_target`` predicts a
move's saving for the integer sample counts every rank will apply; ``unconfirmed`` judges the short
window run on the old shares right after the window that proposed a first move
(``PacingConfig.rebalance_confirm_steps``), so that a straggler which ended with that window costs
nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fabricpace.pacing.config import PacingConfig
from fabricpace.pacing.fleet import Fleet
from fabricpace.pacing.rebalance import counts_from_shares, damped_shares, speed_shares
from fabricpace.pacing.state import PacingState
from fabricpace.pacing.stragglers import tail_gone
from fabricpace.run.window import WindowRows, tail_steps

# (severity, policy, candidate state, reason, rank): one candidate of a trial
Candidate = tuple[float, str, PacingState, str, int]


@dataclass(frozen=True, kw_only=True)
class Pending:
    """Candidates whose first rebalance move waits for a short confirmation window
    (``rebalance_confirm_steps``): the window that proposed them, and the slow group it saw."""

    candidates: list[Candidate]
    summaries: WindowRows
    window: int
    slow: np.ndarray
    excess: float  # the slow group's median excess per sample in the proposing window
    last: float  # the share of collectives it arrived last in there (nan: arrivals not known)


def rebalance_target(
    fleet: Fleet, cur: np.ndarray, config: PacingConfig, step: float | None = None
) -> tuple[np.ndarray, float]:
    """Damped step from shares ``cur`` toward speed-proportional shares and its predicted step-time
    saving (a fraction of the window's step time).

    The saving is predicted for the integer sample counts the shares round to (the rounding every
    rank and the simulator apply): with few samples per rank a small move rounds to no move at
    all, or moves one whole sample onto ranks that then become the slowest — such a candidate
    predicts no saving and is never tried (its trial could only measure noise)."""
    target = speed_shares(fleet.cps)
    world_size = fleet.cps.size
    total = round(float(fleet.samples.sum()))
    now = float((fleet.fixed + fleet.cps * fleet.samples).max())

    def predict(damping: float) -> tuple[np.ndarray, float]:
        new = damped_shares(cur, target, step=damping, min_share=config.rebalance_min_share)
        if total >= world_size:
            counts = np.asarray(counts_from_shares(tuple(new), total, world_size), dtype=np.float64)
        else:  # no usable sample counts (the loop does not report them): shares as fractions
            counts = new * float(fleet.samples.sum())
        return new, (now - float((fleet.fixed + fleet.cps * counts).max())) / fleet.step_time

    damping = config.rebalance_step if step is None else step
    new, gain = predict(damping)
    if gain < config.rebalance_min_gain and damping < 1.0:
        # The damped move can round to no move at all: with kept shares after a straggler
        # recovered, the ranks that took its samples keep their extra sample until the shares
        # are back in full — so the whole move is a candidate when the damped one saves nothing.
        full, full_gain = predict(1.0)
        if full_gain > gain:
            new, gain = full, full_gain
    return new, gain


def unconfirmed(fleet: Fleet, pend: Pending, config: PacingConfig) -> str | None:
    """Why the confirmation window ``fleet`` does not confirm a first move, or None (it does, or
    compute per sample is not known): the slow group's median excess per sample fell below half what
    it was when the move was proposed (the straggler ended with the proposing window); or, when it
    was last in nearly every collective there (``straggler_clear_last_share``: GC pauses and jitter
    make a weaker group's share in a few steps noise), it arrives last in less than
    ``rebalance_confirm_last`` (80%) of the share it did then — counting with it any rank now at least
    the trigger slower per sample, so a second straggler taking the last place does not count against
    the first — (it ended within these steps: slow in most of them, so still slow in their median, but
    no longer holding the others up in the last ones)."""
    cps, slow = fleet.cps, pend.slow
    if slow.size == 0 or not (np.all(np.isfinite(cps)) and np.all(cps > 0)):
        return None
    excess = cps / float(np.median(cps)) - 1.0
    now = float(np.median(excess[slow]))
    if now < 0.5 * pend.excess:
        # (it may still be slower than the median, only no longer as much as the move assumed)
        return (f"less than half as slow per sample as when the move was proposed ({now * 100:+.0f}% vs "
                f"median, {pend.excess * 100:+.0f}% then)")
    if fleet.steps > tail_steps(int(fleet.steps)):
        # A confirmation window longer than its tail (lengthened after stragglers vanished by their
        # probe): a straggler slow in its first steps only has ended within it.
        late = tail_gone(fleet, slow, config)
        if late is not None:
            return f"no longer slower per sample in its last steps ({late * 100:+.0f}% vs median)"
    if not (fleet.has_arrivals and np.isfinite(pend.last)) or pend.last < config.straggler_clear_last_share:
        return None  # (arrival order says little of a group that was not last nearly always)
    group = excess >= config.straggler_compute_excess
    group[slow] = True
    last = float(fleet.last_share[group].sum())
    if last < config.rebalance_confirm_last * pend.last:
        return (f"last in {last * 100:.0f}% of the collectives ({pend.last * 100:.0f}% before): no longer "
                "holding the others up")
    return None


def straggler_ended(fleet: Fleet, pend: Pending, config: PacingConfig) -> bool:
    """Whether the slow group of an unconfirmed first move is no longer slow at all in the confirmation
    window ``fleet`` (below the trigger in its median, or gone in its last steps) — it ended, rather
    than being outweighed by a second straggler or falling short of the arrival test."""
    cps, slow = fleet.cps, pend.slow
    if slow.size == 0 or not (np.all(np.isfinite(cps)) and np.all(cps > 0)):
        return False
    now = float(np.median(cps[slow])) / float(np.median(cps)) - 1.0
    if now < config.straggler_compute_excess:
        return True
    return fleet.steps > tail_steps(int(fleet.steps)) and tail_gone(fleet, slow, config) is not None


def fmt_shares(shares: np.ndarray, world: int, most: int = 16) -> str:
    """Shares as multiples of an equal share, for decision reasons: ``[0.75 1.08 1.08 1.08]x equal``;
    beyond ``most`` ranks only those off the median share, largest change first (a reason listing
    thousands of shares says nothing): ``rank 5 0.75x, rank 9 0.80x, ... (2 more); others 1.00x``."""
    x = np.asarray(shares, dtype=np.float64) * world
    if x.size <= most:
        return "[" + " ".join(f"{v:.2f}" for v in x) + "]x equal"
    usual = float(np.median(x))
    off = np.flatnonzero(np.abs(x - usual) >= 0.005)
    off = off[np.argsort(-np.abs(x[off] - usual), kind="stable")]
    shown = ", ".join(f"rank {r} {x[r]:.2f}x" for r in off[:8])
    more = f" ({off.size - 8} more)" if off.size > 8 else ""
    return f"{shown}{more}; others {usual:.2f}x equal" if off.size else f"all {usual:.2f}x equal"
