"""Collective model against closed forms, ECMP statistics, the closed form vs a full max-min solve,
vectorized sampling and the input errors of the Python API."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fabricpace._errors import InputError
from fabricpace.fabric import collective_time, load_cluster, sample_collective_times
from fabricpace.fabric.explain import explain_collective
from fabricpace.fabric.maxmin import max_min_rates
from fabricpace.fabric.topology import Topology


def test_ring_all_reduce_matches_the_alpha_beta_closed_form(cluster_factory):
    cl = cluster_factory()
    g, nic = 8, 100e9 / 8
    for nodes in (2, 4, 16):
        n = nodes * g
        for size in (1 << 20, 256 << 20, 4 << 30):
            r = collective_time(cl, "all_reduce", size, nodes=nodes, algorithm="ring", protocol="Simple")
            inter = 2 * (nodes - 1)
            floor = 3 * 1.0  # Simple: 3 proxy operations of net_overhead_us=1 per step of a multi-node ring
            lat_us = 8.4 + inter * max(2.0 + 0.5, floor) + (2 * (n - 1) - inter) * max(0.5, floor)
            expect = lat_us * 1e-6 + 2 * (n - 1) / n * size / (g * nic * 0.92)
            assert r.time_s == pytest.approx(expect, rel=1e-12)
            assert r.busbw_gbps == pytest.approx(r.algbw_gbps * 2 * (n - 1) / n)


def test_bandwidth_bound_ring_busbw_does_not_depend_on_rank_count(cluster_factory):
    cl = cluster_factory(
        intra_node={"latency_us": 0.0},
        network={"hop_latency_us": 0.0, "nic_latency_us": 0.0},
        tuning={"base_us": 0.0, "net_overhead_us": 0.0},
    )
    for op in ("all_reduce", "all_gather", "reduce_scatter"):
        bus = [
            collective_time(cl, op, 64 << 30, nodes=n, algorithm="ring", protocol="Simple").busbw_gbps
            for n in (2, 4, 8, 16, 64)
        ]
        assert bus == pytest.approx([8 * 12.5 * 0.92] * 5, rel=1e-9), op
    # one node: NVLink-bound ring at the NVLink efficiency
    one = collective_time(cl, "all_reduce", 64 << 30, nodes=1, algorithm="ring", protocol="Simple")
    assert one.busbw_gbps == pytest.approx(450 * 0.8, rel=1e-9)


def test_ring_latency_grows_with_the_rank_count(cluster_factory):
    cl = cluster_factory()
    lat = [
        collective_time(cl, "all_reduce", 8, nodes=n, algorithm="ring", protocol="Simple").latency_s
        for n in (2, 8, 32)
    ]
    assert lat[0] < lat[1] < lat[2]


def test_multi_node_ring_steps_are_paced_by_the_proxy(cluster_factory):
    """NCCL's rule: every step of a ring that spans nodes costs at least one network post (three with
    Simple); a one-node ring keeps its NVLink latency. Closed form for an all-gather (n-1 steps)."""
    cl = cluster_factory(tuning={"base_us": 0.0, "net_overhead_us": 9.0})
    for proto, mult in (("LL128", 1.0), ("Simple", 3.0)):
        for nodes in (2, 8, 32):
            n = nodes * 8
            r = collective_time(cl, "all_gather", 8, nodes=nodes, algorithm="ring", protocol=proto)
            assert r.latency_s * 1e6 == pytest.approx((n - 1) * 9.0 * mult, rel=1e-12)
    one = collective_time(cl, "all_gather", 8, nodes=1, algorithm="ring", protocol="Simple")
    assert one.latency_s * 1e6 == pytest.approx(7 * 0.5, rel=1e-12)


def test_selection_uses_nccl_constants_not_the_calibration():
    """NCCL does not measure the fabric: a calibrated cluster picks the same algorithm and protocol as its
    preset, and on EFA-like latencies the all-gather switch from LL128 to Simple happens at a fixed size per
    rank (the switch size doubles with the node count), as in the p5 measurements."""
    cl = load_cluster("p5-efa")
    slow = cl.with_tuning(
        net_efficiency=0.3, tree_efficiency=0.3, nvls_tree_efficiency=0.3, base_us=500.0, net_overhead_us=20.0
    )
    for op, nodes, size in (
        ("all_reduce", 8, 64 << 20),
        ("all_gather", 16, 1 << 30),
        ("all_reduce", 2, 8 << 30),
    ):
        a, b = collective_time(cl, op, size, nodes=nodes), collective_time(slow, op, size, nodes=nodes)
        assert (a.algorithm, a.protocol) == (b.algorithm, b.protocol)
    first_simple = []
    for nodes in (2, 4, 8, 16):
        protos = [collective_time(cl, "all_gather", (32 << 20) << k, nodes=nodes).protocol for k in range(8)]
        first_simple.append(protos.index("Simple"))
        assert protos[first_simple[-1] :] == ["Simple"] * (8 - first_simple[-1])
    assert np.diff(first_simple).tolist() == [1, 1, 1]


def test_tree_and_nvls_tree_have_their_own_efficiency():
    """NCCL's tree and NVLS-tree are different pipelines with separate bandwidth rules (tuning.cc): each
    algorithm's bandwidth term scales with its own efficiency and ignores the other's."""
    cl = load_cluster("p5-efa").with_tuning(tuner="nccl", base_us=0.0)
    size, nodes = 4 << 30, 16

    def per_byte(c, alg):  # bandwidth term (s per byte of S), latency removed
        r = collective_time(c, "all_reduce", size, nodes=nodes, algorithm=alg, protocol="Simple")
        return (r.time_s - r.latency_s) / size

    for alg, mine, other in (
        ("tree", "tree_efficiency", "nvls_tree_efficiency"),
        ("nvls_tree", "nvls_tree_efficiency", "tree_efficiency"),
    ):
        base = per_byte(cl.with_tuning(**{mine: 0.8, other: 0.8}), alg)
        assert per_byte(cl.with_tuning(**{mine: 0.4, other: 0.8}), alg) == pytest.approx(2 * base, rel=1e-9)
        assert per_byte(cl.with_tuning(**{mine: 0.8, other: 0.2}), alg) == pytest.approx(base, rel=1e-12)


def test_selection_follows_size_and_scale(cluster_factory):
    plain = cluster_factory()  # no NVLS: ring/tree with LL, LL128, Simple
    assert collective_time(plain, "all_reduce", 8 << 10, nodes=16).protocol in ("LL", "LL128")
    assert collective_time(plain, "all_reduce", 8 << 30, nodes=16).protocol == "Simple"
    cl = load_cluster("dgx-h100-ib")
    small = collective_time(cl, "all_reduce", 8 << 10, nodes=16)
    large = collective_time(cl, "all_reduce", 8 << 30, nodes=16)
    assert small.latency_s < large.latency_s and large.protocol == "Simple"
    assert collective_time(cl, "all_reduce", 8 << 30, nodes=1).algorithm == "nvls"
    # two nodes: the tree crosses the network once per direction, a ring twice -> NVLS-tree wins
    assert collective_time(cl, "all_reduce", 8 << 30, nodes=2).algorithm == "nvls_tree"
    assert large.algorithm == "ring"
    assert collective_time(cl, "all_gather", 1 << 30, nodes=16).algorithm == "ring"
    assert collective_time(cl, "all_to_all", 1 << 30, nodes=16).algorithm == "p2p"


def _no_collision_probability(m: int, k: int) -> float:
    return math.factorial(k) / (math.factorial(k - m) * k**m)


@pytest.mark.parametrize(("m", "k"), [(3, 4), (4, 8), (8, 8)])
def test_ecmp_collision_free_probability_matches_the_formula(cluster_factory, m, k):
    """m connections from leaf 0 to leaf 1 hashed on k spines; none shares an uplink iff all of them get
    the full uplink rate in the max-min solve."""
    cl = cluster_factory(
        nodes=2 * m,
        gpus_per_node=1,
        nics={"count": 1},
        network={"topology": "leaf_spine", "nodes_per_leaf": m, "spines": k},
    )
    topo = Topology.build(cl, 2 * m)
    src, dst, nic = np.arange(m), np.arange(m, 2 * m), np.zeros(m, dtype=np.int64)
    rng = np.random.default_rng(7)
    draws = 3000
    free = 0
    full = min(topo.capacity[topo.nic_tx(0, 0)], topo.capacity[topo.uplink(0, 0)])  # a lone flow's rate
    for _ in range(draws):
        rt = topo.route(src, nic, dst, nic, rng.integers(0, k, size=m))
        rate = max_min_rates(rt, topo.capacity)
        free += bool(np.all(rate >= full * (1 - 1e-9)))
    p = _no_collision_probability(m, k)
    sigma = math.sqrt(p * (1 - p) / draws)
    assert abs(free / draws - p) < 4 * sigma + 1e-3, (free / draws, p)


def _ecmp_cluster(cluster_factory):
    return cluster_factory(
        network={
            "topology": "leaf_spine",
            "nodes_per_leaf": 4,
            "spines": 4,
            "oversubscription": 2.0,
            "routing": "ecmp",
        },
    )


def test_closed_form_draw_equals_a_full_max_min_solve(cluster_factory):
    """The bincount closed form used per draw gives the same network time as routing every connection
    and solving max-min (the collective runs at its slowest connection)."""
    cl = _ecmp_cluster(cluster_factory)
    size = 1 << 30
    for seed in range(12):
        r = collective_time(
            cl,
            "all_reduce",
            size,
            nodes=16,
            algorithm="ring",
            protocol="Simple",
            rng=np.random.default_rng(seed),
        )
        ex = explain_collective(
            cl, "all_reduce", size, nodes=16, gpus_per_node=None, algorithm="ring", seed=seed
        )
        assert (r.time_s - r.latency_s) * 1e6 == pytest.approx(ex["network_time_us"], rel=1e-9), seed


def test_sample_collective_times_is_vectorized_and_seeded(cluster_factory):
    cl = _ecmp_cluster(cluster_factory)
    a = sample_collective_times(cl, "all_reduce", 1 << 30, nodes=16, n=500, rng=np.random.default_rng(1))
    b = sample_collective_times(cl, "all_reduce", 1 << 30, nodes=16, n=500, rng=np.random.default_rng(1))
    assert a.shape == (500,) and np.array_equal(a, b)
    # collisions only slow things down: the best draw is the collision-free time, some draws are slower
    best = a.min()
    assert np.all(a >= best) and (a > best * 1.01).any() and (a == best).any()
    # each draw equals collective_time with the same generator state
    one = collective_time(cl, "all_reduce", 1 << 30, nodes=16, rng=np.random.default_rng(1)).time_s
    assert a[0] == pytest.approx(one, rel=1e-12)
    sprayed = cl.model_copy(update={"network": cl.network.model_copy(update={"routing": "spray"})})
    s = sample_collective_times(sprayed, "all_reduce", 1 << 30, nodes=16, n=50, rng=np.random.default_rng(1))
    assert np.ptp(s) == 0.0 and s[0] <= a.min() * (1 + 1e-12)


def test_sample_collective_times_at_1024_nodes_runs_many_draws():
    cl = load_cluster("roce-leaf-spine-2to1").model_copy(update={"nodes": 1024})
    t = sample_collective_times(cl, "all_reduce", 25 << 20, nodes=1024, n=200, rng=np.random.default_rng(0))
    assert t.shape == (200,) and np.all(np.isfinite(t)) and np.all(t > 0)


def test_link_scale_slows_the_scaled_links(cluster_factory):
    cl = cluster_factory()
    base = collective_time(cl, "all_gather", 8 << 30, nodes=4, algorithm="ring", protocol="Simple")
    half = collective_time(
        cl, "all_gather", 8 << 30, nodes=4, algorithm="ring", protocol="Simple", link_scale=0.5
    )
    assert (half.time_s - half.latency_s) == pytest.approx(2 * (base.time_s - base.latency_s), rel=1e-9)
    one_nic = collective_time(
        cl,
        "all_gather",
        8 << 30,
        nodes=4,
        algorithm="ring",
        protocol="Simple",
        link_scale={"node2.nic3->switch": 0.25},
    )
    assert one_nic.time_s > base.time_s and one_nic.bottleneck == "node2.nic3->switch"
    with pytest.raises(InputError, match="unknown link"):
        collective_time(cl, "all_gather", 1 << 20, nodes=4, link_scale={"nope": 0.5})


def test_bad_arguments_raise_input_errors(cluster_factory):
    cl = cluster_factory()
    with pytest.raises(InputError, match="op 'allreduce'"):
        collective_time(cl, "allreduce", 1, nodes=2)
    with pytest.raises(InputError, match="only 64 nodes"):
        collective_time(cl, "all_reduce", 1, nodes=65)
    with pytest.raises(InputError, match="algorithm 'tree' is modelled for all_reduce"):
        collective_time(cl, "all_gather", 1, nodes=2, algorithm="tree")
    with pytest.raises(InputError, match="n=-1"):
        sample_collective_times(cl, "all_reduce", 1, nodes=2, n=-1, rng=np.random.default_rng(0))


def test_tree_channels_cover_every_nic_with_per_node_nics():
    """p5-efa (32 NICs per node) and dgx-h100-ib (8 NICs, one per GPU) have the same 400 GB/s of NIC
    bandwidth per node; NCCL runs both trees on every channel, so the tree's busiest NIC carries the same
    load per byte on both (a regression: per-node NICs once left half the NICs idle in the tree)."""
    from fabricpace.fabric.collectives import model_terms

    for nodes in (2, 4, 16):
        p5 = model_terms(load_cluster("p5-efa"), "all_reduce", nodes, 8, "nvls_tree")[0]
        ib = model_terms(load_cluster("dgx-h100-ib"), "all_reduce", nodes, 8, "nvls_tree")[0]
        assert p5 == pytest.approx(ib, rel=1e-9)
