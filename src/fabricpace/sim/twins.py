"""The simulator's twins of the pacing actuators: how a ``PacingState`` changes the simulated job.

Each field acts only through the mechanism the real actuator has:

- ``gc_interval`` / ``gc_full_interval``: automatic collection stops; every rank collects its young
  generations at the same steps (``step % gc_interval == 0``) and the whole heap at
  ``step % gc_full_interval == 0`` — see ``hostnoise.GcState.step``.
- ``shares``: each rank's samples per step (global batch unchanged); its compute and its garbage scale
  with its samples (``Engine.run_block``). Data parallelism only: the ranks of a tensor- or
  pipeline-parallel group must process the same samples, and ``BalancedSampler`` splits the batch per
  rank, so with ``tp``/``pp`` > 1 the controller is built without rebalance (``twin_policies``) and a
  state with shares is an error.
- ``comm_window`` / ``comm_spacing_ns``: the comm hook holds bucket launches (in-flight window, minimum
  spacing). The hook runs on the autograd thread, so a hold delays the rest of that rank's backward;
  the held time is recorded as ``paced_ns`` (``Engine._ddp``). As in the real ``CommGate``, the holds
  of one rank and step stop once they add up to the delay budget, ``max_delay_share`` × the median
  step time of the window that decided the state (the pacer's budget); a pinned state with no step
  time yet is uncapped (an oracle). FSDP runs are not gated.
- ``placement``: a rank order (position -> rank), as ``fabricpace place`` writes a hostfile. After the
  restart it stands for, NCCL's rings and trees visit the ranks — so the nodes — in that order. In
  reality the restart renumbers the ranks; the simulator keeps each rank's id on its hardware instead
  (so the controller's per-rank knowledge, node faults and rank faults all stay where they were) and
  reorders the ring: the loop recomputes the transfers from that step on for the new node order
  (``TransferModel.reorder``; a new launch, so a new ECMP draw). The restart itself (checkpoint,
  relaunch) is not charged.
"""

from __future__ import annotations

import numpy as np

from fabricpace._errors import SimulationError
from fabricpace.pacing.config import POLICIES
from fabricpace.pacing.state import PacingState
from fabricpace.sim.engine import RankState, shares_to_samples
from fabricpace.sim.workload import Workload


def twin_policies(workload: Workload) -> tuple[str, ...]:
    """The policies of ``pacing="auto"`` that this workload's twins can apply: all of them, without
    rebalance when tensor or pipeline parallelism groups ranks that must share their samples."""
    if workload.model_parallel > 1:
        return tuple(p for p in POLICIES if p != "rebalance")
    return POLICIES


def apply_state(
    state: RankState,
    pacing: PacingState,
    *,
    batch: int,
    gpus_per_node: int,
    step_time_s: float | None = None,
    max_delay_share: float = 0.01,
    model_parallel: int = 1,
) -> None:
    """Apply ``pacing`` to the carried rank state from the next step on (in place).

    ``step_time_s`` (the last window's median step time) sizes the comm delay budget like the real
    pacer does; None leaves the budget uncapped."""
    world = state.samples.shape[0]
    if pacing.shares is not None and model_parallel > 1:
        raise SimulationError(
            "pacing shares (rebalance) are modelled for data parallelism only; this workload has "
            f"{model_parallel} ranks per tensor/pipeline-parallel group, which must share their samples"
        )
    if pacing.shares is not None and len(pacing.shares) != world:
        raise SimulationError(f"pacing shares has {len(pacing.shares)} entries for {world} ranks")
    if pacing.shares is not None and (min(pacing.shares) < 0 or sum(pacing.shares) <= 0):
        raise SimulationError("pacing shares must be non-negative with a positive sum")
    state.samples = shares_to_samples(pacing.shares, batch, world)
    if pacing.placement is not None:
        order = np.asarray(pacing.placement, dtype=np.int64)
        if order.shape != (world,) or not np.array_equal(np.sort(order), np.arange(world)):
            raise SimulationError("pacing placement must be a permutation of all ranks")
        visited = state.node_of_rank[order]
        if np.any(visited.reshape(-1, gpus_per_node) != visited[::gpus_per_node, None]):
            raise SimulationError("pacing placement must keep each node's ranks together (whole nodes move)")
    if pacing.gc_interval is not None and pacing.gc_interval < 1:
        raise SimulationError(f"pacing gc_interval must be >= 1, got {pacing.gc_interval}")
    if pacing.gc_full_interval is not None and pacing.gc_full_interval < 1:
        raise SimulationError(f"pacing gc_full_interval must be >= 1, got {pacing.gc_full_interval}")
    if pacing.comm_window is not None and pacing.comm_window < 1:
        raise SimulationError(f"pacing comm_window must be >= 1, got {pacing.comm_window}")
    if step_time_s is not None and np.isfinite(step_time_s) and step_time_s > 0:
        state.comm_budget_s = max(0.0, max_delay_share) * step_time_s
    state.pacing = pacing
