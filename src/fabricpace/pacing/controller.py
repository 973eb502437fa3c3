"""The pacing controller: window summaries in, a ``PacingState`` and explained ``Decision`` rows out.

Pure and deterministic: the same summaries (every rank gets all of them from the observer's
all-gather) give the same state on every rank and in the simulator's loop, so no broadcast is needed.
One window of summaries describes the steps run under the state returned for that window; the state
returned now applies to the next window.

Per window the controller
1. judges a running trial (the guard) or maintains the kept policies (gc interval for memory, rebalance
   shares toward speed-proportional, comm window by AIMD with hysteresis), then
2. when no trial runs, proposes the most severe candidate among the enabled policies whose trigger
   fires: gc share of step time, a persistent straggler, transfer inflation with exposed communication
   (each policy's candidate is built in ``triggers``).
Every candidate goes through the guard's interleaved ON/OFF windows before it stays.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from fabricpace.pacing.config import PacingConfig, parse_policies
from fabricpace.pacing.fleet import Fleet, fleet_view, leaves_from_summaries, merge_windows
from fabricpace.pacing.guard import Guard, Verdict, drift_sd
from fabricpace.pacing.moves import Candidate, Pending, straggler_ended, unconfirmed
from fabricpace.pacing.placement import plan_placement
from fabricpace.pacing.state import Decision, PacingState
from fabricpace.pacing.stragglers import (
    fmt_who,
    loads_a_straggler,
    recovered,
    straggler_gone,
    waits_on_straggler,
)
from fabricpace.pacing.triggers import (
    Declined,
    FirstMove,
    comm_candidate,
    first_move_candidate,
    further_move_candidate,
    gc_candidate,
    group_duty,
)
from fabricpace.run.window import WindowRows, WindowSummary


class Controller:
    """One per rank (and one in the simulator). ``update`` is called once per window."""

    def __init__(
        self,
        world_size: int,
        config: PacingConfig = PacingConfig(),
        policies: Sequence[str] | str = ("gc", "rebalance", "comm"),
        *,
        leaves: Sequence[int] | None = None,
        comm_buckets: int | None = None,
    ) -> None:
        if world_size < 1:
            raise ValueError("world_size must be >= 1")
        self.world_size = world_size
        self.config = config
        self.policies = parse_policies(policies if isinstance(policies, str) else list(policies))
        self.leaves = tuple(int(v) for v in leaves) if leaves is not None else None
        if self.leaves is not None and len(self.leaves) != world_size:
            raise ValueError(f"leaves has {len(self.leaves)} entries for {world_size} ranks")
        self.kept = PacingState()
        self.state = PacingState()
        self.guard = Guard(config)
        self.decisions: list[Decision] = []
        self._cooldown_until: dict[str, int] = {}
        self._reverts: dict[str, int] = {}
        self._quiet_transfer = math.inf
        self._gc_rss_ref: float | None = None
        self._placement_done = False
        self._bundle_failed = False
        # Set when a rebalance trial's straggler was gone by its first ON window and the move hurt:
        # slowness on this job does not persist from one window to the next (it wanders between
        # ranks, or comes and goes), so the one-window shortcut for a new straggler is off from then on.
        self._stragglers_wander = False
        # Per slow group (its ranks), since the last kept move: first moves whose straggler was gone by
        # their probe — a group that keeps vanishing before its move runs is slow for less than a window
        # plus a confirmation, and every such probe runs moved samples on a healthy fleet (one sample
        # more on the ranks that took them: +12.5% compute at 8 samples per GPU) — and, with them, the
        # times the group ended within its confirmation window: each doubles the group's next
        # confirmation window (``_confirm_len``). Per group: a straggler that moves to other ranks
        # (a new group each time) is no reason to wait longer for the next one.
        self._gone_probes: dict[tuple[int, ...], int] = {}
        self._short_lived: dict[tuple[int, ...], int] = {}
        self._declined: set[tuple[int, ...]] = set()  # groups whose declined first move was noted
        self._move_group: tuple[int, ...] = ()  # the slow group of the last first move proposed
        # ...and the share of its proposing window's steps in which it was slow (None: not known)
        self._move_duty: float | None = None
        self._gap_probe = False  # the next window repeats the probe (the first met a gap of its group)
        self._last_window = -1  # index of the window of the last update
        self._inflation = 0.0  # this window's transfer / its quiet level
        self._transfer_now = math.nan  # this window's transfer per unit of compute
        # Transfer inflated beyond noise in this window / in the previous one (comm needs both).
        self._inflated_now = False
        self._inflated_prev = False
        self._transfers: list[float] = []  # transfer per step of every ungated window so far
        # (kept state, step time) of windows run without a trial: their window-to-window changes
        # measure how much the host drifts between windows (the guard's between-window noise).
        # (state, step time, window index) of the latest untreated windows: the drift estimate reads
        # only these (a list of every window grew ~72 B per window for the whole run)
        self._untreated: deque[tuple[PacingState, float, int]] = deque(
            maxlen=self.config.guard_drift_windows + 1)
        # Buckets the comm gate can hold per step (DDP's buckets, told by the observer; None = not
        # known, no limit). With no more buckets than the in-flight window it would set, the gate
        # never holds a launch: comm is then never tried (its trial would cost control windows and,
        # on real ranks, a Python comm hook on every bucket, for a gate that cannot act).
        self.comm_buckets = comm_buckets
        # trigger -> (last window it fired, consecutive windows it fired)
        self._streak: dict[str, tuple[int, int]] = {}
        # Steps of the next window when it must be shorter than the others (a rebalance trial's first
        # ON window, ``rebalance_probe_share``), else None. The observer and the simulator close the
        # next window after this many steps under the new state; every rank computes the same value.
        self.next_window_steps: int | None = None
        self._full_steps = 0.0  # the longest window seen: the usual window length
        # Steps left in which a rebalance move kept on its probe is re-checked every probe length
        # (``rebalance_recheck``); the window just closed was such a re-check when ``_rechecking``.
        # The re-check windows so far: together they are judged as the one window they replace.
        self._recheck_left = 0
        self._rechecking = False
        self._rechecks: list[WindowRows] = []
        # A trial with a first rebalance move waiting for its confirmation window, or None; the window
        # just closed was that confirmation window when it is set.
        self._pending: Pending | None = None

    # ------------------------------------------------------------------------------------------ api
    def update(self, step: int, summaries: Sequence[WindowSummary]) -> tuple[PacingState, list[Decision]]:
        """Consume one window's summaries; return the state for the next window and new decisions."""
        out: list[Decision] = []
        if self._pending is not None:
            return self._confirm(step, summaries, out)
        if self._rechecking:
            self._rechecking = False
            self._rechecks.append(WindowRows.of(summaries))
            self._recheck_left -= max(1, int(summaries[0].steps)) if summaries else 1
            summaries = merge_windows(self._rechecks)
            if self._recheck_left > 0:
                return self._recheck(step, fleet_view(summaries, self.world_size), out)
            self._collapse_rechecks(self._rechecks[0][0].window, summaries[0].window)
            self._rechecks = []  # together they make one whole window: judged as one, below
        fleet = fleet_view(summaries, self.world_size)
        self._last_window = fleet.window
        self._full_steps = max(self._full_steps, fleet.steps)
        if self.leaves is None and "placement" in self.policies:
            self.leaves = leaves_from_summaries(summaries, self.world_size)
        self._observe_transfer(fleet)
        if (
            fleet.window >= self.config.warmup_windows
            and np.isfinite(fleet.step_time)
            and fleet.step_time > 0
        ):
            if self.guard.trial is not None:
                self._judge(step, fleet, out)
            else:
                self._untreated.append((self.state, fleet.step_time, fleet.window))
                self._maintain(step, fleet, out)
            if self.guard.trial is None:
                self._undo_recovered(step, fleet, out)
                self._propose(step, fleet, summaries, out)
        self._inflated_prev = self._inflated_now
        self._set_next(fleet)
        if self._pending is not None:
            self.next_window_steps = self._confirm_len()  # the confirmation window
        elif self.guard.trial is None and self._recheck_left > 0 and self.kept.shares is not None:
            self.next_window_steps = self._probe_len()
            self._rechecking = True
        elif self.next_window_steps is None:  # (not a trial's probe)
            self._recheck_left = 0  # a new trial (or no kept move): its own windows decide
        self.decisions.extend(out)
        return self.state, out

    def _confirm_len(self) -> int:
        """Steps of a confirmation window: ``rebalance_confirm_steps``, doubled each time the pending
        move's slow group (the same ranks) ended within its confirmation window or by its probe (since
        the last kept move), at most a whole window. For a group slow for a few steps at a time, a
        longer look on the old shares (free) sees it end — ``unconfirmed`` then reads its last steps
        too — where a probe would run moved samples on a healthy fleet."""
        base = self.config.rebalance_confirm_steps
        n = self._short_lived.get(self._move_group, 0)
        return max(base, min(base * 2 ** min(n, 8), round(self._full_steps)))

    def _collapse_rechecks(self, first: int, last: int) -> None:
        """Re-check windows ``first..last`` stand for one window (``last``): what counts in windows —
        a trigger's consecutive windows, a cooldown — counts them as one."""
        span = last - first
        if span <= 0:
            return
        self._streak = {k: (w + span if w >= first - 1 else w, n) for k, (w, n) in self._streak.items()}
        self._cooldown_until = {k: w + span if w > first else w for k, w in self._cooldown_until.items()}

    def _confirm(
        self, step: int, summaries: Sequence[WindowSummary], out: list[Decision]
    ) -> tuple[PacingState, list[Decision]]:
        """The short window run without a first rebalance move right after the window that proposed
        it: the move is tried only when its slow group is still slow here (``unconfirmed``). A
        straggler that ended with the proposing window, or within the first steps of this one, then
        costs nothing. The two windows count as one (trigger streaks, cooldowns) and, together, are the
        trial's first control window; candidates of other policies start as planned."""
        pend, self._pending = self._pending, None
        assert pend is not None
        fleet = fleet_view(summaries, self.world_size)
        self._last_window = fleet.window
        self._collapse_rechecks(pend.window, fleet.window)
        cands = pend.candidates
        why = unconfirmed(fleet, pend, self.config)
        if why is not None:
            # (a straggler that ended, not one outweighed by a second one: t10 of scenarios_unseen2)
            key = _group_key(pend.slow)
            self._short_lived[key] = self._short_lived.get(key, 0) + straggler_ended(fleet, pend, self.config)
            cands = [c for c in cands if c[1] != "rebalance"]
            self._decide(out, step, "rebalance", "note", 0.0,
                         f"{fmt_who(pend.slow)} {why} in the {fleet.steps:.0f} steps after the window that "
                         "proposed a move: not tried")
        if cands:
            both = fleet_view(merge_windows([pend.summaries, summaries]), self.world_size)
            self._start_trial(step, both, cands, out)
        self._set_next(fleet)
        self.decisions.extend(out)
        return self.state, out

    def _set_next(self, fleet: Fleet) -> None:
        """The state of the window after ``fleet``, and its length when it is a trial's short probe."""
        nxt = fleet.window + 1
        self.state = self.guard.state_for(nxt) if self.guard.trial is not None else self.kept
        self.next_window_steps = self._probe_steps(fleet, nxt)
        if self.next_window_steps is not None and self.guard.trial is not None:
            t = self.guard.trial
            if t.probe is not None and t.probe != nxt:
                t.early = (*t.early, t.probe)  # a repeated probe: the first one leaves the plan too
            t.probe = nxt

    def _recheck(self, step: int, fleet: Fleet, out: list[Decision]) -> tuple[PacingState, list[Decision]]:
        """A short window right after a rebalance move was kept on its probe: only "is its straggler
        gone?" is asked (``_undo_recovered``), of the re-check windows so far taken together (``fleet``:
        the longer they run, the better the fixed per-step part of compute is known), their tail being
        the latest steps. A move kept on a few steps' evidence while its straggler was slow would
        otherwise run a whole window of moved samples when that straggler ends right after the probe.
        Everything else waits for the whole window the re-checks make up."""
        self._undo_recovered(step, fleet, out)
        self.state = self.kept
        self.next_window_steps = None
        if self.kept.shares is not None:
            self.next_window_steps = min(self._probe_len(), self._recheck_left)
            self._rechecking = True
        else:  # undone: the windows so far are not judged again
            self._recheck_left, self._rechecks = 0, []
        self.decisions.extend(out)
        return self.state, out

    def describe(self) -> str:
        """Short human status: what is on, what is on trial."""
        parts = []
        k = self.kept
        if k.gc_interval is not None:
            full = f", full/{k.gc_full_interval}" if k.gc_full_interval else ""
            parts.append(f"gc lockstep/{k.gc_interval}{full}")
        if k.shares is not None:
            r = int(np.argmin(k.shares))
            parts.append(f"rebalance r{r} {100 * (k.shares[r] * self.world_size - 1):+.0f}%")
        if k.comm_window is not None:
            parts.append(f"comm window {k.comm_window}")
        if k.placement is not None:
            parts.append("placement proposed")
        if self._pending is not None:
            parts.append(f"confirming a move for {fmt_who(self._pending.slow)}")
        t = self.guard.trial
        if t is not None:
            # pairs measured of the most a trial can take (it may end earlier; before, windows were
            # shown over the minimum pairs and read "5/4" once a trial ran on)
            most = max(self.config.guard_max_pairs, self.config.guard_extend_pairs)
            parts.append(f"trial {t.policy} pair {t.pair_diffs().size}/{most}")
        return "pacing: " + (", ".join(parts) if parts else "watching")

    def reset_transfer_level(self) -> None:
        """Forget the transfer history (the comm trigger's quiet level): the way transfer is measured
        changed (the observer installed its comm hook), so earlier windows no longer compare."""
        self._transfers.clear()
        self._quiet_transfer = math.inf
        self._inflated_now = self._inflated_prev = False

    def comm_can_act(self) -> bool:
        """Whether the comm gate could hold a launch: more buckets per step than the in-flight window
        a trial would set (True while the bucket count is not known)."""
        return self.comm_buckets is None or self.comm_buckets > self.config.comm_window_init

    def wants_comm(self, *, keep: bool = False) -> bool:
        """Whether bucket launches are gated from the next window on: comm is kept or on trial (a trial
        starts at the window whose update returns True; its first ON window is the next one).

        ``keep``: the observer's comm hook is installed now. It is then also kept while a comm trial
        may start at the next window (the trigger fired in this window and comm's cooldown is over by
        then: a bundle's revert retries its policies one by one at once), so that a revert and a new
        trial one window apart do not remove and reinstall it."""
        if "comm" not in self.policies:
            return False
        t = self.guard.trial
        if t is not None and (t.on.comm_window is not None or t.on.comm_spacing_ns > 0):
            return True
        if self.kept.comm_window is not None or self.kept.comm_spacing_ns > 0:
            return True
        if not keep or not self._inflated_now or not self.comm_can_act():
            return False
        return self._cooldown_until.get("comm", -1) <= self._last_window + 1

    # ------------------------------------------------------------------------------------ internals
    def _drift_sd(self) -> float:
        """Standard deviation of the relative change between consecutive untreated windows that ran
        the same state, level shifts left out (0 with fewer than ``guard_drift_min`` such changes).

        A trial pair compares two different windows, so its noise is not only the spread of steps
        inside each window (what the within-window CI sees) but also how much the host changes from
        one window to the next — on a shared machine, other jobs starting and stopping. Consecutive
        windows without a trial measure exactly that pair noise."""
        h = list(self._untreated)  # (the last guard_drift_windows + 1, by the deque's maxlen)
        # Only windows that follow each other: two untreated windows with a trial between them differ
        # by whatever changed over the trial (a straggler that came and went), not by drift.
        d = [
            b / a - 1.0
            for (sa, a, wa), (sb, b, wb) in itertools.pairwise(h)
            if sa == sb and a > 0 and wb == wa + 1
        ]
        # (A straggler that appeared before the trial and stayed is a level shift, not drift: left
        # out there.)
        return drift_sd(np.asarray(d), self.config)

    def _observe_transfer(self, fleet: Fleet) -> None:
        """Compare this window's transfer with its quiet level: the median of earlier ungated windows.

        Transfer is "inflated" when it is ``comm_high`` times that level AND above it by more than
        ``comm_noise_k`` robust standard deviations (1.4826 MAD) of those windows. The median and the
        spread are estimated from ``comm_history_min`` windows at least: a running minimum (the
        quietest window ever seen) drifts down with every noisy window, so on a busy host almost any
        later window looked inflated against it.

        Transfer is measured relative to the fleet's median compute per step: when the host itself
        slows down (other processes taking the CPU), compute and transfer stretch together and their
        ratio stays; contention in the network stretches transfer alone. A window whose collectives wait
        on a straggler is not a quiet level: its buckets reach the network one by one as the straggler
        sends them and cross it alone (paper workload, rank 3 2x slow: 0.70 of compute against 2.5-2.7
        in healthy windows), so healthy windows after it read as inflated."""
        c = self.config
        comp = float(np.median(fleet.compute)) if fleet.compute.size else 0.0
        t = fleet.transfer / comp if np.isfinite(comp) and comp > 0 else math.nan
        self._transfer_now = t
        ok = bool(np.isfinite(t) and t > 0)
        self._inflated_now = False
        if len(self._transfers) >= c.comm_history_min:
            hist = np.asarray(self._transfers)
            quiet = float(np.median(hist))
            spread = 1.4826 * float(np.median(np.abs(hist - quiet)))
            self._quiet_transfer = quiet
            if ok and quiet > 0:
                self._inflation = t / quiet
                self._inflated_now = self._inflation > c.comm_high and t - quiet > c.comm_noise_k * spread
        if ok and not self._gating_now(fleet.window) and not waits_on_straggler(fleet, c):
            self._transfers.append(float(t))

    def _gating_now(self, window: int) -> bool:
        t = self.guard.trial
        if t is not None and t.arms.get(window) == "on" and t.on.comm_window is not None:
            return True
        return self.kept.comm_window is not None

    def _decide(
        self,
        out: list[Decision],
        step: int,
        policy: str,
        action: str,
        value: float,
        reason: str,
        rank: int = -1,
    ) -> None:
        out.append(
            Decision(step=step, rank=rank, policy=policy, action=action, value=float(value), reason=reason)
        )

    def _judge(self, step: int, fleet: Fleet, out: list[Decision]) -> None:
        trial = self.guard.trial
        assert trial is not None
        trial.record(fleet.window, fleet.step_time, fleet.step_stderr)
        if (
            "rebalance" in trial.policy.split("+")
            and trial.arms.get(fleet.window) == "off"
            and self.kept.shares is not None
            and recovered(fleet, np.asarray(self.kept.shares, dtype=np.float64), self.config) is not None
        ):
            # A further move is on trial and, in a control window, the kept move's straggler is gone:
            # both moves have nothing left to relieve. End the trial (no cooldown); the kept move is
            # undone right after (``_undo_recovered``) instead of running through the trial's windows.
            self._decide(out, step, "guard", "revert", 0.0,
                         f"{trial.policy} reverted (its straggler is gone): the ranks it relieves are no "
                         "longer slow in a control window")
            self.guard.finish()
            return
        v: Verdict = self.guard.verdict(fleet.window)
        gone = straggler_gone(trial, fleet, self.config)
        # (a first pair far worse beyond noise is already a revert: the straggler verdict still applies)
        first = v.decide == "continue" or (v.decide == "revert" and v.pairs == 1)
        if gone is not None and v.pairs >= 1 and first and v.ci_low > 0:
            # The ON window is slower beyond noise and the ranks the move relieves are no longer slow:
            # slowness moved elsewhere (it wanders between nodes), so a second pair would only run the
            # move once more; from now on a new straggler must persist for two windows.
            v = replace(v, decide="revert")
            if trial.off.shares is None:
                # Only a first move tells whether a new straggler persists: a further move on top of a
                # kept one is a correction of a straggler that did persist (audit 17: noise-driven
                # corrections switched a run with one steady 25% straggler to the slower mode).
                self._stragglers_wander = True
                gone += ": the straggler did not persist; new stragglers must now persist for two " \
                    "windows before a move is tried"
            self._decide(out, step, "rebalance", "note", v.estimate, gone)
        elif gone is not None and v.pairs >= 1 and (first or v.decide == "keep"):
            # The straggler left (a fault that ended where the proposing window ended): the move has
            # nothing to relieve. Not "kept" even when the ON window is faster — it is compared with the
            # proposing window, which the straggler made slow — and no cooldown: rebalance did no harm,
            # and a straggler that comes back is moved again.
            duty, gap = self._move_duty, self.config.rebalance_gap_duty
            if (
                trial.off.shares is None
                and fleet.window == trial.probe
                and not trial.early
                and duty is not None
                and duty < gap
                and self._probe_len() < round(self._full_steps)
            ):
                # The group was slow in only part of the proposing window's steps: this probe may have
                # met one of its gaps. Probe once more before calling it gone.
                self._gap_probe = True
                self._decide(out, step, "rebalance", "note", v.estimate,
                             f"{gone}; but it was slow in only about {duty * 100:.0f}% of the proposing "
                             f"window's steps: probing {self._probe_len()} steps more before calling "
                             "it gone")
                return
            self._decide(out, step, "rebalance", "note", v.estimate, gone)
            retry = ""
            # (at the probe only: a straggler gone after the move ran for a while did outlast it)
            if trial.off.shares is None and fleet.window == trial.probe:
                # The second such first move (and every later one, with no kept move between): the
                # next waits a cooldown that doubles each time, as a reverted trial does. (A node 1.5x
                # slow for 10 of every 20 steps, --window 10: 8 probes on a healthy fleet per 300
                # steps, -1.3% throughput; audit 18.)
                key = self._move_group
                n = self._gone_probes[key] = self._gone_probes.get(key, 0) + 1
                self._short_lived[key] = self._short_lived.get(key, 0) + 1
                if n >= 2:
                    wait = self.config.guard_cooldown * 2 ** (n - 2)
                    self._cooldown_until["rebalance"] = fleet.window + wait
                    retry = (f"; this straggler ends before a move reaches it ({n} times): retry in "
                             f"{wait} windows")
            self._decide(out, step, "guard", "revert", v.estimate,
                         f"{trial.policy} reverted (its straggler is gone): {v.describe()}{retry}")
            self.guard.finish()
            return
        loaded = loads_a_straggler(trial, fleet, self.config) if gone is None and v.decide != "keep" else None
        if loaded is not None:
            # A rank the move gave samples to is now the slowest per sample (a second fault began
            # while the move ran): the move's shares no longer fit the job, and waiting for a second
            # pair only runs them longer. Back to the state before the trial, with no cooldown, so a
            # move for the new straggler can be proposed from this very window.
            self._decide(out, step, "rebalance", "note", v.estimate, loaded)
            self._decide(out, step, "guard", "revert", v.estimate,
                         f"{trial.policy} reverted (a new straggler): {v.describe()}")
            self.guard.finish()
            return
        if v.decide == "continue":
            return
        if v.decide == "keep":
            self.kept = trial.on
            if "rebalance" in trial.policy.split("+"):
                self._gone_probes.clear()
                self._short_lived.clear()
            if (
                "rebalance" in trial.policy.split("+")
                and fleet.window == trial.probe
                and self.config.rebalance_recheck > 0
            ):
                self._recheck_left = self.config.rebalance_recheck * round(self._full_steps)
            if "gc" in trial.policy.split("+"):
                self._gc_rss_ref = fleet.rss
            self._decide(out, step, "guard", "keep", v.estimate, f"{trial.policy} kept: {v.describe()}")
        else:
            bundle = "+" in trial.policy
            self._bundle_failed = self._bundle_failed or bundle
            wait = 1
            for pol in trial.policy.split("+"):
                n = self._reverts.get(pol, 0) + 1
                self._reverts[pol] = n
                # A failed bundle is split up at once; a single policy that failed waits longer each time.
                wait = 1 if bundle else self.config.guard_cooldown * 2 ** (n - 1)
                self._cooldown_until[pol] = fleet.window + wait
            why = "it hurts" if v.ci_low > 0 else "no gain beyond noise"
            self._decide(
                out,
                step,
                "guard",
                "revert",
                v.estimate,
                f"{trial.policy} reverted ({why}): {v.describe()}; retry in {wait} windows",
            )
        self.guard.finish()

    def _probe_steps(self, fleet: Fleet, nxt: int) -> int | None:
        """Steps of window ``nxt`` when it is a rebalance trial's first ON window (a short probe), else
        None. Only a trial of rebalance alone: gc and comm effects need whole windows to show."""
        t, share = self.guard.trial, self.config.rebalance_probe_share
        if t is not None and self._gap_probe:
            self._gap_probe = False
            if t.probe is not None and nxt == t.probe + 1:
                return self._probe_len()
        if t is None or share <= 0 or t.policy != "rebalance" or t.probe is not None:
            return None
        if nxt != t.start_window + 1:
            return None
        probe = self._probe_len()
        return probe if probe < round(self._full_steps) else None

    def _probe_len(self) -> int:
        """Steps of a probe (and of a re-check window): ``rebalance_probe_steps``, or a share of a full
        window (the proposing window may itself have been a probe), never more than a full window."""
        steps = round(self._full_steps)
        c = self.config
        probe = c.rebalance_probe_steps or math.ceil(c.rebalance_probe_share * steps)
        return min(max(5, probe), max(1, steps))

    def _undo_recovered(self, step: int, fleet: Fleet, out: list[Decision]) -> None:
        """A kept move is kept because its straggler was slow. Once the ranks it relieved are no longer
        slow, the move only loads the others (often by less than the 3% a further move must predict, so
        no candidate would ever undo it): back to equal shares, the state without rebalance, at once —
        also right after the window that kept it. A straggler that comes back triggers a new move."""
        k = self.kept
        if k.shares is None:
            return
        why = recovered(fleet, np.asarray(k.shares, dtype=np.float64), self.config)
        if why is not None:
            self.kept = replace(k, shares=None)
            self._decide(out, step, "rebalance", "adjust", 1.0, why)

    def _maintain(self, step: int, fleet: Fleet, out: list[Decision]) -> None:
        c, k = self.config, self.kept
        if k.gc_interval is not None and self._gc_rss_ref and fleet.rss > 0:
            growth = fleet.rss / self._gc_rss_ref - 1.0
            # Lockstep young collections never free garbage that was promoted; when resident memory
            # grows, add lockstep full collections (once per window first, then twice as often).
            full_min = max(c.gc_full_interval_min, k.gc_interval)
            if growth > c.gc_rss_growth_limit and (k.gc_full_interval or full_min + 1) > full_min:
                cur_full = k.gc_full_interval
                new = max(full_min, cur_full // 2) if cur_full else max(full_min, int(fleet.steps))
                self.kept = replace(k, gc_full_interval=new)
                self._gc_rss_ref = fleet.rss
                self._decide(
                    out,
                    step,
                    "gc",
                    "adjust",
                    new,
                    f"resident memory grew {growth * 100:.0f}% since the last check: full lockstep "
                    f"collection every {new} steps" + (f" instead of {cur_full}" if cur_full else ""),
                )
        k = self.kept
        if k.comm_window is not None and math.isfinite(self._quiet_transfer) and self._quiet_transfer > 0:
            infl = self._transfer_now / self._quiet_transfer
            new_w = k.comm_window
            if infl > c.comm_high:
                new_w = max(1, k.comm_window // 2)
            elif infl < c.comm_low:
                new_w = min(c.comm_window_max, k.comm_window + 1)
            if new_w != k.comm_window:
                self.kept = replace(k, comm_window=new_w)
                self._decide(
                    out,
                    step,
                    "comm",
                    "adjust",
                    new_w,
                    f"transfer (per unit of compute) {infl:.2f}x its quiet level: in-flight window "
                    f"{k.comm_window} -> {new_w}",
                )

    def _propose(
        self, step: int, fleet: Fleet, summaries: Sequence[WindowSummary], out: list[Decision]
    ) -> None:
        """Candidates whose trigger fires in ``fleet`` (the window ``summaries`` describe): a trial of
        them starts now, or after a confirmation window when one is a first rebalance move."""
        c, k, w = self.config, self.kept, fleet.window
        candidates: list[Candidate] = []
        # Triggers that fired in this window but are not yet persistent: they join a trial that starts
        # anyway (its control windows are paid already), instead of waiting behind it.
        waiting: list[Candidate] = []
        first_move: FirstMove | None = None  # the slow group of a first rebalance move

        def ready(policy: str) -> bool:
            return policy in self.policies and self._cooldown_until.get(policy, -1) <= w

        def persistent(key: str) -> bool:
            """The trigger ``key`` fired in this window; True once it fired in ``trigger_windows``
            consecutive windows. A one-off (a full collection during warm-up, a rank descheduled for a
            window by another process) then never starts a trial, whose control windows would cost."""
            last, n = self._streak.get(key, (-2, 0))
            n = n + 1 if last == w - 1 else 1
            self._streak[key] = (w, n)
            return n >= c.trigger_windows

        if ready("gc") and k.gc_interval is None and fleet.gc_share >= c.gc_trigger_share:
            cand, ok = gc_candidate(fleet, k, c, self.world_size, persistent)
            (candidates if ok else waiting).append(cand)
        cps_ok = bool(np.all(np.isfinite(fleet.cps)) and np.all(fleet.cps > 0))
        if ready("rebalance") and k.shares is None and cps_ok:
            found = first_move_candidate(
                fleet, k, c, self.world_size, persistent, wander=self._stragglers_wander,
                intermittent=lambda g: self._short_lived.get(_group_key(g), 0) >= 1,
            )
            if isinstance(found, Declined):
                key = _group_key(found.slow)
                if key not in self._declined:  # said once per group, not every window
                    self._declined.add(key)
                    self._decide(out, step, "rebalance", "note", 0.0, found.reason)
            elif found is not None:
                cand, ok, first_move = found
                (candidates if ok else waiting).append(cand)
        if ready("rebalance") and k.shares is not None and cps_ok:
            further = further_move_candidate(fleet, k, c, self.world_size, persistent)
            if further is not None:
                cand, ok = further
                (candidates if ok else waiting).append(cand)
        if (
            ready("comm")
            and k.comm_window is None
            and self.comm_can_act()
            and math.isfinite(self._quiet_transfer)
            and self._quiet_transfer > 0
            and fleet.wait_share >= c.comm_trigger_share
            and self._inflated_now
            and self._inflated_prev
        ):
            candidates.append(comm_candidate(fleet, k, c, self._transfer_now / self._quiet_transfer))
        if "placement" in self.policies and self.leaves is not None and not self._placement_done:
            self._placement_done = True
            plan = plan_placement(self.leaves)
            if plan.improves:
                self.kept = replace(self.kept, placement=plan.order)
                self._decide(
                    out,
                    step,
                    "placement",
                    "enable",
                    plan.edges_after,
                    f"ring crosses leaves {plan.edges_before} times; proposed order crosses "
                    f"{plan.edges_after} times (applies at the next restart; `fabricpace place` writes "
                    "the hostfile)",
                )
        if not candidates:
            return
        # Candidates found in the same window are tried together (one trial instead of several: the
        # guard's control windows are the cost of acting), with the triggers still waiting for their
        # second window. A bundle that fails is not retried as a bundle: its policies come back one at
        # a time, most severe first.
        candidates += waiting
        candidates.sort(key=lambda t: -t[0])
        if self._bundle_failed:
            candidates = candidates[:1]
        # (windows no longer than the confirmation window itself are not split)
        confirm = 0 < self.config.rebalance_confirm_steps < round(self._full_steps)
        if first_move is not None:
            self._move_group = _group_key(first_move[0])
            self._move_duty = group_duty(fleet, first_move[0])
        if first_move is not None and confirm and any(t[1] == "rebalance" for t in candidates):
            self._pending = Pending(candidates=candidates, summaries=WindowRows.of(summaries), window=w,
                                     slow=first_move[0], excess=first_move[1], last=first_move[2])
            return
        self._start_trial(step, fleet, candidates, out)

    def _start_trial(
        self, step: int, fleet: Fleet, candidates: list[Candidate], out: list[Decision]
    ) -> None:
        """Start one trial of the candidates together; ``fleet`` (it ran without them) is its first
        control window."""
        w = fleet.window
        on = self.kept
        for _sev, pol, cand, _reason, _rank in candidates:
            on = _merge(on, cand, pol)
        policy = "+".join(t[1] for t in candidates)
        self.guard.start(
            policy=policy,
            on=replace(on, placement=self.kept.placement),
            off=self.kept,
            window=w,
            reason="; ".join(t[3] for t in candidates),
        )
        trial = self.guard.trial
        assert trial is not None
        trial.drift_sd = self._drift_sd()
        # The window that proposed the candidate ran without it: it is the first control window.
        trial.arms[w] = "off"
        trial.record(w, fleet.step_time, fleet.step_stderr)
        for _sev, pol, cand, reason, rank in candidates:
            value = float({"gc": cand.gc_interval, "comm": cand.comm_window}.get(pol) or 0)
            if pol == "rebalance" and cand.shares is not None:
                value = cand.shares[rank] * self.world_size
            self._decide(out, step, pol, "enable", value, f"{reason} (on trial)", rank=rank)


def _merge(base: PacingState, cand: PacingState, policy: str) -> PacingState:
    """``base`` with the fields of one policy taken from ``cand``."""
    if policy == "gc":
        return replace(base, gc_interval=cand.gc_interval, gc_full_interval=cand.gc_full_interval)
    if policy == "rebalance":
        return replace(base, shares=cand.shares)
    if policy == "comm":
        return replace(base, comm_window=cand.comm_window, comm_spacing_ns=cand.comm_spacing_ns)
    return base


def _group_key(ranks: Sequence[int] | np.ndarray) -> tuple[int, ...]:
    """A slow group's key for the per-group counters (its ranks as plain ints)."""
    return tuple(int(r) for r in ranks)
