"""Collectives on the fabric: flow patterns per algorithm, an NCCL-like cost model, and its selection.

Model (per algorithm a, protocol p; S = bytes as nccl-tests counts them)::

    T(a, p) = latency(a, p, ranks, nodes) + S * u_a / eff_p

* ``u_a`` (seconds per byte) comes from the fabric: the algorithm's flows (ring edges per channel, tree
  edges of a double binary tree, rails of the hierarchical scheme) are routed on the topology (NIC ports,
  leaf uplinks via ECMP or spraying, NVLink ports) and ``u_a = max over links of bytes_on_link(S=1) /
  (capacity * efficiency)``. The ring and tree move data in lockstep pipelines, so the slowest link gates
  every flow; the max-min fair rate of the slowest flow is exactly ``capacity / load`` of its busiest link.
  That is why one ECMP draw needs only a ``bincount`` of flows per uplink, not a full max-min solve (the
  tests check this closed form against ``maxmin.max_min_rates`` on random draws).
* ``latency`` follows NCCL's tuning model (src/graph/tuning.cc): a base launch cost plus per-step hardware
  latency; ring steps = 2(n-1) for all-reduce, n-1 for all-gather / reduce-scatter (ring latency grows
  with the rank count); tree latency grows with (g-1) intra-node hops and log2(nodes) network levels.
* protocols: LL (low latency, a quarter of the bandwidth), LL128 (120/128 of it), Simple (full bandwidth,
  highest latency) -- NCCL's ratios.

Selection picks the (algorithm, protocol) with the lowest *expected* time (ECMP replaced by its even
spread), independent of the ECMP draw, as NCCL does (its choice does not see hash collisions); the time
of one draw then uses that draw's loads.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from fabricpace._errors import ConfigError, InputError
from fabricpace.fabric.cluster import Cluster, load_cluster
from fabricpace.fabric.topology import Topology

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")
ALGORITHMS = ("ring", "tree", "hierarchical", "nvls")
PROTOCOLS = ("LL", "LL128", "Simple")

# NCCL tuning.cc ratios, relative to Simple: bandwidth share and per-step latency.
_PROTO_BW = {"LL": 0.25, "LL128": 120.0 / 128.0, "Simple": 1.0}
_PROTO_NET_LAT = {"LL": 2.7 / 14.0, "LL128": 4.0 / 14.0, "Simple": 1.0}
_PROTO_INTRA_LAT = {"LL": 0.6 / 3.4, "LL128": 1.9 / 3.4, "Simple": 1.0}
_PROTO_BASE = {"LL": 6.6 / 8.4, "LL128": 14.0 / 8.4, "Simple": 1.0}

LinkScale = float | np.ndarray | Mapping[str, float] | None


@dataclass(frozen=True)
class CollectiveResult:
    """Predicted time of one collective, with nccl-tests' algbw/busbw (GB/s) and the bottleneck."""

    op: str
    nbytes: int
    nodes: int
    gpus: int
    time_s: float
    algorithm: str
    protocol: str
    algbw_gbps: float
    busbw_gbps: float
    latency_s: float
    bottleneck: str
    bottleneck_flows: int
    bottleneck_share: float
    details: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, object]:
        return {
            "op": self.op,
            "nodes": self.nodes,
            "gpus": self.gpus,
            "bytes": self.nbytes,
            "algorithm": self.algorithm,
            "protocol": self.protocol,
            "time_us": self.time_s * 1e6,
            "algbw_gbps": self.algbw_gbps,
            "busbw_gbps": self.busbw_gbps,
            "latency_us": self.latency_s * 1e6,
            "bottleneck": self.bottleneck,
            "bottleneck_flows": self.bottleneck_flows,
        }


def bus_factor(op: str, ranks: int) -> float:
    """nccl-tests busbw / algbw: 2(n-1)/n all-reduce; (n-1)/n all-gather, reduce-scatter, all-to-all; 1."""
    if ranks <= 1:
        return 1.0 if op == "broadcast" else 0.0
    if op == "all_reduce":
        return 2.0 * (ranks - 1) / ranks
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (ranks - 1) / ranks
    return 1.0


# ---- flow patterns -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Pattern:
    """Bytes per byte of S on fixed links, plus the cross-leaf flows that ECMP hashes.

    ``fixed``: bytes (per S) per link index for NIC and NVLink ports and for sprayed uplinks.
    ``x_src_leaf`` / ``x_dst_leaf``: leaf of each cross-leaf connection; ``x_bytes``: its bytes per S.
    ``steps``: (intra, inter) latency steps; ``kind``: how latency is composed.
    """

    fixed: np.ndarray
    x_src_leaf: np.ndarray
    x_dst_leaf: np.ndarray
    x_bytes: np.ndarray
    fixed_flows: np.ndarray  # number of flows per link (for --explain)


def _channels(cluster: Cluster) -> int:
    return max(cluster.tuning.channels, cluster.nics.count if cluster.nics.per == "node" else 1)


def _nic_of_channel(cluster: Cluster, gpu: np.ndarray, channel: np.ndarray) -> np.ndarray:
    """NIC a channel's network edge uses: the GPU's rail (per-GPU NICs) or channel round-robin (per node)."""
    R, G = cluster.nics.count, cluster.gpus_per_node
    if cluster.nics.per == "gpu":
        if R >= G:  # several NICs per GPU: channels rotate over the GPU's NICs
            per = R // G
            return gpu * per + channel % per
        return gpu // (G // R)
    return channel % R


def _edges_pattern(
    topo: Topology,
    src: np.ndarray,
    dst: np.ndarray,
    nbytes: np.ndarray,
    src_nic: np.ndarray,
    dst_nic: np.ndarray,
    spray: bool,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Accumulate inter-node edges (node -> node, bytes per S) on NIC links; return cross-leaf flows."""
    L = topo.n_links
    fixed = np.bincount(topo.nic_tx(src, src_nic), weights=nbytes, minlength=L)
    fixed += np.bincount(topo.nic_rx(dst, dst_nic), weights=nbytes, minlength=L)
    flows = np.bincount(topo.nic_tx(src, src_nic), minlength=L) + np.bincount(
        topo.nic_rx(dst, dst_nic), minlength=L
    )
    la, lb = topo.leaf(src, src_nic), topo.leaf(dst, dst_nic)
    cross = la != lb
    xa, xb, xbytes = la[cross], lb[cross], nbytes[cross]
    if spray and xa.size:
        S = topo.spines
        spines = np.arange(S)
        share = np.repeat(xbytes / S, S)
        fixed += np.bincount(
            topo.uplink(np.repeat(xa, S), np.tile(spines, xa.size)), weights=share, minlength=L
        )
        fixed += np.bincount(
            topo.downlink(np.repeat(xb, S), np.tile(spines, xb.size)), weights=share, minlength=L
        )
        xa = xb = np.zeros(0, dtype=np.int64)
        xbytes = np.zeros(0)
    return fixed, flows, xa, xb, xbytes


def ring_edges(cluster: Cluster, op: str, nodes: int, g: int) -> tuple[np.ndarray, ...]:
    """Inter-node connections of a ring collective: (src node, dst node, NIC, bytes per byte of S).

    One ring per channel, nodes in order; channel c leaves each node from GPU c mod g on that GPU's rail,
    so channels spread evenly over the NICs."""
    n = nodes * g
    factor = {"all_reduce": 2.0 * (n - 1) / n, "broadcast": 1.0}.get(op, (n - 1) / n)
    C = _channels(cluster)
    ch = np.repeat(np.arange(C), nodes)
    src = np.tile(np.arange(nodes), C)
    dst = (src + 1) % nodes
    nic = _nic_of_channel(cluster, ch % g, ch)
    return src, dst, nic, np.full(src.shape[0], factor / C)


def _ring_pattern(cluster: Cluster, topo: Topology, op: str, nodes: int, g: int, spray: bool) -> _Pattern:
    n = nodes * g
    factor = {"all_reduce": 2.0 * (n - 1) / n, "broadcast": 1.0}.get(op, (n - 1) / n)
    L = topo.n_links
    fixed = np.zeros(L)
    flows = np.zeros(L, dtype=np.int64)
    if g > 1:  # NVLink: every GPU forwards the intra-node share of the ring in each direction
        intra = factor * (g - 1) / g if nodes > 1 else factor
        gpus = np.arange(nodes * g)
        fixed[topo.gpu_tx(gpus // g, gpus % g)] += intra
        fixed[topo.gpu_rx(gpus // g, gpus % g)] += intra
        flows[topo.gpu_tx(gpus // g, gpus % g)] += 1
    empty = np.zeros(0, dtype=np.int64)
    if nodes == 1:
        return _Pattern(fixed, empty, empty, np.zeros(0), flows)
    src, dst, nic, per_edge = ring_edges(cluster, op, nodes, g)
    f, fl, xa, xb, xbytes = _edges_pattern(topo, src, dst, per_edge, nic, nic, spray)
    return _Pattern(fixed + f, xa, xb, xbytes, flows + fl)


def _btree_parents(nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """Two complementary binary trees over nodes (NCCL's double binary tree idea): heap order over
    0..N-1 and over the reversed order, so leaves of one are interior in the other."""
    order0 = np.arange(nodes)
    order1 = order0[::-1]
    parents = []
    for order in (order0, order1):
        pos = np.arange(nodes)
        parent_pos = (pos - 1) // 2
        par = np.full(nodes, -1)
        par[order[1:]] = order[parent_pos[1:]]
        parents.append(par)
    return parents[0], parents[1]


def tree_edges(cluster: Cluster, nodes: int, g: int) -> tuple[np.ndarray, ...]:
    """Inter-node connections of the double binary tree all-reduce: (src, dst, NIC, bytes per byte of S).
    Each tree carries half of S over half of the channels, up (reduce) and down (broadcast)."""
    C = _channels(cluster)
    srcs, dsts, nics, byts = [], [], [], []
    for t, par in enumerate(_btree_parents(nodes)):
        child = np.nonzero(par >= 0)[0]
        chans = np.arange(t, C, 2) if C > 1 else np.array([0])
        per = 0.5 / chans.size
        for c in chans:
            nic = _nic_of_channel(cluster, np.full(child.size, c % g), np.full(child.size, c))
            srcs += [child, par[child]]
            dsts += [par[child], child]
            nics += [nic, nic]
            byts += [np.full(child.size, per), np.full(child.size, per)]
    return tuple(np.concatenate(x) for x in (srcs, dsts, nics, byts))


def _tree_pattern(cluster: Cluster, topo: Topology, nodes: int, g: int, spray: bool) -> _Pattern:
    L = topo.n_links
    fixed = np.zeros(L)
    flows = np.zeros(L, dtype=np.int64)
    if g > 1:  # intra-node chain: reduce up and broadcast down, S each way
        gpus = np.arange(nodes * g)
        fixed[topo.gpu_tx(gpus // g, gpus % g)] += 2.0
        fixed[topo.gpu_rx(gpus // g, gpus % g)] += 2.0
        flows[topo.gpu_tx(gpus // g, gpus % g)] += 1
    empty = np.zeros(0, dtype=np.int64)
    if nodes == 1:
        return _Pattern(fixed, empty, empty, np.zeros(0), flows)
    src, dst, nic, b = tree_edges(cluster, nodes, g)
    f, fl, xa, xb, xbytes = _edges_pattern(topo, src, dst, b, nic, nic, spray)
    return _Pattern(fixed + f, xa, xb, xbytes, flows + fl)


def _alltoall_pattern(cluster: Cluster, topo: Topology, nodes: int, g: int) -> _Pattern:
    """All-to-all: each GPU sends S/n to every rank; the inter-node share leaves on the destination's
    rail (PXN). Many connections per uplink, so ECMP is modelled by its even spread."""
    n = nodes * g
    L = topo.n_links
    fixed = np.zeros(L)
    flows = np.zeros(L, dtype=np.int64)
    gpus = np.arange(n)
    intra = (g - 1) / n
    fixed[topo.gpu_tx(gpus // g, gpus % g)] += intra
    fixed[topo.gpu_rx(gpus // g, gpus % g)] += intra
    empty = np.zeros(0, dtype=np.int64)
    if nodes == 1:
        return _Pattern(fixed, empty, empty, np.zeros(0), flows)
    R = cluster.nics.count
    src = np.repeat(np.arange(nodes), nodes)
    dst = np.tile(np.arange(nodes), nodes)
    keep = src != dst
    src, dst = src[keep], dst[keep]
    # node src sends g * g * S/n bytes to node dst, spread over its R NICs
    per_pair = g * g / n / R
    src_r = np.repeat(src, R)
    dst_r = np.repeat(dst, R)
    nic = np.tile(np.arange(R), src.size)
    f, fl, xa, xb, xbytes = _edges_pattern(topo, src_r, dst_r, np.full(src_r.size, per_pair), nic, nic, True)
    return _Pattern(fixed + f, xa, xb, xbytes, flows + fl)


# ---- evaluation --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Fabric:
    cluster: Cluster
    topo: Topology
    eff: np.ndarray  # per-link efficiency (network vs NVLink)
    cap: np.ndarray  # per-link effective capacity, bytes/s


def _fabric(cluster: Cluster, nodes: int, link_scale: LinkScale) -> _Fabric:
    topo = Topology.build(cluster, nodes)
    cap = topo.capacity.copy()
    if link_scale is not None:
        cap *= _scale_vector(topo, link_scale)
    n_net = 2 * nodes * topo.nics_per_node + 2 * topo.n_leaves * topo.spines
    eff = np.full(topo.n_links, cluster.tuning.nvlink_efficiency)
    eff[:n_net] = cluster.tuning.net_efficiency
    return _Fabric(cluster, topo, eff, cap * eff)


def _scale_vector(topo: Topology, link_scale: float | np.ndarray | Mapping[str, float]) -> np.ndarray:
    if isinstance(link_scale, Mapping):
        vec = np.ones(topo.n_links)
        names = {topo.link_name(i): i for i in range(topo.n_links)}
        for name, value in link_scale.items():
            if name not in names:
                raise InputError(
                    f"link_scale: unknown link {name!r} (e.g. {topo.link_name(0)!r}, 'leaf0->spine0')"
                )
            vec[names[name]] = float(value)
        return vec
    arr = np.asarray(link_scale, dtype=float)
    if arr.ndim == 0:
        vec = np.ones(topo.n_links)
        n_net = 2 * topo.nodes * topo.nics_per_node + 2 * topo.n_leaves * topo.spines
        vec[:n_net] = float(arr)  # a scalar scales the network, not NVLink
        return vec
    if arr.shape != (topo.n_links,):
        raise InputError(f"link_scale: expected {topo.n_links} values (one per link), got shape {arr.shape}")
    return arr


def _pattern(
    cluster: Cluster, fab: _Fabric, op: str, algorithm: str, nodes: int, g: int, spray: bool
) -> _Pattern:
    if op == "all_to_all":
        return _alltoall_pattern(cluster, fab.topo, nodes, g)
    if algorithm == "tree":
        return _tree_pattern(cluster, fab.topo, nodes, g, spray)
    return _ring_pattern(cluster, fab.topo, op, nodes, g, spray)


def _draw_uplink_time(fab: _Fabric, pat: _Pattern, draws: int, rng: np.random.Generator) -> np.ndarray:
    """Seconds per byte of S on the busiest uplink/downlink, one value per ECMP draw (vectorized)."""
    if pat.x_bytes.size == 0:
        return np.zeros(draws)
    topo = fab.topo
    q = fab.cluster.network.qps_per_connection
    S = topo.spines
    xa = np.repeat(pat.x_src_leaf, q)
    xb = np.repeat(pat.x_dst_leaf, q)
    xbytes = np.repeat(pat.x_bytes / q, q)
    spine = rng.integers(0, S, size=(draws, xa.size))
    n_links = topo.n_leaves * S
    offset = (np.arange(draws) * n_links)[:, None]
    up = np.bincount(
        (offset + xa * S + spine).ravel(), weights=np.tile(xbytes, draws), minlength=draws * n_links
    )
    down = np.bincount(
        (offset + xb * S + spine).ravel(), weights=np.tile(xbytes, draws), minlength=draws * n_links
    )
    base = 2 * topo.nodes * topo.nics_per_node
    cap_up = fab.cap[base : base + n_links]
    cap_down = fab.cap[base + n_links : base + 2 * n_links]
    t_up = (up.reshape(draws, n_links) / cap_up).max(axis=1)
    t_down = (down.reshape(draws, n_links) / cap_down).max(axis=1)
    return np.maximum(t_up, t_down)


def _latency_s(cluster: Cluster, op: str, algorithm: str, protocol: str, nodes: int, g: int) -> float:
    tu = cluster.tuning
    n = nodes * g
    net = tu.ring_step_us * _PROTO_NET_LAT[protocol]
    intra = tu.intra_step_us * _PROTO_INTRA_LAT[protocol]
    base = tu.base_us * _PROTO_BASE[protocol]
    if nodes > 1:
        intra = max(intra, net / 3.0)  # NCCL: intra steps of an inter-node ring still pay network overhead
    if op == "all_to_all":
        return 1e-6 * (base + (nodes - 1) * net + (g - 1) * intra)
    if algorithm == "tree":
        tree_net = tu.tree_step_us * _PROTO_NET_LAT[protocol]
        levels = math.ceil(math.log2(nodes)) if nodes > 1 else 0
        return 1e-6 * (base + 2 * ((g - 1) * intra + levels * tree_net))
    if algorithm in ("hierarchical", "nvls"):
        inter = 2 * (nodes - 1) if op == "all_reduce" else nodes - 1
        intra_steps = 2 * (g - 1) if algorithm == "hierarchical" else 2
        return 1e-6 * (base + intra_steps * intra + inter * net)
    steps = 2 * (n - 1) if op == "all_reduce" else n - 1
    inter_steps = (2 * nodes if op == "all_reduce" else nodes - 1) if nodes > 1 else 0
    inter_steps = min(inter_steps, steps)
    return 1e-6 * (base + (steps - inter_steps) * intra + inter_steps * net)


def _candidates(cluster: Cluster, op: str, nodes: int, g: int) -> list[str]:
    if op == "all_reduce":
        algs = ["ring", "tree"]
        if cluster.tuning.nvls and cluster.intra_node.kind == "nvswitch" and g > 1:
            algs.append("nvls")
        return algs
    return ["ring"]


def _protocols(cluster: Cluster) -> list[str]:
    # LL128 needs NVLink-class intra-node links (NCCL enables it on NVLink platforms)
    if cluster.intra_node.kind == "pcie":
        return ["LL", "Simple"]
    return list(PROTOCOLS)


@dataclass(frozen=True)
class _Plan:
    algorithm: str
    protocol: str
    pattern: _Pattern
    latency_s: float
    fixed_time: float  # seconds per byte of S on the busiest fixed link (NIC/NVLink/sprayed)
    fixed_link: int
    bw_factor: float  # protocol and algorithm bandwidth multiplier


def _nvls_fixed_time(fab: _Fabric, op: str, nodes: int, g: int) -> float:
    """NVLink SHARP: intra-node all-reduce at the calibrated NVLS busbw, inter-node rail rings on S/g."""
    tu = fab.cluster.tuning
    n = nodes * g
    t_intra = bus_factor("all_reduce", n) / (tu.nvls_busbw_gbytes * 1e9)
    if nodes == 1:
        return t_intra
    per_nic = 2.0 * (nodes - 1) / nodes / fab.cluster.nics.count
    return max(t_intra, per_nic / float(fab.cap[0]))


def _plan(fab: _Fabric, op: str, nodes: int, g: int, algorithm: str, protocol: str, spray: bool) -> _Plan:
    cluster = fab.cluster
    if algorithm in ("nvls", "hierarchical") and op == "all_reduce":
        if algorithm == "nvls":
            t = _nvls_fixed_time(fab, op, nodes, g)
            pat = _ring_pattern(cluster, fab.topo, op, nodes, g, True)
            link = int(np.argmax(pat.fixed / fab.cap))
        else:
            # reduce-scatter in node, all-reduce of S/g across nodes per rail, all-gather in node
            t_rs = (
                (g - 1) / g / (cluster.intra_node.bandwidth_gbytes * 1e9 * cluster.tuning.nvlink_efficiency)
            )
            per_nic = 2.0 * (nodes - 1) / nodes / cluster.nics.count if nodes > 1 else 0.0
            t = 2 * t_rs + per_nic / float(fab.cap[0])
            pat = _ring_pattern(cluster, fab.topo, op, nodes, g, True)
            link = int(np.argmax(pat.fixed / fab.cap))
        return _Plan(
            algorithm,
            protocol,
            pat,
            _latency_s(cluster, op, algorithm, protocol, nodes, g),
            t,
            link,
            _PROTO_BW[protocol],
        )
    pat = _pattern(cluster, fab, op, algorithm, nodes, g, spray)
    ratio = pat.fixed / fab.cap
    link = int(np.argmax(ratio))
    bw = _PROTO_BW[protocol] * (cluster.tuning.tree_efficiency if algorithm == "tree" else 1.0)
    return _Plan(
        algorithm,
        protocol,
        pat,
        _latency_s(cluster, op, algorithm, protocol, nodes, g),
        float(ratio[link]),
        link,
        bw,
    )


def _validate(cluster: Cluster, op: str, nbytes: float, nodes: int, gpus_per_node: int | None) -> int:
    if op not in OPS:
        raise InputError(f"op {op!r}: choose one of {', '.join(OPS)}")
    if nodes < 1:
        raise InputError(f"nodes={nodes}: must be at least 1")
    if nodes > cluster.nodes:
        raise InputError(f"nodes={nodes}: cluster {cluster.name!r} has only {cluster.nodes} nodes")
    if nbytes < 0:
        raise InputError(f"nbytes={nbytes}: must be >= 0")
    g = cluster.gpus_per_node if gpus_per_node is None else int(gpus_per_node)
    if g < 1 or g > cluster.gpus_per_node:
        raise InputError(f"gpus_per_node={g}: must be 1..{cluster.gpus_per_node} on {cluster.name!r}")
    return g


def _choose(
    fab: _Fabric, op: str, nbytes: float, nodes: int, g: int, algorithm: str | None, protocol: str | None
) -> _Plan:
    spray = fab.cluster.network.routing != "ecmp"
    algs = [algorithm] if algorithm else _candidates(fab.cluster, op, nodes, g)
    protos = [protocol] if protocol else _protocols(fab.cluster)
    for a in algs:
        if a not in ALGORITHMS:
            raise InputError(f"algorithm {a!r}: choose one of {', '.join(ALGORITHMS)}")
        if a != "ring" and op != "all_reduce":
            raise InputError(f"algorithm {a!r} is only modelled for all_reduce; use ring for {op}")
    for p in protos:
        if p not in PROTOCOLS:
            raise InputError(f"protocol {p!r}: choose one of {', '.join(PROTOCOLS)}")
    best: _Plan | None = None
    best_t = math.inf
    for a in algs:
        # selection sees the expected fabric (even spread), like NCCL's model, never a particular hash
        nominal = _plan(fab, op, nodes, g, a, "Simple", True)
        for p in protos:
            t = nominal.latency_s if p == "Simple" else _latency_s(fab.cluster, op, a, p, nodes, g)
            t += nbytes * nominal.fixed_time / (_PROTO_BW[p] * (nominal.bw_factor / _PROTO_BW["Simple"]))
            if t < best_t:
                best_t, best = t, _plan(fab, op, nodes, g, a, p, spray)
    assert best is not None
    return best


def _times(plan: _Plan, nbytes: float, per_byte_draws: np.ndarray) -> np.ndarray:
    per_byte = np.maximum(plan.fixed_time, per_byte_draws)
    return plan.latency_s + nbytes * per_byte / plan.bw_factor


def collective_time(
    cluster: Cluster | str,
    op: str,
    nbytes: float,
    *,
    nodes: int,
    gpus_per_node: int | None = None,
    algorithm: str | None = None,
    protocol: str | None = None,
    rng: np.random.Generator | None = None,
    link_scale: LinkScale = None,
) -> CollectiveResult:
    """Predicted time of one ``op`` of ``nbytes`` (nccl-tests size) on ``nodes`` nodes.

    ``rng`` draws the ECMP hashing (default: the cluster's ``ecmp_seed``); ``link_scale`` scales link
    capacities: a float (all network links), an array (one per link of ``Topology.build``), or a mapping
    of link names (``'leaf0->spine3'``, ``'node2.nic0->switch'``) to factors.
    """
    cl = load_cluster(cluster) if not isinstance(cluster, Cluster) else cluster
    g = _validate(cl, op, nbytes, nodes, gpus_per_node)
    fab = _fabric(cl, nodes, link_scale)
    plan = _choose(fab, op, nbytes, nodes, g, algorithm, protocol)
    gen = rng if rng is not None else np.random.default_rng(cl.network.ecmp_seed)
    draw = _draw_uplink_time(fab, plan.pattern, 1, gen)
    t = float(_times(plan, nbytes, draw)[0])
    ranks = nodes * g
    algbw = nbytes / t / 1e9 if t > 0 else 0.0
    # name the bottleneck: the fixed link, or the most loaded uplink of this draw
    name, nflows, share = _bottleneck(plan, fab, float(draw[0]))
    return CollectiveResult(
        op=op,
        nbytes=int(nbytes),
        nodes=nodes,
        gpus=ranks,
        time_s=t,
        algorithm=plan.algorithm,
        protocol=plan.protocol,
        algbw_gbps=algbw,
        busbw_gbps=algbw * bus_factor(op, ranks),
        latency_s=plan.latency_s,
        bottleneck=name,
        bottleneck_flows=nflows,
        bottleneck_share=share,
        details={"fixed_s_per_byte": plan.fixed_time, "uplink_s_per_byte": float(draw[0])},
    )


def _bottleneck(plan: _Plan, fab: _Fabric, uplink_t: float) -> tuple[str, int, float]:
    if uplink_t > plan.fixed_time:
        return "leaf-spine uplink (ECMP)", 0, 0.0
    link = plan.fixed_link
    flows = int(plan.pattern.fixed_flows[link]) if link < plan.pattern.fixed_flows.size else 0
    return fab.topo.link_name(link), flows, (1.0 / flows if flows else 1.0)


def sample_collective_times(
    cluster: Cluster | str,
    op: str,
    nbytes: float,
    *,
    nodes: int,
    n: int,
    rng: np.random.Generator,
    link_scale: LinkScale = None,
    gpus_per_node: int | None = None,
) -> np.ndarray:
    """``n`` independent ECMP draws of the time (s) of one collective, vectorized: the algorithm and
    protocol are chosen once (NCCL's choice does not depend on hashing), then each draw's busiest uplink
    is a bincount of its hashed connections (closed form of the max-min bottleneck, see module doc)."""
    cl = load_cluster(cluster) if not isinstance(cluster, Cluster) else cluster
    g = _validate(cl, op, nbytes, nodes, gpus_per_node)
    if n < 0:
        raise InputError(f"n={n}: must be >= 0")
    fab = _fabric(cl, nodes, link_scale)
    plan = _choose(fab, op, nbytes, nodes, g, None, None)
    out = np.empty(n)
    chunk = max(1, 2_000_000 // max(1, plan.pattern.x_bytes.size * cl.network.qps_per_connection))
    for lo in range(0, n, chunk):
        hi = min(n, lo + chunk)
        out[lo:hi] = _times(plan, nbytes, _draw_uplink_time(fab, plan.pattern, hi - lo, rng))
    return out


def check_cluster(cluster: Cluster | str) -> Cluster:
    """Load and sanity-check a cluster for collective prediction."""
    cl = load_cluster(cluster) if not isinstance(cluster, Cluster) else cluster
    if cl.network.topology != "single_switch" and cl.network.spines < 1:
        raise ConfigError(f"cluster {cl.name!r}: network.spines must be >= 1")
    return cl
