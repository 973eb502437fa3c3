"""The do-no-harm guard: a policy change stays only if interleaved control windows show it helps.

A candidate policy runs in pairs of windows, one with the candidate (ON) and one without (OFF), in
ABBA order (OFF/ON, ON/OFF, OFF/ON, ...) so a slow drift of the machine cancels out; the first OFF
window is the one that proposed the candidate. Each pair gives
one relative change ``on / off - 1`` of the fleet's mean step time. Windows are the bootstrap's
blocks: steps inside one window are autocorrelated (a GC pause, a noisy neighbour), whole windows much
less so, so pairs are resampled whole (a block bootstrap) and the percentile CI of the mean change
decides: keep when the whole CI lies below ``-guard_min_gain`` (possible after one pair when the gain
is clear); revert when, after ``guard_pairs`` pairs, the CI lies above zero (it clearly hurts) or when
``guard_max_pairs`` pairs could not show a gain beyond noise — unless the estimate still favours the
policy, which then runs on for up to ``guard_extend_pairs`` pairs. With few pairs a bootstrap cannot see
noise it did not sample, so the CI is widened to at least the normal CI implied by the windows'
within-window spread (inflated by ``guard_se_inflation`` for autocorrelation between steps), and at
least to the CI implied by the drift between consecutive untreated windows measured before the trial
(``Trial.drift_sd``, set by the controller with ``drift_sd``): on a shared host the load changes from
one window to the next, which no within-window spread shows. A level shift before the trial (a
straggler that appeared and stayed) is not such a change and is left out of it (``level_shifts``).

The bootstrap RNG is seeded from the config seed and the window index, so every rank — and the
simulator's twin — reaches the same verdict from the same summaries.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fabricpace.pacing.config import PacingConfig
from fabricpace.pacing.state import PacingState


@dataclass(frozen=True, kw_only=True)
class Verdict:
    """Outcome of a trial so far: ``decide`` is "continue", "keep" or "revert"."""

    decide: str
    estimate: float  # mean relative step-time change ON vs OFF (negative = faster)
    ci_low: float
    ci_high: float
    pairs: int

    def describe(self) -> str:
        return (
            f"step time {self.estimate * 100:+.1f}% with it "
            f"({self.ci_low * 100:+.1f}%..{self.ci_high * 100:+.1f}% CI, {self.pairs} window pairs)"
        )


def block_bootstrap_ci(
    diffs: np.ndarray, *, confidence: float, resamples: int, seed: int
) -> tuple[float, float, float]:
    """Mean of per-block differences and its percentile bootstrap CI (blocks resampled whole)."""
    diffs = np.asarray(diffs, dtype=np.float64)
    n = diffs.size
    if n == 0:
        return 0.0, -np.inf, np.inf
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(resamples, n))
    means = diffs[idx].mean(axis=1)
    alpha = (1.0 - confidence) / 2.0
    lo, hi = np.quantile(means, [alpha, 1.0 - alpha])
    return float(diffs.mean()), float(lo), float(hi)


def level_shifts(changes: np.ndarray, config: PacingConfig) -> np.ndarray:
    """Which of the relative changes between consecutive untreated windows are level shifts.

    Drift is how much a window differs from the one before it while nothing changes in the job: on a
    shared host the load comes and goes, in both directions, again and again. A straggler that appears
    mid-run (or a fault that ends) is one jump to a new level that then stays: it says nothing about
    the difference between two windows of a trial that runs after it, yet one +196% jump among four
    changes made the drift SD 0.98 and the CI +-66% after 6 pairs (audit 17, node 2 3x slow from step
    200). So the smaller half of the changes sets the drift's scale (it is never a shift: the bulk of
    the changes is the drift), and a larger change is a shift when it lies beyond ``guard_shift_k``
    times the RMS of the smaller ones that are not shifts (at least ``guard_shift_floor``, so a host
    with near-equal windows does not call 1% a shift). Shifts are left out only when they all go the
    same way: a level that moved and came back (load toggling every few windows, a straggler that came
    and went) is the wander the drift must keep seeing."""
    d = np.asarray(changes, dtype=np.float64)
    shift = np.zeros(d.size, dtype=bool)
    if config.guard_shift_k <= 0 or d.size == 0:
        return shift
    order = np.argsort(np.abs(d), kind="stable")
    keep = (d.size + 1) // 2  # the smaller half (rounded up) is the drift's own scale
    for j, i in enumerate(order[keep:], start=keep):
        calm = d[order[:j]][~shift[order[:j]]]
        scale = max(config.guard_shift_floor, float(np.sqrt(np.mean(calm**2))) if calm.size else 0.0)
        # sorted by size: once one change is a shift, every larger one is too
        shift[i] = bool(shift[order[j - 1]]) or abs(d[i]) > config.guard_shift_k * scale
    if shift.any() and not (np.all(d[shift] > 0) or np.all(d[shift] < 0)):
        return np.zeros(d.size, dtype=bool)  # up and down: the level wanders, which is drift
    return shift


def drift_sd(changes: np.ndarray, config: PacingConfig) -> float:
    """Standard deviation of the changes between consecutive untreated windows, level shifts left out
    (0 with fewer than ``guard_drift_min`` changes left: too few to measure drift)."""
    d = np.asarray(changes, dtype=np.float64)
    d = d[~level_shifts(d, config)]
    if d.size < config.guard_drift_min:
        return 0.0
    return float(np.std(d, ddof=1))


@dataclass(kw_only=True)
class Trial:
    """One candidate policy under test: its ON state, its OFF (control) state and the measurements."""

    policy: str
    on: PacingState
    off: PacingState
    start_window: int
    reason: str
    # window index -> "on" | "off"; planned one window ahead
    arms: dict[int, str] = field(default_factory=dict)
    times: dict[int, float] = field(default_factory=dict)
    # standard error of each window's mean step time (within-window spread / sqrt(steps))
    errors: dict[int, float] = field(default_factory=dict)
    # standard deviation of one pair's relative change measured between untreated windows before the
    # trial (0 = not known): the CI is at least as wide as this pair noise allows
    drift_sd: float = 0.0
    # A short ON window right after the proposing one (a rebalance trial's probe), or None. It is an
    # early look: it can keep a clear gain at once (``probe_diffs``), but it is not one of the pairs —
    # the plan runs as if it were not there, so a probe that shows nothing costs the guard nothing.
    probe: int | None = None
    # Earlier probe windows when the probe was repeated (the first fell into a gap of a straggler that
    # comes and goes): like the probe, ON and outside the plan.
    early: tuple[int, ...] = ()

    def _offset(self, window: int) -> int:
        skip = sum(1 for p in (*self.early, self.probe) if p is not None and window > p)
        return window - self.start_window - skip

    def arm_for(self, window: int) -> str:
        """ABBA plan: pair k covers windows start+2k and start+2k+1: (OFF, ON), (ON, OFF), (OFF, ON)...
        (a probe window is ON and shifts the plan by one).

        Window ``start`` is the window whose summaries proposed the candidate: it ran without it and
        is the first control, so a clear gain is confirmed after a single new window."""
        if window == self.probe or window in self.early:
            return "on"
        pair, second = divmod(self._offset(window), 2)
        first_on = pair % 2 == 1
        return "on" if first_on != bool(second) else "off"

    def probe_diffs(self) -> tuple[np.ndarray, np.ndarray]:
        """The probe window against the proposing window, as one pair (empty before the probe ran)."""
        p, w0 = self.probe, self.start_window
        if p is None or p not in self.times or w0 not in self.times:
            return np.empty(0), np.empty(0)
        on, off = self.times[p], self.times[w0]
        var = (self.errors[p] / off) ** 2 + (on * self.errors[w0] / off**2) ** 2
        return np.asarray([on / off - 1.0]), np.asarray([var])

    def record(self, window: int, step_time: float, stderr: float = 0.0) -> None:
        if window in self.arms and np.isfinite(step_time) and step_time > 0:
            self.times[window] = step_time
            self.errors[window] = stderr if np.isfinite(stderr) and stderr > 0 else 0.0

    def pair_diffs(self) -> np.ndarray:
        return self._pairs()[0]

    def pair_variance(self) -> np.ndarray:
        """Delta-method variance of each pair's relative change from the windows' standard errors."""
        return self._pairs()[1]

    def _pairs(self) -> tuple[np.ndarray, np.ndarray]:
        out, var = [], []
        by_pair: dict[int, list[int]] = {}
        for w in sorted(self.times):
            if w != self.probe and w not in self.early:
                by_pair.setdefault(self._offset(w) // 2, []).append(w)
        for p in sorted(by_pair):
            ws = by_pair[p]
            w_on = next((w for w in ws if self.arms[w] == "on"), None)
            w_off = next((w for w in ws if self.arms[w] == "off"), None)
            if w_on is not None and w_off is not None:
                on, off = self.times[w_on], self.times[w_off]
                out.append(on / off - 1.0)
                var.append((self.errors[w_on] / off) ** 2 + (on * self.errors[w_off] / off**2) ** 2)
        return np.asarray(out, dtype=np.float64), np.asarray(var, dtype=np.float64)


_Z = {0.8: 1.2816, 0.9: 1.6449, 0.95: 1.96, 0.99: 2.5758}


class Guard:
    """Runs one trial at a time and judges it with the block bootstrap."""

    def __init__(self, config: PacingConfig) -> None:
        self.config = config
        self.trial: Trial | None = None

    def start(self, *, policy: str, on: PacingState, off: PacingState, window: int, reason: str) -> Trial:
        self.trial = Trial(policy=policy, on=on, off=off, start_window=window, reason=reason)
        return self.trial

    def state_for(self, window: int) -> PacingState:
        """The state to apply during ``window`` of the running trial (and remember which arm it is)."""
        assert self.trial is not None
        arm = self.trial.arm_for(window)
        self.trial.arms[window] = arm
        return self.trial.on if arm == "on" else self.trial.off

    def verdict(self, window: int) -> Verdict:
        """Judge the trial after the summaries of ``window`` were recorded. After its probe window the
        probe alone is judged: "keep" when it shows a clear gain, else "continue" (never "revert": a
        probe is too short to call a candidate harmful; the straggler checks may still end it)."""
        assert self.trial is not None
        c = self.config
        if window == self.trial.probe:
            diffs, variances = self.trial.probe_diffs()
            est, lo, hi = self._ci(diffs, variances, window)
            keep = diffs.size == 1 and hi < -c.guard_min_gain
            return Verdict(decide="keep" if keep else "continue", estimate=est, ci_low=lo, ci_high=hi,
                           pairs=int(diffs.size))
        diffs = self.trial.pair_diffs()
        est, lo, hi = self._ci(diffs, self.trial.pair_variance(), window)
        n = int(diffs.size)
        decide = "continue"
        if n >= 1 and hi < -c.guard_min_gain:
            decide = "keep"
        elif n >= c.guard_pairs and lo > 0.0:
            decide = "revert"  # it hurts
        elif c.guard_harm_share > 0 and n >= 1 and lo > c.guard_harm_share:
            # Far worse beyond noise after one pair: the next pair opens with another ON window, and no
            # regression to the mean of the proposing window explains a step this much slower.
            decide = "revert"
        elif n >= c.guard_max_pairs and not (est < 0.0 and n < c.guard_extend_pairs):
            # No gain beyond noise. A trial whose estimate still favours the policy runs on (up to
            # `guard_extend_pairs`): on a noisy host a real gain needs more pairs, and the ON windows
            # of a policy that looks helpful cost nothing on average; one that looks harmful stops.
            decide = "revert"
        # A trial whose windows keep going missing must still end.
        limit = 2 * max(c.guard_max_pairs, c.guard_extend_pairs) + 2
        if window - self.trial.start_window >= limit and decide == "continue":
            decide = "revert"
        return Verdict(decide=decide, estimate=est, ci_low=lo, ci_high=hi, pairs=n)

    def _ci(self, diffs: np.ndarray, variances: np.ndarray, window: int) -> tuple[float, float, float]:
        """Mean change and its CI: the block bootstrap, widened by the windows' own spread and by the
        drift between untreated windows."""
        assert self.trial is not None
        c = self.config
        est, lo, hi = block_bootstrap_ci(
            diffs,
            confidence=c.guard_confidence,
            resamples=c.guard_resamples,
            seed=c.seed * 1_000_003 + window,
        )
        n = int(diffs.size)
        if n:
            # With few pairs the bootstrap CI is too narrow (it cannot see noise it did not sample);
            # widen it to at least the normal CI implied by the within-window spread.
            z = float(_Z.get(round(c.guard_confidence, 2), 1.645))
            half = c.guard_se_inflation * z * float(np.sqrt(variances.sum())) / n
            # ...and to the CI implied by the window-to-window drift measured before the trial.
            half = max(half, z * self.trial.drift_sd / float(np.sqrt(n)))
            lo, hi = min(lo, est - half), max(hi, est + half)
        # A step time cannot shrink by more than all of it: a widened CI below -100% only misreads
        # (the audit's "-115.4%..+15.7%"); keep and revert never depend on the low end below it.
        return est, max(lo, -1.0), hi

    def finish(self) -> None:
        self.trial = None
