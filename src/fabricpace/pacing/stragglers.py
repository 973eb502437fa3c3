"""Is the straggler a rebalance move was made for still there? Pure checks over one window's fleet view.

The controller moves samples away from slow ranks; these functions tell it, from one window, whether
that move still has something to relieve: the slow group is still slow at the end of the window that
would propose a move (``still_slow``), the ranks a move on trial relieves are no longer slow
(``straggler_gone``), a rank the move loads became a straggler itself (``loads_a_straggler``), or the
ranks a kept move relieves recovered (``recovered``). Each returns the reason the decision log shows.
"""

from __future__ import annotations

import math

import numpy as np

from fabricpace.pacing.config import PacingConfig
from fabricpace.pacing.fleet import Fleet
from fabricpace.pacing.guard import Trial
from fabricpace.run.window import tail_steps


def _on_shares(trial: Trial, fleet: Fleet) -> np.ndarray | None:
    """The shares a rebalance trial's move runs, when this window is one of its ON windows."""
    if "rebalance" not in trial.policy.split("+") or trial.arms.get(fleet.window) != "on":
        return None
    return None if trial.on.shares is None else np.asarray(trial.on.shares, dtype=np.float64)


def straggler_gone(trial: Trial, fleet: Fleet, config: PacingConfig) -> str | None:
    """Why a rebalance trial's move can no longer help, or None: in an ON window, the ranks it
    relieves (those its ON shares hold below an equal share) are no longer slower per sample than
    the fleet's median. Only a move that takes samples from ranks at or below an equal share in the
    control state is judged: a move back toward equal shares takes samples from ranks above an equal
    share (fast, but overloaded), so it is never judged this way."""
    on = _on_shares(trial, fleet)
    if on is None:
        return None
    n = on.size
    off = np.full(n, 1.0 / n) if trial.off.shares is None else np.asarray(trial.off.shares, np.float64)
    gave = np.where(off <= 1.0 / n + 1e-9, off - on, 0.0)
    if not np.any(gave > 1e-9):
        return None
    # The ranks the move is for: those whose ON share lies below an equal share by at least half as
    # much as the lowest one's (a speed-proportional move also trims ranks a hair slower than the
    # median — a node 4% slow beside a rank 43% slow — and their median must not speak for the
    # straggler). Below equal, not below the control state, as ``recovered`` reads a kept move: a
    # further move on top of a kept one gives ~1 sample here and there, so by what this trial alone
    # took, ranks trimmed on noise outvoted the straggler the shares still relieve (audit 17: "ranks
    # 5,8,18 no longer slower per sample (+0%)" while rank 5, at 0.79x, was +25% slower per sample).
    below = 1.0 / n - on
    donors = np.flatnonzero((below > 1e-9) & (below >= 0.5 * float(below.max())))
    cps = fleet.cps
    if donors.size == 0 or not (np.all(np.isfinite(cps)) and np.all(cps > 0)):
        return None
    excess = cps / float(np.median(cps)) - 1.0
    now = float(np.median(excess[donors]))
    who = fmt_who(donors)
    if now < config.straggler_compute_excess:
        return f"{who} no longer slower per sample in the move's ON window ({now * 100:+.0f}% vs median)"
    # Slow over most of the window but no longer at its end: a fault that ended inside the ON window
    # (the same test a kept move is undone by); else the trial would run another pair after it.
    if fleet.steps <= tail_steps(int(fleet.steps)):
        return None
    late = tail_gone(fleet, donors, config)
    if late is None:
        return None
    return f"{who} no longer slower per sample in the ON window's last steps ({late * 100:+.0f}% vs median)"


def loads_a_straggler(trial: Trial, fleet: Fleet, config: PacingConfig) -> str | None:
    """Why a rebalance trial's move now loads a straggler, or None: in an ON window, a rank the move
    gives samples to (above an equal share) is at least the trigger slower per sample than the
    fleet's median, and slower than the ranks the move relieves. Compute per sample does not
    grow with the samples a rank is given (its fixed per-step part is spread over more), so a
    receiver this slow is slow by itself: a fault that began during the move."""
    on = _on_shares(trial, fleet)
    if on is None:
        return None
    # Against an equal share, not the control state: a further move can give a straggler back a
    # hair of what an earlier move took, and that does not make it a receiver.
    n = on.size
    takers, donors = np.flatnonzero(on > 1.0 / n + 1e-9), np.flatnonzero(on < 1.0 / n - 1e-9)
    cps = fleet.cps
    if takers.size == 0 or donors.size == 0 or not (np.all(np.isfinite(cps)) and np.all(cps > 0)):
        return None
    excess = cps / float(np.median(cps)) - 1.0
    r = int(takers[np.argmax(excess[takers])])
    if excess[r] < config.straggler_compute_excess or excess[r] <= float(np.median(excess[donors])):
        return None
    if takers.size >= 8 and excess[r] < _chance_max(excess[takers]):
        return None  # the slowest of many receivers, no slower than the slowest of them by chance
    return (
        f"rank {r}, given samples by the move, is now {excess[r] * 100:.0f}% slower per sample than the "
        f"median (the ranks it relieves: {float(np.median(excess[donors])) * 100:+.0f}%): a new straggler"
    )


def _chance_max(values: np.ndarray) -> float:
    """The largest of ``values`` that their own spread gives by chance: median + sqrt(2 ln n) robust
    standard deviations (1.4826 MAD), the expected maximum of n normal draws. With ~1,400 receivers and
    3% per-step jitter, a 5-step window's slowest receiver is 5-6% slower per sample than the median by
    chance alone (b01 of scenarios_unseen4, 2,048 ranks: 9 of its further moves reverted as "a new
    straggler", CV 0.029 -> 0.071)."""
    med = float(np.median(values))
    sd = 1.4826 * float(np.median(np.abs(values - med)))
    return med + math.sqrt(2.0 * math.log(values.size)) * sd


def still_slow(fleet: Fleet, slow: np.ndarray) -> bool:
    """Whether the slow group is still slow per sample in the window's last steps: its median excess
    over the tail's median at least half its median excess over the whole window (a straggler that
    recovered inside the window has none left; one that persists keeps about all of it, and a
    group just above the trigger is not lost to one rank's noisy tail). True when the tail is not
    known."""
    if fleet.tail_cps is None or slow.size == 0:
        return True
    tail, med_tail, med = fleet.tail_cps, float(np.median(fleet.tail_cps)), float(np.median(fleet.cps))
    if not (np.isfinite(med_tail) and med_tail > 0 and np.isfinite(med) and med > 0):
        return True
    now = float(np.median(tail[slow])) / med_tail - 1.0
    return now >= 0.5 * (float(np.median(fleet.cps[slow])) / med - 1.0)


def recovered(fleet: Fleet, shares: np.ndarray, config: PacingConfig) -> str | None:
    """Why a kept move has nothing left to relieve, or None: the ranks it took samples from (at least
    half as many as the largest giver, below an equal share) are no longer slow per sample in the
    window's last steps — their median excess over the tail's median below
    ``straggler_tail_gone_excess`` (half the trigger, so one noisy tail of a straggler just above the
    trigger does not undo its move). None when the tail is not known or the check is off."""
    # The ranks the move was made for: those that gave at least half as much as the largest giver
    # (a later small adjustment can leave ranks a hair below equal; they are not its stragglers).
    gave = 1.0 / shares.size - shares
    donors = np.flatnonzero((gave > 1e-9) & (gave >= 0.5 * float(gave.max())))
    now = tail_gone(fleet, donors, config)
    if now is None:
        return None
    who = fmt_who(donors)
    return (
        f"{who} no longer slower per sample in the window's last steps ({now * 100:+.0f}% vs median): "
        "the move has nothing left to relieve, equal shares again"
    )


def tail_gone(fleet: Fleet, ranks: np.ndarray, config: PacingConfig) -> float | None:
    """The median excess per sample of ``ranks`` over the tail's median when it is below
    ``straggler_tail_gone_excess`` (they are no longer slow in the window's last steps), else None
    (still slow, no ranks, the tail not known, or the check off)."""
    gone, tail = config.straggler_tail_gone_excess, fleet.tail_cps
    if gone <= 0 or tail is None or ranks.size == 0:
        return None
    med = float(np.median(tail))
    if not (np.isfinite(med) and med > 0):
        return None
    now = float(np.median(tail[ranks])) / med - 1.0
    return now if now < gone else None


def waits_on_straggler(fleet: Fleet, config: PacingConfig) -> bool:
    """Whether the window's collectives wait on stragglers: ranks at least the trigger slower per sample
    than the median that together arrive last in at least ``straggler_last_share`` of them."""
    cps = fleet.cps
    if not fleet.has_arrivals or not (np.all(np.isfinite(cps)) and np.all(cps > 0)):
        return False
    slow = cps / float(np.median(cps)) - 1.0 >= config.straggler_compute_excess
    return bool(slow.any() and float(fleet.last_share[slow].sum()) >= config.straggler_last_share)


def fmt_who(ranks: np.ndarray) -> str:
    """"rank 3" or "ranks 8-15" for a decision's reason."""
    return f"rank {int(ranks[0])}" if ranks.size == 1 else f"ranks {fmt_ranks(ranks)}"


def fmt_ranks(ranks: np.ndarray) -> str:
    """Ranks for a decision's reason: 8-15, or 1,3,5 (at most 8 listed)."""
    r = [int(x) for x in ranks]
    if len(r) > 2 and r == list(range(r[0], r[-1] + 1)):
        return f"{r[0]}-{r[-1]}"
    return ",".join(str(x) for x in r[:8]) + ("..." if len(r) > 8 else "")
