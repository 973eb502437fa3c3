"""simulate --node-order applies place's rank order: node ids, or the node=K tags of a hosts file (issue 6:
"the simulator and the lab can apply it"). Cluster: the lab mirror with 20 Mbit/s uplinks (4 nodes, 2 per
leaf), where an interleaved order crosses leaves 4 times per ring instead of 2."""

from __future__ import annotations

import re
from pathlib import Path

CLUSTER = Path(__file__).resolve().parents[1] / "diagnose" / "data" / "clusters" / "lab-20m.yaml"


def _ms_per_step(cli, tmp_path: Path, order: str, name: str) -> float:  # type: ignore[no-untyped-def]
    r = cli("simulate", "--cluster", str(CLUSTER), "--workload", "resnet-50", "--nodes", "4", "--steps", "6",
            "--warmup", "2", "--out", str(tmp_path / name), "--node-order", order)
    assert r.returncode == 0, r.stderr
    return float(re.search(r"([\d.]+) ms per step", r.stdout).group(1))  # type: ignore[union-attr]


def test_places_proposed_hostfile_is_applied(cli, tmp_path) -> None:
    inter = tmp_path / "inter.txt"
    inter.write_text("a node=0 leaf=0\nb node=2 leaf=1\nc node=1 leaf=0\nd node=3 leaf=1\n")
    proposed = tmp_path / "proposed.txt"
    r = cli("place", "--cluster", str(CLUSTER), "--hosts", str(inter), "--out", str(proposed), "--keep-tags")
    assert r.returncode == 0, r.stderr
    t_inter = _ms_per_step(cli, tmp_path, str(inter), "inter")
    assert t_inter == _ms_per_step(cli, tmp_path, "0,2,1,3", "ids")
    t_proposed = _ms_per_step(cli, tmp_path, str(proposed), "proposed")
    assert t_proposed == _ms_per_step(cli, tmp_path, "packed", "packed")
    assert t_proposed < 0.7 * t_inter  # half the leaf crossings on 20 Mbit/s uplinks


def test_orders_the_simulator_cannot_apply_are_one_line_errors(cli, refused, tmp_path) -> None:
    untagged = tmp_path / "untagged.txt"
    untagged.write_text("a\nb\nc\nd\n")
    far = tmp_path / "far.txt"
    far.write_text("a node=0\nb node=16\nc node=1\nd node=17\n")
    base = ("simulate", "--cluster", str(CLUSTER), "--workload", "resnet-50", "--nodes", "4", "--steps", "6")
    refused(cli(*base, "--node-order", str(untagged)), "untagged.txt:1", "node=K", "--keep-tags")
    refused(cli(*base, "--node-order", str(far)), "0,16,1,17", "nodes 0..3")
    refused(cli(*base, "--node-order", "0,1,1,3"), "each node id 0..3 once")
    refused(cli(*base, "--node-order", "nope"), "packed, shuffled")
