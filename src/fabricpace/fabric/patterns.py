"""Flow patterns of collective algorithms: which connections each algorithm opens between nodes, on
which NICs, and how many bytes (per byte of S) each carries; plus their load on NIC and NVLink ports.

* ring: one ring per channel over the nodes in order; channel c leaves each node from GPU c mod g on that
  GPU's rail, so channels spread evenly over the NICs; each ring edge carries factor(op) / C of S.
* tree: NCCL's double binary tree idea -- an in-order binary tree over the nodes and its mirror image,
  each carrying half of S, up (reduce) and down (broadcast).
* all-to-all: every node pair, spread over the NICs (PXN puts the traffic on the destination's rail).

Cross-leaf connections are returned separately so that ECMP can hash them (see collectives.py).

``order`` (ring and tree): the job's node at each position of the algorithm, ``order[p]`` = node id
(nodes are numbered in leaf order, as the topology packs them). NCCL builds its inter-node rings and
trees in rank order, so this is the order of the nodes in the hostfile / rendezvous; None is the packed
order 0..N-1.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fabricpace.fabric.cluster import Cluster
from fabricpace.fabric.topology import Topology


def ring_factor(op: str, ranks: int) -> float:
    """Bytes each rank sends per byte of S in a ring: 2(n-1)/n all-reduce, 1 broadcast, else (n-1)/n."""
    if ranks <= 1:
        return 0.0
    if op == "all_reduce":
        return 2.0 * (ranks - 1) / ranks
    if op == "broadcast":
        return 1.0
    return (ranks - 1) / ranks


@dataclass(frozen=True)
class Pattern:
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


def channels(cluster: Cluster) -> int:
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


def edges_pattern(
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
        # a sprayed connection crosses every spine path of its leaves (for --explain's flow counts)
        flows += np.bincount(topo.uplink(np.repeat(xa, S), np.tile(spines, xa.size)), minlength=L)
        flows += np.bincount(topo.downlink(np.repeat(xb, S), np.tile(spines, xb.size)), minlength=L)
        xa = xb = np.zeros(0, dtype=np.int64)
        xbytes = np.zeros(0)
    return fixed, flows, xa, xb, xbytes


def _at(order: tuple[int, ...] | None, pos: np.ndarray) -> np.ndarray:
    """Node ids at algorithm positions ``pos``."""
    return pos if order is None else np.asarray(order, dtype=np.int64)[pos]


def ring_edges(
    cluster: Cluster, op: str, nodes: int, g: int, order: tuple[int, ...] | None = None
) -> tuple[np.ndarray, ...]:
    """Inter-node connections of a ring collective: (src node, dst node, NIC, bytes per byte of S).

    One ring per channel over the nodes in ``order``; channel c leaves each node from GPU c mod g on that
    GPU's rail, so channels spread evenly over the NICs."""
    factor = ring_factor(op, nodes * g)
    C = channels(cluster)
    ch = np.repeat(np.arange(C), nodes)
    pos = np.tile(np.arange(nodes), C)
    src, dst = _at(order, pos), _at(order, (pos + 1) % nodes)
    nic = _nic_of_channel(cluster, ch % g, ch)
    return src, dst, nic, np.full(src.shape[0], factor / C)


def ring_pattern(
    cluster: Cluster,
    topo: Topology,
    op: str,
    nodes: int,
    g: int,
    spray: bool,
    order: tuple[int, ...] | None = None,
) -> Pattern:
    factor = ring_factor(op, nodes * g)
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
        return Pattern(fixed, empty, empty, np.zeros(0), flows)
    src, dst, nic, per_edge = ring_edges(cluster, op, nodes, g, order)
    f, fl, xa, xb, xbytes = edges_pattern(topo, src, dst, per_edge, nic, nic, spray)
    return Pattern(fixed + f, xa, xb, xbytes, flows + fl)


def _inorder_parents(nodes: int) -> np.ndarray:
    """Parent of every node in an in-order binary tree over 0..N-1 (the shape NCCL's btree uses): a
    node's lowest set bit b gives its level; its parent is (r xor b) | 2b, or r xor b past the end.
    Subtrees are contiguous ranges of nodes, so most edges stay inside a leaf. Node 0 is the root."""
    r = np.arange(nodes, dtype=np.int64)
    par = np.full(nodes, -1, dtype=np.int64)
    if nodes < 2:
        return par
    low = r[1:] & -r[1:]
    up = (r[1:] ^ low) | (low << 1)
    par[1:] = np.where(up < nodes, up, r[1:] ^ low)
    return par


def _btree_parents(nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """NCCL's double binary tree idea: the in-order tree and its mirror image (shifted by one node when N
    is odd), so that most leaves of one tree are interior nodes of the other."""
    t0 = _inorder_parents(nodes)
    r = np.arange(nodes)
    if nodes % 2 == 0:
        src = nodes - 1 - r
        p = t0[src]
        t1 = np.where(p >= 0, nodes - 1 - p, -1)
    else:
        src = (r - 1) % nodes
        p = t0[src]
        t1 = np.where(p >= 0, (p + 1) % nodes, -1)
    return t0, t1


def tree_edges(
    cluster: Cluster, nodes: int, g: int, order: tuple[int, ...] | None = None
) -> tuple[np.ndarray, ...]:
    """Inter-node connections of the double binary tree all-reduce: (src, dst, NIC, bytes per byte of S).
    Each tree carries half of S, up (reduce) and down (broadcast). As in NCCL (which duplicates the
    channels, tree 0 on channel c and tree 1 on channel c + C), both trees run on every channel, so every
    NIC carries both trees and a node that is interior in one tree is mostly a leaf in the other."""
    C = channels(cluster)
    srcs, dsts, nics, byts = [], [], [], []
    per = 0.5 / C
    for par in _btree_parents(nodes):
        child = np.nonzero(par >= 0)[0]
        for k in range(C):
            # channel k leaves from GPU k mod g on that GPU's rail (or NIC k mod R with NICs per node)
            nic = _nic_of_channel(cluster, np.full(child.size, k % g), np.full(child.size, k))
            srcs += [_at(order, child), _at(order, par[child])]
            dsts += [_at(order, par[child]), _at(order, child)]
            nics += [nic, nic]
            byts += [np.full(child.size, per), np.full(child.size, per)]
    return tuple(np.concatenate(x) for x in (srcs, dsts, nics, byts))


def tree_pattern(
    cluster: Cluster,
    topo: Topology,
    nodes: int,
    g: int,
    spray: bool,
    *,
    chain: bool = True,
    order: tuple[int, ...] | None = None,
) -> Pattern:
    """Tree all-reduce; ``chain=False`` leaves out the intra-node chain (NVLS-tree reduces in the switch)."""
    L = topo.n_links
    fixed = np.zeros(L)
    flows = np.zeros(L, dtype=np.int64)
    if g > 1 and chain:  # intra-node chain: reduce up and broadcast down, S each way
        gpus = np.arange(nodes * g)
        fixed[topo.gpu_tx(gpus // g, gpus % g)] += 2.0
        fixed[topo.gpu_rx(gpus // g, gpus % g)] += 2.0
        flows[topo.gpu_tx(gpus // g, gpus % g)] += 1
    empty = np.zeros(0, dtype=np.int64)
    if nodes == 1:
        return Pattern(fixed, empty, empty, np.zeros(0), flows)
    src, dst, nic, b = tree_edges(cluster, nodes, g, order)
    f, fl, xa, xb, xbytes = edges_pattern(topo, src, dst, b, nic, nic, spray)
    return Pattern(fixed + f, xa, xb, xbytes, flows + fl)


def alltoall_pattern(cluster: Cluster, topo: Topology, nodes: int, g: int) -> Pattern:
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
        return Pattern(fixed, empty, empty, np.zeros(0), flows)
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
    f, fl, xa, xb, xbytes = edges_pattern(topo, src_r, dst_r, np.full(src_r.size, per_pair), nic, nic, True)
    return Pattern(fixed + f, xa, xb, xbytes, flows + fl)
