"""Training simulator: workload and noise files, the iteration engine, pacing twins, run directories.

``simulate(cluster, workload, noise, nodes=, steps=, seed=, out_dir=)`` writes a run directory that
diagnosis and reports read exactly like a real one. See docs/simulator.md.
"""

from fabricpace.sim.loop import (
    NODE_ORDERS,
    SimOptions,
    check_job,
    rank_leaves,
    resolve_node_order,
    simulate,
)
from fabricpace.sim.noise import Noise, load_noise
from fabricpace.sim.twins import twin_policies
from fabricpace.sim.workload import Workload, load_workload

__all__ = [
    "NODE_ORDERS",
    "Noise",
    "SimOptions",
    "Workload",
    "check_job",
    "load_noise",
    "load_workload",
    "rank_leaves",
    "resolve_node_order",
    "simulate",
    "twin_policies",
]
