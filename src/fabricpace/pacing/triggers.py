"""Pacing triggers: the candidate each policy (gc, rebalance, comm) proposes from one window's fleet view.

Pure functions of one window's ``Fleet``, the kept ``PacingState`` and the ``PacingConfig``, called by the
controller's proposal step for a policy that is enabled and out of its cooldown. Each builds the
``Candidate`` (severity, policy, candidate state, reason, rank) that the guard then tries, with the reason a
user reads in ``pacing.parquet``. The gc and rebalance triggers also say whether the candidate may start a
trial now (``ok``): its trigger fired in ``trigger_windows`` consecutive windows, or is clear within this
one; a candidate that is not ok only joins a trial that starts anyway. Whether a trigger persists is the
controller's count (re-check windows merge into one there): it is passed in as ``persistent(key)``, which
records that trigger ``key`` fired in this window and says whether it has persisted.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from fabricpace.pacing.config import PacingConfig
from fabricpace.pacing.fleet import LOW_PERCENTILES, Fleet
from fabricpace.pacing.moves import Candidate, fmt_shares, rebalance_target
from fabricpace.pacing.rebalance import counts_from_shares
from fabricpace.pacing.state import PacingState
from fabricpace.pacing.stragglers import fmt_ranks, fmt_who, still_slow

# records that the trigger named by the key fired in this window; True once it has persisted
Persistent = Callable[[str], bool]
# (slow group, its median excess per sample, the share of collectives it arrived last in; nan: arrivals
# not known) of a first rebalance move: what its confirmation window checks (``moves.Pending``)
FirstMove = tuple[np.ndarray, float, float]


@dataclass(frozen=True)
class Declined:
    """A first move not tried because, over how often its slow group is slow, it costs more than it
    saves (``duty_weighted``); ``reason`` for the decision log."""

    slow: np.ndarray
    reason: str


def gc_candidate(
    fleet: Fleet, kept: PacingState, config: PacingConfig, world: int, persistent: Persistent
) -> tuple[Candidate, bool]:
    """Lockstep collection, for a window whose GC share of step time reached ``gc_trigger_share`` while
    gc is not kept; and whether it may be tried now.

    GC measured across the fleet within the window (a good share of the ranks collected, or
    object churn: one or more collections per rank and step) and costing twice the trigger is
    tried at once; GC on a few ranks only, or near the trigger, must also fire in the next window
    (on a loaded host a single window near the trigger is often noise).
    """
    c, k = config, kept
    clear = (
        fleet.gc_share >= c.gc_clear_share
        and (fleet.gc_ranks >= c.gc_fleet_share or fleet.gc_per_step >= 1.0)
    ) or (
        fleet.gc_share >= c.gc_heavy_share
        and fleet.gc_ranks >= c.gc_wide_share
        and fleet.gc_ranks * world >= 2  # more than one rank: not a one-off
    )
    ok = persistent("gc") or clear
    interval = c.gc_interval_churn if fleet.gc_per_step >= 1.0 else c.gc_interval
    cand = (
        fleet.gc_share,
        "gc",
        replace(k, gc_interval=interval),
        f"GC pauses cost {fleet.gc_share * 100:.1f}% of step time at unaligned steps "
        f"({fleet.gc_mean_per_step:.2g} collections per rank and step, on "
        f"{fleet.gc_ranks * 100:.0f}% of ranks): trying lockstep collection "
        f"every {interval} step{'s' if interval > 1 else ''}",
        -1,
    )
    return cand, ok


def first_move_candidate(
    fleet: Fleet,
    kept: PacingState,
    config: PacingConfig,
    world: int,
    persistent: Persistent,
    *,
    wander: bool,
    intermittent: Callable[[np.ndarray], bool] | None = None,
) -> tuple[Candidate, bool, FirstMove] | Declined | None:
    """A first rebalance move (no shares kept; every rank's compute per sample known and positive) for a
    slow group that is still slow at the end of the window, whether it may be tried now, and the slow
    group; None when there is none. ``wander``: stragglers on this job did not persist from one window to
    the next, so a move on one window's evidence alone is off. ``intermittent(slow)``: the group already
    ended within a confirmation window or by a probe; its move must then pay over the steps in which it
    is not slow too (``duty_weighted``), else it is ``Declined``."""
    c, k = config, kept
    excess = fleet.cps / float(np.median(fleet.cps)) - 1.0
    # The slow group: clearly above the median and comparable to the slowest (a node of equally
    # slow GPUs moves together; a rank that is only a little slow beside a very slow one waits).
    slow = np.flatnonzero(excess >= max(c.straggler_compute_excess, 0.5 * float(excess.max())))
    last = float(fleet.last_share[slow].sum()) if slow.size else 0.0
    last_ok = (not fleet.has_arrivals) or last >= c.straggler_last_share
    if slow.size and slow.size <= world // 2 and last_ok:
        equal_now = np.full(world, 1.0 / world)
        new, gain = rebalance_target(fleet, equal_now, c)
        # The same slow group in consecutive windows: a persistent straggler; or one so clear
        # within this window (slow in most of its steps, by far) that waiting only costs.
        clear = (
            not wander
            and float(excess[slow].min()) >= c.straggler_clear_excess
            and (not fleet.has_arrivals or last >= c.straggler_clear_last_share)
        )
        # Still slow at the end of the window? A straggler that recovered inside it is slow in
        # the window's median but not in its last steps: moving samples now would run the move
        # after the straggler is gone (the trigger still counts toward persistence).
        fired = gain >= c.rebalance_min_gain and persistent(f"rebalance:{fmt_ranks(slow)}")
        on_and_off = intermittent is not None and intermittent(slow)
        duty = group_duty(fleet, slow) if gain >= c.rebalance_min_gain and on_and_off else None
        if duty is not None:
            expected, cost = duty_weighted(fleet, slow, new, gain, duty, world)
            if expected < c.rebalance_min_gain:
                return Declined(slow, (
                    f"{fmt_who(slow)} slow in about {duty * 100:.0f}% of steps and gone within a check "
                    f"before: a move saving {gain * 100:.0f}% while it is slow costs {cost * 100:.0f}% "
                    f"while it is not ({expected * 100:+.1f}% expected): not tried"
                ))  # fmt: skip
        if gain >= c.rebalance_min_gain and still_slow(fleet, slow):
            ok = fired or clear
            if ok and not fired and c.rebalance_clear_step < c.rebalance_step:
                # One window's evidence only: a smaller first move (what it costs if the
                # straggler is gone by the next window scales with it).
                part, part_gain = rebalance_target(fleet, equal_now, c, c.rebalance_clear_step)
                if part_gain >= c.rebalance_min_gain:
                    new, gain = part, part_gain
            r = int(slow[np.argmax(excess[slow])])
            moved = 1.0 - new[r] * world
            who = fmt_who(slow)
            arr = f"last in {last * 100:.0f}% of collectives, " if fleet.has_arrivals else ""
            reason = (
                f"{who} {arr}compute {excess[r] * 100:.0f}% above median: "
                f"moving {moved * 100:.0f}% of rank {r}'s samples"
            )
            held = last if fleet.has_arrivals else math.nan
            cand = (gain, "rebalance", replace(k, shares=tuple(float(x) for x in new)), reason, r)
            return cand, ok, (slow, float(np.median(excess[slow])), held)
    return None


def group_duty(fleet: Fleet, slow: np.ndarray) -> float | None:
    """The share of the window's steps in which the slow group was slow (mean over its ranks), from the
    low percentiles of their compute per step; None when the ranks did not send them.

    At each percentile p (10th to 50th) a rank's compute is compared with what the fleet's median rank
    computes at that percentile for the same samples: the excess over it, as a share of the rank's
    excess at the median, is about 1 at every p for a rank slow in every step (jitter moves both alike)
    and about 0 at the p that fall in its fast steps. The fast share is where it crosses 1/2 (linear
    between percentiles; under the 10th: none), the duty the rest."""
    low = fleet.compute_low
    if low is None or slow.size == 0:
        return None
    ps = np.asarray(LOW_PERCENTILES)
    samples = fleet.samples
    if bool(np.any(samples <= 0)):
        return None
    per = (low - fleet.fixed) / samples[:, None]  # ranks x p: compute per sample at each percentile
    ref = np.median(per, axis=0)  # the fleet's median rank at each p
    healthy = fleet.fixed + ref[None, :] * samples[slow, None]  # group x p
    own = low[slow]
    span = own[:, -1] - healthy[:, -1]  # each rank's excess at its median
    if bool(np.any(span <= 0)):
        return None
    e = (own - healthy) / span[:, None]  # group x p; 1 at the median by construction
    duty = np.empty(slow.size)
    for j, row in enumerate(e):
        i = int(np.argmax(row >= 0.5))  # first percentile in its slow steps (the last one always is)
        if i == 0:
            fast = 0.0
        else:
            lo, hi = float(row[i - 1]), float(row[i])
            fast = float(ps[i - 1] + (ps[i] - ps[i - 1]) * (0.5 - lo) / (hi - lo))
        duty[j] = 1.0 - fast
    return float(duty.mean())


def duty_weighted(
    fleet: Fleet, slow: np.ndarray, new: np.ndarray, gain: float, duty: float, world: int
) -> tuple[float, float]:
    """(expected saving, cost) of a first move for a slow group that comes and goes, as shares of the
    step: ``duty * gain - (1 - duty) * cost``. The cost is the move's whole-sample counts run with the
    group at the median speed: with 4 samples per GPU, the ranks given a fifth are 25% longer whenever
    the group is healthy, which a saving measured while it is slow does not see (x03 of
    scenarios_unseen4: slow 8 of every 13 steps, a 10% saving against an 18% cost; a 5-step probe in its
    gap cost -0.41% of the run)."""
    total = round(float(fleet.samples.sum()))
    if total < world:  # shares of fewer samples than ranks: no counts to price
        return gain, 0.0
    counts = np.asarray(counts_from_shares(tuple(float(x) for x in new), total, world), dtype=np.float64)
    healthy = fleet.cps.copy()
    healthy[slow] = float(np.median(fleet.cps))
    now = float((fleet.fixed + healthy * fleet.samples).max())
    moved = float((fleet.fixed + healthy * counts).max())
    cost = (moved - now) / fleet.step_time if fleet.step_time > 0 else 0.0
    return duty * gain - (1.0 - duty) * cost, cost


def further_move_candidate(
    fleet: Fleet, kept: PacingState, config: PacingConfig, world: int, persistent: Persistent
) -> tuple[Candidate, bool] | None:
    """A further rebalance move from the kept shares (every rank's compute per sample known and positive)
    and whether it may be tried now; None when it predicts less than ``rebalance_min_gain``."""
    c, k = config, kept
    # Further moves are candidates like the first one: each goes through the guard.
    cur = np.asarray(k.shares, dtype=np.float64)
    new, gain = rebalance_target(fleet, cur, c)
    # Clear within one window: a large predicted saving, and the ranks that would give up
    # samples are the ones the others wait for (e.g. a straggler recovered, and the ranks that
    # took its samples now arrive last in nearly every collective).
    losing = np.flatnonzero(new < cur - 1e-9)
    last_losing = float(fleet.last_share[losing].sum()) if losing.size else 0.0
    equal = 1.0 / world
    back = float(np.abs(new - equal).sum()) < float(np.abs(cur - equal).sum())
    clear = (
        fleet.has_arrivals
        and losing.size > 0
        and last_losing >= c.straggler_last_share
        and gain >= c.rebalance_clear_gain
    ) or (
        # Undoing part of our own move: the ranks holding extra samples arrive last in nearly
        # every collective. Waiting a window for persistence would only run one more window
        # with a move that no longer helps.
        back and fleet.has_arrivals and last_losing >= c.straggler_clear_last_share
    )
    if gain >= c.rebalance_min_gain:
        ok = persistent("rebalance-adjust") or clear
        r = int(np.argmax(fleet.cps))
        if back:
            # e.g. the straggler recovered and the ranks that took its samples hold everyone up
            why = "ranks holding extra samples are now the slowest"
        else:
            why = f"compute still uneven (rank {r} slowest per sample)"
        reason = (
            f"{why}: trying shares {fmt_shares(new, world)}, "
            f"predicted {gain * 100:.1f}% shorter steps"
        )
        return (gain, "rebalance", replace(k, shares=tuple(float(x) for x in new)), reason, r), ok
    return None


def comm_candidate(fleet: Fleet, kept: PacingState, config: PacingConfig, infl: float) -> Candidate:
    """Limiting the in-flight buckets, for transfer (per unit of compute) inflated ``infl`` times its quiet
    level in two windows in a row, with ``comm_trigger_share`` of step time or more exposed."""
    c, k = config, kept
    return (
        fleet.wait_share * (1 - 1 / infl),
        "comm",
        replace(k, comm_window=c.comm_window_init),
        f"transfer (per unit of compute) {infl:.2f}x its quiet level for two windows with "
        f"{fleet.wait_share * 100:.0f}% of step time exposed: limiting in-flight buckets "
        f"to {c.comm_window_init}",
        -1,
    )
