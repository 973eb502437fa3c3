"""The contract between the pacing controller and whatever applies its decisions.

The controller (``fabricpace.pacing``) is pure: it reads window summaries and returns a
``PacingState`` plus the ``Decision`` rows that explain it. The real actuators (observer, gloo/NCCL
ranks) and the simulator's twins both apply the same ``PacingState``, so what the simulator shows is
what the real layer can do — nothing more.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class PacingState:
    """What every rank applies until the next window. Defaults mean "no pacing"."""

    # gc: collect at the same step on every rank every `gc_interval` steps (automatic GC off);
    # None leaves Python's automatic collection alone. These lockstep collections cover the young
    # generations (cheap: what was allocated since the last one); a full collection of every
    # generation runs instead every `gc_full_interval` steps (None = never; the controller sets it
    # when resident memory grows).
    gc_interval: int | None = None
    gc_full_interval: int | None = None
    # rebalance: each rank's fraction of the global batch (sums to 1); None = equal shares.
    shares: tuple[float, ...] | None = None
    # comm: at most `comm_window` DDP buckets in flight (None = unlimited) and at least
    # `comm_spacing_ns` between bucket launches on a rank.
    comm_window: int | None = None
    comm_spacing_ns: int = 0
    # placement: a rank order (position -> original rank) to apply at the next restart; None = keep.
    placement: tuple[int, ...] | None = None

    @property
    def active(self) -> bool:
        return any(
            (
                self.gc_interval is not None,
                self.shares is not None,
                self.comm_window is not None,
                self.comm_spacing_ns > 0,
                self.placement is not None,
            )
        )


@dataclass(frozen=True, kw_only=True)
class Decision:
    """One row of pacing.parquet: ``step, rank (-1 = all), policy, action, value, reason``."""

    step: int
    rank: int
    policy: str  # gc | rebalance | comm | placement | guard
    action: str  # enable | adjust | keep | revert | off
    value: float
    reason: str
