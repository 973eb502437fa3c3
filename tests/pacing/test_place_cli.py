"""fabricpace place through the real entry point."""

from __future__ import annotations

import json
from pathlib import Path

from fabricpace.pacing.placement import cross_leaf_edges, plan_placement

PAPER = Path(__file__).resolve().parents[2] / "src/fabricpace/data/scenarios/paper/cluster.yaml"


def test_plan_groups_leaves_and_never_gets_worse():
    plan = plan_placement([0, 1, 0, 1, 2, 0], nbytes=1 << 30)
    assert plan.edges_before == 5 and plan.edges_after == 3
    assert [[0, 1, 0, 1, 2, 0][i] for i in plan.order] == [0, 0, 0, 1, 1, 2]
    assert plan.bytes_after < plan.bytes_before
    same = plan_placement([0, 0, 1, 1])
    assert same.order == (0, 1, 2, 3) and not same.improves
    assert cross_leaf_edges([3]) == 0


def test_place_proposes_a_leaf_local_ring(cli, tmp_path):
    hosts = tmp_path / "hosts.txt"
    hosts.write_text(
        "# interleaved leaves\nh0 slots=8 node=0\nh1 slots=8 node=4\nh2 slots=8 node=1\nh3 slots=8 node=5\n"
    )
    out = tmp_path / "placed.txt"
    r = cli("place", "--cluster", str(PAPER), "--hosts", str(hosts), "--out", str(out), "--format", "json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["hosts"] == ["h0", "h2", "h1", "h3"]
    assert d["cross_leaf_edges"] == {"before": 4, "after": 2}
    assert d["cross_leaf_bytes"]["after"] == d["cross_leaf_bytes"]["before"] / 2
    assert out.read_text() == "h0 slots=8\nh2 slots=8\nh1 slots=8\nh3 slots=8\n"
    r = cli("place", "--cluster", str(PAPER), "--hosts", str(hosts))
    assert r.returncode == 0 and "4 -> 2" in r.stdout


def test_place_bad_input_is_one_line_exit_2(cli, tmp_path):
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("h0 slots=8\nh1 rack=3\n")
    r = cli("place", "--cluster", str(PAPER), "--hosts", str(hosts))
    assert r.returncode == 2 and "hosts.txt:2" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    r = cli("place", "--cluster", str(PAPER), "--hosts", str(tmp_path / "missing.txt"))
    assert r.returncode == 2 and "missing.txt" in r.stderr
    hosts.write_text("h0\n")
    existing = tmp_path / "keep.txt"
    existing.write_text("mine")
    r = cli("place", "--cluster", str(PAPER), "--hosts", str(hosts), "--out", str(existing))
    assert r.returncode == 2 and existing.read_text() == "mine"
