"""Lab topology: sizes, link rates, names and addresses of every object the lab creates.

Every name starts with the lab's prefix (default ``fp-``), so ``lab down`` can find what a crashed
``lab up`` left behind. Linux limits interface names to 15 characters; names here stay well below.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from fabricpace._errors import InputError

_RATE_UNITS = {
    "bit": 1,
    "kbit": 10**3,
    "mbit": 10**6,
    "gbit": 10**9,
}
# tc reads "bps" as BYTES per second (100mbps = 800 Mbit/s), while most people who write "100mbps" mean
# megabits: `fabric: {uplink: 100mbps}` built 800mbit uplinks without a word. Refused, with both readings.
_BYTE_UNITS = {"bps": 8, "kbps": 8 * 10**3, "mbps": 8 * 10**6, "gbps": 8 * 10**9}
_PREFIX_RE = re.compile(r"^[a-z][a-z0-9]{0,3}-$")
SUBNET = "10.77.0"  # every lab is its own set of namespaces, so labs never see each other's addresses


def parse_rate(text: str, *, option: str = "rate") -> int:
    """'100mbit' -> 100_000_000 bits/s (units: bit, kbit, mbit, gbit; tc's byte units such as 'mbps'
    are refused: they are bytes per second, which is rarely what their writer meant)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]+)\s*", str(text))
    if m and m.group(2).lower() in _BYTE_UNITS:
        num, unit = m.group(1), m.group(2).lower()
        si = unit[:-3]  # "", "k", "m", "g"
        bits = round(float(num) * _BYTE_UNITS[unit])
        raise InputError(
            f"{option} {text!r}: write rates in bits: {num}{si}bit for {num} {si.upper()}bit/s, or "
            f"{format_rate(bits)} for {num} {si.upper()}B/s (tc reads '{unit}' as bytes per second)"
        )
    if not m or m.group(2).lower() not in _RATE_UNITS:
        raise InputError(f"{option} {text!r}: expected a rate such as 100mbit, 1gbit or 500kbit")
    bits = int(float(m.group(1)) * _RATE_UNITS[m.group(2).lower()])
    if not 10_000 <= bits <= 100 * 10**9:
        raise InputError(f"{option} {text!r}: rate must be between 10kbit and 100gbit")
    return bits


def check_prefix(prefix: str) -> str:
    """``prefix`` when it is a lab prefix (``fp-``); else InputError, before anything is looked up.

    ``down`` removes every namespace and root link whose name starts with the prefix and ends every
    process inside those namespaces: ``fp`` would take ``fpa-``'s or ``fps-``'s lab with it, and an
    empty prefix every namespace on the machine. The closing dash keeps one lab's names apart from
    another's."""
    if not _PREFIX_RE.match(str(prefix)):
        raise InputError(
            f"--prefix {prefix!r}: use 1-4 lowercase letters/digits and a dash, e.g. fp- (every name "
            "the lab makes starts with it, so `lab down` removes only that lab)"
        )
    return prefix


def format_rate(bits: int) -> str:
    """100_000_000 -> '100mbit' (exact when possible, else kbit)."""
    for unit, scale in (("gbit", 10**9), ("mbit", 10**6), ("kbit", 10**3)):
        if bits % scale == 0:
            return f"{bits // scale}{unit}"
    return f"{bits}bit"


@dataclass(frozen=True, kw_only=True)
class LabConfig:
    """One lab: ``nodes`` namespaces on ``leaves`` leaf bridges joined by a spine through shaped uplinks."""

    nodes: int = 4
    leaves: int = 2
    uplink_bps: int = 100 * 10**6  # each leaf <-> spine link, shaped in both directions
    node_link_bps: int = 1 * 10**9  # each node <-> leaf link, shaped in both directions
    prefix: str = "fp-"
    foreign_hosts: bool = True  # one extra namespace on the first and last leaf for foreign traffic

    def __post_init__(self) -> None:
        if not 1 <= self.nodes <= 64:
            raise InputError(f"--nodes {self.nodes}: choose 1 to 64 nodes")
        if not 1 <= self.leaves <= min(self.nodes, 16):
            raise InputError(f"--leaves {self.leaves}: choose 1 to min(nodes, 16) leaves")
        check_prefix(self.prefix)

    # --- names (all begin with the prefix) -------------------------------------------------------
    @property
    def switch_ns(self) -> str:
        return f"{self.prefix}sw"

    def node_ns(self, node: int) -> str:
        return f"{self.prefix}n{node}"

    def foreign_ns(self, side: int) -> str:
        return f"{self.prefix}x{side}"

    def leaf_bridge(self, leaf: int) -> str:
        return f"{self.prefix}leaf{leaf}"

    @property
    def spine_bridge(self) -> str:
        return f"{self.prefix}spine"

    def uplink_leaf_end(self, leaf: int) -> str:
        """The uplink's port on the leaf bridge; its egress carries leaf -> spine traffic."""
        return f"{self.prefix}up{leaf}l"

    def uplink_spine_end(self, leaf: int) -> str:
        """The uplink's port on the spine bridge; its egress carries spine -> leaf traffic."""
        return f"{self.prefix}up{leaf}s"

    def node_port(self, node: int) -> str:
        """The node link's port on its leaf bridge (in the switch namespace)."""
        return f"{self.prefix}p{node}"

    def foreign_port(self, side: int) -> str:
        return f"{self.prefix}px{side}"

    NODE_IFACE = "eth0"  # inside each node namespace (GLOO_SOCKET_IFNAME)

    # --- topology ---------------------------------------------------------------------------------
    def leaf_of(self, node: int) -> int:
        """Nodes fill leaves contiguously: with 4 nodes on 2 leaves, nodes 0,1 -> leaf 0; 2,3 -> leaf 1."""
        return node * self.leaves // self.nodes

    def node_addr(self, node: int) -> str:
        return f"{SUBNET}.{node + 1}"

    def foreign_addr(self, side: int) -> str:
        return f"{SUBNET}.{201 + side}"

    def foreign_leaf(self, side: int) -> int:
        return 0 if side == 0 else self.leaves - 1

    def to_dict(self) -> dict[str, object]:
        return {
            "nodes": self.nodes,
            "leaves": self.leaves,
            "uplink": format_rate(self.uplink_bps),
            "node_link": format_rate(self.node_link_bps),
            "prefix": self.prefix,
            "foreign_hosts": self.foreign_hosts,
            "node_leaf": [self.leaf_of(n) for n in range(self.nodes)],
            "node_addr": [self.node_addr(n) for n in range(self.nodes)],
        }

    @classmethod
    def from_dict(cls, raw: dict[str, object]) -> LabConfig:
        return cls(
            nodes=int(raw["nodes"]),  # type: ignore[call-overload]
            leaves=int(raw["leaves"]),  # type: ignore[call-overload]
            uplink_bps=parse_rate(str(raw["uplink"])),
            node_link_bps=parse_rate(str(raw["node_link"])),
            prefix=str(raw["prefix"]),
            foreign_hosts=bool(raw.get("foreign_hosts", True)),
        )


def placement(world: int, cfg: LabConfig, mode: str) -> list[int]:
    """Rank -> node. ``contiguous``: rank r on node r (ring neighbours share a leaf).
    ``interleaved``: consecutive ranks alternate leaves, so every ring hop crosses the spine."""
    if world > cfg.nodes:
        raise InputError(f"{world} ranks need at least {world} lab nodes; run `lab up --nodes {world}`")
    if mode == "contiguous":
        return list(range(world))
    if mode != "interleaved":
        raise InputError(f"placement {mode!r}: choose contiguous or interleaved")
    by_leaf: dict[int, list[int]] = {}
    for n in range(world):
        by_leaf.setdefault(cfg.leaf_of(n), []).append(n)
    order: list[int] = []
    queues = [list(v) for _, v in sorted(by_leaf.items())]
    while any(queues):
        for q in queues:
            if q:
                order.append(q.pop(0))
    return order
