"""The coordination layer: controller, do-no-harm guard and actuators (gc, rebalance, comm, placement).

``Controller`` is pure (window summaries in, ``PacingState`` + ``Decision`` rows out) and runs the same
on every rank and in the simulator; ``make_pacer`` builds the real-rank pacer the observer drives;
``BalancedSampler`` hands each rank its paced share of every global batch. Nothing here imports torch.
"""

from fabricpace.pacing.config import POLICIES, PacingConfig, parse_policies
from fabricpace.pacing.controller import Controller
from fabricpace.pacing.pacer import Pacer, make_pacer, write_decisions
from fabricpace.pacing.placement import PlacementPlan, plan_placement
from fabricpace.pacing.rebalance import counts_from_shares, sample_weight
from fabricpace.pacing.sampler import BalancedSampler
from fabricpace.pacing.state import Decision, PacingState

__all__ = [
    "POLICIES",
    "BalancedSampler",
    "Controller",
    "Decision",
    "Pacer",
    "PacingConfig",
    "PacingState",
    "PlacementPlan",
    "counts_from_shares",
    "make_pacer",
    "parse_policies",
    "plan_placement",
    "sample_weight",
    "write_decisions",
]
