"""Node order: NCCL's rings and trees follow the ranks' node order, so a hostfile that is not sorted by
leaf makes ring neighbours cross the spine."""

from __future__ import annotations

import numpy as np
import pytest

from fabricpace._errors import InputError
from fabricpace.fabric import load_cluster, sample_collective_times
from fabricpace.fabric.patterns import ring_edges, tree_edges
from fabricpace.fabric.topology import Topology
from fabricpace.pacing.placement import cross_leaf_edges, propose_order
from fabricpace.study import load_scenario


@pytest.fixture(scope="module")
def paper():  # type: ignore[no-untyped-def]
    """4 nodes per leaf, 4 spines, 2:1, ECMP, 2 NICs per node."""
    return load_cluster(load_scenario("paper").cluster)


def _crossings(cluster, nodes: int, order) -> int:  # type: ignore[no-untyped-def]
    topo = Topology.build(cluster, nodes)
    src, dst, nic, _ = ring_edges(cluster, "all_reduce", nodes, cluster.gpus_per_node, order)
    return int((topo.leaf(src, nic) != topo.leaf(dst, nic)).sum())


def test_ring_edges_follow_the_order_and_count_crossings_like_placement(paper):
    order = (2, 5, 0, 7, 1, 4, 6, 3)
    src, dst, _, _ = ring_edges(paper, "all_reduce", 8, 8, order)
    n = len(order)
    assert list(src[:n]) == list(order)
    assert list(dst[:n]) == [order[(i + 1) % n] for i in range(n)]
    leaves = [node // 4 for node in order]
    per_channel = _crossings(paper, 8, order) // (src.size // n)
    assert per_channel == cross_leaf_edges(leaves) == 6
    grouped = tuple(order[i] for i in propose_order(leaves))
    assert _crossings(paper, 8, grouped) == _crossings(paper, 8, None)  # 2 per channel: the minimum


def test_tree_edges_map_positions_to_nodes(paper):
    order = tuple(range(7, -1, -1))
    s0, d0, _, _ = tree_edges(paper, 8, 8)
    s1, d1, _, _ = tree_edges(paper, 8, 8, order)
    rev = np.asarray(order)
    assert np.array_equal(s1, rev[s0]) and np.array_equal(d1, rev[d0])


def test_a_shuffled_hostfile_is_slower_on_an_oversubscribed_spine_and_placement_undoes_it(paper):
    nodes = 16
    order = tuple(int(v) for v in np.random.default_rng(3).permutation(nodes))
    grouped = tuple(order[i] for i in propose_order([n // 4 for n in order]))

    def mean_time(o):  # type: ignore[no-untyped-def]
        t = sample_collective_times(
            paper, "all_reduce", 25 << 20, nodes=nodes, n=400, rng=np.random.default_rng(1), node_order=o
        )
        return float(t.mean())

    packed, shuffled, placed = mean_time(None), mean_time(order), mean_time(grouped)
    assert shuffled > 1.5 * packed  # 12+ crossings per channel instead of 4 on a 2:1 spine
    assert placed == pytest.approx(packed, rel=0.05)
    identity = mean_time(tuple(range(nodes)))
    assert identity == packed  # the identity order is the packed order


def test_a_bad_node_order_is_a_one_line_input_error(paper):
    with pytest.raises(InputError, match="node_order"):
        sample_collective_times(
            paper, "all_reduce", 1 << 20, nodes=4, n=1, rng=np.random.default_rng(0), node_order=[0, 1, 1, 3]
        )
