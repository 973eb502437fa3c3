"""Topology: the links of a cluster (with capacities) and the link path of any flow, vectorized.

Link layout for a job on ``nodes`` nodes (node ids 0..nodes-1; by default consecutive ids share a leaf, the
way schedulers pack jobs, and ``node_leaves`` gives the leaf of each node where they do not)::

    [0, NR)                 NIC transmit     (node, nic)
    [NR, 2NR)               NIC receive      (node, nic)
    [2NR, 2NR+LS)           leaf -> spine uplinks   (leaf, spine)
    [2NR+LS, 2NR+2LS)       spine -> leaf downlinks (leaf, spine)
    [.., +NG) / [.., +NG)   GPU NVLink/PCIe transmit / receive (node, gpu)

N = nodes, R = NICs per node, L = leaves (for rail-optimized: one leaf per (group, rail)), S = spines,
G = GPUs per node. Each (leaf, spine) pair is one equal-cost path; its capacity is the leaf's downlink
capacity divided by oversubscription and by S. Routing picks the spine: ECMP hashes each connection
onto one spine (a draw), spraying puts 1/S of the flow on every spine.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fabricpace.fabric.cluster import Cluster


@dataclass(frozen=True)
class Routes:
    """Sparse flow x link incidence: flow ``flow[i]`` puts weight ``weight[i]`` of its rate on ``link[i]``."""

    n_flows: int
    flow: np.ndarray
    link: np.ndarray
    weight: np.ndarray


@dataclass(frozen=True)
class Topology:
    """Links of ``cluster`` restricted to a job on ``nodes`` nodes."""

    cluster: Cluster
    nodes: int
    capacity: np.ndarray = field(repr=False)  # bytes/s per link
    nics_per_node: int
    n_leaves: int
    spines: int
    node_group: np.ndarray | None = field(default=None, repr=False, compare=False)  # leaf block per node

    @staticmethod
    def build(
        cluster: Cluster,
        nodes: int,
        *,
        link_scale: np.ndarray | None = None,
        node_leaves: tuple[int, ...] | None = None,
    ) -> Topology:
        """Links and capacities for ``nodes`` nodes; ``link_scale`` multiplies capacities (slow links).
        ``node_leaves``: the leaf of each node, numbered 0..L-1 (a job the scheduler spread 2 + 2 over two
        leaves of 4); None packs consecutive nodes ``nodes_per_leaf`` to a leaf. A leaf's uplinks are
        those of a whole leaf of the cluster, however few of its nodes the job holds."""
        R = cluster.nics.count
        G = cluster.gpus_per_node
        S = cluster.network.spines if cluster.network.topology != "single_switch" else 1
        group_of: np.ndarray | None = None
        if node_leaves is not None and cluster.network.topology != "single_switch":
            group_of = np.asarray(node_leaves, dtype=np.int64)
            if group_of.shape != (nodes,) or (group_of < 0).any():
                got = list(node_leaves)[:12]
                raise ValueError(f"node_leaves: expected {nodes} leaf numbers >= 0, got {got}")
            groups = int(group_of.max()) + 1 if nodes else 1
            npl = max(cluster.nodes_per_leaf, int(np.bincount(group_of).max(initial=1)))
        else:
            npl = min(cluster.nodes_per_leaf, max(nodes, 1))
            groups = -(-nodes // npl)
        L = groups * R if cluster.network.topology == "rail_optimized" else groups
        nic = cluster.nic_bytes_per_s
        nics_per_leaf = npl if cluster.network.topology == "rail_optimized" else npl * R
        up = nics_per_leaf * nic / (cluster.network.oversubscription * S)
        gpu = cluster.intra_node.bandwidth_gbytes * 1e9
        cap = np.concatenate(
            [
                np.full(2 * nodes * R, nic),
                np.full(2 * L * S, up),
                np.full(2 * nodes * G, gpu),
            ]
        )
        if link_scale is not None:
            scale = np.asarray(link_scale, dtype=float)
            if scale.shape != cap.shape:
                raise ValueError(f"link_scale has shape {scale.shape}, expected {cap.shape}")
            cap = cap * scale
        return Topology(
            cluster=cluster, nodes=nodes, capacity=cap, nics_per_node=R, n_leaves=L, spines=S,
            node_group=group_of,
        )

    @property
    def leaf_groups(self) -> int:
        """Leaves the job spans (rail-optimized: groups of rail leaves)."""
        if self.node_group is not None:
            return int(self.node_group.max(initial=0)) + 1
        return -(-self.nodes // min(self.cluster.nodes_per_leaf, max(self.nodes, 1)))

    # ---- link index helpers ------------------------------------------------------------------------
    @property
    def n_links(self) -> int:
        return int(self.capacity.shape[0])

    def nic_tx(self, node: np.ndarray, nic: np.ndarray) -> np.ndarray:
        return node * self.nics_per_node + nic

    def nic_rx(self, node: np.ndarray, nic: np.ndarray) -> np.ndarray:
        return self.nodes * self.nics_per_node + node * self.nics_per_node + nic

    def uplink(self, leaf: np.ndarray, spine: np.ndarray) -> np.ndarray:
        return 2 * self.nodes * self.nics_per_node + leaf * self.spines + spine

    def downlink(self, leaf: np.ndarray, spine: np.ndarray) -> np.ndarray:
        return 2 * self.nodes * self.nics_per_node + self.n_leaves * self.spines + leaf * self.spines + spine

    def gpu_tx(self, node: np.ndarray, gpu: np.ndarray) -> np.ndarray:
        base = 2 * self.nodes * self.nics_per_node + 2 * self.n_leaves * self.spines
        return base + node * self.cluster.gpus_per_node + gpu

    def gpu_rx(self, node: np.ndarray, gpu: np.ndarray) -> np.ndarray:
        base = 2 * self.nodes * self.nics_per_node + 2 * self.n_leaves * self.spines
        return base + self.nodes * self.cluster.gpus_per_node + node * self.cluster.gpus_per_node + gpu

    def leaf(self, node: np.ndarray, nic: np.ndarray) -> np.ndarray:
        """Leaf switch a (node, nic) port is cabled to."""
        if self.node_group is not None:
            group = self.node_group[node]
        else:
            group = node // min(self.cluster.nodes_per_leaf, max(self.nodes, 1))
        if self.cluster.network.topology == "rail_optimized":
            return group * self.nics_per_node + nic
        return group

    def link_name(self, link: int) -> str:
        """Human-readable name of a link index (for --explain)."""
        NR = self.nodes * self.nics_per_node
        LS = self.n_leaves * self.spines
        G = self.cluster.gpus_per_node
        if link < NR:
            return f"node{link // self.nics_per_node}.nic{link % self.nics_per_node}->switch"
        if link < 2 * NR:
            k = link - NR
            return f"switch->node{k // self.nics_per_node}.nic{k % self.nics_per_node}"
        if link < 2 * NR + LS:
            k = link - 2 * NR
            return f"leaf{k // self.spines}->spine{k % self.spines}"
        if link < 2 * NR + 2 * LS:
            k = link - 2 * NR - LS
            return f"spine{k % self.spines}->leaf{k // self.spines}"
        k = link - 2 * NR - 2 * LS
        kind = "tx" if k < self.nodes * G else "rx"
        k %= self.nodes * G
        return f"node{k // G}.gpu{k % G}.nvlink-{kind}"

    # ---- routing -------------------------------------------------------------------------------------
    def route(
        self,
        src_node: np.ndarray,
        src_nic: np.ndarray,
        dst_node: np.ndarray,
        dst_nic: np.ndarray,
        spine: np.ndarray | None,
    ) -> Routes:
        """Paths of inter-node flows (src_node != dst_node). ``spine``: the ECMP draw per flow (ints in
        [0, S)), or None to spray each flow evenly over all spines."""
        src_node = np.asarray(src_node, dtype=np.int64)
        dst_node = np.asarray(dst_node, dtype=np.int64)
        src_nic = np.asarray(src_nic, dtype=np.int64)
        dst_nic = np.asarray(dst_nic, dtype=np.int64)
        n = src_node.shape[0]
        ids = np.arange(n, dtype=np.int64)
        flows = [ids, ids]
        links = [self.nic_tx(src_node, src_nic), self.nic_rx(dst_node, dst_nic)]
        weights = [np.ones(n), np.ones(n)]
        la, lb = self.leaf(src_node, src_nic), self.leaf(dst_node, dst_nic)
        cross = np.nonzero(la != lb)[0]
        if cross.size:
            if spine is None:
                S = self.spines
                f = np.repeat(cross, S)
                s = np.tile(np.arange(S, dtype=np.int64), cross.size)
                w = np.full(f.shape[0], 1.0 / S)
            else:
                f = cross
                s = np.asarray(spine, dtype=np.int64)[cross]
                w = np.ones(cross.size)
            flows += [f, f]
            links += [self.uplink(la[f], s), self.downlink(lb[f], s)]
            weights += [w, w]
        return Routes(
            n_flows=n,
            flow=np.concatenate(flows),
            link=np.concatenate(links),
            weight=np.concatenate(weights),
        )
