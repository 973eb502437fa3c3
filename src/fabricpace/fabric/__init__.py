"""The fabric model: cluster files, topology, max-min flows, collectives and nccl-tests calibration.

cluster = load_cluster("dgx-h100-ib")
r = collective_time(cluster, "all_reduce", 1 << 30, nodes=16)
t = sample_collective_times(cluster, "all_reduce", 25 << 20, nodes=1024 // 8, n=1000, rng=rng)
"""

from __future__ import annotations

from fabricpace.fabric.cluster import Cluster, load_cluster, preset_names, save_cluster
from fabricpace.fabric.collectives import (
    ALGORITHMS,
    OPS,
    PROTOCOLS,
    CollectiveResult,
    bus_factor,
    collective_time,
    sample_collective_times,
)

__all__ = [
    "ALGORITHMS",
    "OPS",
    "PROTOCOLS",
    "Cluster",
    "CollectiveResult",
    "bus_factor",
    "collective_time",
    "load_cluster",
    "preset_names",
    "sample_collective_times",
    "save_cluster",
]
