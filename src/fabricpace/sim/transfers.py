"""Per-step transfer times of the job's collectives, from the fabric model (``fabricpace.fabric``).

The simulator never models the network itself: it asks ``sample_collective_times`` for one ECMP draw
per step and collective size, under the link capacities that the noise file's slow/flapping links and
foreign traffic leave in each step (piecewise-constant segments). All sizes of one step share that
step's ECMP draw (NCCL reuses the same connections for every bucket of a step), which is done by giving
every size the same seed within a segment.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from fabricpace._errors import ConfigError
from fabricpace.sim.noise import Noise


def link_names(cluster: Any, nodes: int) -> list[str] | None:
    """Names of the links a job on ``nodes`` nodes uses (index order), or None if the model has none."""
    try:
        from fabricpace.fabric.topology import Topology
    except ImportError:
        return None
    topo = Topology.build(cluster, nodes)
    return [topo.link_name(i) for i in range(topo.n_links)]


def _scale_vector(names: list[str] | None, scale: dict[str, float]) -> np.ndarray | None:
    if not scale:
        return None
    if names is None:
        raise ConfigError("link faults need a fabric model with named links; none is available")
    index = {n: i for i, n in enumerate(names)}
    vec = np.ones(len(names))
    for name, value in scale.items():
        vec[index[name]] *= value
    return vec


class TransferModel:
    """Transfer seconds per (step, collective) for a job, drawn once for all steps up front."""

    def __init__(
        self,
        cluster: Any,
        *,
        nodes: int,
        gpus_per_node: int | None = None,
        ops_sizes: Sequence[tuple[str, int]],
        steps: int,
        noise: Noise,
        seed: int,
        names: list[str] | None,
    ) -> None:
        from fabricpace.fabric import sample_collective_times

        used = set(names) if names is not None else None
        seg, states = noise.link_scales(steps, rng=np.random.default_rng([seed, 0xF0]), used=used)
        self.segments = seg
        self.scales = states
        unique = sorted(set(ops_sizes))
        self._col = {key: i for i, key in enumerate(unique)}
        times = np.zeros((steps, len(unique)))
        for s_id, state in enumerate(states):
            where = np.nonzero(seg == s_id)[0]
            if where.size == 0:
                continue
            vec = _scale_vector(names, state)
            for key, col in self._col.items():
                op, nbytes = key
                # Same seed for every size in a segment: one ECMP draw per step shared by all buckets.
                rng = np.random.default_rng([seed, s_id])
                t = sample_collective_times(
                    cluster,
                    op,
                    int(nbytes),
                    nodes=nodes,
                    n=int(where.size),
                    rng=rng,
                    link_scale=vec,
                    gpus_per_node=gpus_per_node,
                )
                times[where, col] = np.asarray(t, dtype=float)
        if not np.all(np.isfinite(times)) or np.any(times < 0):
            from fabricpace._errors import SimulationError

            raise SimulationError("fabric model returned a negative or non-finite collective time")
        self.times = times

    def columns(self, ops_sizes: Sequence[tuple[str, int]]) -> np.ndarray:
        """Column index (into ``times``) of each (op, bytes) in the given order."""
        return np.asarray([self._col[k] for k in ops_sizes], dtype=np.int64)
