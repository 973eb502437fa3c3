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
from fabricpace.fabric.patterns import alltoall_pattern, ring_edges, tree_edges
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
    prefer: str | None = None,
) -> dict[str, Any]:
    """Bottleneck links of one collective point with the flows sharing them (``text`` for humans).
    ``prefer``: the link the model's row names (``CollectiveResult.bottleneck``); among equally loaded
    links (a ring's every NIC carries the same) it is the one named first, so the two agree."""
    g = cluster.gpus_per_node if gpus_per_node is None else gpus_per_node
    if nodes < 2:
        return {"links": [], "text": f"{op} {nbytes} B on {nodes} nodes: single node: NVLink only"}
    if algorithm == "p2p":
        return _explain_p2p(cluster, op, nbytes, nodes, g, top, prefer)
    if algorithm not in ("ring", "tree", "nvls_tree"):
        why = f"{op}/{algorithm}: load-bound estimate, no flows"
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
    pk = _link_index(topo, prefer)
    if pk is not None:  # on a tie, a slowest flow through the model's link
        tied = np.nonzero(rate <= rate[slowest] * (1 + 1e-9))[0]
        through = np.intersect1d(tied, routes.flow[routes.link == pk])
        slowest = int(through[0]) if through.size else slowest
    on_slowest = routes.link[routes.flow == slowest]
    sat = [int(lk) for lk in on_slowest if used[lk] >= cap[lk] * (1 - 1e-6)]
    sat = sorted(set(sat), key=lambda lk: (lk != pk, -count[lk]))[:top]
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
        if count[lk] == 1:  # nothing shares it: the narrowest link on that flow's path
            name = topo.link_name(lk)
            lines.append(f"  bottleneck {name}: 1 flow alone at {_rate(gbps)} -- the narrowest link")
            continue
        # a collision needs a hashing choice (several spines) that put several flows on one path
        collided = "spine" in topo.link_name(lk) and topo.spines > 1
        lines.append(
            f"  bottleneck {topo.link_name(lk)}: {count[lk]} flows share {_rate(gbps)}, each at "
            f"{_rate(float(each.min()) * 8 / 1e9)} (1/{count[lk]} of it) -- "
            f"{'ECMP collision' if collided else 'shared port'}"
        )
    return {"links": links, "network_time_us": slow * 1e6, "text": "\n".join(lines)}


def _rate(gbps: float) -> str:
    """A link rate for people: '400 Gb/s', '37.6 Gb/s', '18.8 Mb/s' (lab links run at Mbit/s, which a
    whole number of Gb/s printed as '0 Gb/s')."""
    v, unit = (gbps, "Gb/s") if gbps >= 1 else (gbps * 1e3, "Mb/s") if gbps >= 1e-3 else (gbps * 1e6, "kb/s")
    return f"{v:.0f} {unit}" if v >= 100 else f"{v:.3g} {unit}"


def _link_index(topo: Topology, name: str | None) -> int | None:
    """Index of the link a model row names ('leaf0->spine3 (ECMP collision)' too); None if not a link."""
    if not name:
        return None
    name = name.removesuffix(" (ECMP collision)")
    return next((i for i in range(topo.n_links) if topo.link_name(i) == name), None)


def _explain_p2p(
    cluster: Cluster, op: str, nbytes: int, nodes: int, g: int, top: int, prefer: str | None
) -> dict[str, Any]:
    """All-to-all: every GPU sends to every peer, so the load per link is the model's own (the pattern of
    collectives.py, ECMP as its even spread): the busiest network links, with the connections on them."""
    topo = Topology.build(cluster, nodes)
    pat = alltoall_pattern(cluster, topo, nodes, g)
    n_net = 2 * nodes * topo.nics_per_node + 2 * topo.n_leaves * topo.spines
    cap = topo.capacity[:n_net] * network_efficiency(cluster.tuning, "p2p")
    ratio = pat.fixed[:n_net] / cap
    worst = float(ratio.max())
    pk = _link_index(topo, prefer)
    busiest = [int(lk) for lk in np.nonzero(ratio >= worst * (1 - 1e-9))[0]]
    busiest = sorted(busiest, key=lambda lk: (lk != pk, -int(pat.fixed_flows[lk]), lk))[:top]
    lines = [
        f"{op} {nbytes} B on {nodes} nodes x {g} GPUs (p2p: every GPU to every peer, "
        f"{int(pat.fixed_flows[: nodes * topo.nics_per_node].sum())} inter-node connections, "
        f"routing {cluster.network.routing} as its even spread): network time {worst * nbytes * 1e6:.1f} us"
    ]
    links = []
    for lk in busiest:
        gbps = cap[lk] * 8 / 1e9
        flows = int(pat.fixed_flows[lk])
        links.append(
            {"link": topo.link_name(lk), "flows": flows, "capacity_gbps": gbps,
             "per_flow_gbps": gbps / flows if flows else gbps}
        )  # fmt: skip
        kind = "spine path" if "spine" in topo.link_name(lk) else "NIC port"
        lines.append(
            f"  bottleneck {topo.link_name(lk)}: {flows} connections share {_rate(gbps)} and carry "
            f"{pat.fixed[lk]:.3g} x S ({pat.fixed[lk] * nbytes / 2**20:.0f} MiB) -- {kind}"
        )
    return {"links": links, "network_time_us": worst * nbytes * 1e6, "text": "\n".join(lines)}
