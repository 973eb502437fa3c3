"""node_leaves: a job the scheduler did not pack (2 + 2 nodes on two leaves of 4) is priced on its own
leaves. Physically, two nodes under each of two leaves of 4 at 4:1 have the uplinks of a leaf of 2 at 2:1,
so the model must give the same time as that packed cluster, draw for draw."""

from __future__ import annotations

import numpy as np
import pytest

from fabricpace._errors import InputError
from fabricpace.fabric import collective_time, load_cluster, sample_collective_times
from fabricpace.fabric.topology import Topology


def _variant(nodes_per_leaf: int, oversubscription: float, topology: str = "leaf_spine"):  # type: ignore[no-untyped-def]
    base = load_cluster("roce-leaf-spine-2to1")
    net = base.network.model_copy(update={
        "nodes_per_leaf": nodes_per_leaf, "spines": 8, "oversubscription": oversubscription,
        "topology": topology,
    })
    return base.model_copy(update={"network": net})


WIDE, NARROW = _variant(4, 4.0), _variant(2, 2.0)  # per leaf: 4 nodes' NICs / 4 == 2 nodes' NICs / 2


@pytest.mark.parametrize("op", ["all_reduce", "all_gather", "reduce_scatter", "all_to_all"])
@pytest.mark.parametrize("nbytes", [1 << 24, 1 << 27, 1 << 30])
def test_two_plus_two_on_leaves_of_four_is_a_packed_cluster_with_leaves_of_two(op, nbytes):  # type: ignore[no-untyped-def]
    want = collective_time(NARROW, op, nbytes, nodes=4)
    # NCCL's algorithm and protocol choice does not know the leaves; force the same plan
    got = collective_time(WIDE, op, nbytes, nodes=4, node_leaves=["b", "b", "a", "a"],
                          algorithm=want.algorithm, protocol=want.protocol)
    assert got.time_s == want.time_s
    assert got.bottleneck == want.bottleneck
    packed = collective_time(WIDE, op, nbytes, nodes=4, algorithm=want.algorithm, protocol=want.protocol)
    assert packed.time_s < got.time_s  # one leaf: no uplinks, one switch hop


def test_sampled_draws_match_too():  # type: ignore[no-untyped-def]
    a = sample_collective_times(WIDE, "all_reduce", 1 << 27, nodes=4, n=300, rng=np.random.default_rng(3),
                                node_leaves=[0, 0, 1, 1])
    b = sample_collective_times(NARROW, "all_reduce", 1 << 27, nodes=4, n=300, rng=np.random.default_rng(3))
    assert np.array_equal(a, b)


def test_the_packed_layout_or_one_switch_changes_nothing():  # type: ignore[no-untyped-def]
    for leaves in ([0, 0, 0, 0], [5, 5, 5, 5]):
        assert collective_time(WIDE, "all_reduce", 1 << 27, nodes=4, node_leaves=leaves).time_s == \
            collective_time(WIDE, "all_reduce", 1 << 27, nodes=4).time_s
    one = _variant(4, 1.0, "single_switch")
    assert collective_time(one, "all_reduce", 1 << 27, nodes=4, node_leaves=[0, 1, 0, 1]).time_s == \
        collective_time(one, "all_reduce", 1 << 27, nodes=4).time_s


def test_leaves_follow_the_node_ids_not_their_position():  # type: ignore[no-untyped-def]
    # nodes 0 and 2 on one leaf: the ring 0,1,2,3 crosses four times, the ring 0,2,1,3 twice
    topo = Topology.build(WIDE, 4, node_leaves=(0, 1, 0, 1))
    assert list(topo.leaf(np.arange(4), np.zeros(4, dtype=np.int64))) == [0, 1, 0, 1]
    interleaved = collective_time(WIDE, "all_reduce", 1 << 30, nodes=4, node_leaves=[0, 1, 0, 1])
    grouped = collective_time(WIDE, "all_reduce", 1 << 30, nodes=4, node_leaves=[0, 1, 0, 1],
                              node_order=[0, 2, 1, 3])
    assert grouped.time_s < interleaved.time_s


def test_a_wrong_length_is_an_input_error():  # type: ignore[no-untyped-def]
    with pytest.raises(InputError, match="node_leaves: expected a leaf for each of the job's 4 nodes, got 3"):
        collective_time(WIDE, "all_reduce", 1 << 20, nodes=4, node_leaves=[0, 0, 1])
