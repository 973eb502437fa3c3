"""Window summaries: the fixed-size per-rank statistics every rank shares every W steps.

The observer all-gathers one float64 vector of ``len(WINDOW_FIELDS)`` per rank (one small collective
per window, never per step); the simulator builds the same vectors from its arrays. The pacing
controller reads only these, so every rank — and the simulator's twin — takes the same decision.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, fields

import numpy as np


@dataclass(frozen=True, kw_only=True)
class WindowSummary:
    """Statistics of one rank over one window of steps (durations in nanoseconds, as float)."""

    rank: int
    window: int  # window index (0, 1, ...)
    first_step: int
    steps: int  # steps in the window
    step_mean_ns: float
    step_median_ns: float
    step_std_ns: float
    compute_median_ns: float  # own useful work per step
    compute_per_sample_ns: float  # compute median / samples median (rebalance reads this)
    wait_mean_ns: float  # blocked on collectives (skew + transfer), per step
    comm_mean_ns: float  # collectives in flight, per step
    transfer_mean_ns: float  # per step: min exit - last arrival, summed over collectives
    last_arrivals: float  # collectives in the window where this rank arrived last
    collectives: float  # collectives in the window
    data_mean_ns: float
    gc_mean_ns: float
    gc_count: float  # collections seen in the window
    paced_mean_ns: float
    samples_mean: float
    rss_bytes: float  # resident memory at window end (gc actuator bounds it)
    # Added by the observer (defaults keep older constructors working):
    arrivals_compared: float = 0.0  # collectives of this rank matched across ranks (≤ arrival slots)
    skew_mean_ns: float = 0.0  # per step: time waiting for the last peer to arrive (wait minus transfer)
    # Id of the leaf switch above this rank's node (a stable hash of its name, -1 = unknown): ranks with
    # equal ids share a leaf, which is all the placement policy needs to know.
    leaf: float = -1.0
    # Added for transient stragglers: the median compute per step and the mean samples per step over
    # the window's last ``tail_steps(steps)`` steps. A straggler that recovered inside the window is
    # slow in the window's median but no longer in its tail; the controller then waits for a second
    # window before moving samples. 0 = not measured (a sender without these fields): ignored.
    tail_compute_median_ns: float = 0.0
    tail_samples_mean: float = 0.0

    def to_array(self) -> np.ndarray:
        # The instance dict holds the fields in declaration order (the dataclass __init__ sets them
        # so); dataclasses.astuple deep-copies every field and made the controller's update ~50x
        # slower (190 ms a window at 2,048 ranks, nearly all of it here).
        return np.fromiter(vars(self).values(), dtype=np.float64, count=len(WINDOW_FIELDS))

    @classmethod
    def from_array(cls, values: np.ndarray) -> WindowSummary:
        # Vectors built before the defaulted trailing fields were added stay readable (defaults apply).
        names = WINDOW_FIELDS[: len(values)] if len(values) >= _REQUIRED else WINDOW_FIELDS
        kwargs: dict[str, float | int] = {n: float(v) for n, v in zip(names, values, strict=True)}
        for n in ("rank", "window", "first_step", "steps"):
            kwargs[n] = int(kwargs[n])
        return cls(**kwargs)  # type: ignore[arg-type]


def tail_steps(steps: int) -> int:
    """How many of a window's last steps make its tail: a fifth of the window (the most recent part,
    which predicts the next window best), at least 5 steps (a median of fewer is mostly jitter), never
    more than the window."""
    return max(0, min(int(steps), max(5, -(-int(steps) // 5))))


WINDOW_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(WindowSummary))
_REQUIRED = sum(1 for f in fields(WindowSummary) if f.default is MISSING)
