"""The coordination layer: controller, do-no-harm guard and actuators (gc, rebalance, comm, placement)."""

from fabricpace.pacing.state import Decision, PacingState

__all__ = ["Decision", "PacingState"]
