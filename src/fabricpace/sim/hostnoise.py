"""Host-side noise drawn per rank and step: compute jitter, GC pauses, other host pauses.

The GC model is mechanistic so that the gc actuator's twin can act on it: each rank accumulates
garbage every step; automatic collection fires when a rank's garbage passes its threshold (drawn
anew after each collection, as allocation counters never line up exactly), costing
``pause_ms_base + pause_ms_per_mb × garbage``. Under lockstep collection (``PacingState.gc_interval``)
automatic collection is off and every rank collects what it has at the same steps.
"""

from __future__ import annotations

from dataclasses import dataclass

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
    """Per-rank garbage (MiB) and the threshold of the next automatic collection."""

    spec: GcSpec
    garbage: np.ndarray
    threshold: np.ndarray

    @classmethod
    def start(cls, spec: GcSpec, ranks: int, rng: np.random.Generator) -> GcState:
        threshold = cls._draw_threshold(spec, rng, ranks)
        # Ranks start at independent fill levels: processes started at different moments and
        # allocated differently during start-up, so their collections are not aligned.
        garbage = rng.uniform(0.0, 1.0, ranks) * threshold
        return cls(spec=spec, garbage=garbage, threshold=threshold)

    @staticmethod
    def _draw_threshold(spec: GcSpec, rng: np.random.Generator, n: int) -> np.ndarray:
        if spec.threshold_cv <= 0:
            return np.full(n, spec.threshold_mb)
        return spec.threshold_mb * np.maximum(1.0 + spec.threshold_cv * rng.standard_normal(n), 0.1)

    def pause_s(self, mb: np.ndarray) -> np.ndarray:
        return (self.spec.pause_ms_base + self.spec.pause_ms_per_mb * mb) / 1e3

    def step(
        self,
        rng: np.random.Generator,
        scale: np.ndarray,
        lockstep_interval: int | None,
        step: int,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Advance one step; returns (pause seconds per rank, collected? per rank).

        ``scale`` is each rank's work relative to nominal (moved samples change its garbage).
        The collection happens at the start of the step (that is where the lockstep actuator
        collects; automatic collections are attributed there too), then the step adds garbage.
        """
        n = self.garbage.shape[0]
        if lockstep_interval is not None:
            collect = np.full(n, step > 0 and step % lockstep_interval == 0)
        else:
            collect = self.garbage >= self.threshold
        pause = np.where(collect, self.pause_s(self.garbage), 0.0)
        if collect.any():
            self.garbage = np.where(collect, 0.0, self.garbage)
            fresh = self._draw_threshold(self.spec, rng, n)
            self.threshold = np.where(collect, fresh, self.threshold)
        g = self.spec
        add: np.ndarray
        if g.garbage_cv > 0:
            shape_k = 1.0 / g.garbage_cv**2
            add = np.asarray(rng.gamma(shape_k, g.garbage_mb_per_step / shape_k, n))
        else:
            add = np.full(n, g.garbage_mb_per_step)
        self.garbage = self.garbage + add * scale
        return pause, collect
