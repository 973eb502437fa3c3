"""The tuner-plugin choice (fabric/tuner.py): point in polygon, and the p5 all-reduce table of AWS's plugin
against the algorithm changes visible in the p5 measurements (tests/fabric/data/README.md)."""

from __future__ import annotations

import math

from fabricpace.fabric import collective_time, load_cluster
from fabricpace.fabric.tuner import inside, tuner_choice


def test_point_in_polygon_counts_edges_as_inside():
    square = ((0.0, 0.0), (2.0, 0.0), (2.0, 2.0), (0.0, 2.0))
    assert inside((1.0, 1.0), square) and inside((2.0, 1.0), square) and inside((0.0, 0.0), square)
    assert not inside((2.5, 1.0), square) and not inside((1.0, -0.1), square)
    line = ((1.0, 4.0), (5.0, 4.0), (1.0, 4.0))  # a degenerate region: only its edge is inside
    assert inside((3.0, 4.0), line) and not inside((3.0, 4.1), line)
    concave = ((0.0, 0.0), (4.0, 0.0), (4.0, 4.0), (2.0, 1.0), (0.0, 4.0))
    assert inside((1.0, 1.0), concave) and not inside((2.0, 3.0), concave)


def _choice(nodes: int, mib: int) -> tuple[str, str] | None:
    return tuner_choice("aws-ofi-p5", "all_reduce", mib << 20, nodes, 8, nvls=True)


def test_p5_all_reduce_table():
    # two nodes: the table has NVLS-tree above 30 MiB, but since PR #778/#779 the plugin leaves 2 nodes to
    # NCCL's own choice
    assert {_choice(2, m) for m in (32, 1024, 8192)} == {None}
    # four nodes: tree/LL128 up to 36 MiB, ring/LL128 to ~1.4 GiB, ring/Simple above (the measured busbw
    # plateaus at ~278 GB/s for 256 MiB..1 GiB and jumps to ~350 GB/s from 2 GiB)
    assert [_choice(4, m) for m in (32, 64, 1024, 2048)] == [
        ("tree", "LL128"),
        ("ring", "LL128"),
        ("ring", "LL128"),
        ("ring", "Simple"),
    ]
    # 32 nodes: NVLS-tree from 288 MiB to 1 GiB (the measured dip to 157 GB/s at 512 MiB), ring/LL128 at 2 GiB
    assert [_choice(32, m) for m in (256, 512, 2048)] == [
        ("tree", "LL128"),
        ("nvls_tree", "Simple"),
        ("ring", "LL128"),
    ]


def test_tuner_leaves_other_cases_to_nccl():
    assert tuner_choice("nccl", "all_reduce", 1 << 30, 4, 8, nvls=True) is None
    assert tuner_choice("aws-ofi-p5", "all_gather", 1 << 30, 4, 8, nvls=True) is None  # no p5 table
    assert tuner_choice("aws-ofi-p5", "all_reduce", 1 << 30, 1, 8, nvls=True) is None  # below 16 ranks
    assert tuner_choice("aws-ofi-p5", "all_reduce", 1 << 30, 4, 4, nvls=True) is None  # 4 GPUs per node
    # without NVLink SHARP the plugin skips NVLS-tree regions and the next region or NCCL decides
    assert tuner_choice("aws-ofi-p5", "all_reduce", 512 << 20, 32, 8, nvls=False) != ("nvls_tree", "Simple")


def test_the_p5_preset_uses_the_plugin_and_forced_choices_win():
    cl = load_cluster("p5-efa")
    r = collective_time(cl, "all_reduce", 64 << 20, nodes=16)
    assert (r.algorithm, r.protocol) == ("tree", "LL128") and math.isfinite(r.time_s)
    nccl = collective_time(cl.with_tuning(tuner="nccl"), "all_reduce", 64 << 20, nodes=16)
    assert nccl.algorithm != "tree"
    forced = collective_time(cl, "all_reduce", 64 << 20, nodes=16, algorithm="ring", protocol="Simple")
    assert (forced.algorithm, forced.protocol) == ("ring", "Simple")
