"""Explain one collective: its connections routed on the fabric, a full max-min solve, and the
bottleneck links with the flows that share them (for example an ECMP collision: three connections hashed
onto one spine uplink, each at a third of its rate).

The explanation uses the same ECMP draw as ``collective_time`` for the same seed (same draw order), so
the bottleneck it names is the one behind the predicted time.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fabricpace.fabric.cluster import Cluster
from fabricpace.fabric.collectives import network_efficiency
from fabricpace.fabric.maxmin import max_min_rates
from fabricpace.fabric.patterns import ring_edges, tree_edges
from fabricpace.fabric.topology import Topology


def routed_connections(
    cluster: Cluster, op: str, nodes: int, g: int, algorithm: str, rng: np.random.Generator
) -> tuple[Topology, Any, np.ndarray]:
    """Route the algorithm's inter-node connections (one flow per queue pair) with one ECMP draw.
    Returns the topology, the routes and each flow's bytes per byte of S."""
    topo = Topology.build(cluster, nodes)
    if algorithm in ("tree", "nvls_tree"):
        src, dst, nic, nbytes = tree_edges(cluster, nodes, g)
    else:
        src, dst, nic, nbytes = ring_edges(cluster, op, nodes, g)
    q = cluster.network.qps_per_connection
    cross = topo.leaf(src, nic) != topo.leaf(dst, nic)
    # same draw order as collectives._draw_uplink_time: cross-leaf connections in edge order, q QPs each
    order = np.concatenate([np.nonzero(cross)[0], np.nonzero(~cross)[0]])
    src, dst, nic, nbytes = (np.repeat(a[order], q) for a in (src, dst, nic, nbytes))
    nbytes = nbytes / q
    n_cross = int(cross.sum()) * q
    spine = np.zeros(src.shape[0], dtype=np.int64)
    if cluster.network.routing == "ecmp":
        spine[:n_cross] = rng.integers(0, topo.spines, size=(1, n_cross))[0]
        routes = topo.route(src, nic, dst, nic, spine)
    else:
        routes = topo.route(src, nic, dst, nic, None)
    return topo, routes, nbytes


def explain_collective(
    cluster: Cluster,
    op: str,
    nbytes: int,
    *,
    nodes: int,
    gpus_per_node: int | None,
    algorithm: str,
    seed: int,
    top: int = 3,
) -> dict[str, Any]:
    """Bottleneck links of one collective point with the flows sharing them (``text`` for humans)."""
    g = cluster.gpus_per_node if gpus_per_node is None else gpus_per_node
    if nodes < 2 or algorithm not in ("ring", "tree", "nvls_tree"):
        why = "single node: NVLink only" if nodes < 2 else f"{op}/{algorithm}: load-bound estimate, no flows"
        return {"links": [], "text": f"{op} {nbytes} B on {nodes} nodes: {why}"}
    rng = np.random.default_rng(seed)
    topo, routes, per_flow = routed_connections(cluster, op, nodes, g, algorithm, rng)
    eff = network_efficiency(cluster.tuning, algorithm)
    cap = topo.capacity * eff
    rate = max_min_rates(routes, cap)
    # the lockstep collective runs at the pace of its slowest connection
    slow = float((per_flow / rate).max()) * nbytes
    used = np.bincount(routes.link, weights=routes.weight * rate[routes.flow], minlength=topo.n_links)
    count = np.bincount(routes.link, minlength=topo.n_links)
    slowest = int(np.argmin(rate))
    on_slowest = routes.link[routes.flow == slowest]
    sat = [int(lk) for lk in on_slowest if used[lk] >= cap[lk] * (1 - 1e-6)]
    sat = sorted(set(sat), key=lambda lk: -count[lk])[:top]
    links = []
    lines = [
        f"{op} {nbytes} B on {nodes} nodes x {g} GPUs ({algorithm}, {routes.n_flows} inter-node flows, "
        f"routing {cluster.network.routing}, seed {seed}): network time {slow * 1e6:.1f} us"
    ]
    for lk in sat:
        gbps = cap[lk] * 8 / 1e9
        each = rate[routes.flow[routes.link == lk]]
        links.append(
            {
                "link": topo.link_name(lk),
                "flows": int(count[lk]),
                "capacity_gbps": gbps,
                "per_flow_gbps": float(each.min() * 8 / 1e9),
            }
        )
        kind = "ECMP collision" if "spine" in topo.link_name(lk) and count[lk] > 1 else "shared port"
        lines.append(
            f"  bottleneck {topo.link_name(lk)}: {count[lk]} flows share {gbps:.0f} Gb/s, each at "
            f"{each.min() * 8 / 1e9:.0f} Gb/s (1/{count[lk]} of it) -- {kind}"
        )
    return {"links": links, "network_time_us": slow * 1e6, "text": "\n".join(lines)}
