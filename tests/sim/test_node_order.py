"""The job's node order in the simulator: a rendezvous (shuffled) order makes the ring cross the spine,
and the placement twin — applied as the restart it stands for — restores the packed collective times."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from fabricpace.pacing.placement import propose_order
from fabricpace.pacing.state import PacingState
from fabricpace.run import load_run
from fabricpace.sim import SimOptions, resolve_node_order, simulate
from fabricpace.study import load_scenario
from fabricpace.study.metrics import summarize_run


@pytest.fixture(scope="module")
def paper_cluster():  # type: ignore[no-untyped-def]
    return load_scenario("paper").cluster


def _sim(tmp_path, name, cluster, workload, *, node_order=None, pinned=None, nodes=8):  # type: ignore[no-untyped-def]
    return load_run(
        simulate(
            cluster,
            workload,
            None,
            nodes=nodes,
            steps=40,
            seed=2,
            out_dir=tmp_path / name,
            node_order=node_order,
            options=SimOptions(pinned=pinned),
        )
    )


def test_rendezvous_order_is_seeded_and_packed_is_none():
    a = resolve_node_order("shuffled", nodes=16, seed=5)
    assert a is not None and sorted(a.tolist()) == list(range(16))
    assert np.array_equal(a, resolve_node_order("shuffled", nodes=16, seed=5))
    assert resolve_node_order("packed", nodes=16, seed=5) is None
    assert resolve_node_order([1, 0, 2], nodes=3, seed=0).tolist() == [1, 0, 2]


def test_shuffled_order_is_slower_and_placement_restores_the_packed_time(tmp_path, paper_cluster):
    workload = load_scenario("paper").workload  # 5.2 GB of gradients per step: comm shows
    order = [0, 4, 1, 5, 2, 6, 3, 7]  # leaves alternate: all 8 ring edges cross the spine (2 when packed)
    packed = _sim(tmp_path, "packed", paper_cluster, workload)
    shuffled = _sim(tmp_path, "shuffled", paper_cluster, workload, node_order=order)
    g = 8
    launch_leaves = [order[r // g] // 4 for r in range(8 * g)]
    placed = _sim(
        tmp_path,
        "placed",
        paper_cluster,
        workload,
        node_order=order,
        pinned=PacingState(placement=propose_order(launch_leaves)),
    )
    t = {
        k: summarize_run(r, 5)["iter_mean_s"]
        for k, r in {"packed": packed, "shuffled": shuffled, "placed": placed}.items()
    }
    assert t["shuffled"] > 1.2 * t["packed"]  # 4x the spine traffic on a 2:1 spine: comm is exposed
    assert t["placed"] == pytest.approx(t["packed"], rel=0.01)
    # ranks.parquet tells where each rank ran (node rank k on node order[k]); the manifest the ring.
    for run in (shuffled, placed):
        assert run.ranks.sort("rank")["node"].to_numpy()[::g].tolist() == order
        assert run.manifest.extra["node_order"] == order
    ring = placed.manifest.extra["ring_node_order"]
    assert [n // 4 for n in ring] == [0, 0, 0, 0, 1, 1, 1, 1] and sorted(ring) == list(range(8))
    assert "ring_node_order" not in shuffled.manifest.extra


def test_placement_splitting_a_node_is_refused(tmp_path, paper_cluster, small_workload):
    from fabricpace._errors import SimulationError

    bad = list(range(64))
    bad[3], bad[12] = bad[12], bad[3]  # ranks of nodes 0 and 1 mixed
    with pytest.raises(SimulationError, match="whole nodes"):
        _sim(tmp_path, "bad", paper_cluster, small_workload, pinned=PacingState(placement=tuple(bad)))


def test_study_cli_node_order(cli, tmp_path, small_workload, paper_cluster):
    out = tmp_path / "study"
    workload = load_scenario("paper").workload
    r = cli(
        "study",
        "--cluster",
        str(paper_cluster),
        "--workload",
        workload,
        "--nodes",
        "8",
        "--repeats",
        "1",
        "--steps",
        "60",
        "--warmup",
        "10",
        "--window",
        "10",
        "--compare",
        "baseline,paced",
        "--node-order",
        "shuffled",
        "--no-figures",
        "--format",
        "json",
        "--out",
        str(out),
    )
    assert r.returncode == 0, r.stderr
    import json

    rows = {row["mode"]: row for row in json.loads(r.stdout)["rows"]}
    # Seed 1 launches 8 nodes as 0 1 7 6 3 5 4 2 (leaves 0 0 1 1 0 1 1 0: 4 ring crossings, 2 needed).
    # The paced controller knows each rank's leaf, proposes the leaf-grouped order at its first window
    # and the twin applies it from there (the restart is not charged).
    decisions = pl.concat([pl.read_parquet(p) for p in out.rglob("pacing.parquet")])
    placement = decisions.filter(pl.col("policy") == "placement")
    assert placement.height == 1 and "crosses leaves 4 times" in placement["reason"][0]
    assert rows["paced"]["throughput"] > 1.1 * rows["baseline"]["throughput"]
    bad = cli(
        "study",
        "--cluster",
        str(paper_cluster),
        "--workload",
        str(small_workload),
        "--nodes",
        "8",
        "--node-order",
        "random",
        "--out",
        str(tmp_path / "bad"),
    )
    assert bad.returncode == 2 and "--node-order" in bad.stderr and "Traceback" not in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
