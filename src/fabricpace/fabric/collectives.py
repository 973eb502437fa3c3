"""Collectives on the fabric: an NCCL-like cost model per (algorithm, protocol), and NCCL-like selection.

Model (S = bytes as nccl-tests counts them)::

    T(a, p) = latency(a, p) + S * u_a / bw_p

* ``u_a`` (seconds per byte of S) comes from the fabric: the algorithm's connections (patterns.py) are
  routed on the topology (NIC ports, leaf uplinks via ECMP or spraying, NVLink ports) and
  ``u_a = max over links of bytes_on_link / (capacity * efficiency)``, with the algorithm's own network
  efficiency (ring, tree and NVLS-tree each have one: ``network_efficiency``). Rings and trees move data in
  lockstep pipelines, so the slowest link paces every flow, and the max-min fair rate of the slowest flow
  is exactly ``capacity / load`` of its busiest link. One ECMP draw therefore needs only a ``bincount`` of
  hashed connections per uplink, not a full max-min solve (tests check this closed form against
  ``maxmin.max_min_rates``).
* ``latency`` is a fixed per-call cost (``tuning.base_us``: launch and pipeline fill; calibrated) plus the
  per-hop latencies of the cluster file along the algorithm's critical path, following the step counts of
  NCCL's tuning model (src/graph/tuning.cc): a ring all-reduce crosses 2(n-1) hops, 2(N-1) of them on
  the network (ring latency grows with the rank count); a tree crosses (g-1) NVLink hops and log2(N)
  network levels twice; NVLS-tree reduces inside the node in the NVSwitch, then runs a tree across nodes.
  A tree hop moves a bigger pipeline chunk than a ring step, so its hop latency is scaled by NCCL's
  tree/ring latency ratios (Simple: 50/9.6 on the network, 28/3.4 on NVLink).
* proxy floor: a ring that spans nodes advances at the pace of the proxy threads that post its network
  operations, so every ring step -- NVLink steps too -- costs at least ``tuning.net_overhead_us``, three
  times with Simple (send, receive, acknowledge). This is NCCL's own rule ("inter-node rings still have to
  launch nsteps * net overhead", tuning.cc; NCCL assumes 1 us); here it is calibrated, because a
  transport's per-message cost differs (about 9 us on AWS EFA against about 1 us on InfiniBand).
* protocols: LL (a quarter of the bandwidth, lowest latency), LL128 (120/128 of it), Simple (full
  bandwidth) -- NCCL's bandwidth and latency ratios.

Selection is NCCL's: the lowest time *as NCCL's cost model estimates it*, with NCCL's built-in constants
(efficiencies, fixed cost, 1 us proxy overhead: ``_nominal``), not the calibrated ones -- NCCL never
measures the fabric, so on a fabric that differs from its constants it switches protocol where the switch
does not pay (p5/EFA all-gather: LL128 to Simple at 16 MiB per rank, where the measured time jumps up).
A tuner plugin, when the cluster file names one (tuner.py), replaces that choice. The choice never sees a
hash draw or a degraded link either; a draw's time then uses that draw's loads.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from fabricpace._errors import InputError
from fabricpace.fabric.cluster import Cluster, Tuning, load_cluster
from fabricpace.fabric.patterns import Pattern, alltoall_pattern, ring_pattern, tree_pattern
from fabricpace.fabric.topology import Topology
from fabricpace.fabric.tuner import tuner_choice

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")
ALGORITHMS = ("ring", "tree", "nvls", "nvls_tree", "hierarchical", "p2p")
PROTOCOLS = ("LL", "LL128", "Simple")

# NCCL tuning.cc ratios relative to Simple (bandwidth share; ring latency per network / NVLink hop; base)
_PROTO_BW = {"LL": 0.25, "LL128": 120.0 / 128.0, "Simple": 1.0}
_PROTO_NET = {"LL": 2.7 / 9.6, "LL128": 4.0 / 9.6, "Simple": 1.0}
_PROTO_INTRA = {"LL": 0.47 / 3.4, "LL128": 1.9 / 3.4, "Simple": 1.0}
_PROTO_BASE = {"LL": 3.6 / 8.4, "LL128": 10.0 / 8.4, "Simple": 1.0}
# A tree moves bigger pipeline chunks per hop than a ring ("Tree/Simple is the latency a 256kB chunk"):
# NCCL's per-hop tree latency relative to its ring latency, network and NVLink, per protocol.
_TREE_NET = {"LL": 5.0 / 2.7, "LL128": 8.5 / 4.0, "Simple": 50.0 / 9.6}
_TREE_INTRA = {"LL": 0.52 / 0.47, "LL128": 1.2 / 1.9, "Simple": 28.0 / 3.4}

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


@dataclass(frozen=True)
class _Fabric:
    cluster: Cluster
    topo: Topology
    raw: np.ndarray  # link capacity after link_scale, bytes/s
    n_net: int  # links [0, n_net) are network links, the rest NVLink ports

    def cap(self, net_eff: float) -> np.ndarray:
        """Effective capacities with ``net_eff`` on network links and NVLink efficiency inside nodes."""
        c = self.raw.copy()
        c[: self.n_net] *= net_eff
        c[self.n_net :] *= self.cluster.tuning.nvlink_efficiency
        return c


def _fabric(
    cluster: Cluster, nodes: int, link_scale: LinkScale, leaves: tuple[int, ...] | None = None
) -> _Fabric:
    topo = Topology.build(cluster, nodes, node_leaves=leaves)
    raw = topo.capacity.copy()
    if link_scale is not None:
        raw *= _scale_vector(topo, link_scale)
    n_net = 2 * nodes * topo.nics_per_node + 2 * topo.n_leaves * topo.spines
    return _Fabric(cluster, topo, raw, n_net)


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


def _draw_uplink_time(
    fab: _Fabric, pat: Pattern, cap: np.ndarray, draws: int, rng: np.random.Generator
) -> np.ndarray:
    """Seconds per byte of S on the busiest uplink/downlink, one value per ECMP draw (vectorized):
    every queue pair of every cross-leaf connection draws a spine; a link's load is a bincount."""
    if pat.x_bytes.size == 0:
        return np.zeros(draws)
    topo = fab.topo
    q = fab.cluster.network.qps_per_connection
    S = topo.spines
    n_links = topo.n_leaves * S
    spine = rng.integers(0, S, size=(draws, pat.x_bytes.size * q))
    offset = (np.arange(draws, dtype=np.int64) * n_links)[:, None]
    per_qp = np.repeat(pat.x_bytes / q, q)
    equal = bool(np.ptp(per_qp) == 0.0)  # rings and trees: every connection carries the same bytes
    base = 2 * topo.nodes * topo.nics_per_node
    worst = np.zeros(draws)
    for leaves, first in ((pat.x_src_leaf, base), (pat.x_dst_leaf, base + n_links)):
        idx = (offset + np.repeat(leaves * S, q)[None, :] + spine).ravel()
        weights = None if equal else np.tile(per_qp, draws)
        load: np.ndarray = np.bincount(idx, weights=weights, minlength=draws * n_links)
        if equal:
            load = load * float(per_qp[0])
        worst = np.maximum(worst, (load.reshape(draws, n_links) / cap[first : first + n_links]).max(axis=1))
    return worst


def _draw_uplink_link(
    fab: _Fabric, pat: Pattern, cap: np.ndarray, rng: np.random.Generator
) -> tuple[float, int, int]:
    """One ECMP draw as ``_draw_uplink_time(..., 1, rng)`` makes it (same random numbers), with the busiest
    uplink/downlink: (seconds per byte of S, its link index, queue pairs hashed onto it); (0, -1, 0) when
    no connection crosses leaves."""
    if pat.x_bytes.size == 0:
        return 0.0, -1, 0
    topo = fab.topo
    q = fab.cluster.network.qps_per_connection
    S = topo.spines
    n_links = topo.n_leaves * S
    spine = rng.integers(0, S, size=(1, pat.x_bytes.size * q))[0]
    per_qp = np.repeat(pat.x_bytes / q, q)
    base = 2 * topo.nodes * topo.nics_per_node
    best = (0.0, -1, 0)
    for leaves, first in ((pat.x_src_leaf, base), (pat.x_dst_leaf, base + n_links)):
        idx = np.repeat(leaves * S, q) + spine
        load = np.bincount(idx, weights=per_qp, minlength=n_links)
        count = np.bincount(idx, minlength=n_links)
        ratio = load / cap[first : first + n_links]
        k = int(np.argmax(ratio))
        if ratio[k] > best[0]:
            best = (float(ratio[k]), first + k, int(count[k]))
    return best


def _hop_latencies(cluster: Cluster, nodes: int, leaves: int | None = None) -> tuple[float, float]:
    """(NVLink hop, network hop) latency in us from the cluster file; a network hop crosses one switch
    inside a leaf and three (leaf, spine, leaf) when the job spans leaves (``leaves``: how many it spans;
    None: as many as packing ``nodes`` needs)."""
    net = cluster.network
    one_leaf = nodes <= cluster.nodes_per_leaf if leaves is None else leaves <= 1
    hops = 1 if net.topology == "single_switch" or one_leaf else 3
    scale = cluster.tuning.latency_scale
    return cluster.intra_node.latency_us * scale, (net.nic_latency_us + hops * net.hop_latency_us) * scale


@dataclass(frozen=True)
class LatencyParts:
    """The latency of one (algorithm, protocol) in microseconds: ``base_us * base_share + fixed_us`` plus,
    for a ring, ``intra_steps * max(intra_us, floor) + inter_steps * max(inter_us, floor)`` with the proxy
    floor ``floor = net_overhead_us * overhead_mult`` (collectives.py module doc). Linear in the fixed cost,
    so calibration can evaluate it for many tunings cheaply."""

    base_share: float
    fixed_us: float
    intra_steps: float = 0.0
    intra_us: float = 0.0
    inter_steps: float = 0.0
    inter_us: float = 0.0
    overhead_mult: float = 0.0

    def latency_us(self, base_us: float, net_overhead_us: float) -> float:
        floor = net_overhead_us * self.overhead_mult
        steps = self.intra_steps * max(self.intra_us, floor) + self.inter_steps * max(self.inter_us, floor)
        return base_us * self.base_share + self.fixed_us + steps

    def floor_us(self, net_overhead_us: float) -> float:
        """What the proxy floor adds to the steps' hop latencies (0 without a floor or below the hops)."""
        floor = net_overhead_us * self.overhead_mult
        return self.intra_steps * max(floor - self.intra_us, 0.0) + self.inter_steps * max(
            floor - self.inter_us, 0.0
        )


def latency_parts(
    cluster: Cluster, op: str, algorithm: str, protocol: str, nodes: int, g: int, *, leaves: int | None = None
) -> LatencyParts:
    """The latency of the model split into its terms (see ``LatencyParts``); public for calibration.
    ``leaves``: leaves the job spans (default: as many as packing ``nodes`` needs)."""
    intra, net = _hop_latencies(cluster, nodes, leaves)
    intra *= _PROTO_INTRA[protocol]
    net *= _PROTO_NET[protocol]
    share = _PROTO_BASE[protocol]
    levels = math.ceil(math.log2(nodes)) if nodes > 1 else 0
    n = nodes * g
    if algorithm == "p2p":
        return LatencyParts(share, (nodes - 1) * net + (g - 1) * intra)
    if algorithm == "tree":
        return LatencyParts(
            share, 2 * ((g - 1) * intra * _TREE_INTRA[protocol] + levels * net * _TREE_NET[protocol])
        )
    if algorithm == "nvls_tree":
        return LatencyParts(share, 2 * (intra * _TREE_INTRA[protocol] + levels * net * _TREE_NET[protocol]))
    if algorithm == "nvls":
        return LatencyParts(share, 2 * intra)
    if algorithm == "hierarchical":
        return LatencyParts(share, 2 * (g - 1) * intra + 2 * (nodes - 1) * net)
    steps = 2 * (n - 1) if op == "all_reduce" else n - 1
    inter = (2 * (nodes - 1) if op == "all_reduce" else nodes - 1) if nodes > 1 else 0
    # NCCL (tuning.cc): "inter-node rings still have to launch nsteps * net overhead" -- a ring that spans
    # nodes advances at the pace of its proxies, so every step, NVLink ones too, costs at least one network
    # post (three with Simple: send, receive, acknowledge). Broadcast is a pipeline, not a ring of steps.
    mult = 0.0 if nodes <= 1 or op == "broadcast" else (3.0 if protocol == "Simple" else 1.0)
    return LatencyParts(share, 0.0, float(steps - inter), intra, float(inter), net, mult)


def _latency_s(
    cluster: Cluster, op: str, algorithm: str, protocol: str, nodes: int, g: int, leaves: int | None = None
) -> float:
    tu = cluster.tuning
    parts = latency_parts(cluster, op, algorithm, protocol, nodes, g, leaves=leaves)
    return parts.latency_us(tu.base_us, tu.net_overhead_us) * 1e-6


def _candidates(cluster: Cluster, op: str, nodes: int, g: int) -> list[str]:
    if op == "all_to_all":
        return ["p2p"]
    if op != "all_reduce":
        return ["ring"]
    nvls = _has_nvls(cluster, g)
    if nodes == 1:
        return ["ring", "nvls"] if nvls else ["ring"]
    return ["ring", "nvls_tree" if nvls else "tree"]


def _protocols(cluster: Cluster, algorithm: str, nodes: int = 1) -> list[str]:
    if algorithm in ("nvls", "nvls_tree", "hierarchical"):
        return ["Simple"]
    if cluster.intra_node.kind == "pcie":  # NCCL enables LL128 on NVLink platforms only
        return ["LL", "Simple"]
    if nodes > 1 and not cluster.tuning.ll128_across_nodes:  # a NIC behind the CPU (cluster.py, Tuning)
        return ["LL", "Simple"]
    return list(PROTOCOLS)


@dataclass(frozen=True)
class _Plan:
    algorithm: str
    protocol: str
    pattern: Pattern
    cap: np.ndarray  # effective link capacities this algorithm sees
    latency_s: float
    fixed_time: float  # seconds per byte of S on the busiest NIC / NVLink / sprayed link
    fixed_link: int  # that link (-1: the NVSwitch itself)
    floor_s: float = 0.0  # the part of latency_s that is the proxy floor, overlapped with data (ring_floor)


def network_efficiency(tuning: Tuning, algorithm: str) -> float:
    """Share of the network line rate an algorithm reaches: ``tree_efficiency`` for NCCL's tree,
    ``nvls_tree_efficiency`` for NVLS-tree (NCCL's tuning.cc gives the two separate bandwidth rules: they are
    different pipelines), ``net_efficiency`` for rings and the rest."""
    if algorithm == "tree":
        return tuning.tree_efficiency
    if algorithm == "nvls_tree":
        return tuning.nvls_tree_efficiency
    return tuning.net_efficiency


def _empty_pattern(n_links: int) -> Pattern:
    e = np.zeros(0, dtype=np.int64)
    return Pattern(np.zeros(n_links), e, e, np.zeros(0), np.zeros(n_links, dtype=np.int64))


@functools.lru_cache(maxsize=64)
def _cached_pattern(
    cluster: Cluster,
    op: str,
    nodes: int,
    g: int,
    algorithm: str,
    spray: bool,
    order: tuple[int, ...] | None,
    leaves: tuple[int, ...] | None = None,
) -> Pattern:
    """Flow pattern of an algorithm (depends on the cluster's fabric, not on the size): cached, because
    the simulator asks for the same pattern for every bucket size. Callers must not mutate it."""
    topo = Topology.build(cluster, nodes, node_leaves=leaves)
    if algorithm in ("tree", "nvls_tree"):
        return tree_pattern(cluster, topo, nodes, g, spray, chain=algorithm == "tree", order=order)
    if algorithm == "p2p":
        return alltoall_pattern(cluster, topo, nodes, g)  # every pair: the order does not matter
    return ring_pattern(cluster, topo, op, nodes, g, spray, order)


def _node_order(order: Sequence[int] | None, nodes: int) -> tuple[int, ...] | None:
    """Validated node order as a hashable tuple; None for the packed order (0..N-1)."""
    if order is None:
        return None
    t = tuple(int(v) for v in order)
    if sorted(t) != list(range(nodes)):
        raise InputError(
            f"node_order: expected each of the job's node ids 0..{nodes - 1} exactly once, got {list(t)[:12]}"
        )
    return None if t == tuple(range(nodes)) else t


def _node_leaves(cluster: Cluster, leaves: Sequence[int | str] | None, nodes: int) -> tuple[int, ...] | None:
    """Validated leaf of each node, renumbered 0.. in order of the leaves' first nodes; None where it is
    the packed layout (or the cluster is one switch), so packed jobs keep their cached plans."""
    if leaves is None or cluster.network.topology == "single_switch":
        return None
    raw = list(leaves)
    if len(raw) != nodes:
        raise InputError(f"node_leaves: expected a leaf for each of the job's {nodes} nodes, got {len(raw)}")
    first: dict[int | str, int] = {}
    for lf in raw:
        first.setdefault(lf, len(first))
    t = tuple(first[lf] for lf in raw)
    per = min(cluster.nodes_per_leaf, max(nodes, 1))
    return None if t == tuple(i // per for i in range(nodes)) else t


def _plan(
    fab: _Fabric,
    op: str,
    nodes: int,
    g: int,
    algorithm: str,
    protocol: str,
    spray: bool,
    order: tuple[int, ...] | None = None,
) -> _Plan:
    cl, topo = fab.cluster, fab.topo
    tu = cl.tuning
    leaves = None if topo.node_group is None else tuple(int(v) for v in topo.node_group)
    lat = _latency_s(cl, op, algorithm, protocol, nodes, g, topo.leaf_groups)
    nvls_t = 2.0 * (g - 1) / g / (tu.nvls_busbw_gbytes * 1e9) if g > 1 else 0.0  # NVSwitch all-reduce of S
    if algorithm == "nvls":
        empty = _empty_pattern(topo.n_links)
        return _Plan(algorithm, protocol, empty, fab.cap(tu.net_efficiency), lat, nvls_t, -1)
    if algorithm == "hierarchical":
        cap = fab.cap(tu.net_efficiency)
        nvl = float(cap[fab.n_net]) if g > 1 else math.inf
        per_nic = 2.0 * (nodes - 1) / nodes / cl.nics.count  # all-reduce of S/g per rail, rails in parallel
        t = 2 * (g - 1) / g / nvl + per_nic / float(cap[0])
        return _Plan(algorithm, protocol, _empty_pattern(topo.n_links), cap, lat, t, 0)
    cap = fab.cap(network_efficiency(tu, algorithm))
    key = cl.model_copy(update={"tuning": type(tu)(channels=tu.channels)})  # patterns ignore the rest
    pat = _cached_pattern(key, op, nodes, g, algorithm, spray, order, leaves)
    ratio = pat.fixed / cap
    link = int(np.argmax(ratio))
    t = float(ratio[link])
    if algorithm == "nvls_tree" and nvls_t > t:
        t, link = nvls_t, -1
    floor = 0.0
    if tu.ring_floor == "overlapped":
        parts = latency_parts(cl, op, algorithm, protocol, nodes, g, leaves=topo.leaf_groups)
        floor = parts.floor_us(tu.net_overhead_us) * 1e-6
    return _Plan(algorithm, protocol, pat, cap, lat, t, link, floor)


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


@functools.lru_cache(maxsize=64)
def _nominal(cluster: Cluster) -> Cluster:
    """The cluster as NCCL's own cost model sees it: its line rates, topology and hop latencies, but NCCL's
    built-in constants instead of the calibrated efficiencies, fixed cost and proxy overhead (NCCL never
    measures them; a tuner plugin would replace this view by its own tables)."""
    d = type(cluster.tuning)()
    return cluster.with_tuning(
        net_efficiency=d.net_efficiency,
        tree_efficiency=d.tree_efficiency,
        nvls_tree_efficiency=d.nvls_tree_efficiency,
        base_us=d.base_us,
        latency_scale=d.latency_scale,
        net_overhead_us=d.net_overhead_us,
    )


@functools.lru_cache(maxsize=4096)
def _select(
    cluster: Cluster, op: str, nbytes: float, nodes: int, g: int, algorithm: str | None, protocol: str | None
) -> tuple[str, str]:
    """(algorithm, protocol) with the lowest time *as NCCL estimates it* (``_nominal``), unless the cluster's
    tuner plugin decides (tuner.py): the choice depends on the size, the scale and the hardware, never on
    the calibration, a hash draw or a degraded link."""
    if algorithm is None and protocol is None:
        nvls = cluster.tuning.nvls and cluster.intra_node.kind == "nvswitch"
        plugin = tuner_choice(cluster.tuning.tuner, op, nbytes, nodes, g, nvls=nvls)
        if plugin is not None:
            return plugin
    nom = _nominal(cluster)
    fab = _fabric(nom, nodes, None)
    algs = [algorithm] if algorithm else _candidates(cluster, op, nodes, g)
    if protocol and not algorithm:  # NCCL_PROTO=LL leaves out the algorithms that run Simple only (NVLS)
        algs = [a for a in algs if protocol in _protocols(cluster, a, nodes)] or algs
    best: tuple[float, str, str] | None = None
    for a in algs:
        nominal = _plan(fab, op, nodes, g, a, "Simple", True)
        for p in [protocol] if protocol else _protocols(cluster, a, nodes):
            t = _latency_s(nom, op, a, p, nodes, g) + nbytes * nominal.fixed_time / _PROTO_BW[p]
            if best is None or t < best[0]:
                best = (t, a, p)
    assert best is not None
    return best[1], best[2]


def selected_plan(cluster: Cluster, op: str, nbytes: float, nodes: int, g: int) -> tuple[str, str]:
    """(algorithm, protocol) the model's NCCL-like selection picks; public for calibration."""
    return _select(cluster, op, float(nbytes), nodes, g, None, None)


def _has_nvls(cluster: Cluster, g: int) -> bool:
    """NVLink SHARP can run: an NVSwitch node with ``tuning.nvls`` and more than one GPU per node."""
    return cluster.tuning.nvls and cluster.intra_node.kind == "nvswitch" and g > 1


def check_forced(
    cluster: Cluster, op: str, nodes: int, g: int, algorithm: str | None, protocol: str | None
) -> tuple[str | None, str | None]:
    """A forced algorithm / protocol (``NCCL_ALGO`` / ``NCCL_PROTO``, any case) in its canonical spelling;
    InputError for a combination NCCL cannot run (or the model does not have): ``p2p`` is all-to-all's
    only algorithm and all-to-all's only one; tree, NVLS, NVLS-tree and hierarchical are all-reduce
    algorithms; NVLS and NVLS-tree need an NVSwitch with ``tuning.nvls`` and run the Simple protocol only
    (as does the hierarchical all-reduce here); LL128 needs NVLink (NCCL disables it on PCIe)."""
    if algorithm is not None:
        canon = {a.lower(): a for a in ALGORITHMS}.get(algorithm.lower())
        if canon is None:
            raise InputError(f"algorithm {algorithm!r}: choose one of {', '.join(ALGORITHMS)}")
        algorithm = canon
    if protocol is not None:
        canon = {p.lower(): p for p in PROTOCOLS}.get(protocol.lower())
        if canon is None:
            raise InputError(f"protocol {protocol!r}: choose one of {', '.join(PROTOCOLS)} (any case)")
        protocol = canon
    where = f"cluster {cluster.name!r}"
    if op == "all_to_all" and algorithm not in (None, "p2p"):
        raise InputError(
            f"algorithm {algorithm!r}: all_to_all runs as point-to-point sends to every peer (p2p), NCCL "
            "has no other algorithm for it; use --algorithm p2p or leave it out"
        )
    if algorithm == "p2p" and op != "all_to_all":
        more = " (or tree, nvls_tree, hierarchical)" if op == "all_reduce" else ""
        raise InputError(f"algorithm 'p2p' is all_to_all's; use ring for {op}{more}")
    if algorithm and algorithm not in ("ring", "p2p") and op != "all_reduce":
        raise InputError(f"algorithm {algorithm!r} is modelled for all_reduce only; use ring for {op}")
    if algorithm == "nvls" and nodes > 1:
        raise InputError("algorithm 'nvls' is single-node; use nvls_tree across nodes")
    if algorithm in ("nvls", "nvls_tree") and not _has_nvls(cluster, g):
        kind = cluster.intra_node.kind
        why = f"its nodes have {kind}, not an NVSwitch" if kind != "nvswitch" else (
            "tuning.nvls is false" if not cluster.tuning.nvls else f"{g} GPU per node"
        )
        raise InputError(
            f"algorithm {algorithm!r} needs NVLink SHARP (an NVSwitch with tuning.nvls: true and 2+ GPUs per "
            f"node); {where}: {why}; use ring or tree"
        )
    if protocol is not None and protocol != "Simple" and algorithm in ("nvls", "nvls_tree", "hierarchical"):
        raise InputError(
            f"protocol {protocol!r} with algorithm {algorithm!r}: it runs the Simple protocol only; use "
            "--protocol Simple or leave it out"
        )
    if protocol == "LL128" and cluster.intra_node.kind == "pcie":
        raise InputError(
            f"protocol 'LL128' needs NVLink (NCCL disables it on PCIe); {where} has intra_node.kind pcie: "
            "use LL or Simple"
        )
    return algorithm, protocol


def _choose(
    fab: _Fabric,
    op: str,
    nbytes: float,
    nodes: int,
    g: int,
    algorithm: str | None,
    protocol: str | None,
    order: tuple[int, ...] | None = None,
) -> _Plan:
    spray = fab.cluster.network.routing != "ecmp"
    algorithm, protocol = check_forced(fab.cluster, op, nodes, g, algorithm, protocol)
    alg, proto = _select(fab.cluster, op, float(nbytes), nodes, g, algorithm, protocol)
    # NCCL's choice does not depend on the order of the nodes; only the flows of the chosen plan do.
    return _plan(fab, op, nodes, g, alg, proto, spray, order)


def _times(plan: _Plan, nbytes: float, uplink_per_byte: np.ndarray) -> np.ndarray:
    data = nbytes * np.maximum(plan.fixed_time, uplink_per_byte) / _PROTO_BW[plan.protocol]
    # tuning.ring_floor "overlapped": each ring step takes max(floor, hop + its data), not floor + data
    return plan.latency_s - plan.floor_s + np.maximum(data, plan.floor_s)


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
    node_order: Sequence[int] | None = None,
    node_leaves: Sequence[int | str] | None = None,
) -> CollectiveResult:
    """Predicted time of one ``op`` of ``nbytes`` (the size nccl-tests prints) on ``nodes`` nodes.

    ``rng`` draws the ECMP hashing (default: the cluster's ``ecmp_seed``); ``link_scale`` scales link
    capacities: a float (all network links), an array (one per link of ``Topology.build``), or a mapping
    of link names (``'leaf0->spine3'``, ``'node2.nic0->switch'``) to factors. ``node_order``: the job's
    nodes in rank order (NCCL's rings and trees follow it); default the packed order 0..N-1, in which
    ring neighbours share a leaf. ``node_leaves``: the leaf switch of each node 0..N-1 (any labels), for
    a job the scheduler did not pack (2 + 2 nodes on two leaves of 4); default: consecutive nodes fill
    leaves of ``nodes_per_leaf``.
    """
    cl = load_cluster(cluster) if not isinstance(cluster, Cluster) else cluster
    g = _validate(cl, op, nbytes, nodes, gpus_per_node)
    fab = _fabric(cl, nodes, link_scale, _node_leaves(cl, node_leaves, nodes))
    plan = _choose(fab, op, nbytes, nodes, g, algorithm, protocol, _node_order(node_order, nodes))
    gen = rng if rng is not None else np.random.default_rng(cl.network.ecmp_seed)
    up, up_link, up_flows = _draw_uplink_link(fab, plan.pattern, plan.cap, gen)
    t = float(_times(plan, nbytes, np.array([up]))[0])
    ranks = nodes * g
    algbw = nbytes / t / 1e9 if t > 0 else 0.0
    data_s = nbytes * max(plan.fixed_time, up) / _PROTO_BW[plan.protocol]
    if plan.floor_s > 0 and plan.floor_s >= data_s:
        # tuning.ring_floor "overlapped" and a floor longer than the data: no link sets this time, the
        # per-step proxy floor does (naming the NIC sent users to the fabric; audit 18)
        name, nflows = "ring-step floor (latency)", 0
    elif up > plan.fixed_time:  # a spine path is the narrowest link of this draw
        # a collision only when hashing had a choice (several spines) and put several flows on this path;
        # one spine, or one flow, is simply the narrowest link (an oversubscribed uplink)
        collided = fab.topo.spines > 1 and up_flows > 1
        name = fab.topo.link_name(up_link) + (" (ECMP collision)" if collided else "")
        nflows = up_flows
    elif plan.fixed_link < 0:
        name, nflows = "NVSwitch (NVLS)", 0
    else:
        name = fab.topo.link_name(plan.fixed_link)
        nflows = int(plan.pattern.fixed_flows[plan.fixed_link])
        if plan.fixed_link < fab.n_net:  # a network link: each connection is qps_per_connection flows,
            nflows *= fab.cluster.network.qps_per_connection  # as the ECMP row and --explain count them
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
        bottleneck_share=1.0 / nflows if nflows else 1.0,
        details={"fixed_s_per_byte": plan.fixed_time, "uplink_s_per_byte": up},
    )


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
    node_order: Sequence[int] | None = None,
    node_leaves: Sequence[int | str] | None = None,
) -> np.ndarray:
    """``n`` independent ECMP draws of the time (s) of one collective, vectorized: algorithm and protocol
    are chosen once (NCCL's choice does not depend on hashing), then each draw's busiest uplink is a
    bincount of its hashed connections (the closed form of the max-min bottleneck; see module doc).
    Cost: O(n x cross-leaf connections), no max-min solve per draw. ``node_order`` and ``node_leaves`` as
    in ``collective_time``."""
    cl = load_cluster(cluster) if not isinstance(cluster, Cluster) else cluster
    g = _validate(cl, op, nbytes, nodes, gpus_per_node)
    if n < 0:
        raise InputError(f"n={n}: must be >= 0")
    fab = _fabric(cl, nodes, link_scale, _node_leaves(cl, node_leaves, nodes))
    plan = _choose(fab, op, nbytes, nodes, g, None, None, _node_order(node_order, nodes))
    out = np.empty(n)
    per_draw = max(1, plan.pattern.x_bytes.size * cl.network.qps_per_connection)
    chunk = max(1, 4_000_000 // per_draw)
    for lo in range(0, n, chunk):
        hi = min(n, lo + chunk)
        out[lo:hi] = _times(plan, nbytes, _draw_uplink_time(fab, plan.pattern, plan.cap, hi - lo, rng))
    return out


def model_terms(cluster: Cluster, op: str, nodes: int, g: int, algorithm: str) -> tuple[float, float, float]:
    """Bandwidth terms of one algorithm at unit efficiency, for fast fitting (calibrate.py):
    (seconds per byte of S on the busiest network link, on the busiest NVLink port, in the NVSwitch).
    ECMP is replaced by its even spread, as in the selection."""
    fab = _fabric(cluster, nodes, None)
    if algorithm == "nvls":
        return 0.0, 0.0, 2.0 * (g - 1) / g / (cluster.tuning.nvls_busbw_gbytes * 1e9)
    if algorithm == "hierarchical":
        nvl = 2 * (g - 1) / g / float(fab.raw[fab.n_net]) if g > 1 else 0.0
        return 2.0 * (nodes - 1) / nodes / cluster.nics.count / float(fab.raw[0]), nvl, 0.0
    if algorithm in ("tree", "nvls_tree"):
        pat = tree_pattern(cluster, fab.topo, nodes, g, True, chain=algorithm == "tree")
    elif algorithm == "p2p":
        pat = alltoall_pattern(cluster, fab.topo, nodes, g)
    else:
        pat = ring_pattern(cluster, fab.topo, op, nodes, g, True)
    ratio = pat.fixed / fab.raw
    nvls_t = 2.0 * (g - 1) / g / (cluster.tuning.nvls_busbw_gbytes * 1e9) if algorithm == "nvls_tree" else 0.0
    return float(ratio[: fab.n_net].max(initial=0.0)), float(ratio[fab.n_net :].max(initial=0.0)), nvls_t


def candidate_plans(cluster: Cluster, op: str, nodes: int, g: int) -> list[tuple[str, str]]:
    """(algorithm, protocol) pairs the selection considers."""
    return [(a, p) for a in _candidates(cluster, op, nodes, g) for p in _protocols(cluster, a, nodes)]


def latency_s(cluster: Cluster, op: str, algorithm: str, protocol: str, nodes: int, g: int) -> float:
    """Latency term of the model (seconds), public for calibration."""
    return _latency_s(cluster, op, algorithm, protocol, nodes, g)


def protocol_bandwidth(protocol: str) -> float:
    """Share of the bandwidth a protocol delivers (NCCL's ratios)."""
    return _PROTO_BW[protocol]
