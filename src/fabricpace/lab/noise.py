"""Host noise inside a worker: real garbage-collector pressure, not sleeps.

A noisy rank keeps a large live heap of container objects (so every full collection has to traverse it)
and, each step, allocates a random number of objects in reference cycles that live a few steps, get
promoted to the old generation and die there. CPython then runs full collections at times that differ
from rank to rank — the per-step random delays that synchronous training amplifies. Because these are
real automatic collections, the observer sees them through ``gc.callbacks`` and the pacing layer's gc
actuator (automatic GC off, lockstep collections) can actually remove the amplification.
"""

from __future__ import annotations

from collections import deque

import numpy as np


class GcPressure:
    """Object churn with a large old generation. ``step()`` is called once per training step."""

    def __init__(self, *, heap_objects: int, churn_objects: int, lifetime_steps: int, seed: int) -> None:
        # Live heap: small lists in dicts (tracked containers) that every full collection must visit.
        self._heap = [{"k": [i, None]} for i in range(heap_objects)]
        self._churn = churn_objects
        self._alive: deque[list[object]] = deque(maxlen=max(1, lifetime_steps))
        self._rng = np.random.default_rng(seed)

    def step(self) -> None:
        # Poisson-like variation per rank and step: the collections land at different steps on each rank.
        n = int(self._rng.integers(self._churn // 2, self._churn * 3 // 2 + 1))
        batch: list[object] = []
        for _ in range(n):
            a: list[object] = []
            b: list[object] = [a]
            a.append(b)  # a cycle: only the cyclic collector can free it
            batch.append(a)
        self._alive.append(batch)  # dies `lifetime_steps` steps later, after promotion
