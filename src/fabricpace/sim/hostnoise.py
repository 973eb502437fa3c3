"""Host-side noise drawn per rank and step: compute jitter, GC pauses, other host pauses.

The GC model is mechanistic so that the gc actuator's twin can act on it (two generations, as
CPython's collector has in effect): each step creates garbage; with automatic collection, young
collections inside the step promote the step's live temporaries, so garbage piles up in the old
generation until a full collection (threshold drawn anew each time, as allocation counters never line
up) pauses the rank for ``pause_ms_base + pause_ms_per_mb × garbage`` at a step of its own. Under
lockstep collection (``PacingState.gc_interval`` / ``gc_full_interval``) automatic collection is off
and every rank collects at the same step boundaries, when the temporaries are dead.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fabricpace.sim.noise import GcSpec, JitterSpec, PauseSpec


def jitter_factors(spec: JitterSpec, rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Multiplicative compute factors with mean 1 and coefficient of variation ``spec.cv``."""
    if spec.cv <= 0:
        return np.ones(shape)
    if spec.distribution == "lognormal":
        s2 = np.log1p(spec.cv**2)
        return rng.lognormal(mean=-s2 / 2, sigma=np.sqrt(s2), size=shape)
    # Normal, floored so that a rank never computes in (near) zero time.
    return np.maximum(1.0 + spec.cv * rng.standard_normal(shape), 0.05)


def host_pauses(
    spec: PauseSpec, rng: np.random.Generator, shape: tuple[int, ...], exposure_s: np.ndarray | float
) -> np.ndarray:
    """Seconds of non-GC host pauses per (step, rank): Poisson(rate × exposure) events, gamma durations."""
    if spec.rate_hz <= 0 or spec.duration_ms <= 0:
        return np.zeros(shape)
    counts = rng.poisson(spec.rate_hz * np.broadcast_to(exposure_s, shape))
    total = np.zeros(shape)
    hit = counts > 0
    if hit.any():
        k = counts[hit].astype(float)
        mean = spec.duration_ms / 1e3
        if spec.duration_cv > 0:
            shape_k = 1.0 / spec.duration_cv**2
            # sum of k iid Gamma(shape, scale) is Gamma(k·shape, scale)
            total[hit] = rng.gamma(k * shape_k, mean / shape_k)
        else:
            total[hit] = k * mean
    return total


@dataclass
class GcState:
    """Per-rank garbage (MiB) in the old generation, garbage not yet collected in the young
    generations, and the old-generation level that triggers the next automatic full collection."""

    spec: GcSpec
    garbage: np.ndarray  # old generation (promoted) garbage
    threshold: np.ndarray
    young: np.ndarray = field(default_factory=lambda: np.zeros(0))
    lockstep: bool = False

    @classmethod
    def start(cls, spec: GcSpec, ranks: int, rng: np.random.Generator) -> GcState:
        threshold = cls._draw_threshold(spec, rng, ranks)
        # Ranks start at independent fill levels: processes started at different moments and
        # allocated differently during start-up, so their collections are not aligned.
        garbage = rng.uniform(0.0, 1.0, ranks) * threshold
        return cls(spec=spec, garbage=garbage, threshold=threshold, young=np.zeros(ranks))

    @staticmethod
    def _draw_threshold(spec: GcSpec, rng: np.random.Generator, n: int) -> np.ndarray:
        if spec.threshold_cv <= 0:
            return np.full(n, spec.threshold_mb)
        return spec.threshold_mb * np.maximum(1.0 + spec.threshold_cv * rng.standard_normal(n), 0.1)

    def full_pause_s(self, mb: np.ndarray) -> np.ndarray:
        """A full collection traverses the whole heap (``pause_ms_base``) plus the garbage."""
        return (self.spec.pause_ms_base + self.spec.pause_ms_per_mb * mb) / 1e3

    def young_pause_s(self, mb: np.ndarray) -> np.ndarray:
        """A young collection traverses only what was allocated since the previous one."""
        return (self.spec.young_pause_ms_base + self.spec.pause_ms_per_mb * mb) / 1e3

    @property
    def rss_mb(self) -> np.ndarray:
        return self.spec.baseline_rss_mb + self.garbage + self.young

    def step(
        self,
        rng: np.random.Generator,
        scale: np.ndarray,
        lockstep_interval: int | None,
        step: int,
        full_interval: int | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Advance one step; returns (pause seconds per rank, collected? per rank).

        Automatic collection (``lockstep_interval`` None): young collections fire inside the step
        (every few hundred allocations), traverse that step's allocations and promote the share of its
        temporaries still alive (``promoted_fraction``) to the old generation; when the old generation's
        garbage passes the rank's threshold, a full collection pauses that rank. Lockstep (the gc
        actuator's twin): automatic collection is off; every rank collects the young generations at the
        start of steps divisible by ``lockstep_interval`` — the garbage of the steps since then is dead
        by now, so nothing is promoted — and the whole heap at steps divisible by ``full_interval``.
        ``scale`` is each rank's work relative to nominal (moved samples move garbage too). All pauses
        are attributed to the start of the step.
        """
        g = self.spec
        n = self.garbage.shape[0]
        add: np.ndarray
        if g.garbage_cv > 0:
            shape_k = 1.0 / g.garbage_cv**2
            add = np.asarray(rng.gamma(shape_k, g.garbage_mb_per_step / shape_k, n)) * scale
        else:
            add = np.full(n, g.garbage_mb_per_step) * scale
        if lockstep_interval is None:
            if self.lockstep:  # back to automatic: what is pending gets collected mid-step, as usual
                self.garbage = self.garbage + g.promoted_fraction * self.young
                self.young = np.zeros(n)
                self.lockstep = False
            collect = self.garbage >= self.threshold
            pause = np.where(collect, self.full_pause_s(self.garbage), 0.0)
            if collect.any():
                self.garbage = np.where(collect, 0.0, self.garbage)
                fresh = self._draw_threshold(g, rng, n)
                self.threshold = np.where(collect, fresh, self.threshold)
            pause = pause + self.young_pause_s(add) * (add > 0)
            self.garbage = self.garbage + g.promoted_fraction * add
            return pause, collect
        self.lockstep = True
        if full_interval is not None and step > 0 and step % full_interval == 0:
            pause = self.full_pause_s(self.garbage + self.young)
            self.garbage = np.zeros(n)
            self.young = np.zeros(n)
            collect = np.ones(n, dtype=bool)
        elif step > 0 and step % lockstep_interval == 0:
            pause = self.young_pause_s(self.young)
            self.young = np.zeros(n)
            collect = np.ones(n, dtype=bool)
        else:
            pause = np.zeros(n)
            collect = np.zeros(n, dtype=bool)
        self.young = self.young + add
        return pause, collect
