"""The lab as the rest of fabricpace sees a cluster: a cluster file, a hosts file, and rank orders.

``lab run`` writes into ``RUN/lab/``:

* ``cluster.yaml`` — a cluster file (docs/cluster-files.md) mirroring the lab's fabric: one node per
  namespace with one GPU (one rank), one NIC per node at the node-link rate, the lab's leaves as a
  leaf-spine with one spine and the uplink rate as the oversubscription (uplink = nodes per leaf ×
  node link / oversubscription), the TCP goodput the lab measured as the network efficiency. With it,
  ``fabricpace diagnose RUN --cluster``, ``collective``, ``simulate`` and ``place`` price the lab the way
  they price a real cluster.
* ``hosts.txt`` — the run's rank order in ``fabricpace place``'s hosts-file format (``fp-n2 slots=1  #
  node=2 leaf=1``), so ``place --cluster RUN/lab/cluster.yaml --hosts RUN/lab/hosts.txt`` proposes a
  better one, and ``lab run --placement FILE`` replays it.

A placement is ``contiguous``, ``interleaved``, a list of node ids in rank order (rank k on node
``order[k]``, as ``simulate``'s node order and ``place --format json``'s ``order`` read for a hosts file
in node order), or a hosts file: each host is a lab node, named ``fp-nK`` (any lab prefix, or none:
``nK``) or tagged ``node=K``, one rank each.
"""

from __future__ import annotations

import re
from pathlib import Path

from fabricpace._errors import InputError
from fabricpace.hostfile import parse_hosts
from fabricpace.lab.config import LabConfig, format_rate, placement

CLUSTER_FILE = "lab/cluster.yaml"
HOSTS_FILE = "lab/hosts.txt"
# TCP goodput of a shaped lab link over its tc rate, measured with `lab measure` (docs/lab.md: 93.8% of
# 20 Mbit/s, 95.2% of 200 Mbit/s, 91-94% of 100 Mbit/s): the ~5% are TCP/IP headers inside the rate.
NET_EFFICIENCY = 0.94
# No delay is emulated (no netem): a hop is a Linux bridge, a NIC a veth and the kernel's TCP stack.
# Both are the kernel's own; the values keep the model's latency terms small, as the lab's are
# (ping across the spine: tens of µs), next to transfers of milliseconds at the lab's rates.
HOP_LATENCY_US = 5.0
NIC_LATENCY_US = 20.0
_HOST = re.compile(r"^(?:[a-z][a-z0-9]{0,3}-)?n(\d+)$")  # fp-n3, a4-n3, n3


def cluster_name(cfg: LabConfig) -> str:
    return f"lab-{cfg.nodes}n-{cfg.leaves}leaf-{format_rate(cfg.uplink_bps)}"


def nodes_per_leaf(cfg: LabConfig) -> int | None:
    """The cluster file's nodes_per_leaf that puts every node on its lab leaf; None when none does (the
    lab spreads nodes over leaves as evenly as it can, a cluster file fills each leaf in turn)."""
    per = -(-cfg.nodes // cfg.leaves)
    ok = all(n // per == cfg.leaf_of(n) for n in range(cfg.nodes))
    return per if ok else None


def cluster_yaml(cfg: LabConfig) -> str | None:
    """The lab's fabric as a cluster file (validated by the cluster model), or None when the lab's
    leaves cannot be written as one (say 6 nodes on 4 leaves: 2,1,2,1 nodes a leaf)."""
    from fabricpace.fabric import Cluster

    per = nodes_per_leaf(cfg)
    if per is None:
        return None
    node_gbps = cfg.node_link_bps / 1e9
    # A faster uplink than the leaf's node links together is no bottleneck: 1:1 says the same.
    oversub = max(1.0, per * cfg.node_link_bps / cfg.uplink_bps)
    cl = Cluster.model_validate({
        "name": cluster_name(cfg),
        "description": (f"fabricpace lab {cfg.prefix}: {cfg.nodes} namespaces x 1 rank on {cfg.leaves} "
                        f"leaf bridges and one spine; node links {format_rate(cfg.node_link_bps)}, uplinks "
                        f"{format_rate(cfg.uplink_bps)}, both shaped with tc htb in each direction"),
        "nodes": cfg.nodes,
        "gpus_per_node": 1,
        "intra_node": {"kind": "pcie", "bandwidth_gbytes": 10.0, "latency_us": 1.0},
        "nics": {"per": "node", "count": 1, "speed_gbps": node_gbps},
        "network": {"topology": "leaf_spine", "nodes_per_leaf": per, "spines": 1,
                    "oversubscription": round(oversub, 6), "routing": "ecmp",
                    "hop_latency_us": HOP_LATENCY_US, "nic_latency_us": NIC_LATENCY_US},
        "tuning": {"net_efficiency": NET_EFFICIENCY, "channels": 1, "nvls": False,
                   "source": "lab measure goodput"},
    })
    head = (f"# Written by `fabricpace lab run`: the lab's fabric as a cluster file.\n"
            f"# uplink = nodes_per_leaf x node link / oversubscription = {per} x "
            f"{format_rate(cfg.node_link_bps)} / {oversub:g} = {format_rate(cfg.uplink_bps)}\n"
            f"# no delay is emulated: the latencies are the kernel's bridges and TCP stack, kept small\n")
    return head + cl.to_yaml()


def hosts_text(cfg: LabConfig, rank_node: list[int]) -> str:
    """The run's rank order as a hosts file (``fabricpace place --hosts``; ``lab run --placement``)."""
    return "".join(f"{cfg.node_ns(n)} slots=1  # node={n} leaf={cfg.leaf_of(n)}\n" for n in rank_node)


def resolve(spec: str | list[int], cfg: LabConfig, world: int, *, source: str) -> list[int]:
    """Rank -> node for the placement ``spec``; InputError (one line, naming ``source``) on bad input."""
    if isinstance(spec, list):
        return _check_order(spec, cfg, world, what=f"{source}: placement {','.join(map(str, spec))}")
    if spec in ("contiguous", "interleaved"):
        return placement(world, cfg, spec)
    return _from_hosts(Path(spec), cfg, world)


def parse_order(text: str) -> list[int] | None:
    """``0,2,1,3`` -> [0, 2, 1, 3]; None when ``text`` is not a comma-separated list of numbers."""
    parts = [p.strip() for p in text.split(",")]
    if len(parts) < 2 or not all(p.isdigit() for p in parts):
        return None
    return [int(p) for p in parts]


def _check_order(order: list[int], cfg: LabConfig, world: int, *, what: str) -> list[int]:
    if len(order) != world:
        raise InputError(f"{what}: {len(order)} nodes for a {world}-rank run; give one node per rank "
                         f"(or --nodes {len(order)})")
    bad = [n for n in order if not 0 <= n < cfg.nodes]
    if bad:
        raise InputError(f"{what}: node {bad[0]} is not in the lab (nodes 0-{cfg.nodes - 1})")
    twice = sorted({n for n in order if order.count(n) > 1})
    if twice:
        raise InputError(f"{what}: node {twice[0]} is given twice; the lab runs one rank per node")
    return list(order)


def _from_hosts(path: Path, cfg: LabConfig, world: int) -> list[int]:
    if not path.is_file():
        raise InputError(f"placement {str(path)!r}: not contiguous, interleaved, a node order such as "
                         "0,2,1,3, or an existing hosts file")
    order: list[int] = []
    for h in parse_hosts(path):
        m = _HOST.match(h.name)
        node = h.node if h.node is not None else int(m.group(1)) if m else None
        if node is None:
            raise InputError(f"{path}:{h.line}: host {h.name!r} is not a lab node; name the lab's nodes "
                             f"{cfg.node_ns(0)} .. {cfg.node_ns(cfg.nodes - 1)} or tag the line node=K")
        if m and h.node is not None and int(m.group(1)) != h.node:
            raise InputError(f"{path}:{h.line}: host {h.name!r} with node={h.node}; give one of them, "
                             "or fix the one that is wrong")
        if h.slots not in (None, 1):
            raise InputError(f"{path}:{h.line}: slots={h.slots}: the lab runs one rank per node; "
                             "write slots=1 (or no count)")
        if not 0 <= node < cfg.nodes:
            raise InputError(f"{path}:{h.line}: node {node} is not in the lab (nodes 0-{cfg.nodes - 1}); "
                             f"use --nodes {node + 1} or more")
        if h.leaf is not None and h.leaf != str(cfg.leaf_of(node)):
            raise InputError(f"{path}:{h.line}: leaf={h.leaf}, but lab node {node} is on leaf "
                             f"{cfg.leaf_of(node)}; fix or drop the leaf= tag")
        order.append(node)
    return _check_order(order, cfg, world, what=f"{path}")


def label(spec: str | list[int]) -> str | list[int]:
    """The placement as the manifest and lab.json record it: a file by its name, the rest as given."""
    if isinstance(spec, list) or spec in ("contiguous", "interleaved"):
        return spec
    return f"hosts file {Path(spec).name}"
