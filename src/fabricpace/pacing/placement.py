"""Placement: a rank order that keeps ring neighbours inside a leaf switch.

A ring collective sends every byte over every edge of the ring (position i -> i+1, wrapping). An edge
whose two ends sit under different leaf switches crosses the spine, where oversubscription and ECMP
collisions live. Grouping nodes by leaf leaves exactly one crossing per used leaf when the ring leaves
it (zero when all nodes share a leaf), the minimum any order can reach (each leaf must be entered and
left at least once). The order is stable: nodes keep their relative order inside a leaf.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


def cross_leaf_edges(leaves: Sequence[int]) -> int:
    """Ring edges (including the wrap-around) whose two ends are on different leaves."""
    n = len(leaves)
    if n < 2:
        return 0
    return sum(1 for i in range(n) if leaves[i] != leaves[(i + 1) % n])


def ring_bytes_per_edge(nbytes: int, n: int) -> float:
    """Bytes a ring all-reduce of ``nbytes`` sends over each edge: 2(n-1)/n * S (REFERENCES.md)."""
    return 0.0 if n < 2 else 2.0 * (n - 1) / n * nbytes


def propose_order(leaves: Sequence[int]) -> tuple[int, ...]:
    """Positions -> original index, grouped by leaf (stable); leaves in order of first appearance."""
    first: dict[int, int] = {}
    for i, leaf in enumerate(leaves):
        first.setdefault(leaf, i)
    return tuple(sorted(range(len(leaves)), key=lambda i: (first[leaves[i]], i)))


@dataclass(frozen=True, kw_only=True)
class PlacementPlan:
    """A proposed order and what it saves."""

    order: tuple[int, ...]
    edges_before: int
    edges_after: int
    bytes_before: float
    bytes_after: float

    @property
    def improves(self) -> bool:
        return self.edges_after < self.edges_before


def plan_placement(leaves: Sequence[int], *, nbytes: int = 1 << 30) -> PlacementPlan:
    """Proposed order plus cross-leaf ring edges and bytes per all-reduce of ``nbytes``, before/after."""
    order = propose_order(leaves)
    after = [leaves[i] for i in order]
    per_edge = ring_bytes_per_edge(nbytes, len(leaves))
    before_edges, after_edges = cross_leaf_edges(leaves), cross_leaf_edges(after)
    if after_edges >= before_edges:  # already optimal: keep the user's order
        order, after_edges = tuple(range(len(leaves))), before_edges
    return PlacementPlan(
        order=order,
        edges_before=before_edges,
        edges_after=after_edges,
        bytes_before=before_edges * per_edge,
        bytes_after=after_edges * per_edge,
    )
