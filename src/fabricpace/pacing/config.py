"""Tunables of the coordination layer: one frozen keyword-only dataclass with documented defaults.

Every threshold the controller, the guard and the actuators use lives here, so the simulator's twin
and the real pacer run with exactly the same numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from fabricpace._errors import ConfigError

# placement only acts when the controller knows each rank's leaf (it applies at the next restart).
POLICIES: tuple[str, ...] = ("gc", "rebalance", "comm", "placement")


@dataclass(frozen=True, kw_only=True)
class PacingConfig:
    """Thresholds and limits of the pacing controller (all shares are fractions of step time)."""

    # --- gc: lockstep garbage collection -------------------------------------------------------
    # Enable lockstep collection when GC pauses cost at least this share of the mean step time: the
    # larger of their mean per rank and their amplified cost (a step waits for any rank's pause).
    gc_trigger_share: float = 0.03
    # Steps between lockstep young-generation collections (1 = at every step boundary, when the
    # step's temporaries are dead; each such collection only walks what the step allocated). Every
    # step by default: k steps' garbage collected at once is one pause k times longer every k-th step,
    # which raises the step-time CV by about pause·sqrt(1/k·(1-1/k)) / step, for the same GC time per
    # step (a young collection's cost is its traversal of what was allocated, and automatic
    # collection already runs young collections at least that often in a loop that makes garbage).
    gc_interval: int = 1
    # When ranks see at least one automatic collection per step (Python's young generations firing
    # mid-step: object churn), collect the young generations at every step boundary instead: each
    # such collection only walks what one step allocated, so the aligned pause stays small.
    gc_interval_churn: int = 1
    # GC across the fleet, measured within the window: when at least this share of the ranks collected
    # in one window and GC costs at least `gc_clear_share`, a GC trigger is tried at once; GC on a few
    # ranks only (or near the trigger) must show again in the next window. A one-off on every rank (a
    # full collection after start-up) can then start a trial whose ON windows cost only lockstep young
    # collections, while each window of waiting on a real GC problem runs at the slower level (and a
    # level change inside the measured steps raises the run's step-time CV).
    gc_fleet_share: float = 0.34
    # ...and costs at least this share of step time (twice the trigger: clear within one window).
    gc_clear_share: float = 0.06
    # GC that costs at least this share of step time, on at least `gc_wide_share` of the ranks (and
    # more than one rank), is also clear within one window: a many-fold excess over the trigger is not
    # noise, and waiting a window leaves it at the slower level (a run where 29% of 384 ranks paid 272%
    # of step time waited).
    gc_heavy_share: float = 0.25
    gc_wide_share: float = 0.10
    gc_interval_min: int = 1
    # Full lockstep collections (added when memory grows) never run more often than this: each walks
    # the whole heap.
    gc_full_interval_min: int = 10
    gc_interval_max: int = 200
    # Memory bound: if resident memory grows more than this fraction above its level when lockstep
    # began, full lockstep collections are added (once per window, then twice as often).
    gc_rss_growth_limit: float = 0.10

    # --- rebalance: move samples away from persistent stragglers --------------------------------
    # Ranks are persistent stragglers when their compute per sample is this much above the median
    # and together they arrive last in at least `straggler_last_share` of the collectives.
    straggler_compute_excess: float = 0.05
    straggler_last_share: float = 0.5
    # A straggler this clear within one window — its per-step *median* compute per sample at least
    # this much above the fleet's median (twice the trigger; a median, so it was slow in most of the
    # window's steps, not stalled in a few) — is tried at once; a weaker one must persist for
    # `trigger_windows` windows. Every window spent before acting runs at the old, slower level.
    straggler_clear_excess: float = 0.10
    # ...and the slow group arrives last in at least this share of the window's collectives (it holds
    # the others up in most steps; a rank that is merely slower on a loaded host often is not last).
    straggler_clear_last_share: float = 0.8
    # The same for a further move of kept shares: a predicted saving of at least this share of step
    # time, with the ranks that would give up samples last in `straggler_last_share` (e.g. the
    # straggler recovered and the ranks that took its samples now hold everyone up).
    rebalance_clear_gain: float = 0.06
    # A kept move whose relieved ranks are below this excess per sample in the window's last steps
    # (``WindowSummary.tail_*``) has nothing left to relieve (its straggler recovered): equal shares
    # again, at once. Half the trigger, so one noisy tail of a straggler just above the trigger does
    # not undo its move. 0 = off.
    straggler_tail_gone_excess: float = 0.025
    # Adjust shares only when the predicted compute-critical-path saving is at least this large.
    rebalance_min_gain: float = 0.03
    # Move at most this fraction of the gap to the speed-proportional shares per window (damping).
    rebalance_step: float = 0.8
    # The same for a first move tried on one window's evidence (a straggler clear within the window):
    # what the move costs when the straggler is gone by the next window scales with it.
    rebalance_clear_step: float = 0.8
    # The first ON window of a rebalance trial is short: this share of the proposing window's steps
    # (at least 5). A straggler that was slow for exactly the window that proposed the move (a fault
    # ending there) is seen gone after these steps instead of a whole window of moved samples, and a
    # clear gain is kept as early. 0 = the ON window is as long as the others.
    rebalance_probe_share: float = 0.2
    # A probe of this many steps whatever the window length (at least 5; 0 = the share above; no probe
    # at all while the share is 0). What a straggler that ended with the proposing window costs is the
    # probe's steps of moved samples, and 5 steps answer as well in a 100-step window as in a 20-step one.
    rebalance_probe_steps: int = 5
    # A first move's probe that finds its slow group gone is followed by one more probe (same length)
    # instead of a revert when the group was slow in fewer than this share of the proposing window's
    # steps (its duty, read from the low percentiles of compute per step): it comes and goes, and a probe
    # that fell into one of its gaps says nothing about whether it left (audit 21: 1.4x for 15 of every
    # 20 steps and 1.5x for 16 of every 22: the probe met a 5- and a 6-step gap, -0.17% and -0.49%).
    # 0 = never.
    rebalance_gap_duty: float = 0.9
    # After a move is kept on its probe, re-check it every probe length for this many full windows (0 =
    # off): only "is its straggler gone?" is asked. A straggler that ends right after the probe then
    # costs a few steps of moved samples instead of a whole window.
    rebalance_recheck: int = 1
    # Before a first move is tried, the slow group must still be slow in a short window of this many
    # steps run without it right after the window that proposed it (0 = off: the trial starts at once).
    # A straggler that ended exactly where that window ended (faults that start and stop at round step
    # numbers end on a window boundary) then costs nothing, instead of a probe of moved samples that has
    # nothing to relieve; a persistent straggler is moved these steps later.
    rebalance_confirm_steps: int = 5
    # ...and, when the slow group arrived last in at least `straggler_clear_last_share` of the proposing
    # window's collectives, it must still arrive last in at least this fraction of that share there (a
    # straggler that ended within those steps is slow in their median but no longer holds anyone up).
    rebalance_confirm_last: float = 0.8
    # No rank gets less than this fraction of an equal share (a rank with 0 samples breaks most loops).
    rebalance_min_share: float = 0.25

    # --- comm: gate DDP bucket launches -----------------------------------------------------------
    # Transfer inflation (current transfer / quietest seen) above `comm_high` shrinks the in-flight
    # window, below `comm_low` grows it (hysteresis between the two thresholds).
    comm_high: float = 1.5
    comm_low: float = 1.15
    # Exposed communication must be at least this share of step time for comm gating to be tried.
    comm_trigger_share: float = 0.10
    # Quiet level of transfer: the median of at least this many earlier ungated windows; a window is
    # inflated only when also more than `comm_noise_k` robust standard deviations above it.
    comm_history_min: int = 3
    comm_noise_k: float = 3.0
    comm_window_init: int = 2
    comm_window_max: int = 8

    # --- triggers -----------------------------------------------------------------------------------
    # A gc or rebalance trigger must fire in this many consecutive windows before a trial starts
    # (comm always needs two: its inflation is measured against the previous window). 1 = act at once.
    trigger_windows: int = 2

    # --- guard: do no harm -------------------------------------------------------------------------
    # A candidate runs in interleaved ON/OFF control windows (ABBA order); it is kept only when the
    # block-bootstrap CI of the relative step-time change lies entirely below -guard_min_gain.
    guard_pairs: int = 2
    guard_max_pairs: int = 3
    # ...unless the estimate still favours the candidate: then up to this many pairs before reverting.
    guard_extend_pairs: int = 6
    # A candidate whose first pair is slower than this share beyond noise (the CI's lower end) is
    # reverted at once instead of running a second ON window. 0 = off (the default): measured at 0.10
    # in session 9 it changed nothing on the transient grid, dev, named, mixed or targeted sets, and
    # on held-out unseen-77 it ended a harmful gc trial early so a rebalance could run (+2.0% ->
    # +14.4%) but made that point's CV worse than the baseline's (a level change in the measured
    # steps) — see docs/pacing.md.
    guard_harm_share: float = 0.0
    guard_min_gain: float = 0.0
    guard_confidence: float = 0.90
    # Widening of the within-window standard error (steps inside a window are autocorrelated).
    guard_se_inflation: float = 1.25
    guard_resamples: int = 2000
    # Between-window noise: the spread of the relative change between consecutive untreated windows
    # (the last `guard_drift_windows` of them) widens the CI once at least `guard_drift_min` changes
    # were seen (earlier, only the within-window spread is known).
    guard_drift_windows: int = 8
    guard_drift_min: int = 3
    # A change between untreated windows beyond `guard_shift_k` times the spread of the smaller half of
    # the changes (at least `guard_shift_floor`) is a level shift, not drift, when all such changes go
    # the same way (a fault that began or ended and stayed: the level moved once and did not come
    # back); it is left out of the drift (0 = off: every change counts). Audit 17: node 2 3x slow from
    # step 200 put its +196% jump into the drift (SD 0.98), every CI was +-66% even after 6 pairs and
    # a -49.7% gain was never kept.
    guard_shift_k: float = 4.0
    guard_shift_floor: float = 0.01
    # After a revert, wait this many windows before trying the same policy again (doubles each time).
    guard_cooldown: int = 4
    # Kept policies are re-checked with one control window pair every this many windows (0 = never).
    guard_recheck: int = 0
    # Windows skipped at the start (warm-up: allocator, caches, JIT) before any decision.
    warmup_windows: int = 0
    # Injected delay (comm spacing/waits) per step is capped at this share of the median step time.
    max_delay_share: float = 0.01
    # A controller update slower than this turns pacing off on that rank (seconds).
    controller_timeout_s: float = 2.0
    # Seed of the guard's bootstrap (the same on every rank, so every rank decides the same).
    seed: int = 0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ConfigError(f"PacingConfig.{f.name}: expected a number, got {value!r}")
            if value < 0 and f.name != "guard_min_gain":
                raise ConfigError(f"PacingConfig.{f.name}: must be >= 0, got {value!r}")
        if not 0 < self.guard_confidence < 1:
            raise ConfigError("PacingConfig.guard_confidence: must lie in (0, 1), e.g. 0.90")
        if self.gc_interval_min < 1 or not self.gc_interval_min <= self.gc_interval <= self.gc_interval_max:
            raise ConfigError("PacingConfig.gc_interval: need 1 <= gc_interval_min <= gc_interval <= max")
        if self.comm_low >= self.comm_high:
            raise ConfigError("PacingConfig.comm_low must be below comm_high (hysteresis band)")
        if self.trigger_windows < 1:
            raise ConfigError("PacingConfig.trigger_windows: must be >= 1")
        if self.guard_extend_pairs < self.guard_max_pairs:
            raise ConfigError("PacingConfig.guard_extend_pairs: must be >= guard_max_pairs")
        if self.guard_pairs < 1 or self.guard_max_pairs < self.guard_pairs:
            raise ConfigError("PacingConfig.guard_pairs: need 1 <= guard_pairs <= guard_max_pairs")
        if (
            not 0 < self.rebalance_step <= 1
            or not 0 < self.rebalance_clear_step <= 1
            or not 0 < self.rebalance_min_share <= 1
        ):
            raise ConfigError("PacingConfig.rebalance_step/clear_step/min_share: must lie in (0, 1]")
        if self.comm_window_init < 1 or self.comm_window_max < self.comm_window_init:
            raise ConfigError("PacingConfig.comm_window_init: need 1 <= comm_window_init <= comm_window_max")

    def with_overrides(self, **overrides: Any) -> PacingConfig:
        """A copy with some fields changed; unknown names are a ConfigError naming the field."""
        known = {f.name for f in fields(self)}
        for name in overrides:
            if name not in known:
                raise ConfigError(f"PacingConfig: unknown field {name!r}; known: {', '.join(sorted(known))}")
        return replace(self, **overrides)


def parse_policies(pacing: str | list[str] | tuple[str, ...] | None) -> tuple[str, ...]:
    """``"auto"`` → all policies; ``"off"``/None → none; ``"gc,comm"`` or a list → those (validated)."""
    if pacing is None:
        return ()
    if isinstance(pacing, str):
        text = pacing.strip().lower()
        if text in ("off", "none", ""):
            return ()
        if text == "auto":
            return POLICIES
        items = [p.strip() for p in text.split(",") if p.strip()]
    else:
        items = [str(p).strip().lower() for p in pacing]
    bad = [p for p in items if p not in POLICIES]
    if bad:
        raise ConfigError(
            f"pacing={pacing!r}: unknown policy {bad[0]!r}; "
            f"use 'auto', 'off' or a list of {', '.join(POLICIES)}"
        )
    # Keep the canonical order so every rank builds the same controller.
    return tuple(p for p in POLICIES if p in items)
