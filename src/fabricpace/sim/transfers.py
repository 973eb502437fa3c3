"""Per-step transfer times of the job's collectives, from the fabric model (``fabricpace.fabric``).

The simulator never models the network itself: it asks ``sample_collective_times`` for the job's
collectives under the link capacities that the noise file's slow/flapping links and foreign traffic
leave in each step (piecewise-constant segments).

ECMP paths are drawn **once per run**, not per step: NCCL opens its queue pairs when the communicator
is created and keeps them for the whole job, and a RoCEv2 connection's UDP source port (the only
field that gives ECMP entropy) is fixed for the connection's lifetime — derived from the two QP numbers,
or kept "all across its vitality" in the CM context (linux-rdma RFC "RoCE v2.0 UDP Source Port
Entropy", 2019-2020). Long-lived RDMA flows also leave no idle gaps for flowlet switching. So a
collision on an uplink is the job's for as long as it runs: it shows up as a slower run (run-to-run
variance across seeds), not as step-to-step noise. What varies per step is what other tenants and
faults do to the links. Every size and every segment uses the same draw (same seed), so a bucket's
connection takes the same spine in every step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from fabricpace._errors import ConfigError
from fabricpace.sim.noise import Noise

# Seed stream of the run's one ECMP draw (independent of the link-state draws, stream 0xF0).
_ECMP_STREAM = 0xEC


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


def _canonical(node_order: Sequence[int] | None) -> tuple[int, ...] | None:
    """A node order as a tuple; None for the packed order (given as None or as 0..N-1)."""
    if node_order is None:
        return None
    order = tuple(int(v) for v in node_order)
    return None if order == tuple(range(len(order))) else order


class TransferModel:
    """Transfer seconds per (step, collective) for a job, drawn once for all steps up front.

    ``node_order``: the job's nodes in rank order (NCCL's rings and trees follow it); None is the
    packed order, in which ring neighbours share a leaf. ``reorder`` switches to another order from a
    given step on (a restart with a new hostfile: new connections, so a new ECMP draw)."""

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
        node_order: Sequence[int] | None = None,
    ) -> None:
        used = set(names) if names is not None else None
        seg, states = noise.link_scales(steps, rng=np.random.default_rng([seed, 0xF0]), used=used)
        self.segments = seg
        self.scales = states
        self._args = (cluster, nodes, gpus_per_node, seed, names)
        unique = sorted(set(ops_sizes))
        self._col = {key: i for i, key in enumerate(unique)}
        self.node_order = _canonical(node_order)
        self.restarts = 0
        self.times = self._compute(self.node_order, restart=0)

    def _compute(self, node_order: tuple[int, ...] | None, *, restart: int) -> np.ndarray:
        from fabricpace.fabric import sample_collective_times

        cluster, nodes, gpus_per_node, seed, names = self._args
        times = np.zeros((self.segments.shape[0], len(self._col)))
        for s_id, state in enumerate(self.scales):
            where = np.nonzero(self.segments == s_id)[0]
            if where.size == 0:
                continue
            vec = _scale_vector(names, state)
            for key, col in self._col.items():
                op, nbytes = key
                # The same seed for every size and segment: one ECMP draw per launch of the job.
                key_seed = [seed, _ECMP_STREAM] + ([restart] if restart else [])
                rng = np.random.default_rng(key_seed)
                t = sample_collective_times(
                    cluster,
                    op,
                    int(nbytes),
                    nodes=nodes,
                    n=1,
                    rng=rng,
                    link_scale=vec,
                    gpus_per_node=gpus_per_node,
                    node_order=node_order,
                )
                times[where, col] = float(np.asarray(t, dtype=float)[0])
        if not np.all(np.isfinite(times)) or np.any(times < 0):
            from fabricpace._errors import SimulationError

            raise SimulationError("fabric model returned a negative or non-finite collective time")
        return times

    def reorder(self, node_order: Sequence[int], *, from_step: int) -> None:
        """Use ``node_order`` from ``from_step`` on (placement applied at a restart)."""
        order = _canonical(node_order)
        if order == self.node_order:
            return
        self.restarts += 1
        fresh = self._compute(order, restart=self.restarts)
        self.times[from_step:] = fresh[from_step:]
        self.node_order = order

    def columns(self, ops_sizes: Sequence[tuple[str, int]]) -> np.ndarray:
        """Column index (into ``times``) of each (op, bytes) in the given order."""
        return np.asarray([self._col[k] for k in ops_sizes], dtype=np.int64)
